"""Cluster stack for scheduler hyperpod: the execution roles and a SageMaker HyperPod cluster with a
controller group, a login group and one instance group per queue, booted by the lifecycle scripts
the deploy uploads to s3://<data bucket>/hyperpod/lifecycle/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fmcluster.model import Tenant
from fmcluster.stacks.cfn import NO_VALUE, Fn, GetAtt, Ref, Sub, if_, text
from fmcluster.stacks.templates import ClusterTemplate
from fmcluster.stacks.templates.common import (
    LIFECYCLE_PREFIX, TEMPLATE_VERSION, alert_publish_statements, assume_role, bucket_arn, bucket_name,
    controller_statements,
    description, metadata, node_statements, output, remote_write_statements, resource_tags, security_group_id,
    spec_file, subnet_id,
)

MANAGED_POLICIES = ("AmazonSageMakerClusterInstanceRolePolicy", "CloudWatchAgentServerPolicy")
RESERVED_GROUP_NAMES = ("controller", "login")
# HyperPod's own checks before an accelerated node joins (GPU/Trainium stress and EFA connectivity);
# a node that fails is replaced instead of joining the cluster.
DEEP_HEALTH_CHECKS = ["InstanceStress", "InstanceConnectivity"]
# Extra EBS volume HyperPod mounts at /opt/sagemaker on each node (containers, logs, local scratch).
EBS_GIB = {"controller": 200, "login": 200, "compute": 500}
# HyperPod mounts the storage stack's file systems itself (InstanceStorageConfigs FsxLustreConfig and
# FsxOpenZfsConfig): the scheduler that brings its own Slurm also
# brings the mounts (fmcluster's shared_storage role does not run there). The DNS names exist only on AWS
# (the emulator creates no FSx): empty, the mount is left out.
MOUNT_LUSTRE, MOUNT_HOME = "MountLustre", "MountHome"
# Which lifecycle hook runs fmcluster's script, and the script. Every group carries SlurmConfig (the API-driven Slurm
# configuration) and relies on HyperPod to write slurm.conf and start Slurm, which is the "Extended mode" of
# OnInitComplete: it "runs after HyperPod configures the default software on the instance" (CloudFormation's
# AWS::SageMaker::Cluster schema, ClusterLifeCycleConfig, as cfn-lint 1.58.0 carries it), "after the AMI-based
# initialization is complete" (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ClusterLifeCycleConfig.html).
# OnCreate is "Customer Managed mode", where the lifecycle scripts bring Slurm up themselves (AWS's base-config waits for
# slurm.conf and runs its own start_slurm.sh; its observability extension says "When using OnCreate with custom lifecycle
# scripts, ensure your start_slurm.sh configures Prolog and Epilog in slurm.conf"); with it fmcluster's script would
# wait for a Slurm nobody starts. AWS's CreateCluster example with SlurmConfig uses OnInitComplete on every group
# (awslabs/awsome-distributed-ai, 1.architectures/5.sagemaker-hyperpod/Extensions/observability/README.md, MIT-0).
# The two are mutually exclusive. The script keeps the name it had as OnCreate.
LIFECYCLE_HOOK, LIFECYCLE_ENTRYPOINT = "OnInitComplete", "on_create.sh"
# How HyperPod treats slurm.conf on the controller (Orchestrator.Slurm.SlurmConfigStrategy). AWS's HyperPod reference
# (https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-ref.html#sagemaker-hyperpod-ref-slurm-orchestrator):
# `Managed` (the default when Orchestrator.Slurm is omitted) "fully controls the partition-node mappings in
# slurm.conf" with drift detection (UpdateCluster fails when slurm.conf differs from what the API configured);
# `Overwrite` applies the API configuration over manual changes, `Merge` keeps manual changes; SlurmConfigStrategy is
# "Required when Orchestrator.Slurm is provided", and can be changed at any time with UpdateCluster (CloudFormation:
# "Update requires: No interruption",
# https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-properties-sagemaker-cluster-clusterorchestratorslurmconfig.html).
# fmcluster never edits HyperPod's slurm.conf (docs/stacks.md, "Which Slurm each scheduler runs"): the instance groups'
# SlurmConfig is its only input, which is Managed's case ("HyperPod ... the single source of truth"). Written out rather
# than left to the default, so that the template says which strategy it relies on and a changed default does not
# change the cluster; a drift UpdateCluster then refuses is someone else's edit, surfaced instead of merged.
SLURM_CONFIG_STRATEGY = "Managed"


def _given(*parameters: str) -> Fn:
    checks = [Fn("Not", [Fn("Equals", [Ref(p), ""])]) for p in parameters]
    return checks[0] if len(checks) == 1 else Fn("And", checks)


def storage_configs(tenant: Tenant, node_type: str) -> list[Any]:
    """The node's extra EBS volume, and the shared file systems HyperPod mounts on it."""
    configs: list[Any] = [{"EbsVolumeConfig": {"VolumeSizeInGB": EBS_GIB[node_type.lower()]}},
                          if_(MOUNT_LUSTRE, {"FsxLustreConfig": {
                              "DnsName": Ref("LustreDnsName"), "MountName": Ref("LustreMountName"),
                              "MountPath": tenant.storage.lustre.mount_point}}, NO_VALUE)]
    if tenant.storage.openzfs is not None:
        configs.append(if_(MOUNT_HOME, {"FsxOpenZfsConfig": {
            "DnsName": Ref("HomeDnsName"), "MountPath": tenant.storage.openzfs.mount_point}}, NO_VALUE))
    return configs


