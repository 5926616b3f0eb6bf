"""`scontrol show node` output of Slurm 22.05, recorded on this machine (tests/fixtures/slurm/), and nodes made
from its block by changing exactly the fields a scenario changes (name, address, state, reason)."""

from __future__ import annotations

import re

from conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "slurm"
RECORDED = (FIXTURES / "scontrol-show-node.txt").read_text()
_BLOCK = RECORDED.split("\n\n")[1]  # cpu-2's block: no Reason line


def node_block(name: str, state: str = "IDLE", reason: str = "", by: str = "root", address: str = "",
               partitions: str = "cpu", when: str = "2026-12-03T04:16:13", cpus_alloc: int = 0,
               slurmd_start: str = "2026-12-03T04:15:43") -> str:
    block = _BLOCK.replace("NodeName=cpu-2", f"NodeName={name}").replace("NodeHostName=cpu-2", f"NodeHostName={name}")
    block = re.sub(r"NodeAddr=\S+", f"NodeAddr={address or '10.79.60.9'}", block)
    block = re.sub(r"State=\S+", f"State={state}", block)
    block = re.sub(r"Partitions=\S+", f"Partitions={partitions}", block)
    block = re.sub(r"CPUAlloc=\d+", f"CPUAlloc={cpus_alloc}", block)
    block = re.sub(r"SlurmdStartTime=\S+", f"SlurmdStartTime={slurmd_start}", block)
    if reason:
        block = block.rstrip("\n") + f"\n   Reason={reason} [{by}@{when}]\n"
    return block.rstrip("\n") + "\n"


def show_node(*blocks: str) -> str:
    return "\n".join(blocks) + "\n"
