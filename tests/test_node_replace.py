"""The controller replaces a compute node itself (fmcluster.node.replace, for the repair agent): the calls it makes,
and the controller role's least-privilege grant for them (the slurm-ec2 cluster template, RepairComputeNodes): this
cluster's compute groups only. The deployed call, from a controller host with its instance role, is
tests/test_cluster_e2e.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from fmcluster.model import load_tenant
from fmcluster.node.replace import node_region, replace_instance
from iam_policy import Request, allows
from test_node_iam import ACCOUNT, context, role_policies


# --- the controller's call ----------------------------------------------------------------------------------------

class FakeAutoScaling:
    def __init__(self, groups: dict[str, str]) -> None:
        self.groups, self.calls = groups, []  # type: ignore[var-annotated]

    def describe_auto_scaling_instances(self, InstanceIds: list[str]) -> dict[str, Any]:  # noqa: N803 - boto3's
        self.calls.append(("DescribeAutoScalingInstances", {"InstanceIds": InstanceIds}))
        return {"AutoScalingInstances": [{"InstanceId": i, "AutoScalingGroupName": self.groups[i]}
                                         for i in InstanceIds if i in self.groups]}

    def terminate_instance_in_auto_scaling_group(self, **params: Any) -> dict[str, Any]:
        self.calls.append(("TerminateInstanceInAutoScalingGroup", params))
        return {}

    def set_instance_health(self, **params: Any) -> dict[str, Any]:
        self.calls.append(("SetInstanceHealth", params))
        return {}


def test_replace_instance_terminates_in_its_group_keeping_the_capacity() -> None:
    fake = FakeAutoScaling({"i-1": "fmc-t-cluster-QueueCpuGroup-ABC"})
    assert replace_instance("i-1", autoscaling=fake) == "fmc-t-cluster-QueueCpuGroup-ABC"
    assert fake.calls[-1] == ("TerminateInstanceInAutoScalingGroup",
                              {"InstanceId": "i-1", "ShouldDecrementDesiredCapacity": False})
    replace_instance("i-1", unhealthy=True, autoscaling=fake)
    assert fake.calls[-1] == ("SetInstanceHealth", {"InstanceId": "i-1", "HealthStatus": "Unhealthy",
                                                    "ShouldRespectGracePeriod": False})
    with pytest.raises(RuntimeError, match="in no Auto Scaling group"):
        replace_instance("i-controller", autoscaling=fake)
    assert fake.calls[-1][0] == "DescribeAutoScalingInstances"


def test_the_node_finds_its_region_in_its_environment_or_node_env(tmp_path: Path) -> None:
    env_file = tmp_path / "node.env"
    env_file.write_text("FMCLUSTER_BUCKET=b\nFMCLUSTER_REGION='ap-northeast-1'\n")
    assert node_region({"FMCLUSTER_REGION": "us-east-2"}, env_file) == "us-east-2"
    assert node_region({}, env_file) == "ap-northeast-1"
    with pytest.raises(RuntimeError, match="no region"):
        node_region({}, tmp_path / "absent")


# --- the controller role may do exactly that, on its own cluster's compute groups ------------------------------

REPAIR_ACTIONS = ("autoscaling:TerminateInstanceInAutoScalingGroup", "autoscaling:SetInstanceHealth")


def group_arn(tenant: Any, name: str) -> str:
    return (f"arn:aws:autoscaling:{tenant.region}:{ACCOUNT}:autoScalingGroup:0123abcd-0000-0000-0000-000000000000:"
            f"autoScalingGroupName/{name}")


def tagged(tenant: Any, org: str, role: str) -> dict[str, str]:
    return {**context(tenant), "aws:ResourceTag/fmcluster:org": org, "aws:ResourceTag/fmcluster:role": role}


@pytest.mark.parametrize("org", ["stockmark", "demo"])
def test_the_controller_may_replace_its_own_compute_nodes_only(org: str) -> None:
    tenant = load_tenant(org, ROOT)
    policies = role_policies(tenant)
    stack = f"{tenant.stack_prefix}-cluster"
    compute = group_arn(tenant, f"{stack}-Queue{tenant.queues[0].name.capitalize()}Group-1A2B3C")
    for action in REPAIR_ACTIONS:
        assert allows(policies["controller"], Request(action, compute, tagged(tenant, org, "compute"))), action
        for role in ("login", "compute"):  # the nodes' own role: never
            assert not allows(policies[role], Request(action, compute, tagged(tenant, org, "compute"))), role
        refused = [
            (group_arn(tenant, f"{stack}-LoginGroup-1A2B3C"), tagged(tenant, org, "login")),
            (compute, tagged(tenant, org, "login")),  # a group tagged otherwise
            (compute, tagged(tenant, "another-org", "compute")),  # another tenant's tags
            (group_arn(tenant, "fmc-other-cluster-QueueCpuGroup-1A2B3C"), tagged(tenant, org, "compute")),
            (compute.replace(ACCOUNT, "210987654321"), tagged(tenant, org, "compute")),
        ]
        for resource, ctx in refused:
            assert not allows(policies["controller"], Request(action, resource, ctx)), (action, resource, ctx)
    assert allows(policies["controller"], Request("autoscaling:DescribeAutoScalingInstances", "*", context(tenant)))
    assert not allows(policies["controller"], Request("autoscaling:UpdateAutoScalingGroup", compute,
                                                      tagged(tenant, org, "compute")))


def test_every_call_replace_instance_makes_is_allowed_to_the_controller() -> None:
    tenant = load_tenant("demo", ROOT)
    fake = FakeAutoScaling({"i-1": f"{tenant.stack_prefix}-cluster-QueueCpuGroup-1A2B3C"})
    replace_instance("i-1", autoscaling=fake)
    replace_instance("i-1", unhealthy=True, autoscaling=fake)
    policies = role_policies(tenant)["controller"]
    compute = group_arn(tenant, fake.groups["i-1"])
    for action, _ in fake.calls:
        resource = "*" if action.startswith("Describe") else compute
        assert allows(policies, Request(f"autoscaling:{action}", resource, tagged(tenant, "demo", "compute"))), action


def test_where_the_scheduler_replaces_its_own_nodes_the_controller_gets_no_such_grant() -> None:
    from fmcluster.schedulers.parallelcluster.stand_in import build

    template = build(load_tenant("pcdemo", ROOT))
    sids = {s.get("Sid") for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Role"
            for p in r["Properties"]["Policies"] for s in p["PolicyDocument"]["Statement"]}
    assert "PrometheusEc2Discovery" in sids and not sids & {"RepairComputeNodes", "RepairFindGroups"}


def test_the_repair_agent_names_a_node_by_its_address_and_finds_its_instance() -> None:
    """Slurm knows a node by its NodeAddr; the controller finds the instance behind it (ec2:DescribeInstances,
    which its role has for discovery), against the emulator's EC2 in-process."""
    import boto3
    from moto import mock_aws

    from fmcluster.node.replace import instance_at

    with mock_aws():
        ec2 = boto3.client("ec2", region_name="ap-northeast-1", aws_access_key_id="x", aws_secret_access_key="x")
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        made = ec2.run_instances(ImageId=image, MinCount=2, MaxCount=2, InstanceType="m5.large")["Instances"]
        first = made[0]
        assert instance_at(first["PrivateIpAddress"], ec2) == first["InstanceId"]
        ec2.terminate_instances(InstanceIds=[first["InstanceId"]])
        with pytest.raises(RuntimeError, match="its instance is gone already"):
            instance_at(first["PrivateIpAddress"], ec2)
