"""accel_detect finds hardware by PCI ids in sysfs and by device nodes, never by a flag.

This machine has no GPU, EFA or Trainium, so the positive cases read a prepared sysfs-shaped tree through
`accel_detect_root`: the detection logic itself is exercised; nothing is installed from it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import HOST_PYTHON, ROOT, venv_tool

pytestmark = pytest.mark.slow

PLAY = """
- hosts: localhost
  gather_facts: false
  roles: [accel_detect]
"""


def pci(root: Path, address: str, vendor: str, device: str, pci_class: str) -> None:
    node = root / "sys" / "bus" / "pci" / "devices" / address
    node.mkdir(parents=True)
    for name, value in {"vendor": vendor, "device": device, "class": pci_class}.items():
        (node / name).write_text(value + "\n", encoding="ascii")


def detect(tmp_path: Path, root: str) -> dict[str, Any]:
    play = tmp_path / "detect.yml"
    play.write_text(PLAY, encoding="utf-8")
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_CACHE_PLUGIN": "memory"}
    proc = subprocess.run(
        [venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={HOST_PYTHON}",
         "-e", f"accel_detect_root={root}", str(play)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    )
    facts: dict[str, Any] = {}
    for play_result in json.loads(proc.stdout)["plays"]:
        for task in play_result["tasks"]:
            facts.update(task["hosts"]["localhost"].get("ansible_facts", {}))
    return facts


def test_gpus_nvswitches_efa_and_trainium_are_counted_from_pci_ids(tmp_path: Path) -> None:
    root = tmp_path / "node"
    for i in range(8):
        pci(root, f"0000:{0x10 + i:02x}:00.0", "0x10de", "0x2330", "0x030200")  # H100 SXM: 3D controller
    for i in range(4):
        pci(root, f"0000:{0x30 + i:02x}:00.0", "0x10de", "0x22a3", "0x068000")  # NVSwitch: bridge
    for i in range(3):
        pci(root, f"0000:{0x50 + i:02x}:00.0", "0x1d0f", "0xefa1", "0x020000")  # EFA
    pci(root, "0000:60:00.0", "0x1d0f", "0xec20", "0x020000")  # ENA: same vendor, not EFA
    pci(root, "0000:61:00.0", "0x1d0f", "0x7164", "0x120000")  # Trainium1
    pci(root, "0000:00:01.0", "0x8086", "0x7000", "0x060100")  # unrelated
    (root / "dev").mkdir()
    for name in ("nvidia0", "nvidiactl", "neuron0"):
        (root / "dev" / name).touch()
    facts = detect(tmp_path, str(root))
    assert (facts["accel_detect_nvidia_gpu_count"], facts["accel_detect_nvswitch_count"],
            facts["accel_detect_efa_count"], facts["accel_detect_neuron_count"]) == (8, 4, 3, 1)
    assert facts["accel_detect_dev_nodes"] == ["neuron0", "nvidia0", "nvidiactl"]
    assert facts["accel_detect_summary"].startswith("PCI: 8 NVIDIA GPU(s), 4 NVSwitch(es), 3 EFA, 1 Trainium")


def test_this_machine_reports_no_accelerator_and_says_where_it_looked(tmp_path: Path) -> None:
    facts = detect(tmp_path, "/")
    if Path("/dev/nvidia0").exists() or list(Path("/sys/class").glob("infiniband/*")):
        pytest.skip("this machine has accelerator hardware")
    assert (facts["accel_detect_nvidia_gpu_count"], facts["accel_detect_efa_count"], facts["accel_detect_neuron_count"]) == (0, 0, 0)
    assert "searched /sys/bus/pci/devices and /dev" in facts["accel_detect_summary"]
