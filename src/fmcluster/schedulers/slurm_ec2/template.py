"""Cluster stack for scheduler slurm-ec2: node roles, one launch template per role (controller, login,
each queue), the controller instance and one auto scaling group per login group and queue."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fmcluster import baked
from fmcluster.catalog import InstanceType
from fmcluster.images import load_images
from fmcluster.model import Queue, Tenant
from fmcluster.stacks.cfn import GetAtt, Ref, text
from fmcluster.stacks.templates import ClusterTemplate
from fmcluster.stacks.templates.common import (
    PLACEMENT_GROUP_PARAMETER, alert_publish_statements, assume_role, bucket_name, cluster_template,
    controller_statements, logical_name, node_statements, output, placement_group_name, placement_group_parameter,
    remote_write_statements, resource_tags, security_group_id, spec_file, subnet_id,
)

# The image parameter of each accelerator kind and the public SSM parameter of the image it boots (the image
# catalog, data/images.yml: ec2_images). fmcluster resolves the path once, when the stack is created, and passes
# the AMI id (AWS::EC2::Image::Id): a redeploy keeps it.
IMAGE_PARAMETER_NAMES = {"cuda": "GpuImageId", "neuron": "NeuronImageId", "none": "CpuImageId"}
AMI_PARAMETERS: dict[str, tuple[str, str]] = {
    kind: (name, str(load_images().ec2_image(kind).ssm_parameter)) for kind, name in IMAGE_PARAMETER_NAMES.items()}
MANAGED_POLICIES = ("AmazonSSMManagedInstanceCore", "CloudWatchAgentServerPolicy")
# How long CloudFormation waits for a group's nodes to signal that their bootstrap worked (creation,
# and each batch of a rolling replacement). A GPU node's first converge takes tens of minutes.
SIGNAL_TIMEOUT = "PT60M"
# Processes an auto scaling group must not run while CloudFormation replaces its instances: they
# would terminate or move nodes that are still bootstrapping.
SUSPEND_DURING_UPDATE = ["HealthCheck", "ReplaceUnhealthy", "AZRebalance", "AlarmNotification", "ScheduledActions"]

RESERVATION_TYPES = ("default", "capacity-block")
# When a Capacity Block's queue is scaled in: its end time minus fmcluster.capacity.END_MARGIN, an ISO 8601 UTC
# time the deploy passes in (the capacity pre-flight read the block's EndDate from EC2).
SCALE_IN_TIME_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$"

UserData = Callable[..., Any]
RoleTags = Callable[["NodeGroup"], dict[str, str]]


def fmcluster_role_tags(group: NodeGroup) -> dict[str, str]:
    """What a node is, in fmcluster's own tags (fmcluster.nodes.FMCLUSTER_TAGS reads them back)."""
    return {"fmcluster:role": group.role, **({"fmcluster:queue": group.queue.name} if group.queue else {})}


@dataclass(frozen=True)
class NodeGroup:
    """One launch template: the controller, the login nodes or one queue."""

    role: str  # controller | login | compute
    logical: str  # Controller | Login | Queue<Name>
    slug: str  # launch template name suffix
    instance: InstanceType
    count: int
    public: bool
    queue: Queue | None = None

    @property
    def root_gib(self) -> int:
        return 500 if self.role == "compute" and self.instance.accelerator != "none" else (
            100 if self.role == "compute" else 200)

    @property
    def image_parameter(self) -> str:
        return AMI_PARAMETERS[self.instance.accelerator][0]

    @property
    def reservation(self) -> str | None:
        return self.queue.capacity_reservation_id if self.queue else None

    @property
    def in_placement_group(self) -> bool:
        """EFA queues share the stack's cluster placement group, unless they launch into a capacity
        reservation: an existing reservation cannot be moved into a new placement group (a Capacity
        Block is already placed by AWS)."""
        return self.role == "compute" and self.instance.has_efa and self.reservation is None

    @property
    def group_logical_id(self) -> str:
        return f"{self.logical}Group"

    @property
    def capacity_block(self) -> bool:
        return self.queue is not None and self.queue.capacity_reservation_type == "capacity-block"

    @property
    def scale_in_parameter(self) -> str:
        """The parameter holding when this Capacity Block queue is scaled in (capacity_block only)."""
        return f"{self.logical}ScaleInTime"


