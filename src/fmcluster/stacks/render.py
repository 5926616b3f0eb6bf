"""Tenant → rendered CloudFormation templates and parameters, offline and without side effects.

The templates are Python data (fmcluster.stacks.templates.*, fmcluster.schedulers.*.template), dumped to YAML by
fmcluster.stacks.cfn: tenant values are leaves of the structure, never text a YAML or `Fn::Sub` parser reads again,
so no value can change a template's structure (tests/test_stack_hostile_values.py proves it for every string
field). Values from the spec and the catalog are rendered in, so the rendered template is the complete record of
what a stack holds and a changed tenant value shows in the change set as exactly the resources it touches.
CloudFormation Parameters carry only what flows in from outside the spec: the previous stacks' outputs (typed:
AWS::EC2::VPC::Id, ...::Subnet::Id, ...::SecurityGroup::Id) and the AMI ids, resolved once and
pinned (see `ImageRef`).

`node_user_data` is the one place the EC2 nodes' boot script is written (fmcluster.schedulers.hyperpod.lifecycle
gives HyperPod's on_create.sh the same variables). The cluster stack is the one the tenant's scheduler hands over
(`Scheduler.cluster_template`, or its stand-in where the provider lacks the scheduler's service), the storage stack
takes the parts it adds (`Scheduler.storage_parts`); the caller hands the scheduler in, the registry stays above.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fmcluster import baked
from fmcluster.images import load_images
from fmcluster.model import Tenant
from fmcluster.paths import PACKAGE_DIR
from fmcluster.stacks import cfn
from fmcluster.stacks.first_boot import (
    BOOT_VARIABLES, S3_CLIENT, S3_CLIENT_PLACEHOLDER, USER_DATA_SCRIPT, boot_environment, first_boot_script,
    packed_s3_client, s3_client_writer,
)
from fmcluster.stacks.templates import ClusterTemplate, SchedulerStacks, image, network, storage
from fmcluster.stacks.templates.common import (
    BOOTSTRAP_PREFIX, DEPLOY_PRINCIPAL_PARAMETER, LIFECYCLE_PREFIX, MANIFEST_PREFIX, NODE_READ_PREFIXES, REPORT_PREFIX,
    logical_name,
)

__all__ = ["BOOT_VARIABLES", "BOOTSTRAP_PREFIX", "BakedImageRef", "CapacityRef", "DeployerRef", "EMULATOR_AMI_PARAMETER", "ImageRef", "NamedImageRef",
           "LIFECYCLE_PREFIX", "MANIFEST_PREFIX", "NODE_READ_PREFIXES", "OutputRef", "REPORT_PREFIX", "RenderedStack",
           "S3_CLIENT", "S3_CLIENT_PLACEHOLDER", "STACK_KEYS", "USER_DATA_SCRIPT", "boot_environment",
           "load_cfn_yaml", "logical_name", "first_boot_script", "node_user_data",
           "packed_s3_client", "render_image_stack", "render_stacks", "s3_client_writer", "user_data_text"]

SOURCE_ROOT = PACKAGE_DIR.parent.parent
TEMPLATES_DIR = PACKAGE_DIR / "stacks" / "templates"
STACK_KEYS = ("network", "storage", "cluster")

# The emulator ships no DLAMI/Ubuntu parameters; on provider local every image is resolved from the
# Amazon Linux parameter moto does ship (its AMI id is as fake as the instances launched from it).
EMULATOR_AMI_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"


@dataclass(frozen=True)
class OutputRef:
    """A stack parameter whose value is another stack's output, known only after that stack exists."""

    stack: str
    output: str
    # Used when the output is absent because the emulator did not create the resource behind it.
    when_missing: str | None = None

    def describe(self) -> str:
        return f"<output {self.output} of the {self.stack} stack>"


@dataclass(frozen=True)
class ImageRef:
    """An AMI id parameter: resolved from the public SSM parameter `ssm_path` when the stack is
    created, then kept (the deployed stack's value is reused) so a redeploy never replaces a node
    because "latest" moved. Refreshing is an explicit choice (`refresh_images=True`)."""

    ssm_path: str

    def describe(self) -> str:
        return f"<AMI resolved once from {self.ssm_path} when the stack is created, then kept>"


