"""Cluster stack for scheduler pcs: the PCS cluster (its Slurm controller runs in AWS's account and reaches the
tenant's VPC through an interface in the private subnet), a security group for that interface, the node roles and
instance profiles, one launch template per node group, one compute node group per queue, one queue per compute
node group, and two node groups in no queue (PCS's login fleet): fmcluster's controller (monitoring, acceptance)
and the login nodes. Every fact below has its source in README.md ("Sources")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fmcluster import baked
from fmcluster.catalog import InstanceType
from fmcluster.images import load_images
from fmcluster.model import Queue, Tenant
from fmcluster.schedulers.pcs.image import INSTALLERS_PATH, SAMPLE_IMAGE, SLURM_VERSION, load_installers
from fmcluster.stacks.cfn import Fn, GetAtt, Ref, text
from fmcluster.stacks.templates import ClusterTemplate, UserData
from fmcluster.stacks.templates.common import (
    PLACEMENT_GROUP_PARAMETER, alert_publish_statements, assume_role, bucket_name, cluster_template,
    controller_statements, logical_name, node_statements, output, placement_group_name, placement_group_parameter,
    remote_write_statements, resource_tags, security_group_id, spec_file, subnet_id,
)

#: Cluster Size → the most compute nodes PCS manages at that size (API_Cluster: SMALL 32, MEDIUM 512, LARGE 2048).
CLUSTER_SIZES = (("SMALL", 32), ("MEDIUM", 512), ("LARGE", 2048))
#: PCS runs Slurm in configless mode: slurmd and sackd fetch slurm.conf from slurmctld (port 6817) and slurmctld
#: reaches slurmd/sackd on 6818; slurmdbd (accounting) listens on 6819 (PCS user guide "Security groups in AWS PCS";
#: Slurm's network guide). slurmctld also answers srun, which listens on an ephemeral port unless SrunPortRange is set.
SLURMCTLD_PORT, SLURMD_PORT, SLURMDBD_PORT = 6817, 6818, 6819
EPHEMERAL_PORTS = (1024, 65535)
#: The IAM path PCS requires of the instance profile (and its role) it passes to a node group's instances.
PCS_IAM_PATH = "/aws-pcs/"
MANAGED_POLICIES = ("AmazonSSMManagedInstanceCore", "CloudWatchAgentServerPolicy")
#: Why a PCS node boots only the tenant's baked image (fmcluster.stacks.templates.ClusterTemplate.baked_required).
BAKED_REQUIRED = (f"the PCS agent and PCS's Slurm are on no catalogued base image: `invoke image` installs them with "
                  f"AWS's installers ({INSTALLERS_PATH.name}); PCS's sample AMI {SAMPLE_IMAGE} is a demonstration "
                  "fmcluster's first boot cannot run on")
#: MIME multi-part user data, which PCS merges with its own: a text/x-shellscript part runs after the node has
#: registered with PCS and before its Slurm daemon starts (PCS user guide "Working with Amazon EC2 user data").
MIME_BOUNDARY = "==FMCLUSTER=="
MIME_HEAD = (f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"\nMIME-Version: 1.0\n\n--{MIME_BOUNDARY}\n'
             'Content-Type: text/x-shellscript; charset="us-ascii"\n\n')
MIME_TAIL = f"\n--{MIME_BOUNDARY}--\n"
#: Node groups fmcluster names itself; queues are named after the tenant's queues.
RESERVED_GROUP_NAMES = ("controller", "login")


@dataclass(frozen=True)
class NodeGroup:
    """One PCS compute node group: fmcluster's controller, the login nodes (both in no queue) or one queue's nodes."""

    role: str  # controller | login | compute
    name: str  # the node group's PCS name
    logical: str  # Controller | Login | Queue<Name>
    instance: InstanceType
    count: int
    queue: Queue | None = None

    @property
    def root_gib(self) -> int:
        return 500 if self.role == "compute" and self.instance.accelerator != "none" else 200

    @property
    def profile(self) -> str:
        return "ControllerInstanceProfile" if self.role == "controller" else "NodeInstanceProfile"


def node_groups(tenant: Tenant) -> list[NodeGroup]:
    groups = [NodeGroup("controller", "controller", "Controller", tenant.controller, 1)]
    if tenant.login is not None and tenant.login_count > 0:
        groups.append(NodeGroup("login", "login", "Login", tenant.login, tenant.login_count))
    seen = {g.logical for g in groups}
    for q in tenant.queues:
        logical = f"Queue{logical_name(q.name)}"
        if q.name in RESERVED_GROUP_NAMES or logical in seen:
            raise ValueError(f"queue '{q.name}' gives the node group {q.name!r} (logical id {logical}), which another "
                             f"queue or one of {', '.join(RESERVED_GROUP_NAMES)} has: rename the queue")
        seen.add(logical)
        groups.append(NodeGroup("compute", q.name, logical, q.instance, q.count, q))
    return groups


def cluster_size(tenant: Tenant) -> str:
    """The smallest PCS cluster size that manages every node of every node group (login and controller count too)."""
    nodes = sum(g.count for g in node_groups(tenant))
    for size, most in CLUSTER_SIZES:
        if nodes <= most:
            return size
    raise ValueError(f"{nodes} nodes: more than a PCS cluster manages ({CLUSTER_SIZES[-1][1]})")


def cluster_name(tenant: Tenant) -> str:
    """The PCS cluster's name (pattern [A-Za-z][A-Za-z0-9-]{2,40}: the stack prefix fits it)."""
    return tenant.stack_prefix


