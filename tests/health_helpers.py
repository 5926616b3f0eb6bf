"""Shared by the health tests: a p5.48xlarge node's config, and a probe that answers with recorded tool outputs.

The recorded outputs stand in for the tools (nvidia-smi, dcgmi, munge, scontrol, stat) of a GPU node this
machine does not have; files the checks read (kernel log, mount table, meminfo, sysfs) are fixture files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from conftest import ROOT
from fmcluster.catalog import load_catalog
from fmcluster.health import data
from fmcluster.health.probe import Completed, Probe

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import efa_ports  # noqa: E402
import gpu_outputs  # noqa: E402

GPU_FIXTURES = gpu_outputs.FIXTURES
NODE = "gpu-1"
#: Slurm's RealMemory of a p5 node as the generated inventory computes it (95 % of 2048 GiB).
P5_REAL_MEMORY_MB = int(2048 * 1024 * 0.95)
#: /proc/meminfo MemTotal of a p5.48xlarge (about 2015 GiB after the kernel's reservations).
P5_MEMINFO = "MemTotal:       2113460916 kB\nMemFree:        2090000000 kB\nMemAvailable:   2095000000 kB\n"
P5_MOUNTINFO = (
    "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw,discard,errors=remount-ro\n"
    "29 22 0:26 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "612 22 0:52 / /fsx rw,relatime shared:312 - lustre 10.0.12.34@tcp:/abcdefgh rw,flock,lazystatfs,encrypt\n"
)
OK_SCONTROL = f"NodeName={NODE} Arch=x86_64 CoresPerSocket=48\n   State=IDLE ThreadsPerCore=2\n   Partitions=gpu\n"


class Recorded(Probe):
    """Answers commands from a table of argv prefixes → (stdout, exit code[, stderr]); anything else is
    'not installed'. Records every command it was asked to run."""

    def __init__(self, answers: Mapping[tuple[str, ...], tuple[Any, ...]]) -> None:
        super().__init__()
        self.answers = dict(answers)
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], timeout: float, stdin: str | None = None) -> Completed:
        self.calls.append(list(argv))
        for prefix in sorted(self.answers, key=len, reverse=True):
            if tuple(argv[:len(prefix)]) == prefix:
                answer = self.answers[prefix]
                if answer == "timeout":
                    return Completed(argv, -9, "", "", timed_out=True)
                out, code = answer[0], answer[1]
                err = answer[2] if len(answer) > 2 else ""
                return Completed(argv, code, out, err)
        return Completed(argv, 127, "", "", missing=True)


def healthy_answers(smi: str | None = None) -> dict[tuple[str, ...], tuple[Any, ...]]:
    return {
        ("munge", "-n"): ("MUNGE:AwQFAAB...credential:\n", 0),
        ("unmunge",): ("STATUS: Success (0)\n", 0),
        ("scontrol", "show", "node"): (OK_SCONTROL, 0),
        ("stat", "-f"): ("lustre\n", 0),
        ("nvidia-smi", "-q", "-x"): (smi if smi is not None else gpu_outputs.smi_xml(), 0),
        ("dcgmi", "discovery", "-l"): (gpu_outputs.fixture("dcgmi-discovery-8.txt"), 0),
        ("dcgmi", "diag", "-r", "1", "-j"): (gpu_outputs.fixture("dcgmi-diag-r1-pass.json"), 0),
    }


BOOT_ID = "5c0f3c1e-0d6c-4b7e-9f51-8a4b2f7d9e10"


def p5_config(tmp: Path, kmsg: str = "kmsg-clean.txt", efa_count: int | None = None, real_accelerators: bool = True,
              booted: bool = True, **overrides: Any) -> dict[str, Any]:
    """A p5.48xlarge compute node's config (built like the node_health role builds it) whose evidence files
    are fixtures under tmp. `efa_count` overrides the catalog's 32 EFA interfaces (the sysfs fixture has 2).
    `booted`: this boot's return diagnostic ran and passed (its record in the state directory), as on a node
    that serves; False leaves no record."""
    instance = load_catalog()["p5.48xlarge"].as_vars()
    if efa_count is not None:
        instance["efa_interfaces"] = efa_count
    (tmp / "meminfo").write_text(P5_MEMINFO)
    (tmp / "mountinfo").write_text(P5_MOUNTINFO)
    (tmp / "boot_id").write_text(BOOT_ID + "\n")
    ib = tmp / "sys" / "class" / "infiniband"
    if not ib.exists():
        efa_ports.build(tmp / "sys")
    paths = {"kmsg": str(GPU_FIXTURES / kmsg), "meminfo": str(tmp / "meminfo"), "mountinfo": str(tmp / "mountinfo"),
             "boot_id": str(tmp / "boot_id"), "infiniband": str(ib)}
    settings: dict[str, Any] = dict(mounts=[{"path": "/fsx", "fstype": "lustre"}], state_dir=str(tmp / "state"),
                                    report_dir=str(tmp / "reports"), textfile_dir=str(tmp / "textfile"),
                                    disk=[{"path": str(tmp), "min_free_percent": 0, "min_free_mib": 0}],
                                    paths=paths)
    settings.update(overrides)
    config = data.node_config(NODE, instance, real_accelerators, P5_REAL_MEMORY_MB, **settings)
    if booted and config["state_dir"]:
        Path(config["state_dir"]).mkdir(parents=True, exist_ok=True)
        (Path(config["state_dir"]) / "boot.json").write_text(json.dumps(
            {"boot_id": BOOT_ID, "level": config["return_diag_level"], "healthy": True, "reason": "", "started": 0}))
    return config


def diag_r2_pass() -> str:
    """`dcgmi diag -r 2 -j` passing on 8 GPUs: the recorded level-1 run plus the categories level 2 adds
    (dcgmi-diag(1): PCIe/NVLink under Integration; GPU Memory and Diagnostic under Hardware)."""
    doc = json.loads(gpu_outputs.fixture("dcgmi-diag-r1-pass.json"))
    passed = [{"status": "Pass"}]
    doc["DCGM GPU Diagnostic"]["test_categories"] += [
        {"category": "Integration", "tests": [{"name": "PCIe", "results": passed}]},
        {"category": "Hardware", "tests": [{"name": "GPU Memory", "results": passed},
                                           {"name": "Diagnostic", "results": passed}]}]
    return json.dumps(doc)
