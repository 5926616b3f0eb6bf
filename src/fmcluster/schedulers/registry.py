"""Which scheduler serves a tenant: the one place that maps `scheduler:` to its class.

Apart from the package (fmcluster.schedulers: the protocol every scheduler implements), so that the schedulers
import the protocol without importing the registry that imports them. A new scheduler is its module plus one
line here.
"""

from __future__ import annotations

from fmcluster.model import Tenant
from fmcluster.schedulers import Scheduler
from fmcluster.schedulers.hyperpod import HyperPod
from fmcluster.schedulers.parallelcluster import ParallelCluster
from fmcluster.schedulers.slurm_ec2 import SlurmEc2


def scheduler_for(tenant: Tenant) -> Scheduler:
    if tenant.scheduler == "parallelcluster":
        return ParallelCluster(tenant)
    if tenant.scheduler == "hyperpod":
        return HyperPod(tenant)
    if tenant.scheduler == "slurm-ec2":
        return SlurmEc2(tenant)
    raise ValueError(f"scheduler {tenant.scheduler!r} is not supported yet")