def mime_user_data(user_data: Any) -> Any:
    """fmcluster's node boot (the renderer's user data: its boot environment, then the first-boot script) as the
    text/x-shellscript part of a MIME multi-part document, the form PCS merges with its own user data."""
    base64 = user_data.value  # Fn::Base64 of one Fn::Join
    delimiter, parts = base64.value
    return Fn("Base64", Fn("Join", [delimiter, [MIME_HEAD, *parts, MIME_TAIL]]))


def interfaces(group: NodeGroup) -> list[dict[str, Any]] | None:
    """EFA instance types: card 0 an `efa` interface (EFA with ENA), every further card one `efa-only` interface, as
    the other schedulers' launch templates; the node group's SubnetIds place them (no subnet here). Others: none (the
    template's SecurityGroupIds)."""
    if not group.instance.has_efa:
        return None
    nics = []
    for card in range(group.instance.efa_interfaces):
        groups = [Ref("EfaSecurityGroupId"), Ref("NodeSecurityGroupId")] if card == 0 else [Ref("EfaSecurityGroupId")]
        nics.append({"DeviceIndex": 0 if card == 0 else 1, "NetworkCardIndex": card,
                     "InterfaceType": "efa" if card == 0 else "efa-only", "Groups": groups,
                     "DeleteOnTermination": True})
    return nics


def _launch_template(tenant: Tenant, group: NodeGroup, user_data: UserData) -> dict[str, Any]:
    data: dict[str, Any] = {
        # The operator's key (fmcluster.access), as on every other scheduler's nodes.
        "KeyName": text("fmcluster-{org}", org=tenant.org),
        "EbsOptimized": True,
        "MetadataOptions": {"HttpEndpoint": "enabled", "HttpTokens": "required", "HttpPutResponseHopLimit": 2},
        "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {
            "VolumeSize": group.root_gib, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}],
    }
    nics = interfaces(group)
    if nics is None:
        data["SecurityGroupIds"] = [Ref("NodeSecurityGroupId")]
    else:
        data["NetworkInterfaces"] = nics
        data["Placement"] = {"GroupName": placement_group_name()}
    data["UserData"] = mime_user_data(user_data(org=tenant.org, role=group.role,
                                                queue=group.queue.name if group.queue else "", signal_resource=""))
    tags = resource_tags(tenant, group.name, role_tags(group.role, group.queue))
    data["TagSpecifications"] = [{"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume")]
    return {"Type": "AWS::EC2::LaunchTemplate", "Properties": {
        "LaunchTemplateName": text("${AWS::StackName}-{name}", name=group.name),
        "LaunchTemplateData": data,
        "TagSpecifications": [{"ResourceType": "launch-template", "Tags": resource_tags(tenant, group.name)}]}}


