"""`invoke fleet`'s rows: every tenant under inventories/ in one table (terminal and a static HTML page); the
command itself is fmcluster.commands.diagnose.fleet.

Nothing is faked: a local tenant is asked only when its emulator runs (otherwise it is 'not deployed'); an AWS
tenant without credentials is 'planned' and its live columns stay unknown. Acceptance figures come from the
records the gate wrote (generated/acceptance/<run>/result.json); the doctor columns from `invoke doctor`'s own
diagnosis of the tenant.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from fmcluster.doctor.report import Diagnosis, clean

if TYPE_CHECKING:
    from fmcluster.model import Tenant

Out = Callable[[str], object]
Diagnose = Callable[[str], Diagnosis]
#: A deployed tenant's usage this month as one cell, e.g. "12.5 GPU-h, 40.0 CPU-h" (fmcluster.health.usage).
UsageOf = Callable[["Tenant"], str]
#: A deployed tenant's repair agent as one cell (repair_cell: fmcluster.lifecycle.repair_summary or why unknown).
RepairOf = Callable[["Tenant"], str]
COLUMNS = ("tenant", "provider", "scheduler", "stack", "nodes", "acceptance", "vs floor", "alerts", "findings",
           "repair", "usage (month)", "state")


@dataclass
class Row:
    org: str
    provider: str = "-"
    scheduler: str = "-"
    stack: str = "-"
    expected: int | None = None
    up: int | None = None
    drained: int | None = None
    acceptance: str = "none recorded"
    ratio: float | None = None
    alerts: int | None = None
    findings: int | None = None
    state: str = "-"
    """healthy | degraded | not deployed | planned | invalid"""
    finding_ids: tuple[str, ...] = ()
    usage: str = "-"
    """GPU- and CPU-hours of the org's jobs since the first of the month (sacct); '?' when it cannot be read"""
    repair: str = "unknown"
    """the controller's repair agent: off (why), or running/paused, breaker, quarantined queues, actions in 24 h
    (fmcluster.lifecycle.repair_summary); 'unknown (why)' where its ledger was not read"""

    def cells(self) -> tuple[str, ...]:
        nodes = (f"{_n(self.up)}/{_n(self.expected)} up, {_n(self.drained)} drained" if self.expected is not None
                 else "-")
        return (self.org, self.provider, self.scheduler, self.stack, nodes, self.acceptance,
                f"{self.ratio:.2f}×" if self.ratio is not None else "-", _n(self.alerts), _n(self.findings),
                self.repair, self.usage, self.state)


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)


def tenants(root: Path | None = None) -> list[str]:
    from fmcluster.paths import inventories_dir

    base = inventories_dir(root)
    return sorted(p.name for p in base.iterdir() if not p.name.startswith(".")
                  and (p / "group_vars" / "all" / "tenant.yml").is_file()) if base.is_dir() else []