@dataclass(frozen=True)
class NamedImageRef:
    """An AMI id parameter for an image with no public SSM parameter (PCS's sample AMIs): the newest available image
    named `name` (EC2 name filter, wildcards allowed) of `owner`, resolved and kept as ImageRef's are."""

    owner: str
    name: str

    def describe(self) -> str:
        return f"<AMI resolved once, the newest named {self.name} of owner {self.owner}, when the stack is created, then kept>"


@dataclass(frozen=True)
class BakedImageRef:
    """An AMI id parameter of a node kind the tenant may have baked (`invoke image`, issue 40): the AMI recorded for
    `kind` (fmcluster.baked.record_path) while it was baked from the install set of the commit being deployed; a
    stale or vanished one is refused (fmcluster.baked.aws_image), never booted; where none is recorded, `base`, the
    catalogued image, resolved and kept as before. `pristine` is what the image stack baked on (its digest's base).
    `kept`: a resource created once reads it (ClusterTemplate.kept_images): once the stack holds an AMI, that stays."""

    kind: str
    pristine: str
    base: ImageRef | NamedImageRef
    kept: bool = False
    #: Why only a baked image serves (ClusterTemplate.baked_required): none recorded is then refused, not `base`.
    required: str = ""

    def describe(self) -> str:
        when = "when the stack is created (then kept: an instance created once reads it)" if self.kept else \
            "while its install set is this commit's"
        fallback = "refused (`invoke image` first)" if self.required else self.base.describe()[1:-1]
        return f"<the {self.kind} image `invoke image` baked, {when}; where none is recorded {fallback}>"


@dataclass(frozen=True)
class CapacityRef:
    """When a Capacity Block queue is scaled in: known only from EC2, by the capacity pre-flight
    (fmcluster.capacity.Preflight.scale_in), which the deploy runs before the stacks."""

    queue: str

    def describe(self) -> str:
        return f"<queue {self.queue}'s Capacity Block end minus the margin, read from EC2 by the capacity pre-flight>"


@dataclass(frozen=True)
class DeployerRef:
    """Who runs the deploy (STS GetCallerIdentity's UserId up to ':'), the one principal the bucket policy lets write
    what nodes run (fmcluster.stacks.templates.common.control_prefix_statement): known only with credentials."""

    def describe(self) -> str:
        return "<the deploy's principal: STS GetCallerIdentity's UserId up to ':', read when the stack is deployed>"


ParameterValue = str | OutputRef | ImageRef | NamedImageRef | BakedImageRef | CapacityRef | DeployerRef
AnyImageRef = ImageRef | NamedImageRef | BakedImageRef
ImageResolver = Callable[[str, AnyImageRef], str]  # (parameter name, ref) -> AMI id


