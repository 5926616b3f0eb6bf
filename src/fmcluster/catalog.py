"""The instance catalog: hardware facts and acceptance floors per EC2 instance type (data/instances.yml)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from fmcluster.paths import CATALOG_PATH

Accelerator = Literal["cuda", "neuron", "none"]


@dataclass(frozen=True)
class AcceptanceFloor:
    message_bytes: int
    min_busbw_by_nodes: dict[str, float]
    expected_busbw_gbps: float
    source: str

    def min_busbw_gbps(self, nodes: int) -> float:
        """The busbw floor for a run over `nodes` nodes (falls back to the `default` entry)."""
        by_nodes = self.min_busbw_by_nodes
        return by_nodes.get(str(nodes), by_nodes["default"])


@dataclass(frozen=True)
class InstanceType:
    name: str
    family: str
    accelerator: Accelerator
    accelerator_model: str
    accelerators_per_node: int
    vcpus: int
    memory_gib: int
    efa_interfaces: int
    network_gbps: int
    nvswitch: bool
    acceptance: AcceptanceFloor

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    def as_vars(self) -> dict[str, Any]:
        """Plain dict for templates and generated inventories."""
        return {
            "name": self.name,
            "family": self.family,
            "accelerator": self.accelerator,
            "accelerator_model": self.accelerator_model,
            "accelerators_per_node": self.accelerators_per_node,
            "vcpus": self.vcpus,
            "memory_gib": self.memory_gib,
            "efa_interfaces": self.efa_interfaces,
            "network_gbps": self.network_gbps,
            "nvswitch": self.nvswitch,
        }


def _instance(name: str, raw: dict[str, Any]) -> InstanceType:
    acc = raw["acceptance"]
    return InstanceType(
        name=name,
        family=raw["family"],
        accelerator=cast(Accelerator, raw["accelerator"]),
        accelerator_model=raw["accelerator_model"],
        accelerators_per_node=int(raw["accelerators_per_node"]),
        vcpus=int(raw["vcpus"]),
        memory_gib=int(raw["memory_gib"]),
        efa_interfaces=int(raw["efa_interfaces"]),
        network_gbps=int(raw["network_gbps"]),
        nvswitch=bool(raw["nvswitch"]),
        acceptance=AcceptanceFloor(
            message_bytes=int(acc["message_bytes"]),
            min_busbw_by_nodes={str(k): float(v) for k, v in acc["min_busbw_gbps"].items()},
            expected_busbw_gbps=float(acc["expected_busbw_gbps"]),
            source=str(acc["source"]),
        ),
    )


@lru_cache(maxsize=4)
def load_catalog(path: Path = CATALOG_PATH) -> dict[str, InstanceType]:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {name: _instance(name, spec) for name, spec in raw["instance_types"].items()}
