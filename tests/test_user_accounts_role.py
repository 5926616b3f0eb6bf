"""roles/user_accounts converges on this host with the project's Ansible (a local connection, as root), inside a
private mount namespace whose /etc is a copy and whose shared home is a temporary directory bound as a mount
point: real groups, users and homes, and nothing of this machine's own accounts changes.

The specification (issue 42): root never acts on a path a user can redirect. A user who points ~/.ssh or their
key file at a directory outside their home (standing in for /etc) changes nothing there at the next converge, and
the converge says it refused; the home root is root's, 0755, with every missing parent made the same way (issue
38: Ansible's `file` gave the missing home root a home's owner and mode); a second converge and a --check --diff run
change nothing."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import HOST_PYTHON, ROOT, venv_tool

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="users, chown and a mount namespace need root"),
              pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is missing")]

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl {}@laptop"
USERS = [
    {"name": "fmct-alice", "uid": 29001, "gid": 29001, "groups": ["fmct-llm"], "ssh_keys": [KEY.format("alice")],
     "removed": False},
    {"name": "fmct-bob", "uid": 29002, "gid": 29002, "groups": ["fmct-llm"], "ssh_keys": [KEY.format("bob")],
     "removed": False},
    {"name": "fmct-carol", "uid": 29003, "gid": 29003, "groups": ["fmct-llm"], "ssh_keys": [], "removed": False},
    {"name": "fmct-dave", "uid": 29004, "gid": 29004, "groups": ["fmct-llm"], "ssh_keys": [KEY.format("dave")],
     "removed": False},
]


def setup(tmp: Path, users: list[dict[str, object]], home_root: Path) -> None:
    """A copy of /etc for the namespace, the shared file system's mount point, the play and its variables."""
    shutil.copytree("/etc", tmp / "etc", symlinks=True)
    (tmp / "fsx").mkdir(exist_ok=True)
    variables = {"user_accounts_users": users, "user_accounts_groups": [{"name": "fmct-llm", "gid": 29100}],
                 "user_accounts_home_root": str(home_root)}
    (tmp / "vars.yml").write_text(yaml.safe_dump(variables))
    (tmp / "play.yml").write_text(yaml.safe_dump([{"name": "user_accounts", "hosts": "localhost",
                                                   "gather_facts": False, "roles": ["user_accounts"]}]))


def converge(tmp: Path, *extra: str) -> tuple[int, int, str]:
    """ansible-playbook in a private mount namespace: /etc is tmp/etc, tmp/fsx is a mount point."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
           "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    playbook = [venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local",
                "-e", f"ansible_python_interpreter={HOST_PYTHON}", "-e", f"@{tmp / 'vars.yml'}",
                str(tmp / "play.yml"), *extra]
    script = 'set -e; mount --bind "$1/etc" /etc; mount --bind "$1/fsx" "$1/fsx"; shift; exec "$@"'
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(tmp),
                           *playbook], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    out = done.stdout + done.stderr
    changed = re.search(r"^localhost\s+: ok=\d+\s+changed=(\d+)", done.stdout, re.M)
    return done.returncode, int(changed.group(1)) if changed else -1, out


def snapshot(top: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Every entry below `top` (not following links): owner, group, mode and content."""
    seen = {}
    for path in [top, *sorted(top.rglob("*"))]:
        st = path.lstat()
        body = path.read_bytes() if stat.S_ISREG(st.st_mode) else os.readlink(path).encode() if path.is_symlink() else b""
        seen[str(path.relative_to(top))] = (st.st_uid, st.st_gid, st.st_mode, body)
    return seen


def owner_mode(path: Path) -> tuple[int, int, str]:
    st = path.lstat()
    return st.st_uid, st.st_gid, oct(stat.S_IMODE(st.st_mode))


def test_the_home_root_is_root_s_0755_and_each_home_its_user_s(tmp_path: Path) -> None:
    home_root = tmp_path / "fsx" / "home"
    setup(tmp_path, USERS, home_root)

    code, changed, out = converge(tmp_path, "--check", "--diff")
    assert code == 0, out[-4000:]
    assert not home_root.exists(), "--check made the home root"

    code, changed, out = converge(tmp_path)
    assert code == 0, out[-4000:]
    assert changed > 0
    assert owner_mode(home_root) == (0, 0, "0o755")
    alice = home_root / "fmct-alice"
    assert owner_mode(alice) == (29001, 29001, "0o700")
    assert owner_mode(alice / ".ssh") == (29001, 29001, "0o700")
    assert owner_mode(alice / ".ssh" / "authorized_keys") == (29001, 29001, "0o600")
    assert KEY.format("alice") in (alice / ".ssh" / "authorized_keys").read_text()
    assert owner_mode(home_root / "fmct-carol") == (29003, 29003, "0o700")
    assert not (home_root / "fmct-carol" / ".ssh").exists()

    code, changed, out = converge(tmp_path)
    assert (code, changed) == (0, 0), out[-4000:]
    code, changed, out = converge(tmp_path, "--check", "--diff")
    assert (code, changed) == (0, 0), out[-4000:]