@dataclass(frozen=True)
class RenderedStack:
    key: str  # network | storage | cluster
    name: str  # CloudFormation stack name, e.g. fmc-demo-network
    source: Path  # the template module it is built by
    body: str  # rendered CloudFormation YAML
    parameters: dict[str, ParameterValue] = field(default_factory=dict)

    def resource_types(self) -> dict[str, str]:
        """Logical id → resource type, from the rendered body."""
        return {name: res["Type"] for name, res in load_cfn_yaml(self.body).get("Resources", {}).items()}

    def resolved_parameters(self, outputs: dict[str, dict[str, str]], resolve_image: ImageResolver | None = None,
                            capacity: dict[str, str] | None = None,
                            deployer: Callable[[], str] | None = None) -> tuple[dict[str, str], list[str]]:
        """Parameters with OutputRefs replaced by `outputs[stack][key]`, ImageRefs by `resolve_image`,
        CapacityRefs by `capacity[queue]` (the pre-flight's scale-in times) and the DeployerRef by `deployer()`; also
        the notes on substitutes. KeyError when something is not known yet."""
        resolved: dict[str, str] = {}
        notes: list[str] = []
        for key, value in self.parameters.items():
            if isinstance(value, OutputRef):
                got = outputs.get(value.stack, {}).get(value.output)
                if got is None:
                    if value.when_missing is None:
                        raise KeyError(f"{self.name}: parameter {key} needs {value.describe()}, which does not exist")
                    notes.append(f"{key}: {value.describe()} does not exist; using {value.when_missing!r}")
                    got = value.when_missing
                resolved[key] = got
            elif isinstance(value, CapacityRef):
                if capacity is None or value.queue not in capacity:
                    raise KeyError(f"{self.name}: parameter {key} needs {value.describe()}")
                resolved[key] = capacity[value.queue]
            elif isinstance(value, DeployerRef):
                if deployer is None:
                    raise KeyError(f"{self.name}: parameter {key} needs {value.describe()}")
                resolved[key] = deployer()
            elif isinstance(value, (ImageRef, NamedImageRef, BakedImageRef)):
                if resolve_image is None:
                    raise KeyError(f"{self.name}: parameter {key} needs {value.describe()}")
                resolved[key] = resolve_image(key, value)
            else:
                resolved[key] = value
        return resolved, notes


class _CfnLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML loader that accepts CloudFormation's short-form tags (!Ref, !Sub, ...); libyaml's parser
    when PyYAML has it (checks and tests read every rendered template)."""


def _cfn_tag(loader: Any, suffix: str, node: Any) -> dict[str, Any]:
    name = "Ref" if suffix == "Ref" else f"Fn::{suffix}"
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {name: value}


_CfnLoader.add_multi_constructor("!", _cfn_tag)


def load_cfn_yaml(text: str) -> dict[str, Any]:
    data = yaml.load(text, Loader=_CfnLoader)  # noqa: S506 - a SafeLoader subclass
    return data if isinstance(data, dict) else {}


# --- the node boot contract -------------------------------------------------------------------------

_USER_DATA_HEAD = """#!/bin/bash
# fmcluster node boot (written by fmcluster.stacks.render.node_user_data): the FMCLUSTER_* environment below,
# then fmcluster/node/boot/node-user-data.sh. FMCLUSTER_SIGNAL_RESOURCE names the resource whose CreationPolicy waits
# for this node's `cloudformation:SignalResource` (the node agent sends it after its first converge).
"""
def node_user_data(*, org: str, role: str, queue: str, signal_resource: str) -> cfn.Fn:
    """EC2 user data of every slurm-ec2 node (controller, login, compute): export the boot
    environment, then src/fmcluster/node/boot/node-user-data.sh (fetch and run the node bootstrap).

    The script is one Fn::Join (never Fn::Sub): tenant values are shell-quoted literal parts, the
    bucket, region and stack name CloudFormation references."""
    env = boot_environment(org=org, bucket=cfn.Ref("DataBucketName"), region=cfn.Ref("AWS::Region"),
                           stack=cfn.Ref("AWS::StackName"), role=role, queue=queue, signal_resource=signal_resource)
    parts: list[Any] = [_USER_DATA_HEAD]
    for name, value in env.items():
        parts += [f"export {name}=", shlex.quote(value) if isinstance(value, str) else value, "\n"]
    parts.append(first_boot_script())
    return cfn.user_data(parts)


def user_data_text(user_data: Any) -> str:
    """The user data script as text, with CloudFormation references shown as ${Name} (for review and
    tests). Accepts the rendered (long-form) or the built (cfn.Fn) structure."""
    if isinstance(user_data, cfn.Fn):
        user_data = load_cfn_yaml(cfn.dump({"x": user_data}))["x"]
    value = user_data.get("Fn::Base64", user_data) if isinstance(user_data, dict) else user_data

    def flat(node: Any) -> str:
        if isinstance(node, str):
            return node
        if isinstance(node, dict) and "Ref" in node:
            return "${" + str(node["Ref"]) + "}"
        if isinstance(node, dict) and "Fn::Sub" in node:
            return str(node["Fn::Sub"])
        if isinstance(node, dict) and "Fn::Join" in node:
            delimiter, parts = node["Fn::Join"]
            return str(delimiter).join(flat(p) for p in parts)
        raise ValueError(f"unexpected user data node {node!r}")

    return flat(value)


# --- rendering ----------------------------------------------------------------------------------------

def cluster_template(tenant: Tenant, scheduler: SchedulerStacks) -> ClusterTemplate | None:
    """The cluster stack the tenant's scheduler hands over: its own, or its stand-in where the provider lacks the
    scheduler's service (provider local); None where the service makes the cluster itself."""
    if not tenant.capabilities.stand_in:
        return scheduler.cluster_template
    if scheduler.stand_in_template is None:
        raise ValueError(f"scheduler {tenant.scheduler!r} makes its cluster with its own service, which provider "
                         f"{tenant.provider!r} does not have, and it has no stand-in (src/fmcluster/schedulers/)")
    return scheduler.stand_in_template


