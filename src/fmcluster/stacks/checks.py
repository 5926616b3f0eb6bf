"""Security and value checks on rendered templates: what cfn-lint does not check for us.

The checks read the rendered body (what CloudFormation will read), by allow-list first: each stack
may hold only the resource types fmcluster means to create there, IAM roles only under the logical
ids fmcluster defines, no transforms or macros. Then the values: EFA group self-only, no open
ingress, bucket private/encrypted/retained with lifecycle rules, file systems retained and created
after their self-ingress rule, IMDSv2, encrypted volumes, least-privilege IAM (no wildcard action,
no wildcard resource on any action that can be scoped, only known managed policies and service
principals), Lustre values, cost tags.

Each finding names the stack, the resource and the fix. Run by `invoke plan`, before every deploy,
and by the tests for every bundled tenant.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from fmcluster.stacks.render import RenderedStack, load_cfn_yaml
from fmcluster.stacks.templates.common import NODE_READ_PREFIXES, REPORT_PREFIX, UNSCOPABLE_ACTIONS
from fmcluster.validation import CONTROL_PREFIXES

OPEN_CIDRS = {"0.0.0.0/0", "::/0"}
# The rule AWS (and the CDK) use to replace the default allow-all egress with one that matches nothing.
DISALLOW_ALL_EGRESS = {"CidrIp": "255.255.255.255/32", "IpProtocol": "icmp", "FromPort": 252, "ToPort": 86}
LUSTRE_THROUGHPUT = {"PERSISTENT_1": {50, 100, 200}, "PERSISTENT_2": {125, 250, 500, 1000}}
PUBLIC_ACCESS_BLOCK = ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
REQUIRED_TAGS = ("fmcluster:org", "fmcluster:programme")
TEMPLATE_KEYS = {"AWSTemplateFormatVersion", "Description", "Metadata", "Parameters", "Conditions", "Resources",
                 "Outputs"}

# What each stack may hold. Anything else (an IAM user, an access key, a Lambda, a nested stack...)
# is a finding that stops plan and deploy, whatever put it there.
ALLOWED_TYPES: dict[str, frozenset[str]] = {
    "network": frozenset({
        "AWS::EC2::VPC", "AWS::EC2::InternetGateway", "AWS::EC2::VPCGatewayAttachment", "AWS::EC2::Subnet",
        "AWS::EC2::RouteTable", "AWS::EC2::Route", "AWS::EC2::SubnetRouteTableAssociation", "AWS::EC2::EIP",
        "AWS::EC2::NatGateway", "AWS::EC2::VPCEndpoint", "AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress",
        "AWS::EC2::SecurityGroupEgress", "AWS::EC2::PlacementGroup"}),
    "storage": frozenset({
        "AWS::S3::Bucket", "AWS::S3::BucketPolicy", "AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress",
        "AWS::FSx::FileSystem", "AWS::FSx::DataRepositoryAssociation",
        # a scheduler whose service makes the nodes (its storage_parts): what their fmcluster bootstrap may read and write
        "AWS::IAM::ManagedPolicy",
        # and the Slurm accounting database it creates when the tenant names none: its second zone's subnet,
        # subnet group and generated password
        "AWS::EC2::Subnet", "AWS::RDS::DBSubnetGroup", "AWS::RDS::DBInstance", "AWS::SecretsManager::Secret"}),
    "cluster": frozenset({
        "AWS::IAM::Role", "AWS::IAM::InstanceProfile", "AWS::EC2::LaunchTemplate", "AWS::EC2::Instance",
        "AWS::AutoScaling::AutoScalingGroup", "AWS::AutoScaling::ScheduledAction", "AWS::SageMaker::Cluster",
        # scheduler pcs: the PCS cluster, its node groups and queues, and its controller interface's security group
        "AWS::PCS::Cluster", "AWS::PCS::ComputeNodeGroup", "AWS::PCS::Queue", "AWS::EC2::SecurityGroup",
        "AWS::EC2::SecurityGroupIngress"}),
    # `invoke image` (fmcluster.stacks.templates.image): EC2 Image Builder's pipeline parts, its builders' group and role
    "image": frozenset({
        "AWS::EC2::SecurityGroup", "AWS::IAM::Role", "AWS::IAM::InstanceProfile", "AWS::ImageBuilder::Component",
        "AWS::ImageBuilder::ImageRecipe", "AWS::ImageBuilder::InfrastructureConfiguration",
        "AWS::ImageBuilder::DistributionConfiguration", "AWS::ImageBuilder::Image"}),
}
ALLOWED_ROLES = frozenset({"NodeRole", "ControllerRole", "ExecutionRole", "ControllerExecutionRole", "BuilderRole"})
#: Managed policies one role alone may hold: Image Builder's instance policy (its builders report to Image Builder
#: with it: https://docs.aws.amazon.com/imagebuilder/latest/userguide/image-builder-setting-up.html), no node's role.
ROLE_MANAGED_POLICIES = {"BuilderRole": frozenset({"EC2InstanceProfileForImageBuilder"})}
ALLOWED_MANAGED_POLICIES = frozenset({"AmazonSSMManagedInstanceCore", "CloudWatchAgentServerPolicy",
                                      "AmazonSageMakerClusterInstanceRolePolicy"})
ALLOWED_SERVICE_PRINCIPALS = frozenset({"ec2.${AWS::URLSuffix}", "ec2.amazonaws.com", "sagemaker.amazonaws.com"})


@dataclass(frozen=True)
class Finding:
    stack: str
    resource: str
    problem: str
    fix: str

    def render(self) -> str:
        return f"{self.stack}: {self.resource}: {self.problem} (fix: {self.fix})"


def _is_ref(value: Any, name: str) -> bool:
    return isinstance(value, dict) and value.get("Ref") == name


def _as_text(value: Any) -> str:
    """A string-valued property as text, intrinsics flattened (${Ref} placeholders)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Ref" in value:
        return "${" + str(value["Ref"]) + "}"
    if isinstance(value, dict) and "Fn::Sub" in value:
        sub = value["Fn::Sub"]
        return str(sub[0] if isinstance(sub, list) else sub)
    if isinstance(value, dict) and "Fn::Join" in value and isinstance(value["Fn::Join"], list):
        delimiter, parts = value["Fn::Join"]
        return str(delimiter).join(_as_text(p) for p in parts)
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return "${" + ".".join(map(str, value["Fn::GetAtt"])) + "}"
    return repr(value)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _walk_keys(node: Any) -> set[str]:
    keys: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            keys.add(str(key))
            keys |= _walk_keys(value)
    elif isinstance(node, list):
        for value in node:
            keys |= _walk_keys(value)
    return keys


