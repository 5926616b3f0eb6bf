"""Evidence and detection: an entry's detection run over the evidence doctor gathered (or a test recorded).

Pure functions over plain data: gathering (fmcluster.doctor.gather) talks to nodes and APIs, this module only
reads what it was given, so every entry's detection is tested on recorded inputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from fmcluster.acceptance.verdict import Verdict
from fmcluster.doctor.knowledge import FACTS, Entry
from fmcluster.doctor.logscan import Hit, scan, short as _short

__all__ = ["Evidence", "Finding", "Hit", "detect", "findings"]


@dataclass
class Evidence:
    """Everything doctor read, by kind. Absent evidence (None / empty) makes an entry silent, never a pass:
    what could not be read is itself a fact (`node_unreachable`, `unreachable`)."""

    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    """node → `fmcluster-health check --json` report"""
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    """log name → acceptance verdict of it"""
    logs: dict[str, str] = field(default_factory=dict)
    """name → text (job logs, nodes' NCCL environment files)"""
    sinfo: str | None = None
    """`sinfo --noheader -N -o '%N|%T|%E'`"""
    targets: list[dict[str, Any]] | None = None
    """Prometheus /api/v1/targets activeTargets"""
    facts: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """fact name → [(where, value)]"""

    def add_fact(self, name: str, where: str, value: str) -> None:
        if name not in FACTS:
            raise KeyError(f"unknown fact {name!r}")
        self.facts.setdefault(name, []).append((where, value))


def detect(entry: Entry, ev: Evidence) -> list[Hit]:
    """Where the entry's detection fires in `ev` (empty: silent): its own kind of evidence, and its log pattern."""
    return _kind_hits(entry, ev) + scan([entry], ev.logs).get(entry.id, [])


def _kind_hits(entry: Entry, ev: Evidence) -> list[Hit]:
    """Where the entry's detection fires in the evidence of its kind (log lines: fmcluster.doctor.logscan)."""
    d = entry.detect
    hits: list[Hit] = []
    if entry.kind == "health":
        match = re.compile(d.get("match", ""))
        for node, report in sorted(ev.reports.items()):
            for result in report.get("results", []):
                if (result.get("check") == d["check"] and result.get("status") == "fail"
                        and match.search(str(result.get("detail", "")))):
                    hits.append(Hit(node, _short(f"{d['check']}: {result.get('detail', '')}")))
    elif entry.kind == "acceptance":
        for name, verdict in sorted(ev.verdicts.items()):
            for finding in verdict.findings:
                if finding.code == d["code"] and (d.get("severity") != "fail" or finding.severity == "fail"):
                    hits.append(Hit(name, _short(f"{finding.code} ({finding.severity}): {finding.message}")))
    elif entry.kind == "slurm":
        pattern = re.compile(d["match"])
        for line in (ev.sinfo or "").splitlines():
            if line.strip() and pattern.search(line.strip()):
                node, _, rest = line.strip().partition("|")
                hits.append(Hit(node, _short(rest.replace("|", ": ", 1))))
    elif entry.kind == "prometheus":
        pattern = re.compile(d["job"])
        for target in ev.targets or []:
            labels = target.get("labels", {}) or {}
            if target.get("health") != "up" and pattern.search(str(labels.get("job", ""))):
                where = str(labels.get("node") or labels.get("instance") or target.get("scrapeUrl", "?"))
                hits.append(Hit(where, _short(f"job {labels.get('job', '?')}: {target.get('health', '?')} "
                                              f"{target.get('lastError', '')}")))
    elif entry.kind == "fact":
        pattern = re.compile(d.get("match", ""))
        hits += [Hit(where, _short(value)) for where, value in ev.facts.get(d["fact"], []) if pattern.search(value)]
    return hits


@dataclass(frozen=True)
class Finding:
    entry: Entry
    hits: tuple[Hit, ...]

    def to_dict(self) -> dict[str, Any]:
        e = self.entry
        return {"id": e.id, "title": e.title, "symptom": e.symptom, "fix": e.fix, "source": e.url,
                "detection": e.reference, "evidence": [{"where": h.where, "evidence": h.evidence} for h in self.hits]}


def findings(entries: Mapping[str, Entry] | list[Entry] | tuple[Entry, ...], ev: Evidence) -> list[Finding]:
    """Every entry that fires, each with its hits; the logs are read once for all entries' patterns."""
    values = list(entries.values()) if isinstance(entries, Mapping) else list(entries)
    log_hits = scan(values, ev.logs)
    out = []
    for entry in values:
        hits = _kind_hits(entry, ev) + log_hits.get(entry.id, [])
        if hits:
            out.append(Finding(entry, tuple(hits)))
    return out
