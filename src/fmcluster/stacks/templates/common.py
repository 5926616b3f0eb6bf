"""Pieces every stack template shares: names, tags, parameters, the provider condition, IAM."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fmcluster.accounting import secret_roles
from fmcluster.manifest import INDEX_PARAMETER, SECRET_PREFIX
from fmcluster.model import Tenant
from fmcluster.stacks.cfn import NO_VALUE, Fn, Ref, Sub, if_, join, tags, text
from fmcluster.validation import ECR_REGISTRY

TEMPLATE_VERSION = "2010-09-09"

# S3 prefixes in the tenant's data bucket and who may do what there (docs/stacks.md, "Node IAM").
BOOTSTRAP_PREFIX = "fmcluster/bootstrap/"  # deploy writes, nodes read
MANIFEST_PREFIX = "fmcluster/manifest/"  # deploy writes, nodes read
LIFECYCLE_PREFIX = "hyperpod/lifecycle/"  # deploy writes, HyperPod (execution role) reads
REPORT_PREFIX = "fmcluster/report/"  # each node writes its own convergence report (NODE_IDENTITY); the deploy reads
NODE_READ_PREFIXES = (BOOTSTRAP_PREFIX, MANIFEST_PREFIX, LIFECYCLE_PREFIX)
#: The deploy writes templates over CloudFormation's inline limit here, CloudFormation reads them.
TEMPLATES_PREFIX = "fmcluster/templates/"
#: What nodes and services run as root (the bootstrap, the manifest and its index, HyperPod's lifecycle scripts,
#: a scheduler service's custom actions under the bootstrap prefix) and the templates CloudFormation runs: the bucket
#: policy lets the deploy's principal alone write or delete there (control_prefix_statement).
CONTROL_PREFIXES = (BOOTSTRAP_PREFIX, MANIFEST_PREFIX, LIFECYCLE_PREFIX, TEMPLATES_PREFIX)
#: Who the deploy is: its STS caller identity's UserId up to the first ':' (a role's id, an IAM user's id, or the
#: account id for the root user), a parameter of the storage stack the deploy fills in (fmcluster.stacks.api).
DEPLOY_PRINCIPAL_PARAMETER = "DeployPrincipalId"

# Describe calls cannot be scoped to resources (the EC2 service authorization reference lists no
# resource type for them), nor can ECR's GetAuthorizationToken (its service authorization reference lists none; the
# ECR user guide's registry_auth.html says to grant it on "*"), so they are the only actions allowed on Resource "*".
UNSCOPABLE_ACTIONS = frozenset({
    "ec2:DescribeAvailabilityZones", "ec2:DescribeDhcpOptions", "ec2:DescribeInstances",
    "ec2:DescribeNetworkInterfaces", "ec2:DescribeSecurityGroups", "ec2:DescribeSubnets", "ec2:DescribeTags",
    "ec2:DescribeVpcs", "autoscaling:DescribeAutoScalingInstances", "ecr:GetAuthorizationToken",
})



def metadata(*ignored: tuple[str, str]) -> dict[str, Any]:
    """Template Metadata: the cfn-lint checks fmcluster ignores, each with its reason next to it."""
    reasons = dict(ignored) | {
        "I1022": "Fn::Join, not Fn::Sub, wherever a tenant value is part of a string: Fn::Sub would read "
                 "${...} inside the value (structure-safe rendering, docs/stacks.md)"}
    return {"cfn-lint": {"config": {"ignore_checks": sorted(reasons)}}, "fmcluster": {"lint-exceptions": reasons}}


def logical_name(name: str) -> str:
    """`gpu-a_1` → `GpuA1`: a CloudFormation logical-id fragment (letters and digits only) from a name."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", name) if part)


def resource_tags(tenant: Tenant, name: str, extra: dict[str, str] | None = None,
                  propagate: bool | None = None) -> list[dict[str, Any]]:
    """Cost-allocation tags (org, programme) and a Name, on every resource that takes tags."""
    return tags({**tenant.tags, "Name": f"{tenant.stack_prefix}-{name}", **(extra or {})}, propagate)


def spec_file(tenant: Tenant) -> str:
    return f"inventories/{tenant.org}/group_vars/all/tenant.yml"


def description(text_: str) -> str:
    """Template descriptions are capped at 1024 characters by CloudFormation."""
    return text_ if len(text_) <= 1024 else text_[:1020] + " ..."


