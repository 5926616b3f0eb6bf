"""Scheduler `slurm-ec2`: self-managed Slurm on EC2 — a controller instance and one auto scaling group per
login role and queue (its cluster stack: fmcluster.schedulers.slurm_ec2.template), every node converged by its own
user data."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from fmcluster.capabilities import SCHEDULERS, SchedulerCapabilities
from fmcluster.model import Tenant
from fmcluster.nodes import Node
from fmcluster.schedulers.protocol import SITE_PLAYBOOK, Out
from fmcluster.schedulers.slurm_ec2.template import CLUSTER_TEMPLATE, SIGNAL_TIMEOUT
from fmcluster.stacks.result import DeleteFirst
from fmcluster.stacks.templates import ClusterTemplate, StorageParts
from fmcluster.steps import StepOutcome


def asg_replace(autoscaling: Any, instance_id: str) -> str:
    """slurm-ec2: terminate the instance in its Auto Scaling group, keeping the desired capacity, so the group
    launches a new one from its launch template. Returns the group's name."""
    found = autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id]).get("AutoScalingInstances", [])
    if not found:
        raise RuntimeError(f"instance {instance_id} is in no Auto Scaling group: nothing would launch its "
                           "replacement (was it started by hand?)")
    group = str(found[0]["AutoScalingGroupName"])
    autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=instance_id, ShouldDecrementDesiredCapacity=False)
    return group


class SlurmEc2:
    name = "slurm-ec2"
    capabilities: SchedulerCapabilities = SCHEDULERS["slurm-ec2"]
    playbook = SITE_PLAYBOOK
    cluster_template: ClusterTemplate | None = CLUSTER_TEMPLATE
    stand_in_template: ClusterTemplate | None = None
    first_boot_window: tuple[str, float] | None = (f"the cluster stack's CreationPolicy signal timeout ({SIGNAL_TIMEOUT})",
                         float(int(SIGNAL_TIMEOUT.removeprefix("PT").removesuffix("M")) * 60))
    instance_quotas = "ec2"

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant

    def discovery(self, outputs: Mapping[str, str]) -> dict[str, Any]:
        return {"kind": "ec2", "tag": "fmcluster:org"}

    def image(self, accelerator: str) -> str:
        # The launch templates' image by the instance's accelerator (data/images.yml, ec2_images).
        from fmcluster.images import load_images

        return load_images().ec2_images[accelerator]

    def storage_parts(self) -> StorageParts:
        return StorageParts()

    def manifest_vars(self) -> dict[str, Any]:
        # The nodes are EC2 instances tagged with the tenant: Prometheus lists them from EC2 itself.
        return {"prometheus_node_discovery": {"kind": "ec2", "region": self.tenant.region,
                                              "tag": "fmcluster:org", "value": self.tenant.org}}

    def before_cluster(self, s3: Any, bucket: str, out: Out) -> None:
        return None

    def validate(self, out: Out) -> int:
        return 0

    def plan(self, out: Out) -> int:
        return 0

    def make_cluster(self, outputs: Mapping[str, str], out: Out) -> StepOutcome:
        return StepOutcome("ok", "made by the cluster stack (launch templates, controller instance, auto scaling groups)")

    def delete_cluster(self, out: Out) -> DeleteFirst | None:
        return None  # the cluster stack is deleted with the others

    def status_lines(self) -> list[str]:
        return []

    def session_target(self, node: Node, outputs: Mapping[str, str]) -> str:
        return node.instance_id  # an EC2 instance of the tenant's account, managed by SSM as any other

    def replacement_refusal(self, node: str) -> str | None:
        return None

    def request_replacement(self, node: Node, autoscaling: Callable[[], Any],
                            on_controller: Callable[[str], subprocess.CompletedProcess[str]]) -> tuple[str, list[str]]:
        group = asg_replace(autoscaling(), node.instance_id)
        return f"{node.instance_id} terminated in Auto Scaling group {group} (desired capacity kept)", []
