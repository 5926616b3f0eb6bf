"""Tenant → rendered CloudFormation templates and parameters, offline and without side effects.

The templates in cfn/ are Jinja2 sources. Values from the tenant spec and the instance catalog are
rendered into them (so the rendered template is the complete record of what a stack holds, and a
changed tenant value shows up in the change set as exactly the resources it touches, on AWS and on
the emulator alike). Structure that varies per tenant is rendered too: one launch template per queue
and, per launch template, as many EFA network interfaces as the catalog says (P5: 32). CloudFormation
Parameters carry only what flows in from outside the spec: the previous stacks' outputs, the provider
and the public AMI parameter paths.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import yaml

from fmcluster.catalog import InstanceType
from fmcluster.model import Tenant
from fmcluster.parallelcluster.config import NODE_READ_PREFIXES, NODE_WRITE_PREFIXES, secret_prefix
from fmcluster.paths import PACKAGE_DIR

CFN_DIR = PACKAGE_DIR.parent.parent / "cfn"
LIFECYCLE_DIR = CFN_DIR / "hyperpod-lifecycle"
LIFECYCLE_PREFIX = "hyperpod/lifecycle/"
STACK_KEYS = ("network", "storage", "cluster")

# Public SSM parameters of the images each accelerator kind boots from (resolved by CloudFormation).
AMI_PARAMETERS: dict[str, tuple[str, str]] = {
    "cuda": ("GpuImageId", "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"),
    "neuron": ("NeuronImageId", "/aws/service/neuron/dlami/multi-framework/ubuntu-22.04/latest/image_id"),
    "none": ("CpuImageId", "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id"),
}
# The emulator ships no DLAMI/Ubuntu parameters; on provider local every image parameter points at
# the Amazon Linux parameter moto does ship (its AMI id is as fake as the instances launched from it).
EMULATOR_AMI_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"

FILE_SYSTEM_PORTS = (
    ("tcp", 988, 988, "Lustre"),
    ("tcp", 1018, 1023, "Lustre"),
    ("tcp", 111, 111, "NFS portmapper (OpenZFS)"),
    ("udp", 111, 111, "NFS portmapper (OpenZFS)"),
    ("tcp", 2049, 2049, "NFS (OpenZFS)"),
    ("udp", 2049, 2049, "NFS (OpenZFS)"),
    ("tcp", 20001, 20003, "NFS mount, status, lock (OpenZFS)"),
    ("udp", 20001, 20003, "NFS mount, status, lock (OpenZFS)"),
)


@dataclass(frozen=True)
class OutputRef:
    """A stack parameter whose value is another stack's output, known only after that stack exists."""

    stack: str
    output: str
    # Used when the output is absent because the emulator did not create the resource behind it.
    when_missing: str | None = None

    def describe(self) -> str:
        return f"<output {self.output} of the {self.stack} stack>"


ParameterValue = str | OutputRef


@dataclass(frozen=True)
class RenderedStack:
    key: str  # network | storage | cluster
    name: str  # CloudFormation stack name, e.g. fmc-demo-network
    source: Path  # the Jinja2 template in cfn/
    body: str  # rendered CloudFormation YAML
    parameters: dict[str, ParameterValue] = field(default_factory=dict)

    def resource_types(self) -> dict[str, str]:
        """Logical id → resource type, from the rendered body."""
        return {name: res["Type"] for name, res in load_cfn_yaml(self.body).get("Resources", {}).items()}

    def resolved_parameters(self, outputs: dict[str, dict[str, str]]) -> tuple[dict[str, str], list[str]]:
        """Parameters with OutputRefs replaced by `outputs[stack][key]`; also the notes on substitutes."""
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
            else:
                resolved[key] = value
        return resolved, notes


class _CfnLoader(yaml.SafeLoader):
    """YAML loader that accepts CloudFormation's short-form tags (!Ref, !Sub, ...)."""


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


