"""The whole `invoke deploy` flow: validate → stacks → nodes → generated inventory → converge →
monitoring → acceptance → summary. Each step lives in its own module; this one only sequences them,
shows progress and ends with a summary a person would read."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

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


def deploy_steps(tenant: Tenant) -> list[Step]:
    """The steps for this tenant, in order. Later steps need the earlier ones to have succeeded."""
    return [("validate", _validate), ("stacks", _stacks)]


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
