"""How a tenant's cluster is made and scheduled: `slurm-ec2` (self-managed Slurm on EC2 launch templates),
`hyperpod` (SageMaker HyperPod with Slurm) or another, one folder each (fmcluster.schedulers).

A scheduler supplies what differs between them, and nothing else branches on it (the protocol is here; which
class serves a tenant is fmcluster.schedulers.registry.scheduler_for; what other modules need to know is a
capability, `capabilities`: fmcluster.capabilities.SCHEDULERS):
- what it needs uploaded before the cluster is made (`before_cluster`: HyperPod's lifecycle scripts,
  a service's node hook) and what makes the cluster beyond our stacks (`make_cluster`: the service's own create
  call where the service makes the cluster; `delete_cluster`, `status_lines` for the other commands);
- how the cluster's nodes are found in the AWS APIs (`discovery`: EC2 tags, or HyperPod's node list) and
  how Prometheus finds them (`manifest_vars`);
- what it adds to fmcluster's storage stack (`storage_parts`: e.g. the node policies and the accounting database
  of a cluster its service makes; nothing for most);
- which playbook every node converges with (`playbook`), which image its nodes boot (`image`), and checks
  of its own (`validate`, `plan`).
Every scheduler's nodes run the same first-boot script (src/fmcluster/node/boot/node-user-data.sh → node-bootstrap.sh).
"""

from __future__ import annotations

import subprocess

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fmcluster.capabilities import SchedulerCapabilities
from fmcluster.model import Tenant
from fmcluster.nodes import Node, discover
from fmcluster.stacks.result import DeleteFirst
from fmcluster.stacks.templates import ClusterTemplate, StorageParts
from fmcluster.steps import StepOutcome

__all__ = ["Scheduler", "TenantEc2Cluster", "discover", "SITE_PLAYBOOK"]

Out = Callable[[str], object]
SITE_PLAYBOOK = "playbooks/site.yml"


class Scheduler(Protocol):
    name: str
    #: How it makes and runs its cluster (fmcluster.capabilities.SCHEDULERS[name]).
    capabilities: SchedulerCapabilities
    playbook: str
    #: The cluster stack fmcluster renders for it (its folder's template.py); None: its own service makes the cluster.
    cluster_template: ClusterTemplate | None
    #: The stack that stands in for that service where the provider does not have it (provider local).
    stand_in_template: ClusterTemplate | None
    #: How long a node's first boot may take before the service that made it gives up: (what, seconds), or None
    #: where the service documents none. The deploy warns when a node's measured first boot comes near it.
    first_boot_window: tuple[str, float] | None
    #: Which service's quotas its instances count against: "ec2" (running On-Demand vCPUs, checked by the capacity
    #: pre-flight) or "sagemaker" (HyperPod's cluster-usage quotas, per instance type; not checked yet).
    instance_quotas: str

    def discovery(self, outputs: Mapping[str, str]) -> dict[str, Any]:
        """How nodes (and the deploy) list the cluster's nodes: the manifest's `discovery` entry."""

    def manifest_vars(self) -> dict[str, Any]:
        """Role variables this scheduler needs (how Prometheus discovers the nodes)."""

    def storage_parts(self) -> StorageParts:
        """What it adds to the storage stack, after the stack's own (empty: nothing)."""

    def image(self, accelerator: str) -> str:
        """The image (a key of data/images.yml) a node with this accelerator boots on AWS."""

    def before_cluster(self, s3: Any, bucket: str, out: Out) -> None:
        """Uploads the cluster stack needs before it is created."""

    def validate(self, out: Out) -> int:
        """Checks beyond fmcluster's own (e.g. its service's own schema); an exit code, 0 when clean."""

    def plan(self, out: Out) -> int:
        """What `invoke plan` shows beyond the stacks (e.g. the cluster config its service is given)."""

    def make_cluster(self, outputs: Mapping[str, str], out: Out) -> StepOutcome:
        """After the stacks: make or update what the stacks do not (a cluster its service makes)."""

    def delete_cluster(self, out: Out) -> DeleteFirst | None:
        """For `invoke destroy`: a cluster that is not one of our stacks, deleted before them."""

    def status_lines(self) -> list[str]:
        """For `invoke status`: what the cluster's own service says about it."""

    def session_target(self, node: Node, outputs: Mapping[str, str]) -> str:
        """The Session Manager target of `node` (`aws ssm start-session --target`): its instance id, or the
        cluster's own form where the instances are the service's (HyperPod). Raises RuntimeError when unknown."""

    def replacement_refusal(self, node: str) -> str | None:
        """Why `invoke replace` leaves `node` to the cluster's own service; None: it does not."""

    def request_replacement(self, node: Node, autoscaling: Callable[[], Any],
                            on_controller: Callable[[str], subprocess.CompletedProcess[str]]) -> tuple[str, list[str]]:
        """Ask for a new node in place of `node`, the scheduler's way: what was asked (for the summary) and notes.
        Raises RuntimeError when the request is refused."""


class TenantEc2Cluster:
    """The answers of a scheduler whose nodes are EC2 instances of the tenant's own account, launched from launch
    templates of fmcluster's cluster stack that tag them with the tenant's org (slurm-ec2, pcs). A subclass gives
    what differs: name, capabilities, cluster_template, first_boot_window, image, make_cluster and replacement."""

    playbook = SITE_PLAYBOOK
    stand_in_template: ClusterTemplate | None = None
    instance_quotas = "ec2"
    #: The tag the launch templates put on every instance, whose value is the tenant's org.
    org_tag = "fmcluster:org"

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant

    def discovery(self, outputs: Mapping[str, str]) -> dict[str, Any]:
        return {"kind": "ec2", "tag": self.org_tag}

    def manifest_vars(self) -> dict[str, Any]:
        # Prometheus lists the nodes from EC2 itself, by the same tag.
        return {"prometheus_node_discovery": {"kind": "ec2", "region": self.tenant.region, "tag": self.org_tag,
                                              "value": self.tenant.org}}

    def storage_parts(self) -> StorageParts:
        return StorageParts()

    def before_cluster(self, s3: Any, bucket: str, out: Out) -> None:
        return None

    def validate(self, out: Out) -> int:
        return 0

    def plan(self, out: Out) -> int:
        return 0

    def delete_cluster(self, out: Out) -> DeleteFirst | None:
        return None  # the cluster stack is deleted with the others

    def status_lines(self) -> list[str]:
        return []  # the cluster is the cluster stack, which `invoke status` lists already

    def session_target(self, node: Node, outputs: Mapping[str, str]) -> str:
        return node.instance_id  # managed by SSM as any other instance of the account
