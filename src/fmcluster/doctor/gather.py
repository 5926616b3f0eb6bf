"""Gathering the evidence of one tenant's cluster, through the same doors an operator uses: the AWS APIs (the
emulator locally), ssh to each node (the provider's client_argv, as `invoke slurm --node`), where the node's own
health program runs its checks (`fmcluster-health check`, never a copy of them), Slurm's clients on the login
node and Prometheus's HTTP API on the controller.

Fail closed: whatever cannot be read becomes a fact (`unreachable`, `node_unreachable`), which the knowledge base
turns into a finding; nothing unread counts as healthy.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fmcluster.escape import escaped, neutral
from fmcluster.doctor.detect import Evidence
from fmcluster.model import Tenant
from fmcluster.nodes import Node, as_root

if TYPE_CHECKING:
    from fmcluster.capabilities import ApiCapabilities
    from fmcluster.providers import Provider

Out = Callable[[str], object]
#: Where the node_health role installs the program and the node's config (fmcluster.health.inventory).
HEALTH_PROGRAM = "/opt/fmcluster/health/bin/fmcluster-health"
HEALTH_CONFIG = "/etc/fmcluster/health/config.json"
#: The NCCL environment the nccl role writes (roles/nccl/defaults/main.yml nccl_profile_path).
NCCL_ENV_FILE = "/etc/profile.d/fmcluster-nccl.sh"
SINFO = "sinfo --noheader --Node '--format=%N|%T|%E'"
ALERTS_QUERY = ("python3 -c \"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("
                "'http://127.0.0.1:9090/api/v1/alerts', timeout=10).read().decode())\"")
SSH_TIMEOUT = 90.0
_MARK = "==fmcluster-doctor:"


@dataclass
class Gathered:
    evidence: Evidence = field(default_factory=Evidence)
    checked: list[str] = field(default_factory=list)
    """What was read (the positive evidence behind a clean result)."""
    notes: list[str] = field(default_factory=list)
    """What stands in for AWS here, and what does not apply."""
    alerts_firing: int | None = None


def node_script(node: Node) -> str:
    """What runs on one node: its own health checks (compute nodes) and its NCCL environment file."""
    lines = ["echo '" + _MARK + "up=='"]
    if node.role == "compute":
        lines += ["echo '" + _MARK + "health=='",
                  as_root(f"{HEALTH_PROGRAM} check --context=manual --no-drain --json --config={HEALTH_CONFIG} "
                          f"--node={shlex.quote(node.name)}") + f" 2>&1; echo '{_MARK}rc='$?'=='"]
    lines += ["echo '" + _MARK + "nccl-env=='", f"cat {NCCL_ENV_FILE} 2>/dev/null; true"]
    return "; ".join(lines)


def parse_node_output(text: str) -> dict[str, str]:
    """Sections of node_script's output: {'up': '', 'health': '<json>', 'rc': '1', 'nccl-env': '...'}."""
    sections: dict[str, str] = {}
    current = ""
    for line in text.splitlines():
        m = re.fullmatch(r"==fmcluster-doctor:([a-z-]+)(?:=(\d+))?==", line.strip())
        if m:
            if m.group(2) is not None:
                sections[m.group(1)] = m.group(2)
                current = ""
            else:
                current = m.group(1)
                sections[current] = ""
            continue
        if current:
            sections[current] += line + "\n"
    return sections


def first_json(text: str) -> Any:
    """The JSON document in `text`, skipping lines before it (a warning the program printed to stderr)."""
    start = 0 if text.startswith("{") else text.find("\n{") + 1
    if start == 0 and not text.startswith("{"):
        raise ValueError("no JSON document")
    return json.JSONDecoder().raw_decode(text, start)[0]