def output(description_: str, value: Any, condition: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"Description": description_, "Value": value}
    if condition:
        out = {"Condition": condition, **out}
    return out


# --- cluster stacks -------------------------------------------------------------------------------
# The network stack's placement group reaches a cluster stack as a parameter that may be empty (the emulator creates
# no placement group): only where it is given do the EFA nodes launch into it.
PLACEMENT_GROUP_PARAMETER = "PlacementGroupName"
HAS_PLACEMENT_GROUP = "HasPlacementGroup"


def placement_group_parameter(description_: str) -> dict[str, str]:
    return {"Type": "String", "Default": "", "AllowedPattern": r"^[A-Za-z0-9._-]*$", "Description": description_}


def placement_group_name() -> Fn:
    """The placement group an EFA node launches into, or no value where the network stack gave none."""
    return if_(HAS_PLACEMENT_GROUP, Ref(PLACEMENT_GROUP_PARAMETER), NO_VALUE)


def cluster_template(description_: str, parameters: dict[str, Any], resources: dict[str, Any],
                     outputs: dict[str, Any], *, placement: bool) -> dict[str, Any]:
    """A cluster stack's template from its parts; `placement`: it takes placement_group_parameter and uses
    placement_group_name."""
    template: dict[str, Any] = {
        "AWSTemplateFormatVersion": TEMPLATE_VERSION,
        "Description": description(description_),
        "Metadata": metadata(),
        "Parameters": parameters,
    }
    if placement:
        template["Conditions"] = {
            HAS_PLACEMENT_GROUP: Fn("Not", [Fn("Equals", [Ref(PLACEMENT_GROUP_PARAMETER), ""])])}
    template["Resources"] = resources
    template["Outputs"] = outputs
    return template


# --- typed cross-stack parameters -----------------------------------------------------------------
# CloudFormation checks AWS-specific parameter types (the VPC, subnet, group exist in the account and
# region) when the change set is created, before any resource is touched.

def vpc_id(description_: str) -> dict[str, str]:
    return {"Type": "AWS::EC2::VPC::Id", "Description": description_}


def subnet_id(description_: str) -> dict[str, str]:
    return {"Type": "AWS::EC2::Subnet::Id", "Description": description_}


def security_group_id(description_: str) -> dict[str, str]:
    return {"Type": "AWS::EC2::SecurityGroup::Id", "Description": description_}


def bucket_name(description_: str) -> dict[str, str]:
    return {"Type": "String", "AllowedPattern": r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
            "ConstraintDescription": "an S3 bucket name", "Description": description_}


# --- IAM ------------------------------------------------------------------------------------------

def bucket_arn(suffix: str = "") -> Sub:
    return Sub("arn:${AWS::Partition}:s3:::${DataBucketName}" + suffix)


def assume_role(service: str, source_account: bool = False, source_arn: Any = None) -> dict[str, Any]:
    statement: dict[str, Any] = {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}
    conditions: dict[str, Any] = {}
    if source_account:
        # Confused-deputy protection: the service may assume the role only on behalf of this account.
        conditions["StringEquals"] = {"aws:SourceAccount": Ref("AWS::AccountId")}
    if source_arn is not None:
        conditions["ArnLike"] = {"aws:SourceArn": source_arn}
    if conditions:
        statement["Condition"] = conditions
    return {"Version": "2012-10-17", "Statement": [statement]}


#: The IAM policy variable naming the calling node's role session: aws:userid is "<role id>:<role session name>" for
#: every assumed role (IAM User Guide, "Request information that you can use for policy variables"). EC2 names an
#: instance profile's session after the instance ("<role id>:<instance id>"); SageMaker HyperPod gives every node of
#: an instance group its execution role under one session, "SageMaker" (docs/stacks.md, "Node IAM"), so on HyperPod
#: it names the group's role, not the node. A grant under it is a grant to that session: the report key adds the
#: node's instance id below it (REPORT_INSTANCE). It resolves for every role session, where ec2:SourceInstanceARN
#: exists only for EC2-delivered credentials: a statement whose variable cannot be resolved grants nothing. Written
#: into Fn::Join parts, never a Sub (CloudFormation would read it as a parameter).
NODE_IDENTITY = "${aws:userid}"
#: The last part of a report's key: the node's own instance id (EC2 and HyperPod instance ids both start "i-").
REPORT_INSTANCE = "i-*"
#: What a node files under REPORT_PREFIX + NODE_IDENTITY: its report and the log beside it, named by its instance id.
REPORT_SUFFIXES = (".json", ".log")