def network_statements() -> list[dict[str, Any]]:
    """What HyperPod needs to attach its instances' interfaces to the tenant VPC, scoped the way
    AWS's sample execution-role policy does: Describe* on '*' (not resource-scopable), interface
    creation only in the cluster subnet with the cluster's groups, interface management only on
    interfaces of this account and region, tagging only while creating an interface."""
    eni = Sub("arn:${AWS::Partition}:ec2:${AWS::Region}:${AWS::AccountId}:network-interface/*")
    return [
        {"Sid": "DescribeVpcResources", "Effect": "Allow", "Resource": "*", "Action": [
            "ec2:DescribeDhcpOptions", "ec2:DescribeNetworkInterfaces", "ec2:DescribeSecurityGroups",
            "ec2:DescribeSubnets", "ec2:DescribeVpcs"]},
        {"Sid": "CreateInterfacesInClusterSubnet", "Effect": "Allow", "Action": "ec2:CreateNetworkInterface",
         "Resource": [
             eni,
             Sub("arn:${AWS::Partition}:ec2:${AWS::Region}:${AWS::AccountId}:subnet/${PrivateSubnetId}"),
             Sub("arn:${AWS::Partition}:ec2:${AWS::Region}:${AWS::AccountId}:security-group/${EfaSecurityGroupId}"),
             Sub("arn:${AWS::Partition}:ec2:${AWS::Region}:${AWS::AccountId}:security-group/${NodeSecurityGroupId}"),
         ]},
        {"Sid": "ManageClusterInterfaces", "Effect": "Allow", "Action": [
            "ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface",
            "ec2:DeleteNetworkInterfacePermission", "ec2:DetachNetworkInterface"],
         "Resource": [eni, Sub("arn:${AWS::Partition}:ec2:${AWS::Region}:${AWS::AccountId}:instance/*")]},
        {"Sid": "TagInterfacesAtCreation", "Effect": "Allow", "Action": "ec2:CreateTags", "Resource": eni,
         "Condition": {"StringEquals": {"ec2:CreateAction": "CreateNetworkInterface"}}},
    ]


def lifecycle_source_statements() -> list[dict[str, Any]]:
    """How HyperPod may list the lifecycle scripts' folder (LifeCycleConfig.SourceS3Uri) with the execution role.
    The nodes' own grant (node_statements) lists where s3:prefix is like `hyperpod/lifecycle/*`: the URI as given
    and any folder under it. No AWS page read says with which prefix HyperPod lists the URI, and the policies AWS
    writes for it grant s3:ListBucket on the whole bucket with no prefix condition (AmazonSageMakerClusterInstance
    RolePolicy, on `sagemaker-*` buckets:
    https://docs.aws.amazon.com/sagemaker/latest/dg/security-iam-awsmanpol-AmazonSageMakerClusterInstanceRolePolicy.html;
    awsome-distributed-training's execution-role policy, https://github.com/awslabs/awsome-distributed-ai/pull/1045).
    The API allows the URI with or without its trailing slash (pattern `(https|s3)://([^/]+)/?(.*)`,
    https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ClusterLifeCycleConfig.html), so the folder's name
    without it is listable too; the bucket's other prefixes, and a listing without a prefix, stay refused."""
    return [{"Sid": "ListLifecycleSourceWithoutSlash", "Effect": "Allow", "Action": "s3:ListBucket",
             "Resource": bucket_arn(), "Condition": {"StringEquals": {"s3:prefix": LIFECYCLE_PREFIX.rstrip("/")}}}]


