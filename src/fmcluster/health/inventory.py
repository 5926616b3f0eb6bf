"""The health part of the generated inventory: tenant → role variables of node_health and the slurm role's
health-check settings, computed once here (never on nodes: this module needs the tenant model)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List

from fmcluster import monitoring

if TYPE_CHECKING:
    from fmcluster.model import Tenant

#: Seconds between health runs (Slurm's HealthCheckInterval, and the controller's pass).
INTERVAL = {"aws": 300, "local": 60}
#: Where the health program is installed on AWS nodes (the image has no fmcluster there otherwise).
AWS_INSTALL_DIR = "/opt/fmcluster/health"


def mounts(tenant: Tenant) -> List[Dict[str, str]]:
    """Shared file systems every node must have mounted: FSx for Lustre, and OpenZFS (NFS) when the tenant has it.
    Provider local has none yet: the emulator creates no FSx (the local stand-in is the lead's substrate work)."""
    if tenant.provider == "local":
        return []
    out = [{"path": tenant.storage.lustre.mount_point, "fstype": "lustre"}]
    if tenant.storage.openzfs is not None:
        out.append({"path": tenant.storage.openzfs.mount_point, "fstype": "nfs4"})
    return out


def inventory_vars(tenant: Tenant) -> Dict[str, Any]:
    """Role variables for the generated inventory's `all: vars:`."""
    local = tenant.provider == "local"
    interval = INTERVAL["local" if local else "aws"]
    if local:
        root = "{{ fmcluster_local_root }}"
        install = f"{root}/health"
        values: Dict[str, Any] = {
            "node_health_install_dir": install,
            "node_health_config_path": f"{root}/nodes/%n/health/config.json",
            "node_health_cluster_config_path": f"{root}/health/cluster.json",
            "node_health_state_dir": f"{root}/nodes/%n/health/state",
            # Every namespace node shares this machine's filesystem: the tenant's runtime root is the shared
            # storage the reports need, as Lustre is on AWS.
            "node_health_report_dir": f"{root}/health/reports",
            "node_health_report_requires_mount": "",
            "node_health_run_dir": f"{root}/health/run",
            "node_health_textfile_dir": monitoring.LOCAL_ROOT + "/nodes/{{ inventory_hostname }}/node_exporter/textfile",
            "slurm_metrics_textfile_dir": monitoring.LOCAL_ROOT + "/nodes/{{ inventory_hostname }}/node_exporter/textfile",
            "slurm_metrics_run_dir": f"{root}/health/run",
            "slurm_metrics_interval": 15,
        }
    else:
        lustre = tenant.storage.lustre.mount_point
        install = AWS_INSTALL_DIR
        values = {
            "node_health_install_dir": install,
            # On Lustre, so the controller reads what a node could not act on; written only while it is mounted.
            "node_health_report_dir": f"{lustre.rstrip('/')}/.fmcluster/health/reports",
            "node_health_report_requires_mount": lustre,
        }
    values.update({
        "node_health_mounts": mounts(tenant),
        "node_health_reports_shared": True,
        "node_health_interval": interval,
        "slurm_metrics_install_dir": install,
        "slurm_health_check_program": f"{install}/bin/fmcluster-health-slurmd",
        "slurm_health_check_interval": interval,
        "slurm_health_check_node_state": "ANY",
        "slurm_prolog": f"{install}/bin/fmcluster-health-slurmd",
    })
    return values