def node_groups(tenant: Tenant) -> list[NodeGroup]:
    groups = [NodeGroup("controller", "Controller", "controller", tenant.controller, 1, False)]
    if tenant.login is not None:
        groups.append(NodeGroup("login", "Login", "login", tenant.login, tenant.login_count,
                                tenant.network.ssh_ingress_cidr is not None))
    seen = {g.logical for g in groups}
    for q in tenant.queues:
        if q.capacity_reservation_type not in RESERVATION_TYPES:
            raise ValueError(f"queue '{q.name}': capacity_reservation_type {q.capacity_reservation_type!r} is not one of "
                             f"{', '.join(RESERVATION_TYPES)}")
        if q.capacity_reservation_type == "capacity-block" and not q.capacity_reservation_id:
            raise ValueError(f"queue '{q.name}': a capacity-block queue needs its capacity_reservation_id")
        logical = f"Queue{logical_name(q.name)}"
        if logical in seen:
            raise ValueError(f"queue '{q.name}' gives the logical id {logical}, which another queue or role already "
                             "has: give the queues names that differ in letters or digits")
        seen.add(logical)
        groups.append(NodeGroup("compute", logical, f"queue-{q.name}", q.instance, q.count, False, q))
    return groups


def image_kinds(tenant: Tenant) -> list[str]:
    kinds = {g.instance.accelerator for g in node_groups(tenant)}
    return [kind for kind in ("cuda", "neuron", "none") if kind in kinds]


def image_parameters(tenant: Tenant) -> dict[str, str]:
    """The AMI parameter of each kind of image the tenant's nodes boot → its public SSM parameter."""
    return dict(AMI_PARAMETERS[kind] for kind in image_kinds(tenant))


def baked_images(tenant: Tenant) -> dict[str, str]:
    """Each AMI parameter → the image kind `invoke image` bakes for its nodes (fmcluster.baked.image_kind)."""
    return {IMAGE_PARAMETER_NAMES[accelerator]: baked.image_kind(accelerator) for accelerator in image_kinds(tenant)}


def kept_images(tenant: Tenant) -> frozenset[str]:
    """The controller instance's AMI parameter: created once and kept (a new ImageId would replace it)."""
    return frozenset({AMI_PARAMETERS[tenant.controller.accelerator][0]})


def capacity_parameters(tenant: Tenant) -> dict[str, str]:
    """Each Capacity Block queue's scale-in parameter → the queue."""
    return {g.scale_in_parameter: g.queue.name for g in node_groups(tenant) if g.capacity_block and g.queue is not None}


def interfaces(group: NodeGroup, subnet: str, groups: list[Any]) -> list[dict[str, Any]]:
    """AWS's configuration for instances with several network cards: the primary interface on card 0,
    device 0, an EFA with ENA (`efa`); every further card one `efa-only` interface on device index 1
    (EFA devices without an IP address: no address space used, no multi-homed IP routing)."""
    if not group.instance.has_efa:
        nic: dict[str, Any] = {"DeviceIndex": 0, "NetworkCardIndex": 0}
        if group.public:
            nic["AssociatePublicIpAddress"] = True
        return [{**nic, "SubnetId": Ref(subnet), "Groups": groups, "DeleteOnTermination": True}]
    nics = []
    for card in range(group.instance.efa_interfaces):
        nic = {"DeviceIndex": 0 if card == 0 else 1, "NetworkCardIndex": card,
               "InterfaceType": "efa" if card == 0 else "efa-only"}
        if group.public and card == 0:
            nic["AssociatePublicIpAddress"] = True
        # An efa-only interface carries only EFA traffic: the EFA group is the only one it needs.
        nic.update({"SubnetId": Ref(subnet), "Groups": groups if card == 0 else [Ref("EfaSecurityGroupId")],
                    "DeleteOnTermination": True})
        nics.append(nic)
    return nics


