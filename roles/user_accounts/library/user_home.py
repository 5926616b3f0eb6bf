#!/usr/bin/python3
# A user's home, ~/.ssh and ~/.ssh/authorized_keys, made and written by root without following any link the
# user controls (role user_accounts; docs/users.md "Homes: root never follows the user's links").
"""Every step works on a directory opened without following links (O_NOFOLLOW | O_DIRECTORY), relative to the
one above it (openat, mkdirat, renameat, unlinkat): whatever the user puts in their home between two steps, root
acts on the entries of their own home and nothing else. An existing key file is never chowned or chmodded in
place (it could be a hard link to another file): a changed file is written anew and renamed over it. A home,
.ssh or key file that is a link, or not what it must be (a directory, a regular file), is refused for that user:
nothing of theirs is touched, the result says why (a warning), and the converge goes on for everyone else."""

from __future__ import annotations

import errno
import os
import secrets
import socket
import stat

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: user_home
short_description: A user's home, ~/.ssh and authorized_keys, written by root without following the user's links
description:
  - Opens the home, then .ssh, then the key file, each relative to the directory above it and without following
    a link; refuses (with a warning, changing nothing of that user's) a home, .ssh or key file that is a link.
options:
  path: {description: The user's home (its parent, the home root, is root's own)., type: path, required: true}
  owner: {description: The user's uid., type: int, required: true}
  group: {description: The user's private gid., type: int, required: true}
  make_home: {description: Create the home when missing and set its owner and mode 0700., type: bool, default: true}
  authorized_keys:
    description: The key file's content (~/.ssh made 0700, the file 0600, both the user's); omitted, the file is removed.
    type: str
"""

HOME_MODE, SSH_MODE, KEYS_MODE = 0o700, 0o700, 0o600
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """A path of the user's that root will not act on."""


def open_dir(parent: int, name: str, shown: str) -> int | None:
    """The directory `name` in `parent`, opened without following a link; None when it does not exist."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as err:
        if err.errno == errno.ENOENT:
            return None
        if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            kind = "a symbolic link" if is_link(parent, name) else "not a directory"
            raise Refused(f"{shown} is {kind}") from None
        raise


def is_link(parent: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def fix_dir(fd: int, owner: int, group: int, mode: int, check: bool) -> list[str]:
    """chown and chmod an opened directory (through its descriptor: no path is resolved again)."""
    st, done = os.fstat(fd), []
    if (st.st_uid, st.st_gid) != (owner, group):
        done.append(f"owner {st.st_uid}:{st.st_gid} -> {owner}:{group}")
        if not check:
            os.fchown(fd, owner, group)
    if stat.S_IMODE(st.st_mode) != mode:
        done.append(f"mode {stat.S_IMODE(st.st_mode):04o} -> {mode:04o}")
        if not check:
            os.fchmod(fd, mode)
    return done


def ensure_dir(parent: int, name: str, shown: str, owner: int, group: int, mode: int, check: bool,
               changes: list[str]) -> int | None:
    fd = open_dir(parent, name, shown)
    if fd is None:
        changes.append(f"{shown}: created")
        if check:
            return None
        try:
            os.mkdir(name, mode, dir_fd=parent)
        except FileExistsError:  # made in between (by the user, in their home): opened as found, or refused
            pass
        fd = open_dir(parent, name, shown)
        if fd is None:
            raise Refused(f"{shown} vanished right after it was made")
    fixed = fix_dir(fd, owner, group, mode, check)
    changes.extend(f"{shown}: {change}" for change in fixed)
    return fd


def read_keys(ssh: int, shown: str) -> tuple[str | None, os.stat_result | None]:
    """The key file's text and status, opened without following a link (and without blocking on a FIFO)."""
    try:
        found = os.stat("authorized_keys", dir_fd=ssh, follow_symlinks=False)
    except FileNotFoundError:
        return None, None
    if stat.S_ISLNK(found.st_mode):
        raise Refused(f"{shown} is a symbolic link")
    if not stat.S_ISREG(found.st_mode):  # a FIFO or socket would block or fail the open
        raise Refused(f"{shown} is not a regular file")
    try:
        fd = os.open("authorized_keys", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=ssh)
    except OSError as err:  # replaced in between
        if err.errno == errno.ENOENT:
            return None, None
        raise Refused(f"{shown} changed while it was read ({os.strerror(err.errno)})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{shown} is not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
            if sum(len(c) for c in chunks) > 1 << 20:
                return "\0(over 1 MiB)", st
        return b"".join(chunks).decode("utf-8", "replace"), st
    finally:
        os.close(fd)


def write_keys(ssh: int, content: str, owner: int, group: int) -> None:
    """A new file in .ssh (O_EXCL: never an existing entry), then renamed over the key file's name. Its name is
    this converge's own: the home is shared by every node, each converging at the same time with PIDs of its own
    PID namespace (two nodes' converges often have the same one), so a name of the PID alone was another node's
    file as often as not (one node renamed or removed the other's, whose rename then failed)."""
    tmp = f".authorized_keys.fmcluster-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(8)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, KEYS_MODE, dir_fd=ssh)
    except FileExistsError:
        raise Refused(f"the key file's temporary name in .ssh ({tmp}) was taken while it was written") from None
    try:
        os.fchown(fd, owner, group)
        os.fchmod(fd, KEYS_MODE)
        os.write(fd, content.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, "authorized_keys", src_dir_fd=ssh, dst_dir_fd=ssh)


def converge(path: str, owner: int, group: int, make_home: bool, keys: str | None, check: bool,
             changes: list[str]) -> dict[str, str]:
    """Returns the key file's before/after for --diff; appends what changed to `changes`."""
    home_root, name = os.path.split(path.rstrip("/"))
    diff: dict[str, str] = {}
    try:
        root = os.open(home_root or "/", DIR_FLAGS & ~os.O_NOFOLLOW)  # the home root is root's: it may be a link
    except FileNotFoundError:
        if not check:  # the role makes the home root first: only a --check run gets here
            raise
        changes.extend([f"{path}: created"] if make_home else [])
        return {"before": "", "after": keys} if make_home and keys is not None else diff
    opened = [root]
    try:
        if make_home:
            home = ensure_dir(root, name, path, owner, group, HOME_MODE, check, changes)
        else:
            home = open_dir(root, name, path)
        if home is None:
            if keys is not None:
                changes.append(f"{path}/.ssh: created")
                diff = {"before": "", "after": keys}
            return diff
        opened.append(home)
        shown_ssh, shown_keys = f"{path}/.ssh", f"{path}/.ssh/authorized_keys"
        if keys is None:
            ssh = open_dir(home, ".ssh", shown_ssh)
            if ssh is None:
                return diff
            opened.append(ssh)
            before, _ = read_keys(ssh, shown_keys)
            if before is not None:
                changes.append(f"{shown_keys}: removed")
                diff = {"before": before, "after": ""}
                if not check:
                    os.unlink("authorized_keys", dir_fd=ssh)
            return diff
        ssh = ensure_dir(home, ".ssh", shown_ssh, owner, group, SSH_MODE, check, changes)
        if ssh is None:
            return {"before": "", "after": keys}
        opened.append(ssh)
        before, st = read_keys(ssh, shown_keys)
        same = st is not None and before == keys and (st.st_uid, st.st_gid) == (owner, group) \
            and stat.S_IMODE(st.st_mode) == KEYS_MODE and st.st_nlink == 1
        if not same:
            changes.append(f"{shown_keys}: {'written' if before != keys else 'owner/mode set'}")
            diff = {"before": before or "", "after": keys}
            if not check:
                write_keys(ssh, keys, owner, group)
        return diff
    finally:
        for fd in reversed(opened):
            os.close(fd)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"path": {"type": "path", "required": True}, "owner": {"type": "int", "required": True},
                       "group": {"type": "int", "required": True}, "make_home": {"type": "bool", "default": True},
                       "authorized_keys": {"type": "str", "no_log": False}},
        supports_check_mode=True)
    p = module.params
    path = os.path.normpath(p["path"])
    if not os.path.isabs(path) or os.path.dirname(path) == path:
        module.fail_json(msg=f"user_home: path must be an absolute home below a home root, not {p['path']!r}")
    changes: list[str] = []
    try:
        diff = converge(path, p["owner"], p["group"], p["make_home"], p["authorized_keys"], module.check_mode, changes)
    except Refused as why:
        module.warn(f"{why}: refused, nothing of this user's was changed (root does not follow links a user "
                    f"controls). Replace it with a real directory or file, e.g. `rm ~/.ssh && mkdir -m 700 ~/.ssh`, "
                    f"and the next converge writes the keys.")
        module.exit_json(changed=False, refused=str(why), changes=[])
    result = {"changed": bool(changes), "changes": changes, "refused": ""}
    if module._diff and diff:  # noqa: SLF001 - AnsibleModule's documented --diff flag
        result["diff"] = {"before_header": f"{path}/.ssh/authorized_keys", "after_header": f"{path}/.ssh/authorized_keys",
                          **diff}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
