"""EFA devices and their port states, from /sys/class/infiniband.

The one answer to "which devices are EFA" (an RDMA device whose device/driver link points at the `efa` driver): the
health check, the EFA exporter (fmcluster.health.efa_exporter) and the efa_exporter role's probe
(`fmcluster-health efa-devices`) all ask it. Port state and physical state are the kernel's `ports/<n>/state` ("4: ACTIVE") and `phys_state`
("5: LinkUp") files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List

EFA_DRIVER = "efa"
#: The kernel's RDMA device class directory.
SYSFS_ROOT = "/sys/class/infiniband"


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


if __name__ == "__main__":  # the efa_exporter role's probe, run by Ansible's script module with the node's python3
    import sys

    for found in efa_devices(Path(sys.argv[1] if len(sys.argv) > 1 else SYSFS_ROOT)):
        print(found.name)