def _launch_template(tenant: Tenant, group: NodeGroup, login_sg: bool, user_data: UserData,
                     role_tags: dict[str, str], signals: bool) -> dict[str, Any]:
    security = ([Ref("EfaSecurityGroupId")] if group.instance.has_efa else []) + [Ref("NodeSecurityGroupId")]
    if group.role == "login" and login_sg:
        security.append(Ref("LoginSecurityGroupId"))
    subnet = "PublicSubnetId" if group.public else "PrivateSubnetId"
    profile = "ControllerInstanceProfile" if group.role == "controller" else "NodeInstanceProfile"
    data: dict[str, Any] = {
        "ImageId": Ref(group.image_parameter),
        "InstanceType": group.instance.name,
        "IamInstanceProfile": {"Arn": GetAtt(profile, "Arn")},
        # The operator's key, imported by the deploy before the stacks (fmcluster.access): ssh for operators,
        # and for the deploy's monitoring and acceptance checks.
        "KeyName": text("fmcluster-{org}", org=tenant.org),
        "EbsOptimized": True,
        "MetadataOptions": {"HttpEndpoint": "enabled", "HttpTokens": "required", "HttpPutResponseHopLimit": 2},
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {
            "VolumeSize": group.root_gib, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}],
    }
    if group.queue is not None and group.reservation:
        data["CapacityReservationSpecification"] = {"CapacityReservationTarget": {
            "CapacityReservationId": group.reservation}}
        if group.queue.capacity_reservation_type == "capacity-block":
            data["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    data["NetworkInterfaces"] = interfaces(group, subnet, security)
    signal = "" if group.role == "controller" or not signals else group.group_logical_id
    data["UserData"] = user_data(org=tenant.org, role=group.role, queue=group.queue.name if group.queue else "",
                                 signal_resource=signal)
    data["TagSpecifications"] = [{"ResourceType": kind, "Tags": resource_tags(tenant, group.slug, role_tags)}
                                 for kind in ("instance", "volume", "network-interface")]
    return {"Type": "AWS::EC2::LaunchTemplate", "Properties": {
        "LaunchTemplateName": text("${AWS::StackName}-{slug}", slug=group.slug),
        "LaunchTemplateData": data,
        "TagSpecifications": [{"ResourceType": "launch-template", "Tags": resource_tags(tenant, group.slug)}]}}


#: A compute group of at least this many nodes may come up short: one node in ten (at least one) may fail its first
#: boot without CloudFormation rolling the whole cluster stack back, controller included. The deploy then names the
#: failed nodes (their reports) and exits non-zero; `invoke replace` repairs them. Login nodes and smaller groups
#: must all come up.
SHORTFALL_FROM_NODES = 10


def min_successful_percent(group: NodeGroup) -> int:
    """The share of a group's instances that must signal SUCCESS for its creation or update to succeed."""
    if group.role != "compute" or group.count < SHORTFALL_FROM_NODES:
        return 100
    return (100 * (group.count - max(1, group.count // 10))) // group.count


def _auto_scaling_group(tenant: Tenant, group: NodeGroup, role_tags: dict[str, str], signals: bool) -> dict[str, Any]:
    # Replace in batches of a quarter of the group, terminating before launching: a reservation or
    # Capacity Block holds exactly `count` instances, so no batch may need extra capacity.
    batch = max(1, group.count // 4)
    props: dict[str, Any] = {
        "MinSize": str(group.count), "MaxSize": str(group.count), "DesiredCapacity": str(group.count),
        "LaunchTemplate": {"LaunchTemplateId": Ref(f"{group.logical}LaunchTemplate"),
                           "Version": GetAtt(f"{group.logical}LaunchTemplate", "LatestVersionNumber")},
        "VPCZoneIdentifier": [Ref("PublicSubnetId" if group.public else "PrivateSubnetId")],
    }
    if group.in_placement_group:
        props["PlacementGroup"] = placement_group_name()
    props["Tags"] = resource_tags(tenant, group.slug, role_tags, propagate=True)
    resource: dict[str, Any] = {"Type": "AWS::AutoScaling::AutoScalingGroup"}
    if signals:
        # The stack is complete only when every node's bootstrap has signalled SUCCESS
        # (FMCLUSTER_SIGNAL_RESOURCE in the user data names this logical id).
        resource["CreationPolicy"] = {"ResourceSignal": {"Count": group.count, "Timeout": SIGNAL_TIMEOUT},
                                      "AutoScalingCreationPolicy": {
                                          "MinSuccessfulInstancesPercent": min_successful_percent(group)}}
    resource["UpdatePolicy"] = {"AutoScalingRollingUpdate": {
        "MaxBatchSize": batch, "MinInstancesInService": group.count - batch,
        "MinSuccessfulInstancesPercent": min_successful_percent(group), "PauseTime": SIGNAL_TIMEOUT,
        "WaitOnResourceSignals": signals,
        "SuspendProcesses": SUSPEND_DURING_UPDATE}}
    resource["Properties"] = props
    return resource


def _role(tenant: Tenant, name: str, statements: list[dict[str, Any]], description_: str) -> dict[str, Any]:
    return {"Type": "AWS::IAM::Role", "Properties": {
        "Description": description_,
        "AssumeRolePolicyDocument": assume_role(text("ec2.${AWS::URLSuffix}")),
        "ManagedPolicyArns": [text("arn:${AWS::Partition}:iam::aws:policy/" + policy) for policy in MANAGED_POLICIES],
        "Policies": [{"PolicyName": "fmcluster-node", "PolicyDocument": {"Version": "2012-10-17",
                                                                          "Statement": statements}}],
        "Tags": resource_tags(tenant, name)}}


def repair_statements(tenant: Tenant) -> list[dict[str, Any]]:
    """The controller's repair agent replaces bad compute nodes itself (fmcluster.node.replace): it may terminate an
    instance in, or mark it unhealthy in, this cluster stack's compute groups only — their names (CloudFormation
    names a group `<stack>-<logical id>-<suffix>`, and only queues' logical ids start with `Queue`) and their tags
    (the tenant's org, role compute) — never the login group, another stack's or another tenant's. The group ARNs
    cannot be referenced: the groups wait for their nodes' signals, which need the controller, whose role this is.
    Finding an instance's group is a list call without resource scoping."""
    return [
        {"Sid": "RepairComputeNodes", "Effect": "Allow",
         "Action": ["autoscaling:TerminateInstanceInAutoScalingGroup", "autoscaling:SetInstanceHealth"],
         "Resource": text("arn:${AWS::Partition}:autoscaling:${AWS::Region}:${AWS::AccountId}:autoScalingGroup:*:"
                          "autoScalingGroupName/${AWS::StackName}-Queue*"),
         "Condition": {"StringEquals": {"aws:ResourceTag/fmcluster:org": tenant.org,
                                        "aws:ResourceTag/fmcluster:role": "compute"}}},
        {"Sid": "RepairFindGroups", "Effect": "Allow", "Action": "autoscaling:DescribeAutoScalingInstances",
         "Resource": "*"},
    ]


def build(tenant: Tenant, user_data: UserData, role_tags: RoleTags = fmcluster_role_tags, signals: bool = True,
          summary: str = "self-managed Slurm on EC2", repair: bool = True) -> dict[str, Any]:
    """The cluster stack. `role_tags` say what each node is (fmcluster's tags; a stand-in's, those
    of the service it stands in for), `signals` whether CloudFormation waits for each node's bootstrap to signal (a node
    whose first boot the stood-in service runs does not signal), `repair` whether
    the controller may replace compute nodes in their groups (not where the scheduler replaces its own)."""
    groups = node_groups(tenant)
    login_sg = tenant.network.ssh_ingress_cidr is not None
    any_efa = any(g.instance.has_efa for g in groups)
    placement = any(g.in_placement_group for g in groups)
    public = any(g.public for g in groups)

    parameters: dict[str, Any] = {
        "PrivateSubnetId": subnet_id("Subnet of the controller and compute nodes (network stack output PrivateSubnetId)."),
    }
    if public:
        parameters["PublicSubnetId"] = subnet_id("Subnet of the login nodes (network stack output PublicSubnetId).")
    if any_efa:
        parameters["EfaSecurityGroupId"] = security_group_id(
            "Security group that admits only itself, on every EFA interface (network stack output).")
    parameters["NodeSecurityGroupId"] = security_group_id(
        "Security group of every node (network stack output NodeSecurityGroupId).")
    if login_sg and tenant.login is not None:
        parameters["LoginSecurityGroupId"] = security_group_id(
            "Security group admitting SSH from network.ssh_ingress_cidr (network stack output).")
    if placement:
        parameters[PLACEMENT_GROUP_PARAMETER] = placement_group_parameter(
            "Cluster placement group for EFA queues without a capacity reservation (network stack output "
            "PlacementGroupName; empty on the emulator, which does not create placement groups).")
    for group in groups:
        if group.capacity_block:
            parameters[group.scale_in_parameter] = {
                "Type": "String", "AllowedPattern": SCALE_IN_TIME_PATTERN,
                "Description": f"When queue {group.queue.name if group.queue else ''} is scaled in to 0 (UTC): its "
                               "Capacity Block's end time, read from EC2 by the deploy's capacity pre-flight, minus "
                               "the margin EC2 and Slurm need (fmcluster.capacity.END_MARGIN)."}
    parameters["DataBucketName"] = bucket_name(
        "The tenant data bucket (storage stack output); the node roles may use their prefixes of it only.")
    for kind in image_kinds(tenant):
        name, path = AMI_PARAMETERS[kind]
        parameters[name] = {"Type": "AWS::EC2::Image::Id", "Description": (
            f"Image of the {'CPU' if kind == 'none' else kind} nodes: an AMI id that fmcluster resolves once from "
            f"{path} when the stack is created and keeps on later deploys (`refresh_images` moves it).")}

    resources: dict[str, Any] = {
        # Least privilege (docs/stacks.md, "Node IAM"): SSM Session Manager, the CloudWatch agent, the
        # fmcluster prefixes of the tenant bucket, the tenant's own secrets, the creation signal.
        "NodeRole": _role(tenant, "node-role", [*node_statements(tenant, controller=False), {
            "Sid": "SignalCreationPolicy", "Effect": "Allow", "Action": "cloudformation:SignalResource",
            "Resource": text("arn:${AWS::Partition}:cloudformation:${AWS::Region}:${AWS::AccountId}:stack/"
                             "${AWS::StackName}/*")}], f"{tenant.stack_prefix} login and compute nodes"),
        "NodeInstanceProfile": {"Type": "AWS::IAM::InstanceProfile", "Properties": {"Roles": [Ref("NodeRole")]}},
        "ControllerRole": _role(tenant, "controller-role",
                                [*node_statements(tenant, controller=True), *controller_statements(),
                                 *remote_write_statements(tenant), *alert_publish_statements(tenant),
                                 *(repair_statements(tenant) if repair else [])],
                                f"{tenant.stack_prefix} Slurm controller"),
        "ControllerInstanceProfile": {"Type": "AWS::IAM::InstanceProfile",
                                      "Properties": {"Roles": [Ref("ControllerRole")]}},
    }
    for group in groups:
        resources[f"{group.logical}LaunchTemplate"] = _launch_template(tenant, group, login_sg, user_data,
                                                                       role_tags(group), signals)
        if group.role == "controller":
            # Created once and then kept: ImageId is the pinned AMI and the launch template is held at
            # version 1, so neither a new image nor a changed launch template replaces the controller
            # on a redeploy (a changed instance type stops and starts it). Ansible changes it later.
            resources["ControllerInstance"] = {"Type": "AWS::EC2::Instance", "Properties": {
                "ImageId": Ref(group.image_parameter), "InstanceType": group.instance.name,
                "LaunchTemplate": {"LaunchTemplateId": Ref("ControllerLaunchTemplate"), "Version": "1"}}}
        else:
            resources[group.group_logical_id] = _auto_scaling_group(tenant, group, role_tags(group), signals)
        if group.capacity_block:
            # EC2 terminates a Capacity Block's instances as it ends, and the group would then launch On-Demand
            # replacements that the block's market type cannot get: scale the group in to 0 before that.
            resources[f"{group.logical}ScaleInBeforeBlockEnds"] = {
                "Type": "AWS::AutoScaling::ScheduledAction", "Properties": {
                    "AutoScalingGroupName": Ref(group.group_logical_id), "StartTime": Ref(group.scale_in_parameter),
                    "MinSize": 0, "MaxSize": 0, "DesiredCapacity": 0}}

    outputs: dict[str, Any] = {
        "NodeRoleArn": output("IAM role of the login and compute nodes.", GetAtt("NodeRole", "Arn")),
        "NodeInstanceProfileArn": output("Instance profile of the login and compute nodes.",
                                         GetAtt("NodeInstanceProfile", "Arn")),
        "ControllerRoleArn": output("IAM role of the Slurm controller.", GetAtt("ControllerRole", "Arn")),
        "ControllerInstanceId": output("The Slurm controller instance.", Ref("ControllerInstance")),
        "ControllerPrivateIp": output("Private address of the Slurm controller (SlurmctldHost).",
                                      GetAtt("ControllerInstance", "PrivateIp")),
    }
    for kind in image_kinds(tenant):
        name = AMI_PARAMETERS[kind][0]
        outputs[name] = output(f"The pinned AMI of the {'CPU' if kind == 'none' else kind} nodes.", Ref(name))
    for group in groups:
        what = "the controller" if group.role == "controller" else (
            "the login nodes" if group.role == "login" else f"queue {group.queue.name if group.queue else ''}")
        outputs[f"{group.logical}LaunchTemplateId"] = output(f"Launch template of {what}",
                                                             Ref(f"{group.logical}LaunchTemplate"))
        if group.role != "controller":
            outputs[f"{group.logical}AutoScalingGroupName"] = output(f"Auto scaling group of {what}",
                                                                     Ref(group.group_logical_id))
    return cluster_template(
        f"fmcluster {tenant.org} cluster ({summary}): node roles and instance profiles, launch "
        f"templates for the controller, login and {len(tenant.queues)} queue(s), the controller instance and one "
        f"auto scaling group per login group and queue. Generated by fmcluster from {spec_file(tenant)}.",
        parameters, resources, outputs, placement=placement)


#: What the renderer builds for a slurm-ec2 tenant (fmcluster.schedulers.slurm_ec2.scheduler hands it over).
CLUSTER_TEMPLATE = ClusterTemplate(source=Path(__file__), build=lambda tenant, user_data: build(tenant, user_data),
                                   image_parameters=image_parameters, baked_images=baked_images,
                                   kept_images=kept_images,
                                   capacity_parameters=capacity_parameters)