def _check_structure(stack: RenderedStack, template: dict[str, Any]) -> list[Finding]:
    findings = []
    for key in sorted(set(template) - TEMPLATE_KEYS):
        findings.append(Finding(stack.name, "(template)", f"unexpected top-level section {key!r}",
                                "fmcluster templates have no Transform, Mappings, Rules or Hooks: remove it"))
    if "Fn::Transform" in _walk_keys(template):
        findings.append(Finding(stack.name, "(template)", "an Fn::Transform (macro/include) that could add resources",
                                "remove it: what a stack holds must be visible in the rendered template"))
    allowed = ALLOWED_TYPES.get(stack.key, frozenset())
    for name, res in (template.get("Resources") or {}).items():
        rtype = res.get("Type") if isinstance(res, dict) else None
        if rtype not in allowed:
            findings.append(Finding(stack.name, str(name), f"resource type {rtype!r} is not one fmcluster creates in "
                                    f"the {stack.key} stack", f"remove it; allowed: {', '.join(sorted(allowed))}"))
        elif rtype == "AWS::IAM::Role" and name not in ALLOWED_ROLES:
            findings.append(Finding(stack.name, str(name), "an IAM role fmcluster does not define",
                                    f"remove it; fmcluster's roles are {', '.join(sorted(ALLOWED_ROLES))}"))
    return findings


