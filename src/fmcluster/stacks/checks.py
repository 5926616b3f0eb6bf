"""Security and value checks on rendered templates: what cfn-lint does not check for us.

Each finding names the stack, the resource and the fix. Run by `invoke plan`, before every deploy,
and by the tests for every bundled tenant.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from fmcluster.stacks.render import RenderedStack, load_cfn_yaml

OPEN_CIDRS = {"0.0.0.0/0", "::/0"}
# The rule AWS (and the CDK) use to replace the default allow-all egress with one that matches nothing.
DISALLOW_ALL_EGRESS = {"CidrIp": "255.255.255.255/32", "IpProtocol": "icmp", "FromPort": 252, "ToPort": 86}
LUSTRE_THROUGHPUT = {"PERSISTENT_1": {50, 100, 200}, "PERSISTENT_2": {125, 250, 500, 1000}}
PUBLIC_ACCESS_BLOCK = ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
REQUIRED_TAGS = ("fmcluster:org", "fmcluster:programme")


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
    for direction in {"ingress", "egress"} - seen:
        findings.append(Finding(stack, "EfaSecurityGroup", f"no self-referencing {direction} rule",
                                f"add an AWS::EC2::SecurityGroup{direction.capitalize()} from/to the group itself"))
    return findings


def _check_open_ingress(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    props = res.get("Properties", {})
    rules = props.get("SecurityGroupIngress", []) if res["Type"] == "AWS::EC2::SecurityGroup" else [props]
    findings = []
    for rule in rules:
        cidr = rule.get("CidrIp") or rule.get("CidrIpv6")
        if isinstance(cidr, str) and cidr in OPEN_CIDRS:
            findings.append(Finding(stack, name, f"ingress open to {cidr}", "admit a specific CIDR (network.ssh_ingress_cidr)"))
        elif isinstance(cidr, str) and ipaddress.ip_network(cidr, strict=False).prefixlen < 8:
            findings.append(Finding(stack, name, f"ingress from the very wide {cidr}", "narrow the CIDR"))
    return findings


def _check_bucket(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    props, findings = res.get("Properties", {}), []
    if res.get("DeletionPolicy") != "Retain" or res.get("UpdateReplacePolicy") != "Retain":
        findings.append(Finding(stack, name, "data bucket is not retained", "DeletionPolicy and UpdateReplacePolicy: Retain"))
    if not props.get("BucketEncryption"):
        findings.append(Finding(stack, name, "no default encryption", "set BucketEncryption"))
    block = props.get("PublicAccessBlockConfiguration", {})
    if not all(block.get(k) is True for k in PUBLIC_ACCESS_BLOCK):
        findings.append(Finding(stack, name, "public access not fully blocked", f"set {', '.join(PUBLIC_ACCESS_BLOCK)} to true"))
    if "VersioningConfiguration" not in props:
        findings.append(Finding(stack, name, "no versioning configuration", "set VersioningConfiguration from storage.s3.versioning"))
    return findings


def _check_role(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    findings = []
    for policy in res.get("Properties", {}).get("Policies", []):
        for st in policy.get("PolicyDocument", {}).get("Statement", []):
            actions = st.get("Action", [])
            actions = [actions] if isinstance(actions, str) else actions
            if st.get("Effect") == "Allow" and any(a == "*" or a.endswith(":*") for a in actions):
                findings.append(Finding(stack, name, f"wildcard action in {policy.get('PolicyName')}: {actions}",
                                        "list the actions the nodes need"))
            if st.get("Effect") == "Allow" and st.get("Resource") == "*" and any(a.startswith("s3:") for a in actions):
                findings.append(Finding(stack, name, "S3 access to every bucket", "scope it to the tenant bucket"))
    for arn in res.get("Properties", {}).get("ManagedPolicyArns", []):
        text = str(arn)
        if "AdministratorAccess" in text or "PowerUserAccess" in text or "AmazonS3FullAccess" in text:
            findings.append(Finding(stack, name, f"broad managed policy {text}", "use least-privilege policies"))
    return findings


def _check_launch_template(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    data, findings = res.get("Properties", {}).get("LaunchTemplateData", {}), []
    if data.get("MetadataOptions", {}).get("HttpTokens") != "required":
        findings.append(Finding(stack, name, "IMDSv1 allowed", "MetadataOptions: HttpTokens: required"))
    for mapping in data.get("BlockDeviceMappings", []):
        if mapping.get("Ebs") and mapping["Ebs"].get("Encrypted") is not True:
            findings.append(Finding(stack, name, "unencrypted EBS volume", "Ebs: Encrypted: true"))
    return findings


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


def _check_tags(stack: str, name: str, res: dict[str, Any]) -> list[Finding]:
    tags = res.get("Properties", {}).get("Tags")
    if not isinstance(tags, list):
        return []
    keys = {t.get("Key") for t in tags if isinstance(t, dict)}
    missing = [k for k in REQUIRED_TAGS if k not in keys]
    return [Finding(stack, name, f"missing cost-allocation tags {missing}", "render Tags with tags_json()")] if missing else []


def check_stack(stack: RenderedStack) -> list[Finding]:
    resources: dict[str, Any] = load_cfn_yaml(stack.body).get("Resources", {})
    findings = _check_efa_group(stack.name, resources)
    for name, res in resources.items():
        rtype = res.get("Type")
        if rtype in ("AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress"):
            findings += _check_open_ingress(stack.name, name, res)
        elif rtype == "AWS::S3::Bucket":
            findings += _check_bucket(stack.name, name, res)
        elif rtype == "AWS::IAM::Role":
            findings += _check_role(stack.name, name, res)
        elif rtype == "AWS::EC2::LaunchTemplate":
            findings += _check_launch_template(stack.name, name, res)
        elif rtype == "AWS::FSx::FileSystem":
            findings += _check_lustre(stack.name, name, res)
        findings += _check_tags(stack.name, name, res)
    return findings


def check_stacks(stacks: list[RenderedStack]) -> list[Finding]:
    return [f for s in stacks for f in check_stack(s)]