def read_node(node: Node, argv: Sequence[str], ev: Evidence) -> None:
    """One node: reachable, its health report (compute nodes), its NCCL environment file."""
    try:
        done = subprocess.run([*argv, node_script(node)], capture_output=True, text=True, timeout=SSH_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        ev.add_fact("node_unreachable", node.name, f"no answer over ssh within {SSH_TIMEOUT:.0f} s")
        return
    sections = parse_node_output(done.stdout)
    if "up" not in sections:
        why = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}")[-300:]
        ev.add_fact("node_unreachable", node.name, f"ssh failed: {why}")
        return
    if node.role == "compute":
        try:
            report = first_json(sections.get("health", ""))
            if not isinstance(report, dict) or not isinstance(report.get("results"), list):
                raise ValueError("not a health report")
        except ValueError:
            shown = sections.get("health", "").strip()[-300:] or "(nothing)"
            ev.add_fact("node_unreachable", node.name,
                        f"its health checks gave no report (exit {sections.get('rc', '?')}): {shown}")
        else:
            ev.reports[node.name] = report
    env = sections.get("nccl-env", "")
    if env.strip():
        ev.logs[f"{node.name}:{NCCL_ENV_FILE}"] = env


def _ask(argv: Sequence[str], command: str, timeout: float = 60.0) -> tuple[str | None, str]:
    try:
        done = subprocess.run([*argv, command], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:.0f} s"
    if done.returncode != 0:
        return None, (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}")[-300:]
    return done.stdout, ""


def stack_facts(tenant: Tenant, endpoint: str | None, apis: ApiCapabilities, got: Gathered) -> None:
    from fmcluster.schedulers.registry import scheduler_for
    from fmcluster.stacks.api import stacks_status

    try:
        result = stacks_status(tenant, endpoint, scheduler=scheduler_for(tenant), apis=apis, out=lambda _line: None)
    except Exception as err:  # noqa: BLE001 - any API error is evidence that could not be read
        got.evidence.add_fact("unreachable", "CloudFormation", f"{type(err).__name__}: {err}")
        return
    for stack in result.stacks:
        got.evidence.add_fact("stack_status", stack.name, str(stack.status or "absent"))
        for lid, rtype in stack.not_created:
            if apis.emulated:
                got.notes.append(f"the AWS emulator did not create {lid} ({rtype}) in {stack.name}: "
                                 "its entries apply on AWS only")
            else:
                got.evidence.add_fact("resource_not_created", f"{stack.name}/{lid}", rtype)
    got.checked.append(f"{len(result.stacks)} stack(s)")


def aws_facts(tenant: Tenant, client: Callable[[str], Any], got: Gathered) -> None:
    """Capacity reservations the queues name, and the FSx data repository associations (AWS only: the emulator
    implements neither)."""
    for queue in tenant.queues:
        if not queue.capacity_reservation_id:
            continue
        where = f"{queue.name}/{queue.capacity_reservation_id}"
        try:
            found = client("ec2").describe_capacity_reservations(
                CapacityReservationIds=[queue.capacity_reservation_id])["CapacityReservations"]
        except Exception as err:  # noqa: BLE001
            got.evidence.add_fact("unreachable", f"EC2 capacity reservation {where}", f"{type(err).__name__}: {err}")
            continue
        for cr in found:
            got.evidence.add_fact("capacity_reservation_state", where, str(cr.get("State", "?")))
            if cr.get("InstanceType") != queue.instance.name or cr.get("AvailabilityZone") != tenant.availability_zone:
                got.evidence.add_fact("capacity_reservation_mismatch", where,
                                      f"reserves {cr.get('InstanceType')} in {cr.get('AvailabilityZone')}; the queue "
                                      f"runs {queue.instance.name} in {tenant.availability_zone}")
        got.checked.append(f"capacity reservation {where}")
    if tenant.storage.lustre.data_repository is None:
        return
    from fmcluster.stacks.outputs import read_stack_outputs

    fs_id = read_stack_outputs(tenant.org).get("LustreFileSystemId", "")
    if not fs_id:
        return
    try:
        dras = client("fsx").describe_data_repository_associations(
            Filters=[{"Name": "file-system-id", "Values": [fs_id]}])["Associations"]
    except Exception as err:  # noqa: BLE001
        got.evidence.add_fact("unreachable", f"FSx {fs_id}", f"{type(err).__name__}: {err}")
        return
    for dra in dras:
        detail = dra.get("FailureDetails", {}).get("Message", "")
        got.evidence.add_fact("dra_lifecycle", str(dra.get("AssociationId", fs_id)),
                              str(dra.get("Lifecycle", "?")) + (f" ({detail})" if detail else ""))
    got.checked.append(f"{len(dras)} data repository association(s)")


