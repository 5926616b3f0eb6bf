"""The AWS emulator's HyperPod stand-in (fmcluster.providers.local.emulator_hyperpod, emulator_server fix 10), against a real
emulator server process: a stack's AWS::SageMaker::Cluster is made, each instance group's instances are launched into
the cluster's subnet with its execution role and the HyperPod agent stand-in as user data, and SageMaker's
DescribeCluster / ListClusterNodes / DescribeClusterNode answer from those instances, so fmcluster's own HyperPod
discovery (fmcluster.nodes.hyperpod_nodes) finds the nodes by their instance groups. Deleting the stack terminates
them; an update that would change the groups is refused (the stand-in does not update a cluster).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from fmcluster.nodes import hyperpod_nodes
from fmcluster.stacks import aws
from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator
from fmcluster.providers.local.emulator_hyperpod import CLUSTER_TAG, SETTINGS_PATH, resource_config

pytestmark = pytest.mark.slow  # a real emulator server (started once for the module)
REGION = "ap-northeast-1"
ORG = "t-hyperpod"
NAME = "fmc-t-hyperpod"


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("hyperpod")
    emulator = ensure_emulator(ORG, root)
    try:
        yield emulator.endpoint
    finally:
        stop_emulator(ORG, root)


def group(name: str, count: int, node_type: str, partition: str | None = None) -> dict[str, Any]:
    slurm: dict[str, Any] = {"NodeType": node_type, **({"PartitionNames": [partition]} if partition else {})}
    return {"InstanceGroupName": name, "InstanceType": "ml.c5.2xlarge", "InstanceCount": count, "ThreadsPerCore": 1,
            "ExecutionRole": {"Fn::GetAtt": ["Role", "Arn"]},
            "LifeCycleConfig": {"SourceS3Uri": "s3://tenant-data/hyperpod/lifecycle/", "OnCreate": "on_create.sh"},
            "SlurmConfig": slurm}


def template(workers: int = 2) -> str:
    role_policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                           "Principal": {"Service": "sagemaker.amazonaws.com"}}]}
    return json.dumps({
        "Resources": {
            "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.81.0.0/16"}},
            "Subnet": {"Type": "AWS::EC2::Subnet", "Properties": {"VpcId": {"Ref": "Vpc"}, "CidrBlock": "10.81.1.0/24",
                                                                   "AvailabilityZone": f"{REGION}a"}},
            "Nodes": {"Type": "AWS::EC2::SecurityGroup", "Properties": {"GroupDescription": "nodes",
                                                                         "VpcId": {"Ref": "Vpc"}}},
            "Role": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": role_policy}},
            "Cluster": {"Type": "AWS::SageMaker::Cluster", "Properties": {
                "ClusterName": NAME, "NodeRecovery": "Automatic",
                "InstanceGroups": [group("controller", 1, "Controller"), group("login", 1, "Login"),
                                   group("cpu", workers, "Compute", "cpu")],
                "VpcConfig": {"SecurityGroupIds": [{"Ref": "Nodes"}], "Subnets": [{"Ref": "Subnet"}]},
                "Tags": [{"Key": "fmcluster:org", "Value": ORG}]}}},
        "Outputs": {"ClusterArn": {"Value": {"Fn::GetAtt": ["Cluster", "ClusterArn"]}}}})


class Cloud:
    def __init__(self, endpoint: str) -> None:
        self.cf: Any = aws.client("cloudformation", REGION, endpoint)
        self.ec2: Any = aws.client("ec2", REGION, endpoint)
        self.sagemaker: Any = aws.client("sagemaker", REGION, endpoint)

    def execute(self, body: str, kind: str) -> str:
        self.cf.create_change_set(StackName=NAME, ChangeSetName="cs", ChangeSetType=kind, TemplateBody=body)
        self.cf.execute_change_set(StackName=NAME, ChangeSetName="cs")
        self.cf.delete_change_set(StackName=NAME, ChangeSetName="cs")
        return str(self.cf.describe_stacks(StackName=NAME)["Stacks"][0]["StackStatus"])

    def instances(self) -> list[dict[str, Any]]:
        return [i for r in self.ec2.describe_instances(Filters=[{"Name": f"tag:{CLUSTER_TAG}", "Values": [NAME]}])[
            "Reservations"] for i in r["Instances"]]


@pytest.fixture(scope="module")
def cloud(endpoint: str) -> Iterator[Cloud]:
    made = Cloud(endpoint)
    assert made.execute(template(), "CREATE") == "CREATE_COMPLETE"
    yield made


def test_the_cluster_is_created_and_its_arn_is_an_output(cloud: Cloud) -> None:
    assert {r["LogicalResourceId"]: r["ResourceType"] for r in cloud.cf.list_stack_resources(StackName=NAME)[
        "StackResourceSummaries"]}["Cluster"] == "AWS::SageMaker::Cluster"
    outputs = {o["OutputKey"]: o["OutputValue"] for o in cloud.cf.describe_stacks(StackName=NAME)["Stacks"][0]["Outputs"]}
    assert re.fullmatch(rf"arn:aws:sagemaker:{REGION}:\d{{12}}:cluster/.+", outputs["ClusterArn"])
    described = cloud.sagemaker.describe_cluster(ClusterName=NAME)
    assert described["ClusterStatus"] == "InService"
    assert {g["InstanceGroupName"]: g["CurrentCount"] for g in described["InstanceGroups"]} == \
        {"controller": 1, "login": 1, "cpu": 2}


def test_each_group_s_instances_are_launched_in_the_cluster_subnet_with_its_execution_role(cloud: Cloud) -> None:
    instances = cloud.instances()
    assert len(instances) == 4
    subnet = cloud.ec2.describe_subnets(Filters=[{"Name": "cidr-block", "Values": ["10.81.1.0/24"]}])["Subnets"][0]
    for instance in instances:
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags["fmcluster:org"] == ORG, "the cluster's tags, which the local provider finds its instances by"
        assert instance["SubnetId"] == subnet["SubnetId"] and instance["InstanceType"] == "c5.2xlarge"
        assert instance["IamInstanceProfile"]["Arn"].split("/")[-1] == f"{NAME}-{tags['sagemaker:instance-group-name']}"


def test_list_and_describe_cluster_nodes_answer_from_the_instances(cloud: Cloud) -> None:
    by_id = {i["InstanceId"]: i for i in cloud.instances()}
    listed = cloud.sagemaker.list_cluster_nodes(ClusterName=NAME)["ClusterNodeSummaries"]
    assert sorted(n["InstanceId"] for n in listed) == sorted(by_id)
    assert {n["InstanceStatus"]["Status"] for n in listed} == {"Running"}
    for summary in listed:
        detail = cloud.sagemaker.describe_cluster_node(ClusterName=NAME, NodeId=summary["InstanceId"])["NodeDetails"]
        instance = by_id[summary["InstanceId"]]
        assert detail["PrivatePrimaryIp"] == instance["PrivateIpAddress"]
        assert detail["PrivateDnsHostname"] == instance["PrivateDnsName"].split(".")[0]
        assert detail["LifeCycleConfig"]["OnCreate"] == "on_create.sh"


def test_fmcluster_s_hyperpod_discovery_finds_the_nodes_by_their_groups(cloud: Cloud) -> None:
    nodes = hyperpod_nodes(cloud.sagemaker, NAME, {"controller": "controller", "login": "login", "cpu": "compute"})
    assert [(n.role, n.queue) for n in nodes] == [("controller", None), ("login", None), ("compute", "cpu"),
                                                   ("compute", "cpu")]
    assert {n.instance_type for n in nodes} == {"c5.2xlarge"}


def test_each_instance_runs_the_agent_stand_in_with_hyperpod_s_resource_config(cloud: Cloud) -> None:
    instances = cloud.instances()
    for instance in instances:
        raw = cloud.ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
        script = base64.b64decode(raw["UserData"]["Value"], validate=True).decode()  # as EC2 (and IMDS) serve it
        assert script.startswith("#!/bin/bash\n") and f"cat > {SETTINGS_PATH} <<'FMCLUSTER_SETTINGS'" in script
        settings = json.loads(script.split("<<'FMCLUSTER_SETTINGS'\n", 1)[1].split("\nFMCLUSTER_SETTINGS\n", 1)[0])
        group_name = {t["Key"]: t["Value"] for t in instance["Tags"]}["sagemaker:instance-group-name"]
        assert settings["instance_group"] == group_name
        assert settings["life_cycle_config"] == {"SourceS3Uri": "s3://tenant-data/hyperpod/lifecycle/",
                                                 "OnCreate": "on_create.sh"}
        config = settings["resource_config"]
        addresses = {i["CustomerIpAddress"] for g in config["InstanceGroups"] for i in g["Instances"]}
        assert addresses == {i["PrivateIpAddress"] for i in instances}, "every instance of the cluster, by address"
        assert len(base64.b64decode(settings["munge_key"])) == 1024
    assert len({json.dumps(s) for s in [resource_config("c", "arn", [])]}) == 1


def test_an_update_of_the_instance_groups_is_refused_and_rolled_back(cloud: Cloud) -> None:
    assert cloud.execute(template(workers=3), "UPDATE") == "UPDATE_ROLLBACK_COMPLETE"
    assert len(cloud.instances()) == 4


def test_deleting_the_stack_terminates_the_instances_and_forgets_the_cluster(cloud: Cloud) -> None:
    cloud.cf.delete_stack(StackName=NAME)
    assert {i["State"]["Name"] for i in cloud.instances()} == {"terminated"}
    assert NAME not in [c["ClusterName"] for c in cloud.sagemaker.list_clusters()["ClusterSummaries"]]
