"""Throw-away tenants for tests (a root directory holding one tenant spec), and the manifest and nodes of a
tenant's cluster as the deploy and the AWS APIs would give them."""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

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
                          booted_image(scheduler.image, provider.node_image), [OPERATOR_KEY],
                          provider.container_registry(outputs))


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


# --- a bundled local tenant deployed for real under another org (the slow tier's stand-in deploys) -------------
def invoke_org(org: str, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    from conftest import ROOT, venv_tool

    return subprocess.run([venv_tool("invoke"), *args, f"--org={org}"], cwd=ROOT, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def on_node_as_root(org: str, name: str, command: str) -> subprocess.CompletedProcess[str]:
    """`command` on node `name` as root: the operator's ssh (a Session Manager session's stand-in), then sudo."""
    return invoke_org(org, "slurm", f"--cmd=sudo -n bash -c {shlex.quote(command)}", f"--node={name}", timeout=300)


def running_instance_tags(org: str) -> list[dict[str, str]]:
    """The tags of the tenant's running instances, as the emulator's EC2 answers them (fmcluster:org = `org`)."""
    from fmcluster.model import load_tenant
    from fmcluster.providers.registry import provider_for
    from fmcluster.stacks import aws

    tenant = load_tenant(org)
    ec2 = aws.client("ec2", tenant.region, provider_for(tenant).endpoint(False, print))
    tags = [{t["Key"]: t["Value"] for t in i.get("Tags", [])}
            for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] == "running"]
    return [t for t in tags if t.get("fmcluster:org") == org]


def clear_previous_run(org: str) -> list[str]:
    """Remove what an earlier run of a fixed-name tenant left on this machine (hosts, bridge, substrate directory,
    baked images) before a tier deploys it again: a run killed mid-tier, or a machine copied while one ran, leaves the
    state files without their processes, and `invoke image` then refuses to replace a layer those dead hosts boot.
    The emulator's state lives in the inventory's generated folder, which each fixture writes afresh."""
    from fmcluster.providers.local.hosts import remove_all
    from fmcluster.providers.local.layers import baked_root

    gone = remove_all(org)
    if baked_root(org).exists():
        shutil.rmtree(baked_root(org))
        gone.append(str(baked_root(org)))
    if gone:
        print(f"{org}: removed what an earlier run left: {', '.join(gone)}", file=sys.stderr)
    return gone


def substrate_leftovers(org: str) -> list[str]:
    """What a destroyed local tenant must not leave: its network namespaces, mounts and substrate directory."""
    found = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
             if ns.startswith(f"fmc-{org}-")]
    found += [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if f"fmcluster-substrate/{org}" in line]
    if Path(f"/var/lib/fmcluster-substrate/{org}").exists():
        found.append(f"/var/lib/fmcluster-substrate/{org}")
    return found


def deploy_copy(bundled: str, bundled_vpc: str, org: str, vpc: str) -> Iterator[subprocess.CompletedProcess[str]]:
    """Deploy a copy of bundled tenant `bundled` as `org` in `vpc` (a range no other test uses); destroy it after."""
    from conftest import ROOT

    if os.geteuid() != 0:
        pytest.skip("local hosts need root (namespaces, mounts)")
    spec = ROOT / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "inventories" / bundled / "group_vars" / "all" / "tenant.yml").read_text()
    spec.write_text(text.replace(f"org: {bundled}", f"org: {org}").replace(bundled_vpc, vpc))
    clear_previous_run(org)
    try:
        yield invoke_org(org, "deploy", timeout=2400)  # the nodes boot the pristine image and install everything
    finally:
        invoke_org(org, "destroy", "--yes")
        shutil.rmtree(ROOT / "inventories" / org, ignore_errors=True)