def gather(tenant: Tenant, node_filter: str = "", out: Out = print) -> Gathered:
    """Every piece of evidence doctor can read about the tenant's cluster."""
    from fmcluster.inventory import read_nodes
    from fmcluster.providers import NoEndpoint, RouteUnusable
    from fmcluster.providers.registry import provider_for

    got = Gathered()
    ev = got.evidence
    provider = provider_for(tenant)
    try:
        endpoint = provider.endpoint(False, lambda _line: None)
    except NoEndpoint as err:
        ev.add_fact("unreachable", "AWS APIs", str(err))
        return got
    out(f"doctor: reading the stacks of {tenant.org}")
    apis = provider.capabilities.apis
    stack_facts(tenant, endpoint, apis, got)
    if not apis.emulated:  # the emulator has no reservations or associations
        from fmcluster.stacks import aws

        aws_facts(tenant, lambda service: aws.client(service, tenant.region, endpoint, apis), got)

    nodes = read_nodes(tenant.org)
    if not nodes:
        ev.add_fact("unreachable", "nodes", f"no nodes known for '{tenant.org}' (generated/hosts.yml); "
                    f"run `invoke deploy --org={tenant.org}`")
        return got
    chosen = [n for n in nodes if node_filter in (n.name, n.address)] if node_filter else list(nodes)
    if not chosen:
        ev.add_fact("unreachable", node_filter, f"no node {escaped(node_filter)} in {tenant.org}; nodes: "
                    + neutral(", ".join(n.name for n in nodes)))
        return got
    try:
        return _gather_from_nodes(provider, nodes, chosen, node_filter, ev, got, out)
    except RouteUnusable as err:  # fail closed: no node was asked, and the diagnosis says why
        ev.add_fact("unreachable", "nodes", str(err))
        return got


def _gather_from_nodes(provider: Provider, nodes: list[Node], chosen: list[Node], node_filter: str, ev: Evidence,
                       got: Gathered, out: Out) -> Gathered:
    from fmcluster.acceptance.gate import client_node
    from fmcluster.acceptance.slurm import SlurmError

    out(f"doctor: running the health checks on {len(chosen)} node(s) over ssh")
    with ThreadPoolExecutor(max_workers=min(8, len(chosen))) as pool:
        list(pool.map(lambda n: read_node(n, provider.client_argv(n), ev), chosen))
    got.checked.append(f"{len(ev.reports)} node health report(s), {len(chosen)} node(s) asked")

    try:
        submit = client_node(nodes)
    except SlurmError as err:
        ev.add_fact("unreachable", "Slurm", str(err))
        return got
    sinfo, why = _ask(provider.client_argv(submit), SINFO)
    if sinfo is None:
        ev.add_fact("unreachable", f"Slurm (sinfo on {submit.name})", why)
    else:
        names = {n.name for n in chosen}
        ev.sinfo = "\n".join(line for line in sinfo.splitlines()
                             if not node_filter or line.split("|", 1)[0] in names)
        got.checked.append(f"sinfo on {submit.name}")

    controller = next((n for n in nodes if n.role == "controller"), None)
    if controller is None:
        ev.add_fact("unreachable", "Prometheus", "the cluster has no controller node")
        return got
    from fmcluster.monitoring import read_targets, target_host

    targets, error = read_targets(provider.client_argv(controller))
    if error or not targets:
        ev.add_fact("unreachable", f"Prometheus on {controller.name}", error or "no active targets")
    else:
        addresses = {n.address for n in chosen}
        ev.targets = [t for t in targets if not node_filter or target_host(t) in addresses]
        got.checked.append(f"{len(ev.targets)} Prometheus target(s)")
        alerts, _ = _ask(provider.client_argv(controller), ALERTS_QUERY)
        try:
            got.alerts_firing = sum(1 for a in json.loads(alerts or "")["data"]["alerts"] if a.get("state") == "firing")
        except (ValueError, KeyError, TypeError):
            got.alerts_firing = None
    return got