def discovery_statements(tenant: Tenant) -> list[dict[str, Any]]:
    """How a HyperPod node finds itself and the cluster's other nodes (fmcluster.nodes.hyperpod_nodes): the
    cluster's ARN ends in an id SageMaker assigns when it creates the cluster, after these roles exist, and the
    nodes need the grant while it is being created (their lifecycle scripts run then). So: the SageMaker
    clusters of this account and region that carry the tenant's org tag, which only this stack puts there."""
    return [{"Sid": "DiscoverClusterNodes", "Effect": "Allow",
             "Action": ["sagemaker:DescribeClusterNode", "sagemaker:ListClusterNodes"],
             "Resource": Sub("arn:${AWS::Partition}:sagemaker:${AWS::Region}:${AWS::AccountId}:cluster/*"),
             "Condition": {"StringEquals": {"aws:ResourceTag/fmcluster:org": tenant.org}}}]


def _role(tenant: Tenant, name: str, statements: list[dict[str, Any]], description_: str) -> dict[str, Any]:
    return {"Type": "AWS::IAM::Role", "Properties": {
        "Description": description_,
        # SageMaker, as AWS's HyperPod documentation and samples trust it, with no aws:SourceArn/aws:SourceAccount
        # condition: SageMaker documents which keys it sets when it assumes a role for each of its features
        # (https://docs.aws.amazon.com/sagemaker/latest/dg/security-confused-deputy-prevention.html: training,
        # processing, inference, Studio, pipelines...) and HyperPod is not among them, so a condition on them could
        # keep HyperPod from the role and fail the cluster. Only a principal of this account may pass the role
        # (iam:PassRole does not cross accounts), which is what such a condition would otherwise add.
        "AssumeRolePolicyDocument": assume_role("sagemaker.amazonaws.com"),
        "ManagedPolicyArns": [text("arn:${AWS::Partition}:iam::aws:policy/" + policy) for policy in MANAGED_POLICIES],
        "Policies": [{"PolicyName": "fmcluster-node", "PolicyDocument": {"Version": "2012-10-17",
                                                                          "Statement": statements}}],
        "Tags": resource_tags(tenant, name)}}


def instance_groups(tenant: Tenant) -> list[dict[str, Any]]:
    """Controller, login (if any) and one compute group per queue, each with its Slurm node type."""
    groups: list[tuple[str, str, int, str, str | None, bool]] = [
        ("controller", tenant.controller.name, 1, "Controller", None, False)]
    if tenant.login is not None:
        groups.append(("login", tenant.login.name, tenant.login_count, "Login", None, False))
    for q in tenant.queues:
        if q.capacity_reservation_id or q.capacity_reservation_type != "default":
            # Never dropped silently: HyperPod takes reserved capacity through its own training plans,
            # not an EC2 capacity reservation id.
            raise ValueError(f"queue '{q.name}': capacity_reservation_id/_type name an EC2 reservation, which a "
                             "HyperPod instance group cannot use; remove them (HyperPod reserves capacity via "
                             "training plans)")
        groups.append((q.name, q.instance.name, q.count, "Compute", q.name, q.instance.accelerator != "none"))
    names = [g[0] for g in groups]
    if len(set(names)) != len(names):
        raise ValueError(f"HyperPod instance group names must be unique; queue names may not repeat or be one of "
                         f"{', '.join(RESERVED_GROUP_NAMES)}: {names}")
    out = []
    for name, instance, count, node_type, partition, accelerated in groups:
        slurm: dict[str, Any] = {"NodeType": node_type}
        if partition is not None:
            slurm["PartitionNames"] = [partition]
        group: dict[str, Any] = {
            "InstanceGroupName": name, "InstanceType": f"ml.{instance}", "InstanceCount": count, "ThreadsPerCore": 1,
            "ExecutionRole": GetAtt("ControllerExecutionRole" if node_type == "Controller" else "ExecutionRole", "Arn"),
            "LifeCycleConfig": {"SourceS3Uri": Sub("s3://${DataBucketName}/" + LIFECYCLE_PREFIX),
                                LIFECYCLE_HOOK: LIFECYCLE_ENTRYPOINT},
            "SlurmConfig": slurm,
            "InstanceStorageConfigs": storage_configs(tenant, node_type),
        }
        if accelerated:
            group["OnStartDeepHealthChecks"] = DEEP_HEALTH_CHECKS
        out.append(group)
    return out


def cluster_name(tenant: Tenant) -> str:
    """The HyperPod cluster's name: what the template creates, and what discovery, the lifecycle environment,
    `invoke status/nodes/replace` ask SageMaker for (one value, set here)."""
    return tenant.stack_prefix