def _check_efa_group(stack: str, resources: dict[str, Any]) -> list[Finding]:
    findings: list[Finding] = []
    if "EfaSecurityGroup" not in resources:
        return findings
    props = resources["EfaSecurityGroup"].get("Properties", {})
    for rule in props.get("SecurityGroupIngress", []):
        findings.append(Finding(stack, "EfaSecurityGroup", f"inline ingress rule {rule}",
                                "the EFA group admits only itself: use a self-referencing SecurityGroupIngress"))
    egress = props.get("SecurityGroupEgress") or []
    if not (len(egress) == 1 and all(egress[0].get(k) == v for k, v in DISALLOW_ALL_EGRESS.items())):
        findings.append(Finding(stack, "EfaSecurityGroup", "egress is not restricted (default allow-all egress stays)",
                                "keep the 'disallow all' placeholder rule inline and a self-referencing SecurityGroupEgress"))
    kinds = {"AWS::EC2::SecurityGroupIngress": ("SourceSecurityGroupId", "ingress"),
             "AWS::EC2::SecurityGroupEgress": ("DestinationSecurityGroupId", "egress")}
    seen = set()
    for name, res in resources.items():
        if res.get("Type") not in kinds or not _is_ref(res.get("Properties", {}).get("GroupId"), "EfaSecurityGroup"):
            continue
        peer_key, direction = kinds[res["Type"]]
        peer = res["Properties"].get(peer_key)
        if not _is_ref(peer, "EfaSecurityGroup") or res["Properties"].get("IpProtocol") != "-1":
            findings.append(Finding(stack, name, f"EFA {direction} rule not limited to the group itself, all protocols",
                                    f"{peer_key}: !Ref EfaSecurityGroup and IpProtocol: '-1'"))
        seen.add(direction)
    for direction in sorted({"ingress", "egress"} - seen):
        findings.append(Finding(stack, "EfaSecurityGroup", f"no self-referencing {direction} rule",
                                f"add an AWS::EC2::SecurityGroup{direction.capitalize()} from/to the group itself"))
    return findings