def own_report_keys(bucket: Sub) -> list[Any]:
    """The report objects a node may write (`bucket`: the bucket's ARN as a Sub, e.g. bucket_arn()): reports and logs
    under its own role session, fmcluster/report/<aws:userid>/i-*.json and .log, and nothing else. A node names them
    by its instance id (report_key), so nodes sharing one session (HyperPod's) never overwrite each other, while no
    node may write under another session. It files under the UserId STS gives its own credentials (fmcluster-s3
    whoami, the agent's get_caller_identity); on the local substrate each host gets its instance role's session as
    EC2 would give it (providers/local)."""
    return [join([bucket, "/" + REPORT_PREFIX + NODE_IDENTITY + "/" + REPORT_INSTANCE + suffix])
            for suffix in REPORT_SUFFIXES]


def report_key(user_id: str, instance_id: str, suffix: str = ".json") -> str:
    """The key a node's report (or log) has under the policy: its STS caller identity's UserId (aws:userid), then
    its instance id (fmcluster.reports.report_key, which the deploy reads by)."""
    return f"{REPORT_PREFIX}{user_id}/{instance_id}{suffix}"


def secret_arns(org: str, names: Sequence[str]) -> list[Any]:
    """The ARNs of the named secrets of the org. Secrets Manager appends '-' and six random characters."""
    return [text("arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:" + SECRET_PREFIX
                 + name + "-??????", org=org) for name in names]


def secrets_of(tenant: Tenant, roles: Sequence[str]) -> list[str]:
    """The secrets the node agent reads on nodes of these roles (the manifest's list, fmcluster.accounting)."""
    return sorted(name for name, readers in secret_roles(tenant).items() if set(readers) & set(roles))


def index_parameter_arn(org: str) -> Any:
    """The SSM parameter naming the SHA-256 of the deploy's index (fmcluster.manifest.index_parameter): nodes read
    it, only the deploy writes it."""
    return text("arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter" + INDEX_PARAMETER, org=org)


def trusted_index_statement(org: str) -> dict[str, Any]:
    """A node reads (never writes) the digest of what the deploy published, to check what it runs against it."""
    return {"Sid": "ReadTrustedIndexDigest", "Effect": "Allow", "Action": "ssm:GetParameter",
            "Resource": index_parameter_arn(org)}


def control_prefix_statement(bucket: Any) -> dict[str, Any]:
    """The bucket policy's Deny: writes and deletes under CONTROL_PREFIXES by anyone but the deploy's principal
    (aws:userid is "<role id>:<session>" for a role session, the user's id for an IAM user, the account id for the
    root user; IAM User Guide, aws:userid:
    https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-keys.html). Nodes write their
    reports under REPORT_PREFIX, users their data elsewhere: neither is touched. `bucket`: the bucket's ARN."""
    principal = Ref(DEPLOY_PRINCIPAL_PARAMETER)
    return {"Sid": "DenyControlWritesButTheDeploy", "Effect": "Deny", "Principal": "*",
            "Action": ["s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion"],
            "Resource": [join([bucket, f"/{prefix}*"]) for prefix in CONTROL_PREFIXES],
            "Condition": {"StringNotLike": {"aws:userid": [principal, join([principal, ":*"])]}}}


