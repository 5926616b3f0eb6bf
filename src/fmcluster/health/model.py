"""Check specs (from health_checks.yml), check results and the report a run writes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

#: What a node needs, in increasing order of cost. A failing check always drains first.
ACTIONS = ("none", "drain", "reboot", "replace")
CONTEXTS = ("interval", "prolog", "manual", "diag", "boot", "cluster")
#: Contexts that run DCGM's longer diagnostics, outside slurmd's 60 s limit: on demand, and once per boot.
LONG_CONTEXTS = ("diag", "boot")
FACTS = ("gpus", "efa", "mounts")


def worst(actions: Sequence[str]) -> str:
    """The most expensive of `actions` ("none" when empty)."""
    return max(actions, key=ACTIONS.index, default="none")


class Unreadable(Exception):
    """A check could not read its evidence. Fail closed: the check fails, with this as the diagnosis."""


@dataclass(frozen=True)
class CheckSpec:
    name: str
    title: str
    scope: str
    contexts: tuple[str, ...]
    when: tuple[str, ...]
    reads: str
    on_failure: str
    source: str

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CheckSpec:
        return cls(name=str(raw["name"]), title=str(raw["title"]), scope=str(raw["scope"]),
                   contexts=tuple(raw["contexts"]), when=tuple(raw.get("when") or ()), reads=str(raw["reads"]),
                   on_failure=str(raw["on_failure"]), source=str(raw["source"]))

    @property
    def default_action(self) -> str:
        """The action of a failure when the check does not name one ("per xid" checks name their own)."""
        return self.on_failure if self.on_failure in ACTIONS else "drain"


@dataclass
class Outcome:
    """What a check function returns: passed or not, one line saying why, the evidence behind it."""

    ok: bool
    detail: str
    action: Optional[str] = None
    evidence: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    check: str
    status: str  # pass | fail | skip
    detail: str
    action: str = "none"
    seconds: float = 0.0
    evidence: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    node: str
    context: str
    started: float
    seconds: float
    results: List[Result]
    drain: Dict[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> List[Result]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def healthy(self) -> bool:
        return not self.failures

    @property
    def action(self) -> str:
        return worst([r.action for r in self.failures])

    def reason(self, limit: int = 200) -> str:
        """The drain reason: `fmcluster-health: <first failing check>: <detail>` (+ the other failing checks)."""
        from fmcluster.health import REASON_PREFIX

        failures = self.failures
        if not failures:
            return ""
        first = failures[0]
        more = f" (+{len(failures) - 1} more: {', '.join(r.check for r in failures[1:])})" if len(failures) > 1 else ""
        detail = " ".join(first.detail.split())  # one line: Slurm shows the reason on one line
        text = f"{REASON_PREFIX} {first.check}: {detail}"
        if len(text) + len(more) > limit:
            text = text[: max(limit - len(more) - 3, len(REASON_PREFIX) + 10)].rstrip() + "..."
        return text + more

    def as_dict(self) -> Dict[str, Any]:
        return {
            "node": self.node, "context": self.context, "started": self.started, "seconds": round(self.seconds, 3),
            "healthy": self.healthy, "action": self.action, "reason": self.reason(),
            "results": [asdict(r) for r in self.results], "drain": self.drain,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Report:
        results = [Result(**r) for r in raw.get("results", [])]
        return cls(node=str(raw["node"]), context=str(raw["context"]), started=float(raw["started"]),
                   seconds=float(raw.get("seconds", 0.0)), results=results, drain=dict(raw.get("drain") or {}))