def last_acceptance(org: str, root: Path | None = None) -> tuple[str, float | None]:
    """('PASS 2026-12-03T10:00Z, 3.1 GB/s', busbw / catalog floor) of the newest recorded run."""
    from fmcluster.acceptance.results import acceptance_dir

    base = acceptance_dir(org, root)
    runs = sorted(p for p in base.iterdir() if (p / "result.json").is_file()) if base.is_dir() else []
    if not runs:
        return "none recorded", None
    try:
        data: dict[str, Any] = json.loads((runs[-1] / "result.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"unreadable ({runs[-1].name})", None
    verdict = "PASS" if data.get("passed") is True else "SKIPPED" if data.get("skipped") else "FAIL"
    tests = [t for t in data.get("tests", []) if isinstance(t, dict)]
    first = tests[0] if tests else {}
    bw = first.get("busbw_gbps")
    expectation = (data.get("verdicts", {}).get(first.get("name"), {}) or {}).get("expectation") or {}
    floor = expectation.get("catalog_floor_gbps")
    ratio = bw / floor if isinstance(bw, (int, float)) and isinstance(floor, (int, float)) and floor > 0 else None
    figure = f", {bw:.3g} GB/s" if isinstance(bw, (int, float)) else ""
    return f"{verdict} {runs[-1].name}{figure}", ratio


def month_usage(tenant: Tenant, root: Path | None = None) -> str:
    """The org's GPU- and CPU-hours since the first of this month, read with sacct on its cluster; '?' when not."""
    import datetime

    from fmcluster.health.usage import UsageError, default_since, totals
    from fmcluster.usage_cluster import read_cluster_usage

    try:
        _, rows = read_cluster_usage(tenant, default_since(datetime.date.today()), root)
    except UsageError:
        return "?"
    total = totals(rows)
    return f"{total['gres/gpu']:.1f} GPU-h, {total['cpu']:.1f} CPU-h"


def repair_cell(tenant: Tenant, root: Path | None = None) -> str:
    """The deployed tenant's repair agent in one cell, read from its controller's ledger as `invoke nodes` reads
    it; 'unknown (why)' where it cannot be read (fail closed: never 'running' without the ledger saying so)."""
    import time

    from fmcluster.health.inventory import repair_vars
    from fmcluster.inventory import read_nodes
    from fmcluster.lifecycle import LifecycleError, controller_of, repair_off, repair_state, repair_summary
    from fmcluster.providers.registry import provider_for

    off = repair_off(tenant)
    if off:
        return f"off ({off})"
    try:
        ledger = repair_state(provider_for(tenant), controller_of(read_nodes(tenant.org, root)))
        return repair_summary(ledger, time.time(), repair_vars(tenant)["node_repair_interval"])
    except LifecycleError as err:
        return f"unknown ({err})"
    except OSError as err:  # no ssh client, say
        return f"unknown (the controller was not asked: {err.strerror or err})"
    except RuntimeError as err:  # the provider has no route to it (local: its host is gone mid-deploy)
        return f"unknown (the controller was not asked: {err})"
    except (TypeError, ValueError, AttributeError) as err:  # a ledger of the wrong shape
        return f"unknown (unreadable repair ledger: {err})"


def row(org: str, diagnose: Diagnose, root: Path | None = None, usage_of: UsageOf | None = None,
        repair_of: RepairOf | None = None) -> Row:
    from fmcluster.lifecycle import repair_off
    from fmcluster.model import TenantInvalid, load_tenant

    try:
        tenant = load_tenant(org, root) if root else load_tenant(org)
    except TenantInvalid:
        return Row(org, state="invalid", stack="invalid spec (invoke validate)", repair="unknown (invalid spec)")
    r = Row(org, tenant.provider, tenant.scheduler, expected=sum(q.count for q in tenant.queues))
    r.acceptance, r.ratio = last_acceptance(org, root)
    off = repair_off(tenant)
    if tenant.capabilities.provider.apis.emulated:  # deployed only while its emulator runs
        from fmcluster.providers.local.emulator import running_emulator

        if running_emulator(org, root) is None:
            r.stack, r.state = "not deployed", "not deployed"
            r.repair = f"off ({off})" if off else "unknown (not deployed)"
            return r
    else:
        from fmcluster.stacks import aws

        if not aws.has_credentials(tenant.region):
            r.stack, r.state = "planned (no AWS credentials: unknown)", "planned"
            r.repair = f"off ({off})" if off else "unknown (no AWS credentials)"
            return r
    d = diagnose(org)
    statuses = sorted({value for _, value in d.facts.get("stack_status", [])})
    r.stack = ", ".join(statuses) or "unknown"
    if d.nodes:
        r.up, r.drained = d.nodes["up"], d.nodes["drained"]
    r.alerts, r.findings = d.alerts_firing, len(d.findings)
    r.finding_ids = tuple(f.entry.id for f in d.findings)
    r.state = "healthy" if d.healthy else "degraded"
    r.usage = usage_of(tenant) if usage_of is not None else month_usage(tenant, root)
    r.repair = repair_of(tenant) if repair_of is not None else repair_cell(tenant, root)
    return r


def table(rows: list[Row]) -> str:
    cells = [COLUMNS] + [tuple(clean(c) for c in r.cells()) for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in rows:
        if r.finding_ids:
            lines.append(f"{clean(r.org)}: {', '.join(clean(i) for i in r.finding_ids)} (invoke doctor --org={clean(r.org)})")
    return "\n".join(lines) + "\n"


def html_page(rows: list[Row], generated: str) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in COLUMNS)
    body = "\n".join(
        f'<tr class="{e(r.state.replace(" ", "-"))}">' + "".join(f"<td>{e(c)}</td>" for c in r.cells())
        + "</tr>" for r in rows)
    details = "\n".join(f"<li><b>{e(r.org)}</b>: {e(', '.join(r.finding_ids))}</li>" for r in rows if r.finding_ids)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>fmcluster fleet</title>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<style>body{{font-family:sans-serif}} table{{border-collapse:collapse}} td,th{{border:1px solid #999;padding:4px 8px}}
tr.degraded{{background:#fdd}} tr.healthy{{background:#dfd}} tr.planned,tr.not-deployed{{color:#555}}
tr.invalid{{background:#fee}}</style></head>
<body><h1>fmcluster fleet</h1>
<p>Generated by <code>invoke fleet</code> at {e(generated)}. Live columns are read from each deployed tenant
(local: only while its emulator runs; AWS: only with credentials); "?" is unknown, never assumed.</p>
<table><thead><tr>{head}</tr></thead>
<tbody>
{body}
</tbody></table>
<h2>Findings</h2><ul>
{details or "<li>none</li>"}
</ul></body></html>
"""
