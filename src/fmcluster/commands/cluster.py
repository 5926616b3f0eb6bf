"""The cluster commands: one function per task, returning its exit code (validate, plan, deploy, stacks, destroy,
status, nodes-up, halt, slurm, acceptance, nodes, replace). tasks.py (invoke) and the `fmcluster` CLI call them
through the package fmcluster.commands.

Every task that changes something validates the tenant first (an invalid spec exits 2 with every problem).
Exit codes: fmcluster.exits.ExitCode, one table for every command.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from fmcluster.exits import ExitCode
from fmcluster.model import Tenant, TenantInvalid, load_tenant
from fmcluster.paths import repo_root
from fmcluster.providers import NoEndpoint as NoEndpointType

if TYPE_CHECKING:
    from fmcluster.capabilities import ApiCapabilities
    from fmcluster.lifecycle import Replacer
    from fmcluster.nodes import Node

Out = Callable[[str], object]


def require_tenant(org: str) -> Tenant:
    """The validated tenant, or exit 2 with the full problem list."""
    try:
        return load_tenant(org)
    except TenantInvalid as err:
        print(err.render(repo_root()), file=sys.stderr)
        raise SystemExit(ExitCode.INVALID) from None


def validate(org: str, out: Out = print) -> int:
    """Schema and catalog checks, every problem with its fix; then the scheduler's own (e.g. its service's schema)."""
    from fmcluster.schedulers.registry import scheduler_for

    try:
        tenant = load_tenant(org)
    except TenantInvalid as err:
        out(err.render(repo_root()))
        return ExitCode.INVALID
    out(tenant.describe())
    return scheduler_for(tenant).validate(out)


def deploy(org: str, approve_replace: bool = False, allow_degraded: bool = False) -> int:
    from fmcluster.deploy import run_deploy

    return run_deploy(require_tenant(org), approve_replace=approve_replace, allow_degraded=allow_degraded)


def _endpoint(tenant: Tenant, start: bool) -> tuple[str | None, NoEndpointType | None]:
    """(endpoint, None), or (None, why it cannot be reached): plan goes offline, others say why."""
    from fmcluster.providers import NoEndpoint
    from fmcluster.providers.registry import provider_for

    try:
        return provider_for(tenant).endpoint(start, print), None
    except NoEndpoint as err:
        return None, err


def plan(org: str, show_templates: bool = False) -> int:
    from fmcluster.stacks.api import plan_stacks

    from fmcluster.paths import UnsafePath
    from fmcluster.providers.registry import provider_for
    from fmcluster.schedulers.registry import scheduler_for

    tenant = require_tenant(org)
    provider = provider_for(tenant)
    # A plan changes nothing: it reads a running endpoint when there is one and never starts one (a local
    # tenant's emulator needs root and would outlive the plan); otherwise it renders offline.
    endpoint, unreachable = _endpoint(tenant, start=provider.plan_starts_endpoint)
    apis = provider.capabilities.apis
    code, scale_in = capacity_preflight(tenant, endpoint, unreachable, apis)
    if code != ExitCode.OK:
        return code
    if (code := secrets_preflight(tenant, endpoint, unreachable, apis)) != ExitCode.OK:
        return code
    try:
        note = (f"{unreachable}. Above is what the stacks would hold; plan started nothing."
                if unreachable is not None and unreachable.nothing_deployed else None)
        result = plan_stacks(tenant, endpoint, scheduler=scheduler_for(tenant), apis=apis, offline=unreachable is not None,
                             show_templates=show_templates, image_parameter=provider.image_parameter,
                             offline_note=note, capacity=scale_in)
    except UnsafePath as err:
        print(f"plan: {err}", file=sys.stderr)
        return ExitCode.FAILED
    from fmcluster.images import booted_image, first_boot_refusals, image_lines
    from fmcluster.stacks.api import required_baked_refusals

    scheduler = scheduler_for(tenant)
    print("\n".join(image_lines(tenant, scheduler.image, provider.node_image)))
    code = ExitCode.OK if result.ok and not result.notes else ExitCode.FAILED  # notes: security findings
    code = scheduler.plan(print) or code
    # What the deploy refuses before changing anything (Deploy.validate), said here with the same words.
    refusals = first_boot_refusals(tenant, booted_image(scheduler.image, provider.node_image))
    refusals = refusals or required_baked_refusals(tenant, scheduler)
    for line in refusals:
        print(f"REFUSED: {line}")
    if refusals:
        print(f"`invoke deploy --org={tenant.org}` refuses this tenant before it creates or changes anything.")
        return ExitCode.INVALID
    return code


def capacity_preflight(tenant: Tenant, endpoint: str | None, unreachable: NoEndpointType | None,
                       apis: ApiCapabilities, out: Out = print) -> tuple[int, dict[str, str]]:
    """The capacity pre-flight (fmcluster.capacity) as `invoke plan` shows it: (0, the scale-in times of Capacity
    Block queues), or (2, {}) after every refusal."""
    from fmcluster.capacity import preflight, render
    from fmcluster.stacks import aws

    if unreachable is not None:
        out(f"[capacity] not checked: {unreachable}; `invoke deploy` checks the reservations and quotas before "
            "any change")
        return ExitCode.OK, {}
    result = preflight(tenant, lambda service: aws.client(service, tenant.region, endpoint, apis),
                       stand_in=apis.capacity_stand_in)
    out("[capacity] reservations and On-Demand quotas (EC2, Service Quotas)")
    render(result, out)
    if not result.ok:
        out(f"{len(result.refusals)} capacity problem(s); nothing was planned or changed.")
        return ExitCode.INVALID, {}
    return ExitCode.OK, result.scale_in


def secrets_preflight(tenant: Tenant, endpoint: str | None, unreachable: NoEndpointType | None,
                      apis: ApiCapabilities, out: Out = print) -> int:
    """The secrets the tenant names for its nodes and makes itself (fmcluster.publish.missing_tenant_secrets), as
    `invoke plan` shows them where it reaches the AWS APIs; the deploy checks them again before changing anything."""
    from fmcluster.publish import missing_tenant_secrets, tenant_named_secrets
    from fmcluster.stacks import aws

    if not tenant_named_secrets(tenant):
        return ExitCode.OK
    if unreachable is not None:
        out(f"[secrets] not checked: {unreachable}; `invoke deploy` checks them before any change")
        return ExitCode.OK
    missing = missing_tenant_secrets(tenant, aws.client("secretsmanager", tenant.region, endpoint, apis))
    out("[secrets] the tenant's own secrets the nodes read (Secrets Manager)")
    for line in missing:
        out(f"  {line}")
    if missing:
        out(f"{len(missing)} secret(s) missing; nothing was planned or changed.")
        return ExitCode.INVALID
    out("  all present")
    return ExitCode.OK


def stacks(org: str) -> int:
    """The stacks alone (network → storage → cluster), without publishing for the nodes or waiting for their
    reports. A cluster stack with a CreationPolicy still waits for its nodes' signals, as on AWS: its instances boot
    meanwhile, and with nothing published their first boot fails and the stack rolls back (use `invoke deploy`)."""
    from fmcluster.schedulers.registry import scheduler_for
    from fmcluster.stacks.api import deploy_stacks
    from fmcluster.commands.stack_helpers import summarize

    from fmcluster.providers.registry import provider_for

    tenant = require_tenant(org)
    provider = provider_for(tenant)
    endpoint, unreachable = _endpoint(tenant, start=True)
    if unreachable is not None:
        print(unreachable)
        return ExitCode.FAILED
    apis = provider.capabilities.apis
    code, scale_in = capacity_preflight(tenant, endpoint, None, apis)
    if code != ExitCode.OK:
        return code
    from fmcluster.stacks import aws
    from fmcluster.stacks.rollout import ReplaceGate, deployed_template, no_controller

    # `invoke stacks` reaches no node: an update that would replace instances is refused (the deploy drains first).
    gate = ReplaceGate(False, lambda roll: [], no_controller,
                       deployed=deployed_template(aws.client("cloudformation", tenant.region, endpoint, apis)))
    # A cluster stack waits for its nodes' signals: its instances boot meanwhile (EC2 on AWS, hosts locally). Nothing
    # is published here, so a first create fails at the nodes' first boot, as it would on AWS (`invoke deploy` publishes).
    result = deploy_stacks(tenant, endpoint, scheduler=scheduler_for(tenant), apis=apis,
                           image_parameter=provider.image_parameter, capacity=scale_in, before_execute=gate,
                           while_waiting=lambda: provider.boot(endpoint, print))
    summarize(result)
    return ExitCode.OK if result.ok else ExitCode.FAILED


def destroy(org: str, yes: bool = False) -> int:
    from fmcluster.providers.registry import provider_for
    from fmcluster.schedulers.registry import scheduler_for
    from fmcluster.stacks.api import destroy_stacks
    from fmcluster.commands.stack_helpers import forget_generated_state

    tenant = require_tenant(org)
    provider = provider_for(tenant)
    endpoint, unreachable = _endpoint(tenant, start=False)

    def confirm(question: str) -> bool:
        if not sys.stdin.isatty():
            print(f"{question} Not a terminal: nothing deleted; pass --yes to confirm.")
            return False
        return input(f"{question} Type '{tenant.org}' to confirm: ").strip() == tenant.org

    if unreachable is not None and not unreachable.nothing_deployed:
        print(f"destroy: {unreachable}")
        return ExitCode.FAILED
    ok = True
    if unreachable is None:
        result = destroy_stacks(tenant, endpoint, scheduler=scheduler_for(tenant), apis=provider.capabilities.apis,
                                confirm=None if yes else confirm,
                                delete_first=scheduler_for(tenant).delete_cluster(print))
        if "cancelled" in result.notes:
            return ExitCode.CANCELLED
        ok = result.ok
    else:
        print(f"destroy: {unreachable}; no stacks to delete")
    if ok:
        provider.teardown(print)
        forget_generated_state(tenant)
    return ExitCode.OK if ok else ExitCode.FAILED


def status(org: str) -> int:
    """Each stack's status and outputs, each kind's recorded baked images (current or stale, booted or not), then each
    node's last convergence report (read from the bucket)."""
    from fmcluster.commands.image_stack import image_status
    from fmcluster.inventory import read_manifest
    from fmcluster.manifest import digest
    from fmcluster.nodes import discover
    from fmcluster.providers.registry import provider_for
    from fmcluster.reports import statuses
    from fmcluster.schedulers.registry import scheduler_for
    from fmcluster.stacks import aws
    from fmcluster.stacks.api import stacks_status

    tenant = require_tenant(org)
    endpoint, unreachable = _endpoint(tenant, start=False)
    if unreachable is not None:
        print(f"status: {unreachable}")
        for line in image_status(tenant, None, reachable=False):  # what is kept is the tenant's, deployed or not
            print(line)
        return ExitCode.NOT_READY
    apis = provider_for(tenant).capabilities.apis
    result = stacks_status(tenant, endpoint, scheduler=scheduler_for(tenant), apis=apis)
    for line in scheduler_for(tenant).status_lines():
        print(line)
    for line in image_status(tenant, endpoint, reachable=True):
        print(line)
    manifest = read_manifest(org)
    bucket = result.outputs.get("DataBucketName")
    if manifest and bucket:
        def client(service: str) -> object:
            return aws.client(service, tenant.region, endpoint, apis)

        nodes = discover(manifest.get("discovery", {}), client, tenant.org)
        found = statuses(client("s3"), bucket, nodes, str(manifest.get("ref", "")), digest(manifest))
        print(f"nodes: {sum(1 for s in found if s.state == 'converged')}/{len(found)} converged "
              f"commit {str(manifest.get('ref', ''))[:12]}")
        for node_status in found:
            print(f"  {node_status.line()}")
    return ExitCode.OK if result.ok else ExitCode.FAILED


