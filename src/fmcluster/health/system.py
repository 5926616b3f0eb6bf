"""Evidence every node has: mounts (/proc/self/mountinfo), free space (statvfs), memory (/proc/meminfo)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List

from fmcluster.health.model import Unreadable


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\040 etc."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> List[Mount]:
    """proc(5): `id parent major:minor root mount_point options [optional...] - fstype source superoptions`."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 3:
            continue
        mounts.append(Mount(_unescape(fields[4]), fields[sep + 1], _unescape(fields[sep + 2])))
    return mounts


def find_mount(mounts: List[Mount], path: str) -> Mount | None:
    """The mount at exactly `path` (the last one wins: a later mount hides an earlier one there)."""
    wanted = os.path.normpath(path)
    found = None
    for mount in mounts:
        if os.path.normpath(mount.mount_point) == wanted:
            found = mount
    return found


def parse_meminfo(text: str) -> Dict[str, int]:
    """/proc/meminfo values in KiB."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0])
    if "MemTotal" not in out:
        raise Unreadable("/proc/meminfo has no MemTotal line")
    return out


@dataclass(frozen=True)
class Space:
    path: str
    free_mib: float
    free_percent: float
    inodes_free_percent: float


def space(path: str) -> Space:
    """Free space and inodes of the file system holding `path` (what an unprivileged writer may use)."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    inodes = st.f_files
    return Space(path, avail / 2**20, 100.0 * avail / total if total else 0.0,
                 100.0 * st.f_favail / inodes if inodes else 100.0)
