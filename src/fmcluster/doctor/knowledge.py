"""The knowledge base (src/fmcluster/data/knowledge.yml): entries, their schema, and the references every
detection makes to a check that exists (a health check, an acceptance code, a fact doctor gathers)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import jsonschema
import yaml

from fmcluster.capabilities import PROVIDERS as PROVIDER_CAPABILITIES, SCHEDULERS as SCHEDULER_CAPABILITIES
from fmcluster.paths import DATA_DIR

KNOWLEDGE_PATH = DATA_DIR / "knowledge.yml"
KINDS = ("health", "acceptance", "log", "slurm", "prometheus", "fact")
#: Every provider and scheduler fmcluster has (their registries): an entry without `applies:` covers each, a new
#: one included, and `applies:` may name no other.
PROVIDERS = tuple(PROVIDER_CAPABILITIES)
SCHEDULERS = tuple(SCHEDULER_CAPABILITIES)

#: The facts doctor gathers (fmcluster.doctor.gather) besides checks, logs, Slurm and Prometheus, which a `fact`
#: detection may name: name → what it holds (one value per place, e.g. per stack, per reservation, per node).
FACTS = {
    "resource_not_created": "CloudFormation resource types in a stack's template that the stack does not hold",
    "stack_status": "each stack's status (CREATE_COMPLETE, ROLLBACK_COMPLETE, ...)",
    "dra_lifecycle": "each FSx data repository association's Lifecycle (AVAILABLE, MISCONFIGURED, FAILED, ...)",
    "capacity_reservation_state": "the State of each capacity reservation the tenant names",
    "capacity_reservation_mismatch": "a reservation whose instance type or zone differs from its queue's",
    "node_unreachable": "a node doctor could not run its health checks on (ssh failed, no report came back)",
    "unreachable": "an API or service doctor could not ask (AWS APIs/emulator, Slurm, Prometheus)",
}

_TEXT: dict[str, Any] = {"type": "string", "minLength": 1}
_DETECT: dict[str, dict[str, Any]] = {
    "health": {"check": _TEXT, "match": _TEXT},
    "acceptance": {"code": _TEXT, "severity": {"enum": ["fail"]}},
    "log": {"pattern": _TEXT},
    "slurm": {"match": _TEXT},
    "prometheus": {"job": _TEXT},
    "fact": {"fact": _TEXT, "match": _TEXT},
}
_REQUIRED = {"health": ["check"], "acceptance": ["code"], "log": ["pattern"], "slurm": ["match"],
             "prometheus": ["job"], "fact": ["fact"]}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["schema_version", "sources", "entries"],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"const": 1},
        "sources": {"type": "object", "minProperties": 1,
                    "additionalProperties": {"type": "string", "pattern": r"https://\S+"}},
        "entries": {"type": "array", "minItems": 20, "items": {
            "type": "object",
            "required": ["id", "title", "symptom", "detect", "fix", "source"],
            "additionalProperties": False,
            "properties": {
                "id": {"type": "string", "pattern": "^[a-z0-9]+(?:-[a-z0-9]+)*$"},
                "title": _TEXT, "symptom": _TEXT, "fix": _TEXT, "source": _TEXT,
                "log": _TEXT, "unless": _TEXT,
                "explains": {"type": "array", "minItems": 1, "uniqueItems": True,
                             "items": {"type": "string", "pattern": "^[a-z0-9]+(?:-[a-z0-9]+)*$"}},
                "applies": {"type": "object", "additionalProperties": False, "properties": {
                    "providers": {"type": "array", "minItems": 1, "items": {"enum": list(PROVIDERS)}},
                    "schedulers": {"type": "array", "minItems": 1, "items": {"enum": list(SCHEDULERS)}}}},
                "detect": {"oneOf": [
                    {"type": "object", "required": ["kind", *_REQUIRED[kind]], "additionalProperties": False,
                     "properties": {"kind": {"const": kind}, **props}}
                    for kind, props in _DETECT.items()]},
            },
        }},
    },
}


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    symptom: str
    fix: str
    source: str
    """The source's text as `sources` gives it (title, URL)."""
    kind: str
    detect: Mapping[str, str]
    providers: tuple[str, ...]
    schedulers: tuple[str, ...]
    log_pattern: str = ""
    """The log lines that show this failure (a `log` entry's detection, or any entry's `log:`); empty: none."""
    unless: str = ""
    """A log line that proves the pattern's hit harmless in that log (e.g. the plugin set NCCL_PROTO itself)."""
    explains: tuple[str, ...] = ()
    """Entries whose findings are symptoms of this one: dropped when this one fires in the same log."""

    @property
    def url(self) -> str:
        return next((w.rstrip(".,;") for w in self.source.split() if w.startswith("https://")), "")

    @property
    def reference(self) -> str:
        """The checks it refers to, in one phrase (docs and findings)."""
        if self.kind == "log":
            return f"log line /{self.log_pattern}/"
        return self._check_reference() + (f"; log line /{self.log_pattern}/" if self.log_pattern else "")

    def _check_reference(self) -> str:
        d = self.detect
        if self.kind == "health":
            return f"health check `{d['check']}`" + (f" /{d['match']}/" if "match" in d else "")
        if self.kind == "acceptance":
            return f"acceptance finding `{d['code']}`" + (" (fail)" if d.get("severity") == "fail" else "")
        if self.kind == "slurm":
            return f"sinfo node|state|reason /{d['match']}/"
        if self.kind == "prometheus":
            return f"Prometheus target of job /{d['job']}/ not up"
        return f"fact `{d['fact']}`" + (f" /{d['match']}/" if "match" in d else "")

    def applies_to(self, provider: str, scheduler: str) -> bool:
        return provider in self.providers and scheduler in self.schedulers