def nodes_up(org: str) -> int:
    """Boot what the AWS APIs say the cluster has (local: a host per instance; AWS: EC2 does it)."""
    from fmcluster.providers.registry import provider_for

    tenant = require_tenant(org)
    provider = provider_for(tenant)
    endpoint, unreachable = _endpoint(tenant, start=False)
    if unreachable is not None:
        print(f"nodes-up: {unreachable}")
        return ExitCode.NOT_READY
    result = provider.boot(endpoint, print)
    print(f"nodes-up: {len(result.started)} booted, {len(result.kept)} running, {len(result.removed)} removed")
    return ExitCode.OK


def image(org: str, kind: str = "cpu", check: bool = False) -> int:
    """Bake the tenant's node image of `kind` from the pristine one (issue 40: locally a layer, on AWS the image stack's
    AMIs, every kind the tenant has); with
    `check`, boot a host from the current baked image and run a first boot's install steps on it instead: what they
    still install is what the image lacks."""
    from fmcluster.baked import installed_summary
    from fmcluster.capabilities import provider_capabilities
    from fmcluster.providers.local.hosts import SubstrateError

    tenant = require_tenant(org)
    if not provider_capabilities(tenant.provider).bakes_images:
        # No substrate of its own to bake on: EC2 Image Builder's stack, deployed with credentials, its AMIs recorded.
        from fmcluster.commands.image_stack import plan_image_stack

        return plan_image_stack(tenant)  # the stack holds every kind the tenant has
    from fmcluster.providers.local import bake, layers

    try:
        if check:
            checked = bake.check(tenant, kind, print)
            for line in checked.lines:
                print(f"  {line}")
            print(f"image: a host booted from {checked.image} ran the install steps in {checked.seconds:.0f}s: "
                  f"{installed_summary(checked.installed).replace('at first boot', 'by them')}")
            return ExitCode.OK if not checked.installed else ExitCode.FAILED
        done = bake.bake(tenant, kind, print)
    except (SubstrateError, ValueError) as err:
        print(f"image: {err}")
        return ExitCode.FAILED
    for line in done.lines:
        print(f"  {line}")
    record = done.record
    print(f"image: baked {record.kind} image {record.digest} of '{org}' (commit {record.commit[:12]}); record "
          f"{layers.record_path(org, kind)}; its hosts boot it while the install set stays {record.digest}")
    return ExitCode.OK


