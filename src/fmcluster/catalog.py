"""The instance catalog: hardware facts and acceptance baselines per EC2 instance type (data/instances.yml)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, cast, get_args

import yaml

from fmcluster.paths import CATALOG_PATH

Accelerator = Literal["cuda", "neuron", "none"]


NodeClass = Literal["single_node", "multi_node"]
NODE_CLASS_WORDS: dict[NodeClass, str] = {
    "single_node": "1 node: intra-node (NVLink) only",
    "multi_node": "2+ nodes: crosses the network",
}


class CatalogError(ValueError):
    """The catalog file breaks one of its own rules; the message names the file, the key and the rule."""


def node_class(nodes: int) -> NodeClass:
    """1 node never leaves the NVSwitch; 2 or more cross the network, which is what the floors differ on."""
    return "single_node" if nodes <= 1 else "multi_node"


@dataclass(frozen=True)
class Floor:
    gbps: float
    source: str


@dataclass(frozen=True)
class PublicFigure:
    """What healthy clusters show publicly: busbw at one message size (None = peak at large sizes)."""

    gbps: float
    message_bytes: int | None
    nodes: int
    source: str


@dataclass(frozen=True)
class AcceptanceBaselines:
    """all_reduce busbw baselines of one instance type, by node-count class and message size."""

    reference_bytes: int
    """The message size floors are defined at; acceptance gates there and bisection probes run it."""
    floors: dict[NodeClass, Floor]
    public: dict[NodeClass, tuple[PublicFigure, ...]]

    @property
    def message_bytes(self) -> int:
        return self.reference_bytes

    def floor(self, nodes: int) -> Floor:
        return self.floors[node_class(nodes)]

    def min_busbw_gbps(self, nodes: int) -> float:
        """The busbw floor (GB/s) for a run over `nodes` nodes."""
        return self.floor(nodes).gbps

    def public_figures(self, nodes: int) -> tuple[PublicFigure, ...]:
        return self.public.get(node_class(nodes), ())

    def public_at(self, nodes: int, message_bytes: int | None) -> PublicFigure | None:
        """The public figure for this node class at exactly `message_bytes` (None: the peak figure)."""
        return next((f for f in self.public_figures(nodes) if f.message_bytes == message_bytes), None)


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
    acceptance: AcceptanceBaselines
    nvlink_gbps: float = 0.0
    """Total NVLink bandwidth of one GPU, both directions, GB/s (0: no NVLink); a physical busbw ceiling."""
    nvlink_source: str = ""

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def needs_fabric(self) -> bool:
        """It has an accelerator or EFA: its tasks need an NCCL/libfabric environment."""
        return self.accelerator != "none" or self.has_efa

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


def _baselines(name: str, acc: dict[str, Any], path: Path) -> AcceptanceBaselines:
    where = f"{path}: instance_types.{name}.acceptance"
    reference = int(acc["reference_bytes"])
    floors: dict[NodeClass, Floor] = {}
    public: dict[NodeClass, tuple[PublicFigure, ...]] = {}
    for cls in get_args(NodeClass):
        raw = (acc.get("floors") or {}).get(cls)
        if not raw or not str(raw.get("source", "")).strip():
            raise CatalogError(f"{where}.floors.{cls}: missing, or without a source; give gbps and source")
        floors[cls] = Floor(float(raw["gbps"]), str(raw["source"]))
        figures = []
        for i, fig in enumerate((acc.get("public") or {}).get(cls) or ()):
            size = None if fig["bytes"] == "peak" else int(fig["bytes"])
            figure = PublicFigure(float(fig["gbps"]), size, int(fig["nodes"]), str(fig.get("source", "")))
            if not figure.source.strip():
                raise CatalogError(f"{where}.public.{cls}[{i}]: a public figure needs its source")
            if (size is None or size == reference) and figure.gbps < floors[cls].gbps:
                raise CatalogError(
                    f"{where}.public.{cls}[{i}]: the floor {floors[cls].gbps:g} GB/s exceeds the public figure "
                    f"{figure.gbps:g} GB/s of the same class and size; a floor must never ask for more than "
                    "healthy clusters show")
            figures.append(figure)
        public[cls] = tuple(figures)
    return AcceptanceBaselines(reference, floors, public)


def _instance(name: str, raw: dict[str, Any], path: Path = CATALOG_PATH) -> InstanceType:
    nvlink = raw.get("nvlink") or {}
    if nvlink and not (float(nvlink.get("gbps", 0)) > 0 and str(nvlink.get("source", "")).strip()):
        raise CatalogError(f"{path}: instance_types.{name}.nvlink: give gbps (> 0) and its source")
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
        acceptance=_baselines(name, raw["acceptance"], path),
        nvlink_gbps=float((raw.get("nvlink") or {}).get("gbps", 0)),
        nvlink_source=str((raw.get("nvlink") or {}).get("source", "")),
    )


@lru_cache(maxsize=4)
def load_catalog(path: Path = CATALOG_PATH) -> dict[str, InstanceType]:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {name: _instance(name, spec, path) for name, spec in raw["instance_types"].items()}
