"""`invoke doctor`'s diagnosis: the knowledge base's detections over a cluster's evidence (or one job log), per
finding what is wrong, the evidence, the fix and the source; healthy only on positive evidence. The command
itself is fmcluster.commands.diagnose.doctor."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fmcluster.catalog import load_catalog
from fmcluster.doctor import instance_facts, knowledge
from fmcluster.doctor.detect import Evidence, Finding, findings
from fmcluster.doctor.logscan import explained

Out = Callable[[str], object]
#: Characters of a log read for log-pattern entries from its start, and from its end (the acceptance parser itself
#: streams the whole file); a failure usually shows at one end of a long job's log, and what lies between is noted.
LOG_SCAN_BYTES = 16 * 1024 * 1024
LOG_TAIL_BYTES = 16 * 1024 * 1024
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def clean(text: str) -> str:
    """Text from nodes and logs, safe for a terminal: control characters (escape sequences) shown, not sent."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


@dataclass
class Diagnosis:
    subject: str
    """`org demo (local, slurm-ec2)` or the log's path"""
    findings: list[Finding]
    checked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    acceptance: dict[str, Any] | None = None
    """Log mode: the acceptance verdict, as `fmcluster acceptance parse --json` gives status, codes and cause."""
    nodes: dict[str, int] | None = None
    alerts_firing: int | None = None
    facts: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    complete: bool = True
    """Everything was read (False: the middle of a long log was skipped, so it cannot be called healthy)."""

    @property
    def healthy(self) -> bool:
        """Positive evidence only: something was read (all of it), nothing fired, and a judged log passed."""
        if self.findings or not self.checked or not self.complete:
            return False
        return self.acceptance is None or self.acceptance.get("status") == "pass"

    def to_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "healthy": self.healthy, "findings": [f.to_dict() for f in self.findings],
                "checked": self.checked, "notes": self.notes, "acceptance": self.acceptance, "nodes": self.nodes,
                "alerts_firing": self.alerts_firing}


def render(d: Diagnosis) -> str:
    lines = [f"doctor: {clean(d.subject)}"]
    if d.acceptance is not None:
        a = d.acceptance
        lines.append(f"acceptance verdict: {str(a['status']).upper()} ({clean(str(a['cause']))}); codes: "
                     f"{', '.join(a['codes']) or '-'}")
    for f in d.findings:
        e = f.entry
        lines += ["", f"[{e.id}] {e.title}", f"  detected by: {clean(e.reference)}"]
        lines += [f"  evidence: {clean(h.where)}: {clean(h.evidence)}" for h in f.hits]
        lines += [f"  fix: {e.fix}", f"  source: {e.url}"]
    if d.notes:
        lines += ["", "notes:"] + [f"  {clean(n)}" for n in d.notes]
    lines += ["", f"checked: {clean('; '.join(d.checked)) or 'nothing could be read'}"]
    if d.healthy:
        lines.append("verdict: healthy")
    else:
        why = f"{len(d.findings)} finding(s)" if d.findings else (
            "nothing could be read" if not d.checked else f"acceptance {d.acceptance and d.acceptance.get('status')}")
        lines.append(f"verdict: UNHEALTHY ({why})")
    return "\n".join(lines) + "\n"


def judge_log(path: Path, org: str | None = None, instance_type: str | None = None) -> tuple[Any, Any]:
    """(parsed log, verdict) exactly as `fmcluster acceptance parse [--org]` judges it (the same calls)."""
    from fmcluster.commands.acceptance_cli import _queues
    from fmcluster.acceptance.expectation import resolve_expectation
    from fmcluster.acceptance.parser import parse_file
    from fmcluster.acceptance.verdict import judge
    from fmcluster.catalog import load_catalog

    log = parse_file(path)
    queues, override = _queues(org) if org and not instance_type else (None, None)
    resolution = resolve_expectation(log, load_catalog(), instance_type=instance_type, queues=queues, queue=None, nodes=None,
                                     override_gbps=override, collective=None, require_data_check=False)
    return log, judge(log, resolution.expectation, not_judged_reason=resolution.reason)


