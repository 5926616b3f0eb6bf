"""Throw-away tenants for tests (a root directory holding one tenant spec), and the manifest and nodes of a
tenant's cluster as the deploy and the AWS APIs would give them."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fmcluster.model import Tenant
from fmcluster.nodes import Node, Role, hostname_for
from fmcluster.providers.registry import provider_for
from fmcluster.images import booted_image
from fmcluster.publish import build_manifest
from fmcluster.schedulers.registry import scheduler_for
from fmcluster.stacks.render import subnet_cidrs


def make_root(tmp: Path, org: str, vpc_cidr: str, login: int = 0,
              queues: dict[str, int] | list[dict[str, Any]] | None = None,
              provider: str = "local", **extra: Any) -> Path:
    """Write inventories/<org>/group_vars/all/tenant.yml under `tmp`; return `tmp`. `queues`: name → count of
    c5.2xlarge nodes, or the spec's own list of queues.

    `extra` adds or replaces top-level keys of the spec (e.g. storage with an openzfs home)."""
    spec: dict[str, Any] = {
        "schema_version": 1,
        "org": org,
        "programme": "test",
        "provider": provider,
        "region": "ap-northeast-1",
        "availability_zone": "ap-northeast-1a",
        "scheduler": "slurm-ec2",
        "controller": {"instance_type": "m5.xlarge"},
        "login": {"instance_type": "m5.xlarge", "count": login},
        "queues": queues if isinstance(queues, list) else
        [{"name": name, "instance_type": "c5.2xlarge", "count": count} for name, count in (queues or {"cpu": 2}).items()],
        "network": {"vpc_cidr": vpc_cidr},
        "storage": {"lustre": {"deployment_type": "SCRATCH_2", "storage_capacity_gib": 1200}},
        **extra,
    }
    spec_path = tmp / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(yaml.safe_dump({"tenant": spec}, sort_keys=False))
    return tmp


REF = "0123456789abcdef0123456789abcdef01234567"
#: A public key as the deploy passes the operator's (public material; no private half exists).
OPERATOR_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFmclusterTestOperatorKeyAAAAAAAAAAAAAAAAAAAA fmcluster-test"


def manifest_for(tenant: Tenant, outputs: dict[str, str] | None = None) -> dict[str, Any]:
    """The manifest the deploy publishes for `tenant`, with its provider's and scheduler's parts."""
    provider, scheduler = provider_for(tenant), scheduler_for(tenant)
    outputs = outputs or {}
    return build_manifest(tenant, REF, outputs, provider.queue_resources, scheduler.manifest_vars(),
                          provider.manifest_vars(), scheduler.discovery(outputs),
                          booted_image(scheduler.image, provider.node_image), [OPERATOR_KEY])


def nodes_for(tenant: Tenant, drop: Sequence[str] = ()) -> list[Node]:
    """One node per instance the cluster stack makes, on the private subnet, named as EC2 names them."""
    private = ipaddress.IPv4Network(subnet_cidrs(tenant.network.vpc_cidr)["private"])
    roles: list[tuple[Role, str | None, str]] = [("controller", None, tenant.controller.name)]
    roles += [("login", None, tenant.login.name)] * tenant.login_count if tenant.login else []
    roles += [("compute", q.name, q.instance.name) for q in tenant.queues for _ in range(q.count)]
    nodes = []
    for i, (role, queue, instance_type) in enumerate(roles):
        address = str(private.network_address + 10 + i)
        nodes.append(Node(hostname_for(address), address, role, queue, f"i-{i:017x}", instance_type))
    return [n for n in nodes if n.name not in drop]
