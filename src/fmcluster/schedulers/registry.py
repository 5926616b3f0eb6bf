"""Which scheduler serves a tenant: the one place that maps `scheduler:` to its class.

A new scheduler is its folder (fmcluster.schedulers.<name>: scheduler.py, capabilities.yml, template.py when
fmcluster renders its cluster stack, README.md) plus its line in SCHEDULER_CLASSES.
"""

from __future__ import annotations

from collections.abc import Callable

from fmcluster.model import Tenant
from fmcluster.schedulers.hyperpod.scheduler import HyperPod
from fmcluster.schedulers.parallelcluster.scheduler import ParallelCluster
from fmcluster.schedulers.pcs.scheduler import Pcs
from fmcluster.schedulers.protocol import Scheduler
from fmcluster.schedulers.slurm_ec2.scheduler import SlurmEc2

SCHEDULER_CLASSES: dict[str, Callable[[Tenant], Scheduler]] = {
    cls.name: cls for cls in (SlurmEc2, HyperPod, ParallelCluster, Pcs)
}


def scheduler_for(tenant: Tenant) -> Scheduler:
    cls = SCHEDULER_CLASSES.get(tenant.scheduler)
    if cls is None:
        raise ValueError(f"scheduler {tenant.scheduler!r} has no class in fmcluster.schedulers.registry; "
                         f"known: {', '.join(sorted(SCHEDULER_CLASSES))}")
    return cls(tenant)
