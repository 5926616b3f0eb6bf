"""What the nodes' first boot sends CloudFormation, where a test boots no node: the stand-in for the signals.

On AWS (and with local hosts) every instance of a group with a CreationPolicy signals its group once, at the end
of its first boot (node-bootstrap.sh / the node agent: SignalResource, its instance id as UniqueId). Tests that
deploy the stacks alone (no host, no bundle to converge from) pass `NodesSignal(...)` as the deploy's
`while_waiting`: each call signals, for every instance of each resource still waiting, what `status` says (SUCCESS
by default), once per instance, and may first file the node's report as the agent would (`before_signal`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from fmcluster.stacks import aws

#: (logical id of the signalled resource, instance id) → SUCCESS | FAILURE
Status = Callable[[str, str], str]


class NodesSignal:
    def __init__(self, region: str, endpoint: str, status: Status = lambda logical_id, instance: "SUCCESS",
                 before_signal: Callable[[str, str, str], None] | None = None) -> None:
        self.cf: Any = aws.client("cloudformation", region, endpoint)
        self.autoscaling: Any = aws.client("autoscaling", region, endpoint)
        self.status, self.before_signal = status, before_signal
        self.sent: dict[str, str] = {}  # instance id → the status it signalled
        self.calls = 0

    def waiting(self) -> list[tuple[str, str, str]]:
        """(stack, logical id, instance id) of every instance whose resource waits for signals."""
        found = []
        for stack in self.cf.describe_stacks()["Stacks"]:
            if stack["StackStatus"] not in ("CREATE_IN_PROGRESS", "UPDATE_IN_PROGRESS"):
                continue
            for res in self.cf.list_stack_resources(StackName=stack["StackName"])["StackResourceSummaries"]:
                if res["ResourceStatus"] != "CREATE_IN_PROGRESS":
                    continue
                if res["ResourceType"] == "AWS::EC2::Instance":
                    found.append((stack["StackName"], res["LogicalResourceId"], res["PhysicalResourceId"]))
                elif res["ResourceType"] == "AWS::AutoScaling::AutoScalingGroup":
                    groups = self.autoscaling.describe_auto_scaling_groups(
                        AutoScalingGroupNames=[res["PhysicalResourceId"]])["AutoScalingGroups"]
                    found += [(stack["StackName"], res["LogicalResourceId"], i["InstanceId"])
                              for g in groups for i in g["Instances"]]
        return found

    def __call__(self) -> None:
        self.calls += 1
        for stack, logical_id, instance in self.waiting():
            if instance in self.sent:
                continue
            status = self.status(logical_id, instance)
            if self.before_signal is not None:
                self.before_signal(logical_id, instance, status)
            self.sent[instance] = status
            try:
                self.cf.signal_resource(StackName=stack, LogicalResourceId=logical_id, UniqueId=instance,
                                        Status=status)
            except ClientError as err:  # the resource stopped waiting meanwhile (another node's FAILURE)
                if "cannot be signaled" not in str(err):
                    raise