def logical_name(name: str) -> str:
    """`gpu-a_1` → `GpuA1`: a CloudFormation logical-id fragment from a tenant name."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", name) if part)


def _subnets(vpc_cidr: str) -> tuple[str, str]:
    """Public: the first /24 (or the first quarter of a small VPC); private: the upper half."""
    vpc = ipaddress.ip_network(vpc_cidr)
    lower, upper = vpc.subnets(prefixlen_diff=1)
    public = next(lower.subnets(new_prefix=max(24, lower.prefixlen + 1)))
    return str(public), str(upper)


def _legacy_import_policy(events: tuple[str, ...]) -> str:
    """PERSISTENT_1/SCRATCH file systems take one AutoImportPolicy value instead of a DRA."""
    wanted = set(events)
    if not wanted:
        return "NONE"
    if wanted >= {"NEW", "CHANGED", "DELETED"}:
        return "NEW_CHANGED_DELETED"
    return "NEW_CHANGED" if "CHANGED" in wanted else "NEW"


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(CFN_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - renders YAML, not HTML
    )


def _tags(tenant: Tenant, name: str, extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    tags = {**tenant.tags, "Name": f"{tenant.stack_prefix}-{name}", **(extra or {})}
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _interfaces(instance: InstanceType, public: bool) -> list[dict[str, Any]]:
    """One network interface per EFA device (card i; the primary on card 0, device 0), else one plain ENI."""
    if not instance.has_efa:
        return [{"device_index": 0, "card": 0, "efa": False, "public": public}]
    return [
        {"device_index": 0 if card == 0 else 1, "card": card, "efa": True, "public": public and card == 0}
        for card in range(instance.efa_interfaces)
    ]


def _node_roles(tenant: Tenant, login_sg: bool) -> list[dict[str, Any]]:
    def groups(instance: InstanceType, extra: list[str]) -> str:
        refs = (["EfaSecurityGroupId"] if instance.has_efa else []) + ["NodeSecurityGroupId"] + extra
        return json.dumps([{"Ref": r} for r in refs])

    def image(instance: InstanceType) -> str:
        return AMI_PARAMETERS[instance.accelerator][0]

    roles: list[dict[str, Any]] = [{
        "role": "controller", "queue": "", "logical": "Controller", "slug": "controller",
        "instance_type": tenant.controller.name, "image_parameter": image(tenant.controller),
        "count": 1, "root_gib": 200, "capacity_reservation_id": None, "public": False,
        "subnet_parameter": "PrivateSubnetId", "efa": tenant.controller.has_efa,
        "interfaces": _interfaces(tenant.controller, False), "groups_json": groups(tenant.controller, []),
        "role_tags": {"fmcluster:role": "controller"},
        "comment": f"Slurm controller: 1x {tenant.controller.name}", "comment_short": "the controller",
    }]
    if tenant.login is not None:
        public = login_sg
        roles.append({
            "role": "login", "queue": "", "logical": "Login", "slug": "login",
            "instance_type": tenant.login.name, "image_parameter": image(tenant.login),
            "count": tenant.login_count, "root_gib": 200, "capacity_reservation_id": None, "public": public,
            "subnet_parameter": "PublicSubnetId" if public else "PrivateSubnetId", "efa": tenant.login.has_efa,
            "interfaces": _interfaces(tenant.login, public),
            "groups_json": groups(tenant.login, ["LoginSecurityGroupId"] if login_sg else []),
            "role_tags": {"fmcluster:role": "login"},
            "comment": f"Login nodes: {tenant.login_count}x {tenant.login.name}", "comment_short": "the login nodes",
        })
    for q in tenant.queues:
        efa = f", {q.instance.efa_interfaces} EFA interfaces" if q.instance.has_efa else ""
        roles.append({
            "role": "compute", "queue": q.name, "logical": f"Queue{logical_name(q.name)}", "slug": f"queue-{q.name}",
            "instance_type": q.instance.name, "image_parameter": image(q.instance),
            "count": q.count, "root_gib": 500 if q.instance.accelerator != "none" else 100,
            "capacity_reservation_id": q.capacity_reservation_id, "public": False,
            "subnet_parameter": "PrivateSubnetId", "efa": q.instance.has_efa,
            "interfaces": _interfaces(q.instance, False), "groups_json": groups(q.instance, []),
            "role_tags": {"fmcluster:role": "compute", "fmcluster:queue": q.name},
            "comment": f"Queue {q.name}: {q.count}x {q.instance.name}{efa}",
            "comment_short": f"queue {q.name}",
        })
    return roles


def _context(tenant: Tenant) -> dict[str, Any]:
    public_cidr, private_cidr = _subnets(tenant.network.vpc_cidr)
    lustre = tenant.storage.lustre
    dra = lustre.data_repository
    login_sg = tenant.network.ssh_ingress_cidr is not None
    accelerators = {tenant.controller.accelerator} | {q.instance.accelerator for q in tenant.queues}
    if tenant.login is not None:
        accelerators.add(tenant.login.accelerator)
    images = [
        {"parameter": AMI_PARAMETERS[kind][0], "ssm_path": AMI_PARAMETERS[kind][1],
         "description": f"Image of the {'CPU' if kind == 'none' else kind} nodes: a public SSM parameter path that "
                        f"CloudFormation resolves at each deploy; fmcluster passes {AMI_PARAMETERS[kind][1]} "
                        "(on the emulator, which lacks it: Amazon Linux's)."}
        for kind in ("cuda", "neuron", "none") if kind in accelerators
    ]
    node_roles = _node_roles(tenant, login_sg)
    instance_groups = [{"name": "controller", "instance_type": f"ml.{tenant.controller.name}", "count": 1,
                        "threads_per_core": 1}]
    if tenant.login is not None:
        instance_groups.append({"name": "login", "instance_type": f"ml.{tenant.login.name}",
                                "count": tenant.login_count, "threads_per_core": 1})
    instance_groups += [{"name": q.name, "instance_type": f"ml.{q.instance.name}", "count": q.count,
                         "threads_per_core": 1} for q in tenant.queues]
    return {
        "org": tenant.org,
        "scheduler": tenant.scheduler,
        # scheduler parallelcluster: the storage stack's node policy (fmcluster.parallelcluster.config)
        "node_read_prefixes": NODE_READ_PREFIXES,
        "node_list_prefixes": [p + "*" for p in NODE_READ_PREFIXES],
        "node_write_prefixes": NODE_WRITE_PREFIXES,
        "secret_prefix": secret_prefix(tenant.org),
        "prefix": tenant.stack_prefix,
        "spec_file": f"inventories/{tenant.org}/group_vars/all/tenant.yml",
        "az": tenant.availability_zone,
        "vpc_cidr": tenant.network.vpc_cidr,
        "public_cidr": public_cidr,
        "private_cidr": private_cidr,
        "ssh_ingress_cidr": tenant.network.ssh_ingress_cidr,
        "login_sg": login_sg,
        "s3_versioning": tenant.storage.s3_versioning,
        "lustre": lustre,
        "dra": dra,
        "dra_resource": dra is not None and lustre.deployment_type == "PERSISTENT_2",
        "legacy_import_policy": _legacy_import_policy(dra.import_policy) if dra else "NONE",
        "openzfs": tenant.storage.openzfs,
        "fs_ports": FILE_SYSTEM_PORTS,
        "queues": tenant.queues,
        "node_roles": node_roles,
        "any_efa": any(role["efa"] for role in node_roles),
        "images": images,
        "instance_groups": instance_groups,
        "lifecycle_prefix": LIFECYCLE_PREFIX,
        "tags_json": lambda name, extra=None: json.dumps(_tags(tenant, name, extra)),
        "asg_tags_json": lambda name, extra=None: json.dumps(
            [{**t, "PropagateAtLaunch": True} for t in _tags(tenant, name, extra)]),
    }


def cluster_template_name(tenant: Tenant) -> str:
    return f"cluster-{tenant.scheduler}.yaml"


def render_stacks(tenant: Tenant) -> list[RenderedStack]:
    """The tenant's stacks in dependency order (network → storage → cluster), rendered offline.

    Scheduler parallelcluster has no cluster stack of ours: ParallelCluster creates its own from the
    cluster config fmcluster.parallelcluster renders (network and storage stay ours)."""
    if tenant.scheduler not in ("slurm-ec2", "hyperpod", "parallelcluster"):
        raise ValueError(f"scheduler {tenant.scheduler!r} has no cluster template yet (cfn/cluster-*.yaml)")
    env, ctx = _environment(), _context(tenant)
    provider = tenant.provider
    net = "network"
    network_params: dict[str, ParameterValue] = {"Provider": provider}
    storage_params: dict[str, ParameterValue] = {
        "Provider": provider,
        "VpcId": OutputRef(net, "VpcId"),
        "VpcCidr": OutputRef(net, "VpcCidr"),
        "PrivateSubnetId": OutputRef(net, "PrivateSubnetId"),
        "NodeSecurityGroupId": OutputRef(net, "NodeSecurityGroupId"),
    }
    cluster_params: dict[str, ParameterValue] = {
        "Provider": provider,
        "PrivateSubnetId": OutputRef(net, "PrivateSubnetId"),
        "EfaSecurityGroupId": OutputRef(net, "EfaSecurityGroupId"),
        "NodeSecurityGroupId": OutputRef(net, "NodeSecurityGroupId"),
        "DataBucketName": OutputRef("storage", "DataBucketName"),
    }
    if tenant.scheduler == "slurm-ec2":
        cluster_params["PublicSubnetId"] = OutputRef(net, "PublicSubnetId")
        cluster_params["PlacementGroupName"] = OutputRef(net, "PlacementGroupName", when_missing="")
        if ctx["login_sg"]:
            cluster_params["LoginSecurityGroupId"] = OutputRef(net, "LoginSecurityGroupId")
        for image in ctx["images"]:
            cluster_params[image["parameter"]] = EMULATOR_AMI_PARAMETER if provider == "local" else image["ssm_path"]
    sources = {"network": "network.yaml", "storage": "storage.yaml", "cluster": cluster_template_name(tenant)}
    params = {"network": network_params, "storage": storage_params, "cluster": cluster_params}
    stacks = []
    for key in STACK_KEYS if tenant.scheduler != "parallelcluster" else ("network", "storage"):
        body = env.get_template(sources[key]).render(ctx)
        declared = load_cfn_yaml(body).get("Parameters", {})
        stacks.append(RenderedStack(
            key=key,
            name=f"{tenant.stack_prefix}-{key}",
            source=CFN_DIR / sources[key],
            body=body,
            # Only what the rendered template declares (e.g. no EFA group for a CPU-only cluster).
            parameters={k: v for k, v in params[key].items() if k in declared},
        ))
    return stacks