def halt(org: str, node: str) -> int:
    """Take one node down hard, as a crash would (its instance stays; `nodes-up` boots it again)."""
    from fmcluster.providers.registry import provider_for

    tenant = require_tenant(org)
    try:
        provider_for(tenant).halt(node, print)
    except (RuntimeError, KeyError) as err:
        print(f"halt: {err}")
        return ExitCode.FAILED
    return ExitCode.OK


def slurm(org: str, cmd: str, node: str = "") -> int:
    """A command on the login node (or `node`), through ssh as an operator would type it (the remote shell
    reads `cmd`: Slurm clients, or anything else an operator runs there)."""
    import subprocess

    from fmcluster.acceptance.gate import client_node
    from fmcluster.inventory import read_nodes
    from fmcluster.providers.registry import provider_for

    tenant = require_tenant(org)
    nodes = read_nodes(org)
    if not nodes:
        print(f"slurm: no nodes known for '{org}'; run `invoke deploy --org={org}` first")
        return ExitCode.NOT_READY
    target = next((n for n in nodes if node in (n.name, n.address)), None) if node else client_node(nodes)
    if target is None:
        from fmcluster.escape import escaped, neutral

        print(f"slurm: no node {escaped(node)} in {org}; nodes: {neutral(', '.join(n.name for n in nodes))}")
        return ExitCode.FAILED
    provider = provider_for(tenant)
    if why := provider.route(target).unusable():
        print(f"slurm: {why}")
        return ExitCode.NOT_READY
    return subprocess.run([*provider.client_argv(target), cmd]).returncode


