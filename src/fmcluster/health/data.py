"""fmcluster's side of the health data: the YAML data files loaded, and node configs built exactly as the
node_health role renders them (roles/node_health/templates/config.json.j2; a test keeps the two equal), so
`invoke doctor` and the tests run the very checks a node runs. Needs PyYAML: never imported on nodes."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CHECKS_PATH = DATA_DIR / "health_checks.yml"
XID_PATH = DATA_DIR / "xid.yml"

#: The node_health role's defaults for what a config carries besides the node's facts (kept equal by a test).
DEFAULT_DISK = ({"path": "/", "min_free_percent": 5, "min_free_mib": 2048, "min_free_inodes_percent": 5},
                {"path": "/tmp", "min_free_percent": 5, "min_free_mib": 1024, "min_free_inodes_percent": 5})
DEFAULT_TIMEOUTS = {"default": 15, "budget": 50, "prolog": 8, "munge": 10, "scontrol": 15, "mount": 10,
                    "nvidia-smi": 20, "dcgm": 40, "dcgm-diag": 900, "dcgm-diag-r3": 3600, "dcgm-diag-r4": 10800}


def _load(path: Path) -> Dict[str, Any]:
    import yaml

    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path} is not a mapping")
    return doc


@lru_cache(maxsize=None)
def checks_doc() -> Dict[str, Any]:
    """src/fmcluster/data/health_checks.yml."""
    return _load(CHECKS_PATH)


@lru_cache(maxsize=None)
def xid_doc() -> Dict[str, Any]:
    """src/fmcluster/data/xid.yml."""
    return _load(XID_PATH)


def node_config(node: str, instance: Mapping[str, Any], real_accelerators: bool, real_memory_mb: int,
                mounts: Sequence[Mapping[str, str]] = (), slurm_conf: str = "", munge_socket: str = "",
                report_dir: str = "", report_requires_mount: str = "", state_dir: str = "", textfile_dir: str = "",
                disk: Optional[Sequence[Mapping[str, Any]]] = None, timeouts: Optional[Mapping[str, float]] = None,
                commands: Optional[Mapping[str, Sequence[str]]] = None, paths: Optional[Mapping[str, str]] = None,
                drain: bool = True, return_diag_level: int = 2) -> Dict[str, Any]:
    """The node config the health program reads (JSON on the node)."""
    return {
        "generated_by": "fmcluster (role node_health); edits will be reverted",
        "node": node,
        "facts": {
            "real_accelerators": bool(real_accelerators),
            "instance_type": str(instance.get("name", "unknown")),
            "accelerator": str(instance.get("accelerator", "none")),
            "accelerators_per_node": int(instance.get("accelerators_per_node", 0) or 0),
            "efa_interfaces": int(instance.get("efa_interfaces", 0) or 0),
            "real_memory_mb": int(real_memory_mb),
        },
        "slurm": {"conf": slurm_conf, "drain": drain},
        "munge": {"socket": munge_socket},
        "mounts": [dict(m) for m in mounts],
        "disk": [dict(d) for d in (DEFAULT_DISK if disk is None else disk)],
        "timeouts": dict(DEFAULT_TIMEOUTS if timeouts is None else timeouts),
        "commands": {k: list(v) for k, v in (commands or {}).items()},
        "paths": dict(paths or {}),
        "report_dir": report_dir,
        "report_requires_mount": report_requires_mount,
        "state_dir": state_dir,
        "textfile_dir": textfile_dir,
        "return_diag_level": int(return_diag_level),
        "checks": checks_doc()["checks"],
        "xids": xid_doc(),
    }