def diagnose_log(path: Path, org: str | None = None, instance_type: str | None = None) -> Diagnosis:
    """Any log: every entry's log pattern in one pass over its lines, and, when it is benchmark output, the acceptance
    verdict's findings; the instance's facts applied (fmcluster.doctor.instance_facts); a cause found drops the
    findings it explains. Raises OSError if unreadable."""
    log, verdict = judge_log(path, org, instance_type)
    # Read as the parser reads it: decompressed, decoded, its size and lines bounded (fmcluster.acceptance.parser).
    head, tail, skipped = read_ends(path)
    # A log the reader stopped in (4 GiB, the line bound, a decompression bomb) is never healthy: its verdict says so.
    benchmark = is_benchmark(log) or log.bytes_capped
    logs = {str(path): head, **({f"{path} (end)": tail} if tail else {})}
    ev = Evidence(verdicts={str(path): verdict} if benchmark else {}, logs=logs)
    entries = [e for e in knowledge.load() if e.log_pattern or (benchmark and e.kind == "acceptance")]
    known = instance_facts.resolve(load_catalog(), instance_type, _org_types(org), log)
    found, notes = instance_facts.apply(findings(entries, ev), log, known, knowledge.by_id(), benchmark)
    found, dropped = without_symptoms(in_log_order(found))
    notes += first_failure(found)
    if not benchmark:
        notes.append("not benchmark output (no nccl-tests or nccom-test header, rank list or table): the acceptance "
                     "checks do not apply; the log was read for every entry's log lines")
    if skipped:
        notes.append(f"{skipped:,} characters in the middle of the log were not read (it is read to "
                     f"{LOG_SCAN_BYTES >> 20} MiB from its start and {LOG_TAIL_BYTES >> 20} MiB from its end; lines of "
                     "'(end)' count from there): it is not called healthy")
    checked = [f"log {path} ({verdict.status if benchmark else 'read'})"] if (head + tail).strip() else []
    acceptance = {"status": verdict.status, "codes": list(verdict.codes), "cause": verdict.cause} if benchmark else None
    return Diagnosis(str(path), found, checked=checked, notes=dropped + notes, acceptance=acceptance,
                     complete=not skipped)


def read_ends(path: Path) -> tuple[str, str, int]:
    """(the log's start, its end when the start did not hold it all, the characters between them not kept), read
    through the parser's bounded reader in one pass with bounded memory."""
    from fmcluster.acceptance.parser import read_bounded

    head: list[str] = []
    tail: deque[str] = deque()
    head_size = tail_size = skipped = 0
    for line, _ in read_bounded(path):
        if not tail and head_size + len(line) <= LOG_SCAN_BYTES:
            head.append(line)
            head_size += len(line)
            continue
        tail.append(line)
        tail_size += len(line)
        while tail_size > LOG_TAIL_BYTES and len(tail) > 1:
            dropped = tail.popleft()
            tail_size -= len(dropped)
            skipped += len(dropped)
    return "".join(head), "".join(tail), skipped


def _org_types(org: str | None) -> list[str]:
    if not org:
        return []
    from fmcluster.commands.acceptance_cli import _queues

    return [instance.name for instance in _queues(org)[0].values()]


def is_benchmark(log: Any) -> bool:
    """The log holds a collective benchmark's own output (a header, rank list, size table or its failure lines), so
    the acceptance verdict applies to it."""
    return bool(log.rows or log.header or log.rank_lines_seen or log.benchmark_printed or log.avg_busbw_text
                or log.tables or log.test_failures or log.tool != "nccl-tests")


def in_log_order(found: list[Finding]) -> list[Finding]:
    """The verdict's findings first, then the log's in the order their first line appears: what failed first (the
    first rank, the first cause) leads."""
    return sorted(found, key=lambda f: min((h.line for h in f.hits), default=0))


def first_failure(found: list[Finding]) -> list[str]:
    """Where the log first shows a failure (the line, and the rank and host its prefix named): where to start."""
    hits = [(h, f.entry.id) for f in found for h in f.hits if h.line]
    if not hits:
        return []
    hit, entry_id = min(hits, key=lambda pair: pair[0].line)
    return [f"first failure in the log: {hit.where} [{entry_id}]"]


def without_symptoms(found: list[Finding]) -> tuple[list[Finding], list[str]]:
    """The findings less those a fired cause explains (knowledge.yml `explains`), and a note for each dropped one."""
    causes = explained([f.entry for f in found])
    kept = [f for f in found if f.entry.id not in causes]
    return kept, [f"[{f.entry.id}] not shown: a symptom of [{causes[f.entry.id]}]" for f in found
                  if f.entry.id in causes]


def diagnose_cluster(org: str, node: str = "", out: Out = print) -> Diagnosis:
    from fmcluster.commands.cluster import require_tenant
    from fmcluster.doctor.gather import gather

    tenant = require_tenant(org)
    got = gather(tenant, node, out)
    entries = [e for e in knowledge.load() if e.applies_to(tenant.provider, tenant.scheduler)]
    found = findings(entries, got.evidence)
    return Diagnosis(f"{org} ({tenant.provider}, {tenant.scheduler})" + (f", node {node}" if node else ""),
                     found, got.checked, got.notes, nodes=node_counts(tenant, got.evidence),
                     alerts_firing=got.alerts_firing, facts=got.evidence.facts)


def node_counts(tenant: Any, ev: Evidence) -> dict[str, int] | None:
    """Compute nodes expected (the spec), up and drained (Slurm's view); None when Slurm was not read."""
    if ev.sinfo is None:
        return None
    states = [line.split("|")[1] for line in ev.sinfo.splitlines() if line.count("|") >= 2]
    return {"expected": sum(q.count for q in tenant.queues),
            "up": sum(1 for s in states if not s.endswith("*") and not s.startswith(("down", "fail"))),
            "drained": sum(1 for s in states if s.startswith("drain"))}
