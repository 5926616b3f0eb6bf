"""What this node must have, from the inventory and the instance catalog: it decides which checks apply.

Never from what the node happens to have: a p5 node whose GPUs are missing must fail the GPU checks, not skip
them. The one exception is a substrate whose nodes never have the catalog's hardware (the provider's capability
`real_accelerators` false: provider local's namespace nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Tuple


@dataclass(frozen=True)
class Facts:
    real_accelerators: bool
    instance_type: str
    accelerator: str
    gpus: int
    efa: int
    mounts: Tuple[Dict[str, str], ...]
    real_memory_mb: int
    why_not: Mapping[str, str]  # fact → why it is false here, for the skip message

    def holds(self, name: str) -> bool:
        return bool(getattr(self, name))


def derive(config: Mapping[str, Any]) -> Facts:
    """Facts of the node described by a node config (see fmcluster.health.data.node_config)."""
    raw = config.get("facts", {})
    if not isinstance(raw.get("real_accelerators"), bool):
        # Fail closed: without the capability, nothing says whether a missing GPU is a fault or the substrate.
        raise ValueError("the node config's facts have no real_accelerators (true or false): write it with role "
                         "node_health (node_health_real_accelerators, from the manifest's fmcluster_capabilities)")
    real = bool(raw["real_accelerators"])
    itype = str(raw.get("instance_type", "unknown"))
    accel = str(raw.get("accelerator", "none"))
    per_node = int(raw.get("accelerators_per_node", 0) or 0)
    efa = int(raw.get("efa_interfaces", 0) or 0)
    mounts = tuple({"path": str(m["path"]), "fstype": str(m.get("fstype", ""))} for m in config.get("mounts", []))
    why: Dict[str, str] = {}
    gpus = per_node if accel == "cuda" and real else 0
    if accel != "cuda":
        why["gpus"] = f"the instance catalog gives {itype} no NVIDIA GPU (accelerator {accel})"
    elif not real:
        why["gpus"] = (f"provider local: this namespace node has none of the {per_node} GPUs the catalog gives {itype}")
    elif per_node <= 0:
        why["gpus"] = f"the instance catalog gives {itype} 0 GPUs"
    efa_here = efa if real else 0
    if efa <= 0:
        why["efa"] = f"the instance catalog gives {itype} no EFA interface"
    elif not real:
        why["efa"] = f"provider local: this namespace node has none of the {efa} EFA interfaces of {itype}"
    if not mounts:
        why["mounts"] = "the inventory lists no shared file system for this node"
    return Facts(real_accelerators=real, instance_type=itype, accelerator=accel, gpus=gpus, efa=efa_here, mounts=mounts,
                 real_memory_mb=int(raw.get("real_memory_mb", 0) or 0), why_not=why)


def unmet(facts: Facts, when: List[str]) -> List[str]:
    """The reasons the facts in `when` do not hold (empty: the check applies)."""
    return [facts.why_not.get(name, f"{name} is false") for name in when if not facts.holds(name)]