def acceptance(org: str) -> int:
    from fmcluster.acceptance.gate import record_pass, run_gate, cluster_state
    from fmcluster.acceptance.slurm import SlurmError
    from fmcluster.inventory import read_nodes
    from fmcluster.providers.registry import provider_for

    tenant = require_tenant(org)
    nodes = read_nodes(org)
    if not nodes:
        print(f"acceptance: no nodes known for '{org}'; run `invoke deploy --org={org}` first")
        return ExitCode.NOT_READY
    try:
        result = run_gate(tenant, provider_for(tenant), nodes, print)
    except SlurmError as err:
        print(f"acceptance: cannot use Slurm: {err}")
        return ExitCode.NOT_READY
    if result.passed and not result.skipped:
        from fmcluster.inventory import read_manifest

        manifest = read_manifest(org)
        if manifest:
            record_pass(tenant, cluster_state(manifest, nodes), result)
    return result.exit_code


# --- node lifecycle (docs/health.md): which nodes are unhealthy, and replacing one ---------------------------
def _replacer(tenant: Tenant, what: str, timeout_s: float | None = None) -> Replacer | int:
    """The tenant's Replacer (provider, endpoint, published manifest), or the exit code after saying why not."""
    from fmcluster.inventory import read_manifest
    from fmcluster.lifecycle import Replacer
    from fmcluster.providers.registry import provider_for

    endpoint, unreachable = _endpoint(tenant, start=False)
    if unreachable is not None:
        print(f"{what}: {unreachable}")
        return ExitCode.NOT_READY
    manifest = read_manifest(tenant.org)
    if not manifest:
        print(f"{what}: nothing published for '{tenant.org}'; run `invoke deploy --org={tenant.org}` first")
        return ExitCode.NOT_READY
    return Replacer(tenant, provider_for(tenant), endpoint, manifest, timeout_s=timeout_s)


