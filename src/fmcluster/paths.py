"""Where things live in an fmcluster checkout. One function per location, so no path is typed twice."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "data"
SCHEMA_PATH = DATA_DIR / "tenant.schema.json"
RESERVED_ACCOUNTS_PATH = DATA_DIR / "reserved_accounts.yml"
CATALOG_PATH = DATA_DIR / "instances.yml"
#: What a node runs before fmcluster's toolchain is there (shell and the standard library alone): the user data's
#: script, the S3 client it writes out, the bootstrap it fetches.
NODE_BOOT_DIR = PACKAGE_DIR / "node" / "boot"


def repo_root() -> Path:
    """The checkout fmcluster works in: $FMCLUSTER_ROOT, else the source tree this package sits in."""
    override = os.environ.get("FMCLUSTER_ROOT")
    if override:
        return Path(override).resolve()
    return PACKAGE_DIR.parent.parent


def source_root() -> Path:
    """The checkout this package's code ships in (roles, playbooks), whatever $FMCLUSTER_ROOT says:
    tests and Molecule scenarios point $FMCLUSTER_ROOT at throwaway tenant trees, not at code."""
    return PACKAGE_DIR.parent.parent


def inventories_dir(root: Path | None = None) -> Path:
    return (root or repo_root()) / "inventories"


def image_cache() -> Path:
    """Where node images and their records are kept on this machine: the local substrate's pristine image and baked
    layers, and every tenant's baked-image records (fmcluster.baked.record_path), whichever provider built them."""
    return Path(os.environ.get("FMCLUSTER_IMAGE_CACHE", "/var/cache/fmcluster/images"))


def tenant_dir(org: str, root: Path | None = None) -> Path:
    return inventories_dir(root) / org


def tenant_spec_path(org: str, root: Path | None = None) -> Path:
    """The one declarative source of a tenant."""
    return tenant_dir(org, root) / "group_vars" / "all" / "tenant.yml"


def generated_dir(org: str, root: Path | None = None) -> Path:
    """Files derived from the spec and from stack outputs; git-ignored, never edited by hand."""
    return tenant_dir(org, root) / "generated"


def secrets_dir(org: str, root: Path | None = None) -> Path:
    """Generated secrets (munge key, Grafana admin password); git-ignored, mode 0700."""
    return (root or repo_root()) / ".secrets" / org


class UnsafePath(ValueError):
    """A place fmcluster writes to is a symbolic link (or not a directory): writing would follow it elsewhere."""


def real_dir(folder: Path, base: Path) -> Path:
    """`folder` (inside `base`) as real directories, created where missing. A component below `base` that is a
    symbolic link or not a directory is refused: a generated file is written where its path says, never where a
    link points (`generated -> /elsewhere`)."""
    base.mkdir(parents=True, exist_ok=True)  # the tenant's folder: load_tenant refuses it as a link
    here = base
    for part in folder.relative_to(base).parts:
        here = here / part
        try:
            os.mkdir(here)
        except FileExistsError:
            pass
        mode = os.lstat(here).st_mode
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            what = "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"
            raise UnsafePath(f"{here} is {what}; fmcluster writes generated files only into real directories "
                             f"(remove it: `rm {here}`, the next run recreates it)")
    return folder


def write_fresh(path: Path, data: str | bytes, base: Path, if_changed: bool = False) -> bool:
    """Write `path` afresh: a new temporary file in its real directory (see real_dir), renamed over `path`.
    An existing link or file at `path` is replaced, never written through. With `if_changed`, an existing
    regular file holding `data` already is left untouched. Returns whether it wrote."""
    body = data.encode("utf-8") if isinstance(data, str) else data
    real_dir(path.parent, base)
    if if_changed:
        try:
            current = os.lstat(path)
            if stat.S_ISREG(current.st_mode) and current.st_size == len(body):
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as handle:
                    if handle.read(len(body) + 1) == body:
                        return False
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o644)
            handle.write(body)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True
