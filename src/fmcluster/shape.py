"""The cluster against its declaration: every compute node the tenant declares, per queue, serving in Slurm.

A deploy whose steps all succeeded can still end over a degraded cluster (a node drained by its health checks or
by acceptance, a slurmd that never came back, an instance missing from its group). The deploy's `shape` step asks
the controller what Slurm and the health triage see (fmcluster.lifecycle.read_view), counts the serving compute
nodes of each queue against `queues[].count`, and names every other node with its state, reason, check and the
action the triage table gives it. A degraded cluster fails the deploy unless the operator allows it
(`invoke deploy --allow-degraded`); acceptance then says which declared nodes it could not test.

Nodes that settle by themselves (a slurmd registering after a reboot, a node the health program drained and
resumes once its check passes) get up to two health intervals first; a node drained by acceptance or by a person
does not settle by itself, so the step does not wait for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fmcluster.health import slurm as slurm_text
from fmcluster.health.triage import Finding
from fmcluster.model import Tenant
from fmcluster.nodes import Node
from fmcluster.steps import StepOutcome

#: Slurm flags under which a node takes no new job (base states other than these are not serving either).
NOT_SERVING_FLAGS = frozenset({"DRAIN", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP",
                               "MAINTENANCE", "REBOOT_REQUESTED", "REBOOT_ISSUED", "FAIL"})
SERVING_STATES = frozenset({"IDLE", "ALLOCATED", "MIXED", "COMPLETING"})
#: Who drained a node when nobody will undo it without being asked (fmcluster.health.triage's origins).
STICKY_ORIGINS = frozenset({"acceptance", "person", "quarantine"})


@dataclass(frozen=True)
class Missing:
    """A declared compute node that does not serve: its name (or the queue's shortfall), and why."""

    node: str
    queue: str
    state: str
    reason: str
    action: str = ""
    settles: bool = True  # may come back by itself (Slurm's ReturnToService, the health program's resume)

    def line(self) -> str:
        todo = f"; triage action: {self.action}" if self.action and self.action != "none" else ""
        return f"{self.node} (queue {self.queue}): {self.state} — {self.reason}{todo}"


@dataclass
class Shape:
    """Serving compute nodes per queue against the declared counts."""

    declared: dict[str, int]
    serving: dict[str, list[str]] = field(default_factory=dict)
    missing: list[Missing] = field(default_factory=list)

    @property
    def degraded(self) -> bool:
        return bool(self.missing) or any(len(self.serving.get(q, [])) < n for q, n in self.declared.items())

    @property
    def settling(self) -> bool:
        """Every gap may close by itself (so waiting a little is worth it)."""
        return all(m.settles for m in self.missing)

    def counts(self) -> str:
        return ", ".join(f"{q} {len(self.serving.get(q, []))}/{n}" for q, n in self.declared.items())


def serving(known: slurm_text.Node | None) -> bool:
    return (known is not None and known.state in SERVING_STATES
            and not NOT_SERVING_FLAGS.intersection(known.flags))


def measure(tenant: Tenant, nodes: Sequence[Node], cluster: dict[str, slurm_text.Node],
            findings: Sequence[Finding]) -> Shape:
    """The shape of the cluster from the live instances, Slurm's nodes and the triage's findings."""
    shape = Shape({q.name: q.count for q in tenant.queues})
    found = {f.node: f for f in findings}
    # Slurm names a node as its scheduler does (e.g. `<queue>-st-<resource>-<n>`, not the instance's
    # hostname); its NodeAddr is the instance's address everywhere.
    by_address = {n.address: n for n in cluster.values() if n.address}
    for node in nodes:
        if node.role != "compute":
            continue
        queue = node.queue or "?"
        known = cluster.get(node.name) or by_address.get(node.address)
        finding = found.get(known.name) if known else None
        if serving(known) and finding is None:
            shape.serving.setdefault(queue, []).append(node.name)
            continue
        if known is None:
            shape.missing.append(Missing(node.name, queue, "not in Slurm",
                                         "its instance runs but slurmctld does not list it (still joining?)"))
            continue
        flags = [f for f in known.flags if f in NOT_SERVING_FLAGS]
        state = known.display_state + ("" if known.responding else " (not responding)")
        reason = (finding.reason or finding.why) if finding else (known.reason or "+".join([known.state, *flags]))
        shape.missing.append(Missing(node.name, queue, state, reason or "no reason recorded",
                                     finding.action if finding else "",
                                     settles=not (finding and finding.origin in STICKY_ORIGINS)))
    for queue, count in shape.declared.items():
        short = count - len(shape.serving.get(queue, [])) - sum(1 for m in shape.missing if m.queue == queue)
        if short > 0:
            shape.missing.append(Missing(f"{short} instance(s)", queue, "absent",
                                         f"the queue declares {count}; its group runs fewer", settles=False))
    return shape


Look = Callable[[], Shape]


def settle(look: Look, budget_s: float, out: Callable[[str], object], poll_s: float = 5.0) -> Shape:
    """Look until the cluster has its shape, a gap cannot close by itself, or the budget is spent."""
    deadline = time.monotonic() + budget_s
    shape = look()
    announced = 0.0
    while shape.degraded and shape.settling and time.monotonic() < deadline:
        if time.monotonic() - announced >= 30:
            out(f"  waiting up to {deadline - time.monotonic():.0f}s for "
                f"{', '.join(m.node for m in shape.missing)} to serve ({shape.counts()})")
            announced = time.monotonic()
        time.sleep(poll_s)
        shape = look()
    return shape


def outcome(shape: Shape, allow_degraded: bool, org: str) -> StepOutcome:
    details = [m.line() for m in shape.missing]
    if not shape.degraded:
        return StepOutcome("ok", f"every declared compute node serves ({shape.counts()})")
    hints = [f"`invoke nodes --org={org}` shows each node's check and action; `invoke replace --org={org} "
             "--node=N` replaces one; `invoke deploy --allow-degraded` accepts the cluster as it is"]
    if allow_degraded:
        return StepOutcome("ok", f"DEGRADED, allowed by --allow-degraded: {shape.counts()} serving", details,
                           degraded=True)
    return StepOutcome("failed", f"the cluster is below its declared shape: {shape.counts()} compute nodes serve",
                       details + hints)