def role_tags(role: str, queue: Queue | None) -> dict[str, str]:
    """What a node is, in the tags its launch template gives it (discovery reads them: fmcluster.nodes)."""
    return {"fmcluster:role": role, **({"fmcluster:queue": queue.name} if queue else {})}


def _tag_map(tenant: Tenant, name: str) -> dict[str, str]:
    """PCS resources take their tags as a map, not a list."""
    return {tag["Key"]: tag["Value"] for tag in resource_tags(tenant, name)}


def _node_group(tenant: Tenant, group: NodeGroup) -> dict[str, Any]:
    return {"Type": "AWS::PCS::ComputeNodeGroup", "Properties": {
        "ClusterId": GetAtt("Cluster", "Id"),
        "Name": group.name,
        "AmiId": Ref(image_parameter(group.instance.accelerator)),
        "CustomLaunchTemplate": {"TemplateId": Ref(f"{group.logical}LaunchTemplate"),
                                 "Version": GetAtt(f"{group.logical}LaunchTemplate", "LatestVersionNumber")},
        "IamInstanceProfileArn": GetAtt(group.profile, "Arn"),
        "InstanceConfigs": [{"InstanceType": group.instance.name}],
        # Static: `count` nodes stay up (minimum = maximum), as on the other schedulers.
        "ScalingConfiguration": {"MinInstanceCount": group.count, "MaxInstanceCount": group.count},
        "SubnetIds": [Ref("PrivateSubnetId")],
        "Tags": _tag_map(tenant, group.name)}}


def register_statement() -> dict[str, Any]:
    """What PCS requires of a node group's instance role: to register the instance with the cluster (its agent calls
    RegisterComputeNodeGroupInstance at boot), for this stack's cluster only."""
    return {"Sid": "RegisterWithPcsCluster", "Effect": "Allow", "Action": "pcs:RegisterComputeNodeGroupInstance",
            "Resource": GetAtt("Cluster", "Arn")}


def _role(tenant: Tenant, name: str, statements: list[dict[str, Any]], description_: str) -> dict[str, Any]:
    return {"Type": "AWS::IAM::Role", "Properties": {
        "Description": description_,
        "Path": PCS_IAM_PATH,
        "AssumeRolePolicyDocument": assume_role(text("ec2.${AWS::URLSuffix}")),
        "ManagedPolicyArns": [text("arn:${AWS::Partition}:iam::aws:policy/" + policy) for policy in MANAGED_POLICIES],
        "Policies": [{"PolicyName": "fmcluster-node", "PolicyDocument": {"Version": "2012-10-17",
                                                                          "Statement": statements}}],
        "Tags": resource_tags(tenant, name)}}