class KnowledgeInvalid(ValueError):
    """knowledge.yml breaks its schema or refers to a check that does not exist."""


def problems(raw: Mapping[str, Any]) -> list[str]:
    """Every schema or reference problem of a knowledge document (empty: valid)."""
    from fmcluster.acceptance.verdict import CODES
    from fmcluster.health.data import checks_doc

    validator = jsonschema.Draft202012Validator(SCHEMA)
    found = [f"{'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
             for e in sorted(validator.iter_errors(raw), key=lambda e: list(e.absolute_path))]
    if found:
        return found
    checks = {c["name"] for c in checks_doc()["checks"]}
    seen: set[str] = set()
    for i, entry in enumerate(raw["entries"]):
        where = f"entries/{i} ({entry['id']})"
        if entry["id"] in seen:
            found.append(f"{where}: duplicate id")
        seen.add(entry["id"])
        if entry["source"] not in raw["sources"]:
            found.append(f"{where}: source {entry['source']!r} is not in `sources`")
        d = entry["detect"]
        found += _log_problems(where, entry, {e["id"] for e in raw["entries"]})
        if d["kind"] == "health" and d["check"] not in checks:
            found.append(f"{where}: no health check {d['check']!r} in health_checks.yml")
        if d["kind"] == "acceptance" and d["code"] not in CODES:
            found.append(f"{where}: no acceptance finding {d['code']!r} in fmcluster.acceptance.verdict.CODES")
        if d["kind"] == "fact" and d["fact"] not in FACTS:
            found.append(f"{where}: doctor gathers no fact {d['fact']!r} (fmcluster.doctor.knowledge.FACTS)")
        for key in ("match", "pattern", "job"):
            if key in d:
                try:
                    re.compile(d[key])
                except re.error as err:
                    found.append(f"{where}: detect.{key} is not a regular expression: {err}")
    return found


def _log_problems(where: str, entry: Mapping[str, Any], ids: set[str]) -> list[str]:
    """`log`/`unless` are regular expressions, a `log` entry has its pattern in `detect` only, `explains` names
    other entries that exist."""
    found = []
    if entry["detect"]["kind"] == "log" and "log" in entry:
        found.append(f"{where}: a `log` entry has its pattern in detect.pattern, not in `log`")
    if "unless" in entry and "log" not in entry and entry["detect"]["kind"] != "log":
        found.append(f"{where}: `unless` without a log pattern")
    for key in ("log", "unless"):
        if key in entry:
            try:
                re.compile(entry[key])
            except re.error as err:
                found.append(f"{where}: {key} is not a regular expression: {err}")
    found += [f"{where}: explains {other!r}, which is no entry" for other in entry.get("explains", [])
              if other not in ids or other == entry["id"]]
    return found


def load_raw(path: Path = KNOWLEDGE_PATH) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return raw


@lru_cache(maxsize=2)
def load(path: Path = KNOWLEDGE_PATH) -> tuple[Entry, ...]:
    raw = load_raw(path)
    found = problems(raw)
    if found:
        raise KnowledgeInvalid(f"{path}:\n  " + "\n  ".join(found))
    return tuple(
        Entry(id=e["id"], title=e["title"], symptom=e["symptom"], fix=" ".join(e["fix"].split()),
              source=str(raw["sources"][e["source"]]), kind=e["detect"]["kind"],
              detect={k: str(v) for k, v in e["detect"].items() if k != "kind"},
              providers=tuple(e.get("applies", {}).get("providers", PROVIDERS)),
              schedulers=tuple(e.get("applies", {}).get("schedulers", SCHEDULERS)),
              log_pattern=str(e["detect"]["pattern"] if e["detect"]["kind"] == "log" else e.get("log", "")),
              unless=str(e.get("unless", "")), explains=tuple(e.get("explains", ())))
        for e in raw["entries"])


def by_id() -> dict[str, Entry]:
    return {e.id: e for e in load()}
