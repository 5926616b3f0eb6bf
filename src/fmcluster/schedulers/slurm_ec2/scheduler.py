"""Scheduler `slurm-ec2`: self-managed Slurm on EC2 — a controller instance and one auto scaling group per
login role and queue (its cluster stack: fmcluster.schedulers.slurm_ec2.template), every node converged by its own
user data."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from fmcluster.capabilities import SCHEDULERS, SchedulerCapabilities
from fmcluster.nodes import Node
from fmcluster.schedulers.protocol import Out, TenantEc2Cluster
from fmcluster.schedulers.slurm_ec2.template import CLUSTER_TEMPLATE, SIGNAL_TIMEOUT
from fmcluster.stacks.templates import ClusterTemplate
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


class SlurmEc2(TenantEc2Cluster):
    name = "slurm-ec2"
    capabilities: SchedulerCapabilities = SCHEDULERS["slurm-ec2"]
    cluster_template: ClusterTemplate | None = CLUSTER_TEMPLATE
    first_boot_window: tuple[str, float] | None = (f"the cluster stack's CreationPolicy signal timeout ({SIGNAL_TIMEOUT})",
                         float(int(SIGNAL_TIMEOUT.removeprefix("PT").removesuffix("M")) * 60))

    def image(self, accelerator: str) -> str:
        # The launch templates' image by the instance's accelerator (data/images.yml, ec2_images).
        from fmcluster.images import load_images

        return load_images().ec2_images[accelerator]

    def make_cluster(self, outputs: Mapping[str, str], out: Out) -> StepOutcome:
        return StepOutcome("ok", "made by the cluster stack (launch templates, controller instance, auto scaling groups)")

    def replacement_refusal(self, node: str) -> str | None:
        return None

    def request_replacement(self, node: Node, autoscaling: Callable[[], Any],
                            on_controller: Callable[[str], subprocess.CompletedProcess[str]]) -> tuple[str, list[str]]:
        group = asg_replace(autoscaling(), node.instance_id)
        return f"{node.instance_id} terminated in Auto Scaling group {group} (desired capacity kept)", []