def _security(tenant: Tenant) -> dict[str, Any]:
    """The PCS controller's interface: Slurm's ports from the nodes, and to the nodes slurmd's and srun's."""
    node = Ref("NodeSecurityGroupId")
    ephemeral = {"IpProtocol": "tcp", "FromPort": EPHEMERAL_PORTS[0], "ToPort": EPHEMERAL_PORTS[1]}
    return {
        "ClusterSecurityGroup": {"Type": "AWS::EC2::SecurityGroup", "Properties": {
            "GroupDescription": f"{tenant.stack_prefix} PCS controller interface: Slurm between controller and nodes",
            "VpcId": Ref("VpcId"),
            "SecurityGroupIngress": [
                {"IpProtocol": "tcp", "FromPort": SLURMCTLD_PORT, "ToPort": SLURMCTLD_PORT,
                 "SourceSecurityGroupId": node, "Description": "slurmctld from the nodes (configless slurmd, sackd)"},
                {"IpProtocol": "tcp", "FromPort": SLURMDBD_PORT, "ToPort": SLURMDBD_PORT,
                 "SourceSecurityGroupId": node, "Description": "slurmdbd from the nodes (Slurm accounting)"}],
            "SecurityGroupEgress": [{**ephemeral, "DestinationSecurityGroupId": node,
                                     "Description": "slurmd and sackd (6818) and srun's reply ports on the nodes"}],
            "Tags": resource_tags(tenant, "pcs-controller")}},
        "NodesFromPcsController": {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {
            "GroupId": node, "SourceSecurityGroupId": Ref("ClusterSecurityGroup"), **ephemeral,
            "Description": "The PCS controller to slurmd and sackd (6818) and to srun's reply ports"}},
    }


def build(tenant: Tenant, user_data: UserData) -> dict[str, Any]:
    groups = node_groups(tenant)
    efa = any(g.instance.has_efa for g in groups)
    parameters: dict[str, Any] = {
        "VpcId": {"Type": "AWS::EC2::VPC::Id", "Description": "The tenant VPC (network stack output VpcId)."},
        "PrivateSubnetId": subnet_id("Subnet of the PCS controller's interface and every node group (network stack "
                                     "output PrivateSubnetId)."),
        "NodeSecurityGroupId": security_group_id("Security group of every node (network stack output)."),
    }
    if efa:
        parameters["EfaSecurityGroupId"] = security_group_id(
            "Security group that admits only itself, on every EFA interface (network stack output).")
        parameters[PLACEMENT_GROUP_PARAMETER] = placement_group_parameter(
            "Cluster placement group of the EFA node groups (network stack output PlacementGroupName).")
    parameters["DataBucketName"] = bucket_name(
        "The tenant data bucket (storage stack output); the node roles may use their prefixes of it only.")
    catalog = load_images()
    for accelerator in image_accelerators(tenant):
        kind = baked.image_kind(accelerator)
        parameters[image_parameter(accelerator)] = {
            "Type": "AWS::EC2::Image::Id",
            "Description": f"AMI of the {kind} node groups: the tenant's baked {kind} image (`invoke image`: "
                           f"{catalog[load_installers().base(accelerator)].name} with PCS's agent and Slurm)."}

    node = [*node_statements(tenant, controller=False), register_statement()]
    controller = [*node_statements(tenant, controller=True), *controller_statements(), *remote_write_statements(tenant),
                  *alert_publish_statements(tenant), register_statement()]
    resources: dict[str, Any] = {
        **_security(tenant),
        "Cluster": {"Type": "AWS::PCS::Cluster", "Properties": {
            "Name": cluster_name(tenant),
            "Scheduler": {"Type": "SLURM", "Version": SLURM_VERSION},
            "Size": cluster_size(tenant),
            "Networking": {"SubnetIds": [Ref("PrivateSubnetId")], "SecurityGroupIds": [Ref("ClusterSecurityGroup")]},
            # Slurm accounting (slurmdbd, run by PCS): teams' fair share and QoS, `invoke usage`'s sacct.
            "SlurmConfiguration": {"Accounting": {"Mode": "STANDARD"}},
            "Tags": _tag_map(tenant, "pcs")}},
        # Least privilege (docs/stacks.md, "Node IAM"): the other schedulers' node statements and PCS's registration.
        "NodeRole": _role(tenant, "node-role", node, f"{tenant.stack_prefix} PCS login and compute nodes"),
        "NodeInstanceProfile": {"Type": "AWS::IAM::InstanceProfile",
                                "Properties": {"Path": PCS_IAM_PATH, "Roles": [Ref("NodeRole")]}},
        "ControllerRole": _role(tenant, "controller-role", controller,
                                f"{tenant.stack_prefix} fmcluster controller (a PCS node group of one)"),
        "ControllerInstanceProfile": {"Type": "AWS::IAM::InstanceProfile",
                                      "Properties": {"Path": PCS_IAM_PATH, "Roles": [Ref("ControllerRole")]}},
    }
    for group in groups:
        resources[f"{group.logical}LaunchTemplate"] = _launch_template(tenant, group, user_data)
        resources[f"{group.logical}NodeGroup"] = _node_group(tenant, group)
        if group.queue is not None:
            resources[f"{group.logical}"] = {"Type": "AWS::PCS::Queue", "Properties": {
                "ClusterId": GetAtt("Cluster", "Id"), "Name": group.queue.name,
                "ComputeNodeGroupConfigurations": [{"ComputeNodeGroupId": GetAtt(f"{group.logical}NodeGroup", "Id")}],
                "Tags": _tag_map(tenant, f"queue-{group.queue.name}")}}

    outputs: dict[str, Any] = {
        "ClusterName": output("Name of the PCS cluster.", cluster_name(tenant)),
        "ClusterId": output("Id of the PCS cluster.", GetAtt("Cluster", "Id")),
        "ClusterArn": output("ARN of the PCS cluster.", GetAtt("Cluster", "Arn")),
        "ClusterSecurityGroupId": output("Security group of the PCS controller's interface.",
                                         Ref("ClusterSecurityGroup")),
        "NodeRoleArn": output("IAM role of the login and compute nodes.", GetAtt("NodeRole", "Arn")),
        "ControllerRoleArn": output("IAM role of fmcluster's controller node.", GetAtt("ControllerRole", "Arn")),
    }
    for group in groups:
        what = f"queue {group.queue.name}" if group.queue else f"the {group.role} node group"
        outputs[f"{group.logical}NodeGroupId"] = output(f"PCS compute node group of {what}.",
                                                        GetAtt(f"{group.logical}NodeGroup", "Id"))
    return cluster_template(
        f"fmcluster {tenant.org} cluster (AWS PCS, Slurm {SLURM_VERSION}): the PCS cluster and its controller's "
        f"security group, node roles, launch templates, a controller and a login node group, {len(tenant.queues)} "
        f"queue(s) with one compute node group each. Generated by fmcluster from {spec_file(tenant)}.",
        parameters, resources, outputs, placement=efa)