def _build(tenant: Tenant, key: str, cluster: ClusterTemplate | None, scheduler: SchedulerStacks) -> dict[str, Any]:
    if key == "network":
        return network.build(tenant)
    if key == "storage":
        return storage.build(tenant, scheduler.storage_parts())
    if cluster is None:
        raise ValueError(f"scheduler {tenant.scheduler!r} makes its own cluster stack: fmcluster builds none")
    return cluster.build(tenant, node_user_data)


def subnet_cidrs(vpc_cidr: str) -> dict[str, str]:
    """The cluster's subnets in the VPC, by name (network stack: PublicSubnet, PrivateSubnet)."""
    public, private = network.subnets(vpc_cidr)
    return {"public": public, "private": private}


def baked_image_refs(tenant: Tenant, scheduler: SchedulerStacks, cluster: ClusterTemplate,
                     params: dict[str, ParameterValue]) -> dict[str, ParameterValue]:
    """The cluster's AMI parameters a baked image may fill (ClusterTemplate.baked_images), each its BakedImageRef over
    the ref it had. None on a provider that bakes its own (the local substrate boots its layers, not an AMI)."""
    if tenant.capabilities.provider.bakes_images:
        return {}
    refs: dict[str, ParameterValue] = {}
    for name, kind in cluster.baked_images(tenant).items():
        base = params[name]
        if not isinstance(base, (ImageRef, NamedImageRef)):
            raise ValueError(f"{cluster.source.name}: baked image parameter {name} is not an AMI parameter")
        found = load_images()[scheduler.image(baked.KIND_ACCELERATOR[kind])]
        refs[name] = BakedImageRef(kind, image.pristine(found, cluster.image_steps()), base,
                                   name in cluster.kept_images(tenant), cluster.baked_required)
    return refs


