"""The whole `invoke deploy` flow: validate → stacks → nodes → generated inventory → converge →
monitoring → acceptance → summary. Each step lives in its own module; this one only sequences them,
shows progress and ends with a summary a person would read."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from fmcluster.cli import describe
from fmcluster.model import Tenant

Status = Literal["ok", "changed", "skipped", "failed"]


@dataclass
class StepOutcome:
    status: Status
    summary: str
    details: list[str] = field(default_factory=list)


@dataclass
class StepReport:
    name: str
    outcome: StepOutcome
    seconds: float


Step = tuple[str, Callable[[Tenant], StepOutcome]]


def _validate(tenant: Tenant) -> StepOutcome:
    return StepOutcome("ok", describe(tenant))


def _stacks(tenant: Tenant) -> StepOutcome:
    from fmcluster.stacks.api import deploy_stacks

    result = deploy_stacks(tenant)
    if not result.ok:
        failure = next((s.failure for s in result.stacks if s.failure), None)
        return StepOutcome("failed", failure.render() if failure else "a stack did not deploy",
                           [f"{s.name}: {s.action} {s.status}" for s in result.stacks])
    details = [f"{s.name}: {s.action}" for s in result.stacks]
    missing = [f"{lid} ({kind})" for s in result.stacks for lid, kind in s.not_created]
    if missing:
        details.append(f"not created by the AWS emulator (exist only on AWS): {', '.join(missing)}")
    status: Status = "changed" if result.changed else "ok"
    return StepOutcome(status, f"{len(result.changed)} stack(s) created/updated, {len(result.skipped)} unchanged", details)


def _nodes(tenant: Tenant) -> StepOutcome:
    from fmcluster.inventory import write_inventory
    from fmcluster.localnodes import load_nodes, nodes_up
    from fmcluster.stacks.outputs import read_stack_outputs

    before = {n.name for n in load_nodes(tenant.org)}
    nodes = nodes_up(tenant, out=lambda line: print(f"    {line}"))
    path = write_inventory(tenant, nodes, read_stack_outputs(tenant.org))
    added = [n.name for n in nodes if n.name not in before]
    status: Status = "changed" if added else "ok"
    summary = f"{len(nodes)} namespace nodes up ({len(added)} new); inventory {path.parent}/"
    return StepOutcome(status, summary, [f"{n.name} {n.address} ({n.role})" for n in nodes])


def _recap_changes(output: str) -> dict[str, int]:
    """changed= per host from an ansible-playbook PLAY RECAP."""
    import re

    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", output, re.M)}


def _converge_push(tenant: Tenant) -> StepOutcome:
    import subprocess

    from fmcluster.converge import ansible_env, converge_command
    from fmcluster.paths import repo_root

    argv = converge_command(tenant, limit="controller:login", playbook="playbooks/site.yml")
    print("    " + " ".join(argv), flush=True)
    proc = subprocess.Popen(argv, cwd=repo_root(), env=ansible_env(tenant), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:  # per-host progress: task headers and each host's result as it lands
        lines.append(line)
        if line.startswith(("TASK [", "PLAY [", "changed:", "fatal:", "failed:")) or line.startswith("RUNNING HANDLER"):
            print("    " + line.rstrip()[:160], flush=True)
    code = proc.wait()
    output = "".join(lines)
    changes = _recap_changes(output)
    details = [f"{host}: changed={n}" for host, n in sorted(changes.items())]
    if code:
        return StepOutcome("failed", f"ansible-playbook exited {code}", details + output.strip().splitlines()[-15:])
    total = sum(changes.values())
    return StepOutcome("changed" if total else "ok", f"controller and login converged by push, {total} change(s)", details)


def _converge_pull(tenant: Tenant) -> StepOutcome:
    from fmcluster.localnodes import load_nodes
    from fmcluster.pull import pull_converge

    compute = [n.name for n in load_nodes(tenant.org) if n.role == "compute"]
    reports = pull_converge(tenant, compute)
    details = [r.render() for r in reports]
    failed = [r.node for r in reports if r.rc != 0]
    if failed:
        return StepOutcome("failed", f"ansible-pull failed on {', '.join(failed)}", details)
    total = sum(r.changed or 0 for r in reports)
    slowest = max((r.seconds for r in reports), default=0.0)
    return StepOutcome("changed" if total else "ok",
                       f"{len(reports)} compute node(s) converged themselves with ansible-pull, {total} change(s), "
                       f"slowest {slowest:.1f}s", details)


def _monitoring(tenant: Tenant, wait_s: float = 150.0) -> StepOutcome:
    """Prometheus on the controller must scrape every node's exporter: ask its HTTP API, as Grafana would."""
    import json
    import urllib.request

    from fmcluster.localnodes import load_nodes

    nodes = load_nodes(tenant.org)
    controller = next(n for n in nodes if n.role == "controller")
    url = f"http://{controller.address}:9090/api/v1/targets?state=active"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                targets: list[dict[str, Any]] = json.load(response)["data"]["activeTargets"]
            error = ""
        except OSError as err:
            targets, error = [], str(err)
        up_hosts = {str(t.get("scrapeUrl", "")).split("//")[-1].split(":")[0] for t in targets if t.get("health") == "up"}
        # A node that just converged may not be in Prometheus's file_sd yet (its refresh_interval is 1m, plus
        # a scrape interval): wait for every node, not for whatever targets happen to be known.
        missing = [n.name for n in nodes if n.address not in up_hosts]
        down = [t for t in targets if t.get("health") != "up"]
        if targets and not missing and not down:
            break
        if time.monotonic() > deadline:
            detail = [f"{t.get('scrapeUrl')}: {t.get('health')} {t.get('lastError', '')}" for t in down]
            detail += [f"{name}: no target up" for name in missing]
            return StepOutcome("failed", f"Prometheus at {url}: {len(missing)} node(s) not scraped, "
                               f"{len(down)} target(s) down {error}", detail)
        time.sleep(3)
    jobs = sorted({str(t.get("labels", {}).get("job", "?")) for t in targets})
    return StepOutcome("ok", f"Prometheus scrapes all {len(nodes)} nodes: {len(targets)}/{len(targets)} targets up "
                       f"({', '.join(jobs)})",
                       [f"Prometheus: http://{controller.address}:9090 (from this machine)",
                        "Grafana dashboards: provisioning files only on local (Grafana is installed on AWS)"])


