"""EFA devices and their port states, from /sys/class/infiniband.

The device test is the EFA exporter's (roles/efa_exporter/files/fmcluster_efa_exporter.py: an RDMA device
whose device/driver link points at the `efa` driver); a test keeps the two in agreement on the same sysfs
fixture. Port state and physical state are the kernel's `ports/<n>/state` ("4: ACTIVE") and `phys_state`
("5: LinkUp") files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List

EFA_DRIVER = "efa"


def is_efa_device(device: Path) -> bool:
    driver = device / "device" / "driver"
    try:
        return Path(os.path.realpath(driver)).name == EFA_DRIVER and driver.exists()
    except OSError:
        return False


def efa_devices(sysfs_root: Path) -> List[Path]:
    if not sysfs_root.is_dir():
        return []
    return sorted((d for d in sysfs_root.iterdir() if is_efa_device(d)), key=lambda d: d.name)


@dataclass(frozen=True)
class Port:
    device: str
    port: str
    state: str  # e.g. "4: ACTIVE", or "" when unreadable
    phys_state: str  # e.g. "5: LinkUp"

    @property
    def up(self) -> bool:
        return self.state.endswith("ACTIVE") and self.phys_state.endswith("LinkUp")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def ports(device: Path) -> List[Port]:
    root = device / "ports"
    if not root.is_dir():
        return []
    return [Port(device.name, p.name, _read(p / "state"), _read(p / "phys_state"))
            for p in sorted(root.iterdir(), key=lambda p: p.name)]
