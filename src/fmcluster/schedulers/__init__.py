"""How a tenant's cluster is made and scheduled: `slurm-ec2` (self-managed Slurm on EC2 launch templates) or
`hyperpod` (SageMaker HyperPod with Slurm).

A scheduler supplies what differs between them, and nothing else branches on it:
- which CloudFormation template makes the cluster (`cluster_template`) and what it needs uploaded first
  (`before_cluster`: HyperPod's lifecycle scripts);
- how the cluster's nodes are found in the AWS APIs (`discovery`: EC2 tags, or HyperPod's node list) and
  how Prometheus finds them (`manifest_vars`);
- which playbook every node converges with (`playbook`).
Every scheduler's nodes run the same first-boot script (scripts/node-user-data.sh → node-bootstrap.sh).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fmcluster.model import Tenant
from fmcluster.nodes import discover

__all__ = ["Scheduler", "discover", "scheduler_for", "SITE_PLAYBOOK"]

Out = Callable[[str], object]
SITE_PLAYBOOK = "playbooks/site.yml"


class Scheduler(Protocol):
    name: str
    playbook: str

    def cluster_template(self) -> str:
        """The cfn/ template of the cluster stack."""

    def discovery(self, outputs: Mapping[str, str]) -> dict[str, Any]:
        """How nodes (and the deploy) list the cluster's nodes: the manifest's `discovery` entry."""

    def manifest_vars(self) -> dict[str, Any]:
        """Role variables this scheduler needs (how Prometheus discovers the nodes)."""

    def before_cluster(self, s3: Any, bucket: str, out: Out) -> None:
        """Uploads the cluster stack needs before it is created."""

    def validate(self, out: Out) -> int:
        """Checks beyond fmcluster's own (ParallelCluster: its own schema); an exit code, 0 when clean."""

    def plan(self, out: Out) -> int:
        """What `invoke plan` shows beyond the stacks (ParallelCluster: the rendered cluster config)."""


def scheduler_for(tenant: Tenant) -> Scheduler:
    if tenant.scheduler == "parallelcluster":
        from fmcluster.schedulers.parallelcluster import ParallelCluster

        return ParallelCluster(tenant)
    if tenant.scheduler == "hyperpod":
        from fmcluster.schedulers.hyperpod import HyperPod

        return HyperPod(tenant)
    if tenant.scheduler == "slurm-ec2":
        from fmcluster.schedulers.slurm_ec2 import SlurmEc2

        return SlurmEc2(tenant)
    raise ValueError(f"scheduler {tenant.scheduler!r} is not supported yet")
