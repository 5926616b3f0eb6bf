"""Test tenants for the local node provider: a throw-away checkout root holding one tenant spec.

The root mirrors the repository (playbooks/, roles/, ansible.cfg are symlinks), so converge runs the real
playbook while the tenant's generated inventory and secrets stay in the temporary directory.
"""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def make_root(tmp: Path, org: str, subnet: str, login: int = 0, queues: dict[str, int] | None = None) -> Path:
    """Write inventories/<org>/group_vars/all/tenant.yml under `tmp` and link the repo's Ansible content."""
    spec = {
        "tenant": {
            "schema_version": 1,
            "org": org,
            "programme": "test",
            "provider": "local",
            "region": "ap-northeast-1",
            "availability_zone": "ap-northeast-1a",
            "scheduler": "slurm-ec2",
            "controller": {"instance_type": "m5.xlarge"},
            "login": {"instance_type": "m5.xlarge", "count": login},
            "queues": [{"name": name, "instance_type": "c5.2xlarge", "count": count}
                       for name, count in (queues or {"cpu": 2}).items()],
            "network": {"local_subnet": subnet},
            "storage": {"lustre": {"deployment_type": "SCRATCH_2", "storage_capacity_gib": 1200}},
        }
    }
    spec_path = tmp / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    for name in ("playbooks", "roles", "ansible.cfg"):
        if not (tmp / name).exists():
            (tmp / name).symlink_to(REPO / name)
    return tmp
