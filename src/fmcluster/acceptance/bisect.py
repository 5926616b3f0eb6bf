"""Find the nodes that make a collective slow or wrong, by testing node pairs.

Round 1 tests disjoint pairs (an odd node out is paired with the first node), so the pairs of a big
cluster can run at the same time. A node in a passing pair is good. A failing pair with one good member
convicts the other member; a failing pair with no known-good member is split and each member is tested
again beside a good node. If no pair passes at all, the problem is cluster-wide (a setting, not a node):
nothing is convicted, because draining every node would hide the real cause. (With two nodes a
failing pair cannot say which node it was: that is reported the same way.)

This module judges nothing: a pair passes or fails by the probe's answer, which in the gate is
`verdict.judge(...).passed` on the pair's log (runner.py), the same judging as every other run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Pair = tuple[str, str]
PairProbe = Callable[[Sequence[Pair]], dict[Pair, bool]]
"""Runs each pair's test (possibly concurrently) and says which passed (in the gate: the pair's verdict)."""


@dataclass(frozen=True)
class Bisection:
    bad: tuple[str, ...]
    good: tuple[str, ...]
    cluster_wide: bool
    """Every pair failed: the cause is shared (configuration, fabric), not one node."""
    probes: tuple[tuple[Pair, bool], ...] = field(default=())
    """Every pair tested, in order, with its outcome: the evidence for the drain reason."""

    def evidence(self, node: str) -> str:
        """The pair results that convicted `node`, for the drain reason."""
        failed = [f"{a}+{b}" for (a, b), ok in self.probes if not ok and node in (a, b)]
        return "failed in pair " + ", ".join(failed) if failed else "no failing pair"


def first_round(nodes: Sequence[str]) -> list[Pair]:
    pairs = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2 and len(nodes) > 1:
        pairs.append((nodes[-1], nodes[0]))
    return pairs


def find_bad_nodes(nodes: Sequence[str], probe: PairProbe) -> Bisection:
    """Bisect `nodes` (at least two) with pair tests run by `probe`."""
    if len(nodes) < 2:
        raise ValueError("bisection needs at least two nodes")
    history: list[tuple[Pair, bool]] = []
    results = probe(first_round(nodes))
    history += results.items()
    good = {n for pair, ok in results.items() if ok for n in pair}
    if not good:
        return Bisection(bad=(), good=(), cluster_wide=True, probes=tuple(history))
    bad: set[str] = set()
    unresolved: list[str] = []
    for (a, b), ok in results.items():
        if ok:
            continue
        for node, other in ((a, b), (b, a)):
            if node in good:
                continue
            if other in good:
                bad.add(node)
            elif node not in unresolved:
                unresolved.append(node)
    if unresolved:
        helpers = sorted(good)
        second = [(node, helpers[i % len(helpers)]) for i, node in enumerate(unresolved)]
        results = probe(second)
        history += results.items()
        for (node, _helper), ok in results.items():
            (good.add if ok else bad.add)(node)
    order = {n: i for i, n in enumerate(nodes)}
    return Bisection(
        bad=tuple(sorted(bad, key=order.__getitem__)),
        good=tuple(sorted(good - bad, key=order.__getitem__)),
        cluster_wide=False,
        probes=tuple(history),
    )