def build(tenant: Tenant) -> dict[str, Any]:
    prefix = tenant.stack_prefix
    resources: dict[str, Any] = {
        # Least privilege (docs/stacks.md, "Node IAM"): HyperPod's managed instance policy, the fmcluster
        # prefixes of the tenant bucket (the lifecycle scripts among them), each role's own secrets, the
        # cluster's node list and the VPC interfaces HyperPod attaches.
        "ExecutionRole": _role(tenant, "hyperpod-role", [*node_statements(tenant, controller=False),
                                                          *lifecycle_source_statements(),
                                                          *discovery_statements(tenant), *network_statements()],
                               f"{prefix} HyperPod login and compute instances"),
        "ControllerExecutionRole": _role(tenant, "hyperpod-controller-role",
                                         [*node_statements(tenant, controller=True), *lifecycle_source_statements(),
                                          *controller_statements(),
                                          *remote_write_statements(tenant), *alert_publish_statements(tenant),
                                          *discovery_statements(tenant),
                                          *network_statements()], f"{prefix} HyperPod controller"),
        "Cluster": {"Type": "AWS::SageMaker::Cluster", "Properties": {
            "ClusterName": cluster_name(tenant),
            "InstanceGroups": instance_groups(tenant),
            "Orchestrator": {"Slurm": {"SlurmConfigStrategy": SLURM_CONFIG_STRATEGY}},
            # HyperPod replaces a node that fails its health checks instead of leaving it down.
            "NodeRecovery": "Automatic",
            "VpcConfig": {"SecurityGroupIds": [Ref("EfaSecurityGroupId"), Ref("NodeSecurityGroupId")],
                          "Subnets": [Ref("PrivateSubnetId")]},
            "Tags": resource_tags(tenant, "hyperpod")}},
    }
    outputs = {
        "ClusterName": output("Name of the HyperPod cluster.", cluster_name(tenant)),
        "ExecutionRoleArn": output("IAM role of the HyperPod login and compute instances.",
                                   GetAtt("ExecutionRole", "Arn")),
        "ControllerExecutionRoleArn": output("IAM role of the HyperPod controller.",
                                             GetAtt("ControllerExecutionRole", "Arn")),
        "LifecycleScriptsUri": output("Where the lifecycle scripts are read from.",
                                      Sub("s3://${DataBucketName}/" + LIFECYCLE_PREFIX)),
        "ClusterArn": output("ARN of the HyperPod cluster.", GetAtt("Cluster", "ClusterArn")),
    }
    return {
        "AWSTemplateFormatVersion": TEMPLATE_VERSION,
        "Description": description(
            f"fmcluster {tenant.org} cluster (SageMaker HyperPod with Slurm): execution roles and the HyperPod "
            "cluster with a controller group, a login group and one instance group per queue, running the lifecycle "
            f"scripts from the tenant bucket. Generated by fmcluster from {spec_file(tenant)}."),
        "Metadata": metadata(),
        "Parameters": {
            "PrivateSubnetId": subnet_id("Subnet of the HyperPod instances (network stack output PrivateSubnetId)."),
            "EfaSecurityGroupId": security_group_id("Security group that admits only itself (network stack output)."),
            "NodeSecurityGroupId": security_group_id(
                "Security group of every node (network stack output NodeSecurityGroupId)."),
            "DataBucketName": bucket_name(
                "The tenant data bucket (storage stack output), holding the lifecycle scripts."),
            "LustreDnsName": {"Type": "String", "Default": "", "Description":
                              "DNS name of FSx for Lustre (storage stack output; empty where it does not exist)."},
            "LustreMountName": {"Type": "String", "Default": "", "Description":
                                "Lustre mount name (storage stack output; empty where it does not exist)."},
            **({"HomeDnsName": {"Type": "String", "Default": "", "Description":
                                "DNS name of the FSx for OpenZFS home (storage stack output; empty where it does "
                                "not exist)."}} if tenant.storage.openzfs is not None else {}),
        },
        "Conditions": {MOUNT_LUSTRE: _given("LustreDnsName", "LustreMountName"),
                       **({MOUNT_HOME: _given("HomeDnsName")} if tenant.storage.openzfs is not None else {})},
        "Resources": resources,
        "Outputs": outputs,
    }


#: What the renderer builds for a hyperpod tenant: HyperPod boots its nodes through the lifecycle scripts, so the
#: EC2 user data is not used, and its instances' images are HyperPod's own (no AMI parameters).
CLUSTER_TEMPLATE = ClusterTemplate(source=Path(__file__), build=lambda tenant, user_data: build(tenant))
