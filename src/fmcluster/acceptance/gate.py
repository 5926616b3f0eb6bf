"""The acceptance gate as the deploy and `invoke acceptance` run it: from this machine, through ssh to the
cluster's login node (the controller when there is none), exactly as an operator would on AWS.

A deploy that changed nothing (same commit, manifest and nodes as the last PASS, less than a day ago) does not
re-run the collectives: the last run is the evidence, and the summary says which run it was. Anything else
re-runs them; `invoke acceptance` always does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from fmcluster.acceptance.results import acceptance_dir
from fmcluster.acceptance.runner import AcceptanceResult, run_acceptance
from fmcluster.acceptance.slurm import SlurmClient, SlurmError
from fmcluster.manifest import digest, membership_digest
from fmcluster.model import Tenant
from fmcluster.nodes import Node
from fmcluster.providers import Provider, RouteUnusable, controller_contract
from fmcluster.steps import StepOutcome

Out = Callable[[str], object]
LAST_PASS = "last-pass.json"
#: A PASS older than this is run again even when nothing changed.
REUSE_FOR = timedelta(hours=24)


def client_node(nodes: Sequence[Node]) -> Node:
    for role in ("login", "controller"):
        found = [n for n in nodes if n.role == role]
        if found:
            return found[0]
    raise SlurmError("the cluster has no login or controller node to submit from")


def cluster_state(manifest: Mapping[str, Any], nodes: Sequence[Node]) -> dict[str, str]:
    return {"ref": str(manifest.get("ref", "")), "manifest_digest": digest(manifest),
            "membership_digest": membership_digest(nodes)}


def reusable_pass(tenant: Tenant, state: Mapping[str, str]) -> dict[str, Any] | None:
    """The last PASS of this very cluster state, if recent; None otherwise (including unreadable records)."""
    try:
        last = json.loads((acceptance_dir(tenant.org) / LAST_PASS).read_text())
        finished = datetime.fromisoformat(str(last["finished"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if any(last.get(k) != v for k, v in state.items()):
        return None
    if finished.tzinfo is None:  # a time without its zone: its age is unknown
        return None
    age = datetime.now(timezone.utc) - finished
    if age < timedelta(0) or age > REUSE_FOR:  # from the future (a clock was wrong) or too old
        return None
    return dict(last)


def record_pass(tenant: Tenant, state: Mapping[str, str], result: AcceptanceResult) -> None:
    record = {**state, "run_dir": str(result.run_dir), "finished": datetime.now(timezone.utc).isoformat(),
              "tests": [{"name": t.name, "busbw_gbps": t.verdict.busbw_gbps} for t in result.tests]}
    from fmcluster.paths import tenant_dir, write_fresh

    write_fresh(acceptance_dir(tenant.org) / LAST_PASS, json.dumps(record, indent=1) + "\n", tenant_dir(tenant.org))


def run_gate(tenant: Tenant, provider: Provider, nodes: Sequence[Node], out: Out,
             every_node: bool = True) -> AcceptanceResult:
    """Run the gate now through the submit node."""
    try:
        client = SlurmClient(prefix=tuple(provider.client_argv(client_node(nodes))),
                             slurm_bin_dir=controller_contract(tenant, provider.node_image).slurm_bin_dir)
    except RouteUnusable as err:  # the callers report a SlurmError as "not ready", with its reason
        raise SlurmError(f"cannot reach the submit node: {err}") from err
    return run_acceptance(tenant, client, tenant.storage.lustre.mount_point, out=out, every_node=every_node)


def deploy_acceptance(tenant: Tenant, provider: Provider, nodes: Sequence[Node], manifest: Mapping[str, Any],
                      out: Out, every_node: bool = True, reuse: bool = True) -> StepOutcome:
    """The deploy's acceptance step. `every_node` False (the operator allowed a degraded cluster): the serving
    nodes are judged, the untested ones listed, and the run is not kept as a PASS a later deploy may reuse.
    `reuse` False: run now even when the last PASS was of this very cluster state."""
    if not tenant.acceptance.enabled:
        return StepOutcome("skipped", "acceptance is disabled in the tenant spec")
    state = cluster_state(manifest, nodes)
    last = reusable_pass(tenant, state) if reuse else None
    if last is not None:
        figures = ", ".join(f"{t['name']} {t['busbw_gbps']:.3f} GB/s" for t in last.get("tests", [])
                            if t.get("busbw_gbps") is not None)
        return StepOutcome("ok", f"not re-run: the cluster is unchanged since its PASS at {last['finished'][:19]}Z "
                           "(`invoke acceptance` runs it again)", [f"last run: {last['run_dir']}", figures])
    try:
        result = run_gate(tenant, provider, nodes, out, every_node)
    except SlurmError as err:
        return StepOutcome("failed", f"cannot use Slurm on the cluster: {err}")
    details = [f"{t.name}: {len(t.nodes)} node(s), busbw "
               f"{t.verdict.busbw_gbps if t.verdict.busbw_gbps is not None else '-'} GB/s — "
               f"{'pass' if t.passed else 'FAIL: ' + t.verdict.cause}" for t in result.tests]
    details += [f"drained {d.node}: {d.reason}" for d in result.drained]
    details += result.notes
    if result.run_dir:
        details.append(f"results: {result.run_dir}")
    if result.skipped:
        return StepOutcome("skipped", result.skipped, details)
    if not result.passed:
        return StepOutcome("failed", "acceptance FAILED: the fabric is not fit for training", details)
    if result.unavailable:
        return StepOutcome("changed", f"acceptance passed on the serving nodes only ({len(result.tests)} collective "
                           f"run(s)); not tested: {', '.join(result.unavailable)} — not a PASS of the cluster", details)
    record_pass(tenant, state, result)
    return StepOutcome("changed", f"acceptance passed ({len(result.tests)} collective run(s))", details)