def test_a_home_root_a_user_was_given_is_taken_back_by_root(tmp_path: Path) -> None:
    """What the demo had (issue 38): /fsx/home owned by the first user, 0700."""
    home_root = tmp_path / "fsx" / "home"
    setup(tmp_path, USERS[:1], home_root)
    home_root.mkdir(mode=0o700)
    os.chown(home_root, 29001, 29001)
    code, _, out = converge(tmp_path)
    assert code == 0, out[-4000:]
    assert owner_mode(home_root) == (0, 0, "0o755")


def test_links_a_user_plants_in_their_home_are_refused_and_nothing_outside_changes(tmp_path: Path) -> None:
    home_root = tmp_path / "fsx" / "home"
    setup(tmp_path, USERS, home_root)
    code, _, out = converge(tmp_path)
    assert code == 0, out[-4000:]

    # Stands in for /etc: root's, with a file named like a key file and one a user would like to own.
    etc = tmp_path / "victim-etc"
    etc.mkdir(mode=0o755)
    (etc / "authorized_keys").write_text("root's own file\n")
    (etc / "shadow").write_text("root:secret\n")
    (etc / "shadow").chmod(0o640)
    home = {user["name"]: home_root / str(user["name"]) for user in USERS}
    # alice: ~/.ssh -> etc (the converge would make it hers and write her keys into it).
    shutil.rmtree(home["fmct-alice"] / ".ssh")
    (home["fmct-alice"] / ".ssh").symlink_to(etc)
    # bob: ~/.ssh/authorized_keys -> etc/shadow (the converge would rewrite and chown it).
    (home["fmct-bob"] / ".ssh" / "authorized_keys").unlink()
    (home["fmct-bob"] / ".ssh" / "authorized_keys").symlink_to(etc / "shadow")
    # carol has no keys: ~/.ssh -> etc (the converge would remove etc/authorized_keys).
    (home["fmct-carol"] / ".ssh").symlink_to(etc)
    # dave's keys change, his ~/.ssh -> etc: and he is then removed (his key file removed through the link).
    shutil.rmtree(home["fmct-dave"] / ".ssh")
    (home["fmct-dave"] / ".ssh").symlink_to(etc)
    users = [*USERS[:3], {**USERS[3], "removed": True}]
    (tmp_path / "vars.yml").write_text(yaml.safe_dump({**yaml.safe_load((tmp_path / "vars.yml").read_text()),
                                                      "user_accounts_users": users}))
    before = snapshot(etc)

    code, changed, out = converge(tmp_path, "--diff")
    assert code == 0, out[-4000:]
    assert snapshot(etc) == before
    assert owner_mode(etc) == (0, 0, "0o755")
    flat = " ".join(out.split())
    for refused in (f"{home['fmct-alice']}/.ssh is a symbolic link", f"{home['fmct-bob']}/.ssh/authorized_keys is a "
                    "symbolic link", f"{home['fmct-carol']}/.ssh is a symbolic link",
                    f"{home['fmct-dave']}/.ssh is a symbolic link"):
        assert f"{refused}: refused" in flat, out[-4000:]
    # The links themselves are the users' own business: left as they are.
    assert (home["fmct-alice"] / ".ssh").is_symlink() and (home["fmct-bob"] / ".ssh" / "authorized_keys").is_symlink()

    # Once alice puts a real ~/.ssh back, the next converge writes her keys there.
    (home["fmct-alice"] / ".ssh").unlink()
    (home["fmct-alice"] / ".ssh").mkdir()
    code, changed, out = converge(tmp_path)
    assert code == 0, out[-4000:]
    assert owner_mode(home["fmct-alice"] / ".ssh" / "authorized_keys") == (29001, 29001, "0o600")
    assert snapshot(etc) == before


def test_a_key_file_hard_linked_elsewhere_is_replaced_never_chowned(tmp_path: Path) -> None:
    """A hard link keeps the other file's owner and content: the converge writes a new file in its place."""
    home_root = tmp_path / "fsx" / "home"
    setup(tmp_path, USERS[:1], home_root)
    code, _, out = converge(tmp_path)
    assert code == 0, out[-4000:]
    keys = home_root / "fmct-alice" / ".ssh" / "authorized_keys"
    outside = tmp_path / "fsx" / "outside"
    outside.write_text("root's\n")
    outside.chmod(0o644)
    keys.unlink()
    os.link(outside, keys)
    code, changed, out = converge(tmp_path)
    assert (code, changed) == (0, 1), out[-4000:]
    assert owner_mode(outside) == (0, 0, "0o644") and outside.read_text() == "root's\n"
    assert owner_mode(keys) == (29001, 29001, "0o600") and KEY.format("alice") in keys.read_text()


def test_a_key_file_that_is_a_fifo_is_refused_without_blocking_the_converge(tmp_path: Path) -> None:
    home_root = tmp_path / "fsx" / "home"
    setup(tmp_path, USERS[:1], home_root)
    code, _, out = converge(tmp_path)
    assert code == 0, out[-4000:]
    keys = home_root / "fmct-alice" / ".ssh" / "authorized_keys"
    keys.unlink()
    os.mkfifo(keys)
    code, changed, out = converge(tmp_path)
    assert (code, changed) == (0, 0), out[-4000:]
    assert f"{keys} is not a regular file: refused" in " ".join(out.split())
    assert stat.S_ISFIFO(keys.lstat().st_mode)
