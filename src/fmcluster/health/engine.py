"""Run the checks that apply to a node in a context, in the data file's order, failing closed."""

from __future__ import annotations

import time
import traceback
from typing import Any, List, Mapping, Optional, Sequence

from fmcluster.health import facts as facts_mod
from fmcluster.health.checks import REGISTRY, Context, diag_timeout_name, write_boot_record
from fmcluster.health.model import LONG_CONTEXTS, CheckSpec, Outcome, Report, Result, Unreadable
from fmcluster.health.probe import Deadline, Probe


def specs(config: Mapping[str, Any]) -> List[CheckSpec]:
    return [CheckSpec.from_dict(raw) for raw in config.get("checks", [])]


def run_checks(config: Mapping[str, Any], context: str, node: str, probe: Optional[Probe] = None,
               only: Sequence[str] = (), diag_level: int = 2) -> Report:
    """Every node check of `context` (or just `only`) on `node`; checks whose facts do not hold are skipped
    with the reason. A check that raises, or cannot be found, fails with a diagnosis (fail closed)."""
    started = time.time()
    clock = time.monotonic()
    probe = probe or Probe()
    node_facts = facts_mod.derive(config)
    ctx = Context(node=node, config=config, facts=node_facts, probe=probe, deadline=Deadline(budget(config, context,
                                                                                                  diag_level)),
                  memo={"diag_level": diag_level})
    results: List[Result] = []
    for spec in specs(config):
        if spec.scope != "node" or (only and spec.name not in only) or (not only and context not in spec.contexts):
            continue
        results.append(_run_one(spec, ctx))
    report = Report(node=node, context=context, started=started, seconds=time.monotonic() - clock, results=results)
    if context == "boot":
        write_boot_record(ctx, diag_level, report.healthy, report.reason(), started)
    return report


def budget(config: Mapping[str, Any], context: str, diag_level: int) -> float:
    """Seconds a run may take. slurmd kills a HealthCheckProgram after 60 s and a Prolog should end within
    MessageTimeout (10 s); the diagnostic contexts (diag on demand, boot before slurmd starts) run outside slurmd
    and take as long as DCGM's level does, plus the quick checks' budget."""
    timeouts = config.get("timeouts", {})
    if context == "prolog":
        return float(timeouts.get("prolog", 8))
    quick = float(timeouts.get("budget", 50))
    if context in LONG_CONTEXTS:
        return quick + float(timeouts.get(diag_timeout_name(config, diag_level), 900))
    return quick


def _run_one(spec: CheckSpec, ctx: Context) -> Result:
    t0 = time.monotonic()
    missing = facts_mod.unmet(ctx.facts, list(spec.when))
    if missing:
        return Result(spec.name, "skip", "; ".join(missing))
    if ctx.deadline.left() <= 0:
        return Result(spec.name, "fail", "not run: the run's time budget was spent by earlier checks",
                      spec.default_action)
    fn = REGISTRY.get(spec.name)
    if fn is None:
        return Result(spec.name, "fail", "this health program has no check of that name (older than the data?)",
                      spec.default_action)
    try:
        outcome = fn(ctx)
    except Unreadable as err:
        outcome = Outcome(False, f"could not read the evidence: {err}")
    except Exception as err:  # noqa: BLE001 - any crash of a check is a failed check, never a pass
        tail = traceback.format_exception_only(type(err), err)[-1].strip()
        outcome = Outcome(False, f"the check crashed: {tail}")
    seconds = round(time.monotonic() - t0, 3)
    if outcome.ok:
        return Result(spec.name, "pass", outcome.detail, "none", seconds, outcome.evidence)
    return Result(spec.name, "fail", outcome.detail, outcome.action or spec.default_action, seconds, outcome.evidence)