def node_statements(tenant: Tenant, *, controller: bool) -> list[dict[str, Any]]:
    """What a node's role may do in S3 and Secrets Manager: read the bootstrap, the manifest and the
    HyperPod lifecycle prefixes, write its own report (by NODE_IDENTITY), read the secrets its role's
    nodes read (the controller: every secret the manifest gives it; login and compute: the munge key)."""
    read = [f"{prefix}*" for prefix in NODE_READ_PREFIXES]
    secrets = secrets_of(tenant, ["controller"] if controller else ["login", "compute"])
    return [
        {"Sid": "ListFmclusterPrefixes", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn(),
         "Condition": {"StringLike": {"s3:prefix": read}}},
        {"Sid": "LocateBucket", "Effect": "Allow", "Action": "s3:GetBucketLocation", "Resource": bucket_arn()},
        {"Sid": "ReadBootstrapManifestLifecycle", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": [bucket_arn("/" + prefix) for prefix in read]},
        {"Sid": "WriteReports", "Effect": "Allow", "Action": "s3:PutObject", "Resource": own_report_keys(bucket_arn())},
        {"Sid": "ReadOwnSecrets", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
         "Resource": secret_arns(tenant.org, secrets)},
        trusted_index_statement(tenant.org),
        # Every node finds itself and the cluster's other nodes among the tenant's instances (its node agent;
        # Describe* cannot be resource-scoped).
        {"Sid": "FindClusterNodes", "Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
        *container_pull_statements(tenant),
    ]


#: What pulling an image from ECR takes on the repository (AWS's read-only managed policy, AmazonEC2ContainerRegistry
#: ReadOnly, lists the same: https://docs.aws.amazon.com/AmazonECR/latest/userguide/security-iam-awsmanpol.html).
ECR_PULL_ACTIONS = ("ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")


def container_pull_statements(tenant: Tenant) -> list[dict[str, Any]]:
    """Where the tenant runs containers (docs/containers.md): the node's root-run token refresher asks ECR for an
    authorization token (GetAuthorizationToken takes no resource but `*`: the token is per registry, and grants only
    what this role grants: https://docs.aws.amazon.com/AmazonECR/latest/userguide/registry_auth.html), and skopeo pulls
    with it from the repositories of the tenant's own account, in the stacks' region and the regions of the spec's
    `containers.registries` (validation keeps those to the same account), and from no other account's."""
    if not tenant.containers.enabled:
        return []
    # The stack's own region (its storage stack's ContainerRegistry output is that region's ECR), then the others.
    resources: list[Any] = [Sub("arn:${AWS::Partition}:ecr:${AWS::Region}:${AWS::AccountId}:repository/*")]
    regions: list[str] = []
    for host in tenant.containers.registries:
        match = ECR_REGISTRY.fullmatch(host)
        if match is not None and match["region"] not in regions:
            regions.append(match["region"])
    resources += [text("arn:${AWS::Partition}:ecr:{region}:${AWS::AccountId}:repository/*", region=region)
                  for region in regions]
    return [
        {"Sid": "EcrAuthorizationToken", "Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
        {"Sid": "PullTenantImages", "Effect": "Allow", "Action": list(ECR_PULL_ACTIONS), "Resource": resources},
    ]


def controller_statements() -> list[dict[str, Any]]:
    """Prometheus's EC2 service discovery on the controller (Describe* cannot be resource-scoped)."""
    return [{"Sid": "PrometheusEc2Discovery", "Effect": "Allow",
             "Action": ["ec2:DescribeAvailabilityZones", "ec2:DescribeInstances", "ec2:DescribeTags"],
             "Resource": "*"}]


def alert_publish_statements(tenant: Tenant) -> list[dict[str, Any]]:
    """Alertmanager on the controller (head node) publishes to the tenant's SNS receivers (monitoring.alert_receivers
    of type sns; its sns_config signs with SigV4 and, given no keys, the instance role's credentials): sns:Publish on
    those topics alone. Alertmanager runs as the Prometheus account, which the IMDS rule lets through."""
    topics = sorted({r.target for r in tenant.monitoring.alert_receivers if r.type == "sns"})
    if not topics:
        return []
    return [{"Sid": "AlertmanagerPublish", "Effect": "Allow", "Action": "sns:Publish", "Resource": topics}]


#: An Amazon Managed Prometheus remote-write URL (fmcluster.validation checks the tenant's): region, workspace id.
AMP_REMOTE_WRITE_URL = re.compile(
    r"https://aps-workspaces\.([a-z0-9-]+)\.amazonaws\.com/workspaces/(ws-[0-9a-f-]{1,64})/api/v1/remote_write")


def remote_write_statements(tenant: Tenant) -> list[dict[str, Any]]:
    """Prometheus on the controller (head node) sends to the tenant's Amazon Managed Prometheus workspace
    (monitoring.remote_write_url, SigV4 with the instance role): aps:RemoteWrite on that workspace alone."""
    url = tenant.monitoring.remote_write_url
    if not url:
        return []
    match = AMP_REMOTE_WRITE_URL.fullmatch(url)
    if match is None:
        raise ValueError(f"monitoring.remote_write_url {url!r} is not an Amazon Managed Prometheus remote-write URL "
                         "(https://aps-workspaces.REGION.amazonaws.com/workspaces/ws-ID/api/v1/remote_write)")
    region, workspace = match.groups()
    return [{"Sid": "PrometheusRemoteWrite", "Effect": "Allow", "Action": "aps:RemoteWrite",
             "Resource": text("arn:${AWS::Partition}:aps:{region}:${AWS::AccountId}:workspace/{workspace}",
                              region=region, workspace=workspace)}]