def _check_open_ingress(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    props = res.get("Properties", {})
    rules = props.get("SecurityGroupIngress", []) if res["Type"] == "AWS::EC2::SecurityGroup" else [props]
    findings = []
    for rule in rules:
        cidr = rule.get("CidrIp") or rule.get("CidrIpv6")
        if not isinstance(cidr, str):
            continue
        try:
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            findings.append(Finding(stack, name, f"ingress from {cidr!r}, which is not a CIDR", "use a CIDR block"))
            continue
        if cidr in OPEN_CIDRS:
            findings.append(Finding(stack, name, f"ingress open to {cidr}", "admit a specific CIDR (network.ssh_ingress_cidr)"))
        elif network.prefixlen < 8:
            findings.append(Finding(stack, name, f"ingress from the very wide {cidr}", "narrow the CIDR"))
    return findings


def _retained(res: dict[str, Any]) -> bool:
    return res.get("DeletionPolicy") == "Retain" and res.get("UpdateReplacePolicy") == "Retain"


def _check_bucket(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    props, findings = res.get("Properties", {}), []
    if not _retained(res):
        findings.append(Finding(stack, name, "data bucket is not retained", "DeletionPolicy and UpdateReplacePolicy: Retain"))
    if not props.get("BucketEncryption"):
        findings.append(Finding(stack, name, "no default encryption", "set BucketEncryption"))
    block = props.get("PublicAccessBlockConfiguration", {})
    if not all(block.get(k) is True for k in PUBLIC_ACCESS_BLOCK):
        findings.append(Finding(stack, name, "public access not fully blocked", f"set {', '.join(PUBLIC_ACCESS_BLOCK)} to true"))
    if "VersioningConfiguration" not in props:
        findings.append(Finding(stack, name, "no versioning configuration", "set VersioningConfiguration from storage.s3.versioning"))
    rules = (props.get("LifecycleConfiguration") or {}).get("Rules") or []
    enabled = [r for r in rules if r.get("Status") == "Enabled"]
    if not any("NoncurrentVersionExpiration" in r for r in enabled):
        findings.append(Finding(stack, name, "old object versions are kept forever",
                                "add a lifecycle rule with NoncurrentVersionExpiration"))
    if not any("AbortIncompleteMultipartUpload" in r for r in enabled):
        findings.append(Finding(stack, name, "incomplete multipart uploads are kept forever",
                                "add a lifecycle rule with AbortIncompleteMultipartUpload"))
    return findings


def _check_file_system(stack: str, name: str, res: dict[str, Any], resources: dict[str, Any]) -> list[Finding]:
    findings = []
    if not _retained(res):
        findings.append(Finding(stack, name, "file system is not retained (a delete or replacing update loses its data)",
                                "DeletionPolicy and UpdateReplacePolicy: Retain"))
    groups = [str(g["Ref"]) for g in _as_list(res.get("Properties", {}).get("SecurityGroupIds", []))
              if isinstance(g, dict) and "Ref" in g]
    self_rules = {lid for lid, r in resources.items() if r.get("Type") == "AWS::EC2::SecurityGroupIngress"
                  and any(_is_ref(r.get("Properties", {}).get("GroupId"), g)
                          and _is_ref(r.get("Properties", {}).get("SourceSecurityGroupId"), g) for g in groups)}
    if not self_rules or not self_rules <= set(_as_list(res.get("DependsOn", []))):
        findings.append(Finding(stack, name, "created without waiting for its security group's self-ingress rule "
                                "(FSx checks port 988 at creation and fails now and then)",
                                f"DependsOn: {sorted(self_rules) or ['<the self-ingress rule>']}"))
    return findings + _check_lustre(stack, name, res)


def _statement_problems(name: str, policy: str, st: dict[str, Any]) -> list[tuple[str, str]]:
    if st.get("Effect") != "Allow":
        return []
    problems = []
    if "NotAction" in st or "NotResource" in st:
        problems.append((f"NotAction/NotResource in {policy} (grants everything not listed)",
                         "list the actions and resources instead"))
    actions = [str(a) for a in _as_list(st.get("Action", []))]
    if any("*" in a for a in actions):
        problems.append((f"wildcard action in {policy}: {actions}", "list the actions the nodes need"))
    for resource in _as_list(st.get("Resource", [])):
        text = _as_text(resource)
        # ${AWS::Partition} and friends hold colons of their own: compare the ARN's fields without them.
        fields = re.sub(r"\$\{[^}]*\}", "x", text)
        wildcard = text == "*" or re.fullmatch(r"arn:[^:]*:[^:]*:[^:]*:[^:]*:\*", fields) is not None
        sensitive = [a for a in actions if a not in UNSCOPABLE_ACTIONS]
        if wildcard and sensitive:
            problems.append((f"wildcard resource {text!r} in {policy} for {sensitive}",
                             "scope the resource (only Describe* calls that have no resource type may use '*')"))
    return problems


def _check_role(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    findings = []
    props = res.get("Properties", {})
    for st in (props.get("AssumeRolePolicyDocument") or {}).get("Statement", []):
        principal = st.get("Principal", {})
        services = [_as_text(s) for s in _as_list(principal.get("Service", []))] if isinstance(principal, dict) else []
        others = set(principal) - {"Service"} if isinstance(principal, dict) else {"*"}
        if others or not set(services) <= ALLOWED_SERVICE_PRINCIPALS:
            findings.append(Finding(stack, name, f"trust policy admits {principal}",
                                    f"only the services {', '.join(sorted(ALLOWED_SERVICE_PRINCIPALS))} may assume it"))
    for policy in props.get("Policies", []):
        for st in (policy.get("PolicyDocument") or {}).get("Statement", []):
            for problem, fix in _statement_problems(name, str(policy.get("PolicyName")), st):
                findings.append(Finding(stack, name, problem, fix))
    for arn in props.get("ManagedPolicyArns", []):
        text = _as_text(arn)
        allowed = ALLOWED_MANAGED_POLICIES | ROLE_MANAGED_POLICIES.get(name, frozenset())
        if not any(text.endswith(f":iam::aws:policy/{p}") for p in allowed):
            findings.append(Finding(stack, name, f"managed policy {text} is not one fmcluster uses",
                                    f"use least-privilege inline statements; allowed: {', '.join(sorted(ALLOWED_MANAGED_POLICIES))}"))
    return findings


#: EC2 takes user data up to 16 KB "in raw form, before it is base64-encoded"
#: (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html): a larger one fails the
#: launch, so every node of the group never boots.
USER_DATA_MAX_BYTES = 16 * 1024
#: The longest value each reference in a user data may take: a bucket name 63 bytes (S3's naming rules), a stack name
#: 128 (CloudFormation's), a region name 25 (the longest today is 14). Any other reference counts as 1,024 bytes.
REF_MAX_BYTES = {"DataBucketName": 63, "AWS::StackName": 128, "AWS::Region": 25}
UNKNOWN_REF_BYTES = 1024


def user_data_max_bytes(value: Any) -> int:
    """The most bytes a (Fn::Base64 of a) user data can decode to, its references at their longest."""
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, dict) and "Fn::Base64" in value:
        return user_data_max_bytes(value["Fn::Base64"])
    if isinstance(value, dict) and "Ref" in value:
        return REF_MAX_BYTES.get(str(value["Ref"]), UNKNOWN_REF_BYTES)
    if isinstance(value, dict) and "Fn::Join" in value and isinstance(value["Fn::Join"], list):
        delimiter, parts = value["Fn::Join"]
        return len(str(delimiter).encode()) * max(len(parts) - 1, 0) + sum(user_data_max_bytes(p) for p in parts)
    return UNKNOWN_REF_BYTES


def _check_launch_template(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    data, findings = res.get("Properties", {}).get("LaunchTemplateData", {}), []
    if data.get("MetadataOptions", {}).get("HttpTokens") != "required":
        findings.append(Finding(stack, name, "IMDSv1 allowed", "MetadataOptions: HttpTokens: required"))
    if "UserData" in data and (size := user_data_max_bytes(data["UserData"])) > USER_DATA_MAX_BYTES:
        findings.append(Finding(stack, name, f"user data of up to {size} bytes, over EC2's {USER_DATA_MAX_BYTES} "
                                "(the launch would fail)", "shrink src/fmcluster/node/boot/node-user-data.sh or the packed "
                                "fmcluster-s3 it carries (fmcluster.stacks.first_boot)"))
    for mapping in data.get("BlockDeviceMappings", []):
        if mapping.get("Ebs") and mapping["Ebs"].get("Encrypted") is not True:
            findings.append(Finding(stack, name, "unencrypted EBS volume", "Ebs: Encrypted: true"))
    return findings


def _check_instance(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    props = res.get("Properties", {})
    if "LaunchTemplate" not in props and props.get("MetadataOptions", {}).get("HttpTokens") != "required":
        return [Finding(stack, name, "IMDSv1 allowed", "launch it from a launch template that requires IMDSv2")]
    return []


def _check_lustre(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    props = res.get("Properties", {})
    if props.get("FileSystemType") != "LUSTRE":
        return []
    cfg, findings = props.get("LustreConfiguration", {}), []
    kind, capacity = cfg.get("DeploymentType"), props.get("StorageCapacity")
    if kind not in ("PERSISTENT_1", "PERSISTENT_2", "SCRATCH_1", "SCRATCH_2"):
        findings.append(Finding(stack, name, f"invalid Lustre DeploymentType {kind!r}", "use PERSISTENT_2 (or another FSx type)"))
    step = 3600 if kind == "SCRATCH_1" else 2400
    if isinstance(capacity, int) and not (capacity == 1200 or (capacity >= step and capacity % step == 0)):
        findings.append(Finding(stack, name, f"StorageCapacity {capacity} GiB is not 1200 or a multiple of {step}",
                                "set storage.lustre.storage_capacity_gib to a valid size"))
    throughput = cfg.get("PerUnitStorageThroughput")
    if kind in LUSTRE_THROUGHPUT and throughput not in LUSTRE_THROUGHPUT[kind]:
        findings.append(Finding(stack, name, f"PerUnitStorageThroughput {throughput} invalid for {kind}",
                                f"use one of {sorted(LUSTRE_THROUGHPUT[kind])}"))
    return findings


#: What nodes execute or trust in the data bucket: no data repository may be linked over, inside or around it.
CONTROL_PREFIXES_IN_BUCKET = tuple(dict.fromkeys((*CONTROL_PREFIXES, *NODE_READ_PREFIXES, REPORT_PREFIX)))


def _check_data_repository(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    """A Lustre data repository (DRA or the legacy Import/ExportPath) never covers a control prefix."""
    props = res.get("Properties", {})
    paths = [props.get("DataRepositoryPath")] if res.get("Type") == "AWS::FSx::DataRepositoryAssociation" else \
        [(props.get("LustreConfiguration") or {}).get(k) for k in ("ImportPath", "ExportPath")]
    findings = []
    for path in (p for p in paths if p is not None):
        text = _as_text(path)
        match = re.fullmatch(r"s3://[^/]*/?(.*)", text)
        if match is None:
            findings.append(Finding(stack, name, f"data repository path {text!r} is not an s3:// path in the data bucket",
                                    "set storage.lustre.data_repository.s3_prefix to a data folder, e.g. data/"))
            continue
        prefix = match.group(1)
        control = next((c for c in CONTROL_PREFIXES_IN_BUCKET if c.startswith(prefix) or prefix.startswith(c)), None)
        if control is not None:
            findings.append(Finding(stack, name, f"data repository path {text!r} covers the control prefix {control!r} "
                                    "(what nodes run as root would be exported from the file system)",
                                    "set storage.lustre.data_repository.s3_prefix to a data folder of its own, e.g. data/"))
    return findings


def _check_tags(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    tags = res.get("Properties", {}).get("Tags")
    if not isinstance(tags, list):
        return []
    keys = {t.get("Key") for t in tags if isinstance(t, dict)}
    missing = [k for k in REQUIRED_TAGS if k not in keys]
    return [Finding(stack, name, f"missing cost-allocation tags {missing}", "render Tags with resource_tags()")] if missing else []


def check_stack(stack: RenderedStack) -> list[Finding]:
    template = load_cfn_yaml(stack.body)
    findings = _check_structure(stack, template)
    resources: dict[str, Any] = {k: v for k, v in (template.get("Resources") or {}).items() if isinstance(v, dict)}
    findings += _check_efa_group(stack.name, resources)
    for name, res in resources.items():
        rtype = res.get("Type")
        if rtype in ("AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress"):
            findings += _check_open_ingress(stack.name, name, res)
        elif rtype == "AWS::S3::Bucket":
            findings += _check_bucket(stack.name, name, res)
        elif rtype == "AWS::S3::BucketPolicy" and not _retained(res):
            findings.append(Finding(stack.name, name, "bucket policy is not retained with its bucket (a retained "
                                    "bucket would lose TLS-only access)", "DeletionPolicy and UpdateReplacePolicy: Retain"))
        elif rtype == "AWS::IAM::Role":
            findings += _check_role(stack.name, name, res)
        elif rtype == "AWS::EC2::LaunchTemplate":
            findings += _check_launch_template(stack.name, name, res)
        elif rtype == "AWS::EC2::Instance":
            findings += _check_instance(stack.name, name, res)
        elif rtype == "AWS::FSx::FileSystem":
            findings += _check_file_system(stack.name, name, res, resources)
            findings += _check_data_repository(stack.name, name, res)
        elif rtype == "AWS::FSx::DataRepositoryAssociation":
            findings += _check_data_repository(stack.name, name, res)
        findings += _check_tags(stack.name, name, res)
    return findings


def check_stacks(stacks: list[RenderedStack]) -> list[Finding]:
    return [f for s in stacks for f in check_stack(s)]