def nodes(org: str, as_json: bool = False, replace: bool = False) -> int:
    """Every node with its Slurm state; unhealthy ones with reason, check and action. Exit 1 when any node is
    unhealthy. `replace`: the automatic mode (tenant health.auto_replace), replacing the nodes whose action is
    replace."""
    import json

    from fmcluster.lifecycle import LifecycleError, auto_replacements, controller_of, line_dicts
    from fmcluster.lifecycle import node_lines, read_view, render_lines

    tenant = require_tenant(org)
    replacer = _replacer(tenant, "nodes")
    if isinstance(replacer, int):
        return replacer
    try:
        live = replacer.live_nodes()
        lines = node_lines(live, read_view(replacer.provider, controller_of(live), replacer.tenant))
    except LifecycleError as err:
        print(f"nodes: {err}")
        return err.code
    unhealthy = [ln for ln in lines if ln.unhealthy]
    if as_json:
        print(json.dumps(line_dicts(lines), indent=1))
    else:
        print(render_lines(lines), end="")
        to_replace = [ln.node for ln in unhealthy if ln.action == "replace"]
        print(f"{len(unhealthy)} of {len(lines)} node(s) unhealthy"
              + (f"; to replace: {', '.join(to_replace)} (`invoke replace --org={org} --node=N`)" if to_replace else ""))
        _print_repair(tenant, replacer, live)
    if not replace:
        return ExitCode.FAILED if unhealthy else ExitCode.OK
    if not tenant.health.auto_replace:
        print(f"nodes --replace: tenant '{org}' has not opted in (health.auto_replace: true in its tenant.yml); "
              f"nothing replaced. Replace one node with `invoke replace --org={org} --node=N`.")
        return ExitCode.FAILED if unhealthy else ExitCode.OK
    wanted, why_not = auto_replacements(lines, tenant.compute_nodes)
    if why_not:
        print(f"nodes --replace: {why_not}")
        return ExitCode.FAILED
    code: int = ExitCode.OK
    for name in wanted:
        print(f"\nnodes --replace: replacing {name} (health.auto_replace)")
        code = max(code, _replace(tenant, replacer, name))
    return code if wanted else (ExitCode.FAILED if unhealthy else ExitCode.OK)


def _print_repair(tenant: Tenant, replacer: Replacer, live: list[Node]) -> None:
    """Where the controller's repair agent runs (health.repair, the scheduler's `repair` row), what it did."""
    import time

    from fmcluster.health.inventory import repair_vars
    from fmcluster.lifecycle import LifecycleError, controller_of, render_repair, repair_off, repair_state

    if repair_off(tenant):
        return
    try:
        print(render_repair(repair_state(replacer.provider, controller_of(live)), time.time(),
                            every_s=repair_vars(tenant)["node_repair_interval"]), end="")
    except LifecycleError as err:
        print(f"repair agent: {err}")


def replace(org: str, node: str, timeout_s: float | None = None) -> int:
    """Replace one compute node the scheduler's way and wait for positive evidence that its successor serves, within
    `timeout_s` in all (default: the provider's boot budget)."""
    from fmcluster.schedulers.registry import scheduler_for

    tenant = require_tenant(org)
    refusal = scheduler_for(tenant).replacement_refusal(node)
    if refusal:
        print(f"replace: {refusal}")
        return ExitCode.INVALID
    if timeout_s is not None and timeout_s <= 0:
        print(f"replace: --timeout={timeout_s:g} must be a positive number of seconds")
        return ExitCode.INVALID
    replacer = _replacer(tenant, "replace", timeout_s)
    if isinstance(replacer, int):
        return replacer
    return _replace(tenant, replacer, node)


def _replace(tenant: Tenant, replacer: Replacer, node: str) -> int:
    from fmcluster.inventory import write_inventory
    from fmcluster.lifecycle import LifecycleError

    try:
        result = replacer.replace(node)
    except LifecycleError as err:
        print(f"replace: {err}")
        return err.code
    print(result.summary())
    # generated/hosts.yml follows the live nodes (acceptance and `invoke slurm` read it).
    write_inventory(tenant, replacer.manifest, replacer.live_nodes())
    return ExitCode.FAILED if result.failed else ExitCode.OK


# --- users and teams (docs/users.md) ------------------------------------------------------------------------
def usage(org: str, since: str = "", as_json: bool = False, out: Out = print) -> int:
    """GPU-, CPU- and node-hours per team and user since `since` (YYYY-MM-DD; default: the first of this month),
    from sacct on the login node (else the controller), as `invoke slurm` reaches it."""
    import datetime

    from fmcluster.health.usage import UsageError, check_since, default_since, render_json, render_table
    from fmcluster.usage_cluster import NoCluster, read_cluster_usage

    tenant = require_tenant(org)
    try:
        since = check_since(since) if since else default_since(datetime.date.today())
    except UsageError as err:
        out(f"usage: {err}")
        return ExitCode.INVALID
    try:
        _, rows = read_cluster_usage(tenant, since)
    except NoCluster as err:
        out(f"usage: {err}")
        return ExitCode.NOT_READY
    except UsageError as err:
        out(f"usage: {err}")
        return ExitCode.FAILED
    out((render_json if as_json else render_table)(rows, tenant.org, since).rstrip("\n"))
    return ExitCode.OK