def _acceptance(tenant: Tenant) -> StepOutcome:
    from fmcluster.acceptance.runner import run_acceptance

    if not tenant.acceptance.enabled:
        return StepOutcome("skipped", "acceptance is disabled in the tenant spec")
    result = run_acceptance(tenant)
    details = [f"{t.name}: {len(t.nodes)} node(s), busbw {t.verdict.busbw_gbps if t.verdict.busbw_gbps is not None else '-'}"
               f" GB/s — {'pass' if t.passed else 'FAIL: ' + t.verdict.cause}" for t in result.tests]
    details += [f"drained {d.node}: {d.reason}" for d in result.drained]
    if result.run_dir:
        details.append(f"results: {result.run_dir}")
    if result.skipped:
        return StepOutcome("skipped", result.skipped, details)
    if not result.passed:
        return StepOutcome("failed", "acceptance FAILED: the fabric is not fit for training", details)
    return StepOutcome("ok", f"acceptance passed ({len(result.tests)} collective run(s))", details)


def _aws_nodes(tenant: Tenant) -> StepOutcome:
    return StepOutcome("skipped", "on AWS the cluster stack's instances converge themselves at boot "
                       "(user data runs scripts/node-converge.sh with ansible-pull); this run pushes nothing to AWS hosts")


def deploy_steps(tenant: Tenant) -> list[Step]:
    """The steps for this tenant, in order. Later steps need the earlier ones to have succeeded."""
    if tenant.provider == "aws":
        return [("validate", _validate), ("stacks", _stacks), ("nodes", _aws_nodes)]
    return [
        ("validate", _validate),
        ("stacks", _stacks),
        ("nodes", _nodes),
        ("converge (push)", _converge_push),
        ("converge (pull)", _converge_pull),
        ("monitoring", _monitoring),
        ("acceptance", _acceptance),
    ]


def run_steps(tenant: Tenant, steps: list[Step], out: Callable[[str], object] = print) -> list[StepReport]:
    reports: list[StepReport] = []
    for index, (name, step) in enumerate(steps, start=1):
        out(f"\n==> [{index}/{len(steps)}] {name}")
        started = time.monotonic()
        try:
            outcome = step(tenant)
        except Exception as err:  # a step failing must still produce the summary
            outcome = StepOutcome("failed", f"{type(err).__name__}: {err}",
                                  traceback.format_exc().strip().splitlines()[-6:])
        reports.append(StepReport(name, outcome, time.monotonic() - started))
        out(f"    {outcome.status}: {outcome.summary} ({reports[-1].seconds:.1f}s)")
        if outcome.status == "failed":
            for line in outcome.details:
                out(f"      {line}")
            break
    return reports


def render_summary(tenant: Tenant, reports: list[StepReport], total_steps: int) -> str:
    width = max(len(r.name) for r in reports)
    lines = [f"\n=== deploy summary: {tenant.org} ({tenant.provider}) ==="]
    for report in reports:
        lines.append(f"  {report.name:<{width}}  {report.outcome.status:<8} {report.seconds:6.1f}s  {report.outcome.summary}")
        lines.extend(f"  {'':<{width}}  {'':<8} {'':>7}  {d}" for d in report.outcome.details if report.outcome.status != "failed")
    not_run = total_steps - len(reports)
    failed = [r for r in reports if r.outcome.status == "failed"]
    total = sum(r.seconds for r in reports)
    if failed:
        lines.append(f"  FAILED at '{failed[0].name}'; {not_run} later step(s) not run. Fix the cause and re-run: "
                     "completed steps are skipped or no-ops.")
    else:
        changed = sum(1 for r in reports if r.outcome.status == "changed")
        lines.append(f"  done in {total:.1f}s: {changed} step(s) changed something, "
                     f"{len(reports) - changed} had nothing to do.")
    return "\n".join(lines)


def run_deploy(tenant: Tenant, out: Callable[[str], object] = print) -> int:
    steps = deploy_steps(tenant)
    reports = run_steps(tenant, steps, out)
    out(render_summary(tenant, reports, len(steps)))
    return 1 if any(r.outcome.status == "failed" for r in reports) else 0
