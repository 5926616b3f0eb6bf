"""The monitoring part of the generated inventory: tenant values → role variables.

`write_inventory` (Slurm issue) puts `inventory_vars(tenant)` under `all: vars:` of the generated
hosts.yml; playbooks/monitoring.yml then maps the inventory's groups and catalog facts onto the exporter
roles itself. Roles never read the tenant; this is the one place its monitoring section is translated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fmcluster.model import Tenant
from fmcluster.paths import repo_root


def playbook_path(root: Path | None = None) -> Path:
    """playbooks/monitoring.yml: run it with `-i inventories/<org>/generated/` after the nodes exist."""
    return (root or repo_root()) / "playbooks" / "monitoring.yml"


def inventory_vars(tenant: Tenant) -> dict[str, Any]:
    """Role variables derived from the tenant, for the generated inventory's `all: vars:`."""
    monitoring = tenant.monitoring
    values: dict[str, Any] = {
        "prometheus_retention_days": monitoring.prometheus_retention_days,
        "prometheus_remote_write_url": monitoring.remote_write_url or "",
        "prometheus_remote_write_region": tenant.region if monitoring.remote_write_url else "",
        "grafana_enabled": monitoring.grafana,
        "alertmanager_receivers": [
            {"name": r.name, "type": r.type, "target": r.target} for r in monitoring.alert_receivers
        ],
        # Expected on every node where FSx exists (the playbook only expects it with provider aws).
        "fmcluster_lustre_mount_point": tenant.storage.lustre.mount_point,
    }
    if tenant.provider == "local":
        # The namespace nodes share this machine's filesystem and packages (scripts/bootstrap.sh installs
        # them): no node runs apt, so several nodes never race for the dpkg lock.
        values.update({"node_exporter_install": False, "prometheus_install": False, "alertmanager_install": False})
    return values
