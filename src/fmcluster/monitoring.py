"""The monitoring part of the generated inventory: tenant values → role variables.

`write_inventory` (Slurm issue) puts `inventory_vars(tenant)` under `all: vars:` of the generated
hosts.yml; playbooks/monitoring.yml then maps the inventory's groups and catalog facts onto the exporter
roles itself. Roles never read the tenant; this is the one place its monitoring section is translated.
"""

from __future__ import annotations

import subprocess
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
        values.update(_local_vars())
    return values


LOCAL_ROOT = "{{ fmcluster_local_root | default('/var/lib/fmcluster/local') }}/monitoring"


def _local_vars() -> dict[str, Any]:
    """Provider local: nodes share this machine's filesystem, so every file lives under the tenant's runtime
    root (per node where several nodes write), and no node runs apt (bootstrap installed the packages; several
    nodes would race for the dpkg lock)."""
    node = LOCAL_ROOT + "/nodes/{{ inventory_hostname }}"
    return {
        "node_exporter_install": False, "prometheus_install": False, "alertmanager_install": False,
        "node_exporter_run_dir": f"{node}/node_exporter",
        "efa_exporter_run_dir": f"{node}/efa_exporter",
        "efa_exporter_install_dir": f"{node}/efa_exporter/lib",
        "dcgm_exporter_run_dir": f"{node}/dcgm_exporter",
        "prometheus_config_dir": f"{LOCAL_ROOT}/prometheus/etc",
        "prometheus_data_dir": f"{LOCAL_ROOT}/prometheus/data",
        "prometheus_run_dir": f"{LOCAL_ROOT}/prometheus/run",
        "alertmanager_config_dir": f"{LOCAL_ROOT}/alertmanager/etc",
        "alertmanager_data_dir": f"{LOCAL_ROOT}/alertmanager/data",
        "alertmanager_run_dir": f"{LOCAL_ROOT}/alertmanager/run",
        "grafana_provisioning_dir": f"{LOCAL_ROOT}/grafana/provisioning",
        "grafana_dashboards_dir": f"{LOCAL_ROOT}/grafana/dashboards",
    }


def stop_daemons(root: Path) -> list[Path]:
    """Stop every monitoring daemon started as a plain process under root (each by the pid in its pidfile).

    For provider local before the namespace nodes are removed: a process keeps a deleted network
    namespace alive, so deleting the namespace does not stop it. root is `<fmcluster_local_root>/monitoring`.
    Returns the pidfiles whose process was stopped.
    """
    stopped = []
    for pidfile in sorted(root.rglob("*.pid")) if root.is_dir() else []:
        result = subprocess.run(
            ["start-stop-daemon", "--stop", "--quiet", "--retry=TERM/10/KILL/5", "--remove-pidfile",
             f"--pidfile={pidfile}"], check=False)
        if result.returncode == 0:
            stopped.append(pidfile)
    return stopped
