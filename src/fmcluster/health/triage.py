"""Triage: which nodes are unhealthy, why, and what each needs (none / drain / reboot / replace).

Input is what an operator (or `invoke nodes`) can get from the controller: `scontrol show node` text, the
nodes' JSON health reports, and the two data files. The decision, in order:

1. a reason the health program wrote (`fmcluster-health: <check>: ...`): the report's own action when the
   report is at hand and agrees, else the check's `on_failure`; for `xid`, the worst action of the XIDs the
   reason or report names, from xid.yml (79 fell off the bus → replace; 13 application error → none);
2. a reason Slurm or fmcluster acceptance wrote: `external_reasons` in health_checks.yml;
3. any other reason is a person's drain: left to them (none).
A node that is healthy in Slurm but whose fresh report fails (it could not drain itself) is listed too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from fmcluster.health import slurm
from fmcluster.health.model import ACTIONS, CheckSpec, worst
from fmcluster.health.xid import XidTable

XID_IN_TEXT = re.compile(r"\bXID (\d+)\b")


@dataclass
class Finding:
    node: str
    state: str
    reason: str
    set_by: str
    since: str
    origin: str  # fmcluster-health | slurm | acceptance | person | report | repair | quarantine
    check: str
    action: str
    why: str
    xids: List[int] = field(default_factory=list)

    @property
    def replace(self) -> bool:
        return self.action == "replace"


def decide_xids(xids: Sequence[int], table: XidTable) -> str:
    """The action a set of XIDs needs: the worst of their rows (an unlisted XID: the table's unknown_action)."""
    return worst([table.action(x) for x in xids])


class Rules:
    """The data triage decides with: health_checks.yml (checks, external_reasons) and xid.yml."""

    def __init__(self, checks_doc: Mapping[str, Any], xid_doc: Mapping[str, Any]) -> None:
        self.checks = {c["name"]: CheckSpec.from_dict(c) for c in checks_doc.get("checks", [])}
        self.external = list(checks_doc.get("external_reasons", []))
        self.xids = XidTable(xid_doc)

    def for_reason(self, reason: str, report: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        ours = slurm.reason_check(reason)
        if ours:
            name, detail = ours
            spec = self.checks.get(name)
            codes = [int(c) for c in XID_IN_TEXT.findall(detail)]
            if report and report.get("reason") == reason:
                failing = [r for r in report.get("results", []) if r.get("status") == "fail"]
                action = worst([str(r.get("action", "drain")) for r in failing]) if failing else "drain"
                codes = sorted({int(code) for r in failing for code in r.get("evidence", {}).get("xids", {})}) or codes
                return {"origin": "fmcluster-health", "check": name, "action": action, "xids": codes,
                        "why": f"the node's health report asks for {action}"}
            if name == "xid" and codes:
                action = decide_xids(codes, self.xids)
                return {"origin": "fmcluster-health", "check": name, "action": action, "xids": codes,
                        "why": "; ".join(f"XID {c} ({self.xids.describe(c)}): {self.xids.action(c)}" for c in codes)}
            if spec is None:
                return {"origin": "fmcluster-health", "check": name, "action": "drain", "xids": [],
                        "why": f"check {name!r} is not in health_checks.yml: look at the node"}
            return {"origin": "fmcluster-health", "check": name, "action": spec.default_action, "xids": [],
                    "why": f"{name}: {spec.title}"}
        for rule in self.external:
            if reason.startswith(str(rule["match"])):
                origin = str(rule.get("origin") or
                             ("acceptance" if str(rule["match"]).startswith("fmcluster acceptance") else "slurm"))
                return {"origin": origin, "check": "", "action": str(rule["action"]), "xids": [],
                        "why": str(rule["why"])}
        return {"origin": "person", "check": "", "action": "none", "xids": [],
                "why": "drained by a person (or a tool fmcluster does not know): theirs to lift"}


def unhealthy_nodes(show_node: str, rules: Rules, reports: Optional[Mapping[str, Mapping[str, Any]]] = None,
                    sinfo_reasons: str = "") -> List[Finding]:
    """Every node that is drained, draining, down, failing or not responding, or whose report fails.

    `show_node` is `scontrol show node` output (full reasons). `sinfo_reasons` (`sinfo -R` output) is only
    used for nodes `show_node` lacks, e.g. when the caller has nothing else."""
    reports = reports or {}
    findings: List[Finding] = []
    nodes = slurm.parse_show_node(show_node)
    known = {n.name for n in nodes}
    for node in nodes:
        report = reports.get(node.name)
        report_fails = report is not None and not report.get("healthy", True)
        unavailable = node.drained or node.state in ("DOWN", "FAIL") or not node.responding
        if not unavailable and not report_fails:
            continue
        reason = node.reason
        if not reason and report_fails:
            reason = str(report.get("reason", "")) if report is not None else ""
            verdict = rules.for_reason(reason, report)
            verdict["origin"] = "report"
        elif not reason:
            verdict = {"origin": "slurm", "check": "", "action": "replace" if node.state == "DOWN" else "none",
                       "xids": [], "why": "down without a reason" if node.state == "DOWN" else "not responding (yet)"}
        else:
            verdict = rules.for_reason(reason, report)
        findings.append(Finding(node.name, node.display_state + ("" if node.responding else "*"), reason,
                                node.reason_by, node.reason_time, **verdict))
    for line in slurm.parse_sinfo_reasons(sinfo_reasons):
        for name in line.nodes:
            if name not in known:
                verdict = rules.for_reason(line.reason)
                findings.append(Finding(name, "unknown", line.reason, line.user, line.time, **verdict))
    return sorted(findings, key=lambda f: (-ACTIONS.index(f.action), f.node))


def replacements(findings: Sequence[Finding]) -> List[str]:
    """The nodes whose finding says replace: what an automatic mode would hand to the provider."""
    return [f.node for f in findings if f.replace]


def table(findings: Sequence[Finding]) -> str:
    """A terminal table, one node per line."""
    if not findings:
        return "no unhealthy node\n"
    rows = [("NODE", "STATE", "ACTION", "CHECK", "REASON")]
    rows += [(f.node, f.state, f.action, f.check or f.origin, f.reason or f.why) for f in findings]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "".join("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] + "\n" for r in rows)
