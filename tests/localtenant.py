"""Throw-away tenants for tests: a root directory holding one tenant spec (inventories/<org>/.../tenant.yml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def make_root(tmp: Path, org: str, vpc_cidr: str, login: int = 0,
              queues: dict[str, int] | list[dict[str, Any]] | None = None,
              provider: str = "local", **extra: Any) -> Path:
    """Write inventories/<org>/group_vars/all/tenant.yml under `tmp`; return `tmp`. `queues`: name → count of
    c5.2xlarge nodes, or the spec's own list of queues.

    `extra` adds or replaces top-level keys of the spec (e.g. storage with an openzfs home)."""
    spec: dict[str, Any] = {
        "schema_version": 1,
        "org": org,
        "programme": "test",
        "provider": provider,
        "region": "ap-northeast-1",
        "availability_zone": "ap-northeast-1a",
        "scheduler": "slurm-ec2",
        "controller": {"instance_type": "m5.xlarge"},
        "login": {"instance_type": "m5.xlarge", "count": login},
        "queues": queues if isinstance(queues, list) else
        [{"name": name, "instance_type": "c5.2xlarge", "count": count} for name, count in (queues or {"cpu": 2}).items()],
        "network": {"vpc_cidr": vpc_cidr},
        "storage": {"lustre": {"deployment_type": "SCRATCH_2", "storage_capacity_gib": 1200}},
        **extra,
    }
    spec_path = tmp / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(yaml.safe_dump({"tenant": spec}, sort_keys=False))
    return tmp