def render_stacks(tenant: Tenant, scheduler: SchedulerStacks,
                  image_parameter: Callable[[str], str] = lambda path: path) -> list[RenderedStack]:
    """The tenant's stacks in dependency order (network → storage → cluster), rendered offline, with what the tenant's
    scheduler hands over (`scheduler`: the caller's, fmcluster.schedulers.registry.scheduler_for(tenant)).

    A scheduler whose service makes the cluster has no cluster stack of ours on AWS: the service makes its own from
    what the scheduler's folder renders (network and storage stay ours); on provider local the stand-in's stack
    takes its place."""
    cluster = cluster_template(tenant, scheduler)
    net = "network"
    network_params: dict[str, ParameterValue] = {}
    storage_params: dict[str, ParameterValue] = {
        "VpcId": OutputRef(net, "VpcId"),
        "VpcCidr": OutputRef(net, "VpcCidr"),
        "PrivateSubnetId": OutputRef(net, "PrivateSubnetId"),
        "NodeSecurityGroupId": OutputRef(net, "NodeSecurityGroupId"),
        DEPLOY_PRINCIPAL_PARAMETER: DeployerRef(),
    }
    cluster_params: dict[str, ParameterValue] = {
        # A cluster stack with a security group of its own (PCS's controller interface) needs the VPC.
        "VpcId": OutputRef(net, "VpcId"),
        "PrivateSubnetId": OutputRef(net, "PrivateSubnetId"),
        "PublicSubnetId": OutputRef(net, "PublicSubnetId"),
        "EfaSecurityGroupId": OutputRef(net, "EfaSecurityGroupId"),
        "NodeSecurityGroupId": OutputRef(net, "NodeSecurityGroupId"),
        "LoginSecurityGroupId": OutputRef(net, "LoginSecurityGroupId"),
        "PlacementGroupName": OutputRef(net, "PlacementGroupName", when_missing=""),
        "DataBucketName": OutputRef("storage", "DataBucketName"),
        # The file systems a scheduler's service mounts itself (HyperPod); aws only: empty on the emulator.
        "LustreDnsName": OutputRef("storage", "LustreDnsName", when_missing=""),
        "LustreMountName": OutputRef("storage", "LustreMountName", when_missing=""),
        "HomeDnsName": OutputRef("storage", "HomeDnsName", when_missing=""),
    }
    if cluster is not None:
        for name, path in cluster.image_parameters(tenant).items():
            cluster_params[name] = ImageRef(image_parameter(path))
        for name, (owner, pattern) in cluster.image_names(tenant).items():
            cluster_params[name] = NamedImageRef(owner, pattern)
        cluster_params |= baked_image_refs(tenant, scheduler, cluster, cluster_params)
        for name, queue in cluster.capacity_parameters(tenant).items():
            cluster_params[name] = CapacityRef(queue)
    sources = {"network": TEMPLATES_DIR / "network.py", "storage": TEMPLATES_DIR / "storage.py",
               **({"cluster": cluster.source} if cluster is not None else {})}
    params = {"network": network_params, "storage": storage_params, "cluster": cluster_params}
    stacks = []
    for key in STACK_KEYS if cluster is not None else ("network", "storage"):
        template = _build(tenant, key, cluster, scheduler)
        declared = template.get("Parameters", {})
        stacks.append(RenderedStack(
            key=key,
            name=f"{tenant.stack_prefix}-{key}",
            source=sources[key],
            body=cfn.dump(template),
            # Only what the rendered template declares (e.g. no EFA group for a CPU-only cluster).
            parameters={k: v for k, v in params[key].items() if k in declared},
        ))
    return stacks


#: The image stack's key: a stack of its own, deployed by `invoke image`, never by the deploy (each create or update
#: of it builds images, which takes an hour).
IMAGE_STACK_KEY = "image"


def render_image_stack(tenant: Tenant, scheduler: SchedulerStacks, commit: str, digests: dict[str, str],
                       image_parameter: Callable[[str], str] = lambda path: path) -> RenderedStack:
    """The tenant's image stack (fmcluster.stacks.templates.image), rendered offline: `commit` the bundle it builds
    from, `digests` each kind's install-set digest (fmcluster.baked.committed_digest), recorded on the images. Its
    parent images are pinned like the cluster stack's (ImageRef, from the catalogued SSM parameter)."""
    template = image.build(tenant, scheduler)
    kinds = image.kind_images(tenant, scheduler)
    if set(digests) != set(kinds):
        raise ValueError(f"image stack of {tenant.org!r}: digests for {sorted(digests)}, kinds {sorted(kinds)}")
    params: dict[str, ParameterValue] = {
        "VpcId": OutputRef("network", "VpcId"),
        "PrivateSubnetId": OutputRef("network", "PrivateSubnetId"),
        "DataBucketName": OutputRef("storage", "DataBucketName"),
        "SourceCommit": commit,
    }
    for kind, found in kinds.items():
        params[image.parent_parameter(kind)] = ImageRef(image_parameter(str(found.ssm_parameter)))
        params[image.digest_parameter(kind)] = digests[kind]
    return RenderedStack(key=IMAGE_STACK_KEY, name=f"{tenant.stack_prefix}-{IMAGE_STACK_KEY}",
                         source=TEMPLATES_DIR / "image.py", body=cfn.dump(template), parameters=params)