def image_parameter(accelerator: str) -> str:
    """The AMI parameter of the node groups with this accelerator: PcsCpuImageId, PcsGpuImageId, PcsTrainiumImageId."""
    return f"Pcs{logical_name(baked.image_kind(accelerator))}ImageId"


def image_accelerators(tenant: Tenant) -> list[str]:
    found = {g.instance.accelerator for g in node_groups(tenant)}
    return [accelerator for accelerator in baked.KIND_ACCELERATOR.values() if accelerator in found]


def image_parameters(tenant: Tenant) -> dict[str, str]:
    """Each AMI parameter → the public SSM parameter of the base its image is baked on (installers.yml bases): what
    the baked-image reference carries; a PCS node never boots it (BAKED_REQUIRED)."""
    catalog = load_images()
    return {image_parameter(a): str(catalog[load_installers().base(a)].ssm_parameter) for a in image_accelerators(tenant)}


def baked_images(tenant: Tenant) -> dict[str, str]:
    """Each AMI parameter → the image kind `invoke image` bakes for its node groups."""
    return {image_parameter(a): baked.image_kind(a) for a in image_accelerators(tenant)}


#: What the renderer builds for a pcs tenant (fmcluster.schedulers.pcs.scheduler hands it over).
CLUSTER_TEMPLATE = ClusterTemplate(source=Path(__file__), build=build, image_parameters=image_parameters,
                                   baked_images=baked_images, baked_required=BAKED_REQUIRED,
                                   image_steps=lambda: load_installers().install_script())
