"""The health part of the manifest: tenant → role variables of node_health and slurm_metrics and the slurm
role's health-check settings, computed once here (never on nodes: this module needs the tenant model)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fmcluster.model import Tenant

#: Where the health program is installed on every node.
INSTALL_DIR = "/opt/fmcluster/health"
#: /proc/self/mountinfo's file system type of each kind of shared storage (fmcluster.publish.shared_storage).
FSTYPES = {"lustre": "lustre", "nfs": "nfs4"}
#: Slurm's SlurmdTimeout where the health interval is long: its own default (slurm.conf(5), SlurmdTimeout: 300 s).
SLURMD_TIMEOUT_S = 300


def mounts(storage: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Shared file systems every node must have mounted. A file system the stacks did not create (empty
    `source`: the local substrate binds a shared directory at its mount point) is checked as mounted, of any type."""
    return [{"path": str(fs["mount_point"]), "fstype": FSTYPES.get(str(fs["type"]), "") if fs["source"] else ""}
            for fs in storage]


def manifest_vars(tenant: Tenant, storage: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Role variables for the manifest's `vars`; `storage` is the manifest's shared_storage_filesystems."""
    # Seconds between health runs (Slurm's HealthCheckInterval, and the controller's pass): the provider's.
    provider = tenant.capabilities.provider
    interval = provider.health_interval_s
    lustre = tenant.storage.lustre.mount_point.rstrip("/")
    return {
        "node_health_install_dir": INSTALL_DIR,
        # On Lustre, so the controller reads what a node could not act on; written only while it is mounted.
        "node_health_report_dir": f"{lustre}/.fmcluster/health/reports",
        "node_health_report_requires_mount": lustre,
        "node_health_mounts": mounts(storage),
        "node_health_reports_shared": True,
        "node_health_interval": interval,
        "slurm_metrics_install_dir": INSTALL_DIR,
        "slurm_metrics_interval": provider.metrics_interval_s,
        "slurm_health_check_program": f"{INSTALL_DIR}/bin/fmcluster-health-slurmd",
        "slurm_health_check_interval": interval,
        # slurmctld pings every SlurmdTimeout/3 and skips health runs on a node it marked NOT_RESPONDING until a
        # ping gets through: a ping at least every health interval keeps a repaired node's return within one.
        "slurm_slurmd_timeout": min(SLURMD_TIMEOUT_S, 3 * interval),
        "slurm_health_check_node_state": "ANY",
        "slurm_credential_lifetime": provider.credential_lifetime_s,
        "slurm_resume_timeout": resume_timeout_s(tenant),
        "node_health_return_diag_level": tenant.health.return_diag_level,
        "slurm_prolog": f"{INSTALL_DIR}/bin/fmcluster-health-slurmd",
        **repair_vars(tenant),
    }


def resume_timeout_s(tenant: Tenant) -> int:
    """Slurm's ResumeTimeout: how long a rebooted node may take to register before Slurm marks it DOWN. A node
    with GPUs runs its boot diagnostic at the tenant's level before slurmd starts, so its time is added."""
    provider = tenant.capabilities.provider
    gpus = provider.real_accelerators and any(queue.instance.accelerator == "cuda" for queue in tenant.queues)
    from fmcluster.health.data import DEFAULT_TIMEOUTS
    from fmcluster.health.engine import budget

    diag = budget({"timeouts": DEFAULT_TIMEOUTS}, "boot", tenant.health.return_diag_level)
    return provider.reboot_timeout_s + (int(diag) if gpus else 0)


def repair_vars(tenant: Tenant) -> dict[str, Any]:
    """node_repair's variables: the tenant's budgets, the scheduler's commands (its capabilities.yml `repair`;
    none: its own service repairs nodes, and the agent stays off)."""
    repair = tenant.health.repair
    mechanism = tenant.capabilities.scheduler.repair
    interval = tenant.capabilities.provider.health_interval_s
    return {
        "node_repair_enabled": repair.enabled and mechanism is not None,
        "node_repair_program": f"{INSTALL_DIR}/bin/fmcluster-health",
        "node_repair_interval": interval,
        "node_repair_mechanism": {k: v for k, v in (mechanism or {}).items() if k in ("reboot", "replace")},
        "node_repair_policy": {
            # A dead slurmd gets two health intervals (the controller's pass notices it, systemd restarts it, the
            # node's own health run resumes it) and a minute before the node counts as gone.
            "restart_grace_s": 2 * interval + 60,
            "reboots_per_node": repair.reboots_per_node,
            "replacements_per_queue": repair.replacements_per_queue,
            "window_s": repair.window_hours * 3600,
            "backoff_s": repair.backoff_seconds,
            "breaker_share": repair.breaker_share,
            # How long a replacement has to show before the node may be acted on again.
            "settle_s": max(300, 10 * interval),
        },
    }
