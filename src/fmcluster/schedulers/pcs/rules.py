"""What AWS PCS (or the image its nodes boot) refuses, refused by fmcluster before anything runs, each naming the
tenant key and the fix.

`fmcluster.validation` finds this module through the scheduler's folder (validation.scheduler_rules: a scheduler's
rules.py, `check_tenant(tenant, add)`) and runs it on the raw spec of a pcs tenant, so a problem is reported with the
file, line, key and fix like every other. Each rule has a stable id, in its message, and its source in README.md.
What the schema and fmcluster's own checks already refuse (queue names' characters, reserved names, capacity
reservations on a scheduler whose capabilities say it takes none) is not repeated here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fmcluster.escape import escaped
from fmcluster.schedulers.pcs.image import INSTALLERS_PATH, load_installers

KeyPath = tuple[str | int, ...]
Add = Callable[[KeyPath, str, str], None]

#: PCS queue names: letters, digits and hyphens, starting with a letter, at most 25 characters (the schema allows 31).
QUEUE_NAME_MAX = 25
#: The most compute nodes a PCS cluster manages (its LARGE size); the controller and login node groups count too.
MAX_NODES = 2048


def check_tenant(tenant: dict[str, Any], add: Add) -> None:
    from fmcluster.catalog import load_catalog

    catalog, refused = load_catalog(), load_installers().refused
    t: KeyPath = ("tenant",)
    raw_queues = tenant.get("queues")
    queues: list[Any] = raw_queues if isinstance(raw_queues, list) else []
    for i, queue in enumerate(queues):
        if not isinstance(queue, dict):
            continue
        name = queue.get("name")
        if isinstance(name, str) and len(name) > QUEUE_NAME_MAX:
            add((*t, "queues", i, "name"), f"[pcs-queue-name] {escaped(name)} has {len(name)} characters; AWS PCS "
                f"queue names have at most {QUEUE_NAME_MAX}", f"shorten it to {QUEUE_NAME_MAX} characters or fewer")
        itype = queue.get("instance_type")
        instance = catalog.get(itype) if isinstance(itype, str) else None
        if instance is not None and instance.accelerator in refused:
            add((*t, "queues", i, "instance_type"), f"[pcs-image-neuron] {escaped(itype)} is a {instance.accelerator} "
                f"instance: {refused[instance.accelerator]} ({INSTALLERS_PATH.name} refused_accelerators)",
                "use a GPU or CPU instance type on scheduler pcs, or scheduler hyperpod or slurm-ec2 for Trainium")
    nodes = _count(tenant.get("login"), 1) + 1 + sum(_count(q, 0) for q in queues)
    if nodes > MAX_NODES:
        add((*t, "queues"), f"[pcs-cluster-size] {nodes} nodes (controller and login included); an AWS PCS cluster "
            f"manages at most {MAX_NODES} (size LARGE)", "split the tenant into clusters of at most "
            f"{MAX_NODES} nodes")
    accounting = tenant.get("accounting")
    if isinstance(accounting, dict) and "database_endpoint" in accounting:
        add((*t, "accounting", "database_endpoint"), "[pcs-accounting] AWS PCS runs Slurm accounting (slurmdbd and its "
            "database) itself; a database endpoint of yours would be ignored", "remove accounting.database_endpoint")


def _count(section: Any, default: int) -> int:
    count = section.get("count", default) if isinstance(section, dict) else 0
    return count if isinstance(count, int) and not isinstance(count, bool) else 0
