"""Bisection by node pairs finds the bad nodes, and refuses to blame nodes for a cluster-wide fault."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fmcluster.acceptance.bisect import Pair, find_bad_nodes, first_round


def fabric_with_bad(bad: set[str], log: list[Pair] | None = None):
    """A pair test on a fabric where any pair touching a node in `bad` is slow."""

    def probe(pairs: Sequence[Pair]) -> dict[Pair, bool]:
        if log is not None:
            log.extend(pairs)
        return {p: not (set(p) & bad) for p in pairs}

    return probe


def nodes(n: int) -> list[str]:
    return [f"n{i}" for i in range(1, n + 1)]


def test_first_round_pairs_are_disjoint_and_the_odd_node_joins_the_first() -> None:
    assert first_round(nodes(4)) == [("n1", "n2"), ("n3", "n4")]
    assert first_round(nodes(3)) == [("n1", "n2"), ("n3", "n1")]


@pytest.mark.parametrize(("count", "bad"), [(3, {"n2"}), (3, {"n3"}), (4, {"n4"}), (16, {"n7"}),
                                            (16, {"n3", "n12"}), (5, {"n1"})])
def test_the_bad_nodes_are_found(count: int, bad: set[str]) -> None:
    result = find_bad_nodes(nodes(count), fabric_with_bad(bad))
    assert set(result.bad) == bad
    assert not result.cluster_wide
    assert set(result.good) == set(nodes(count)) - bad


def test_both_members_of_a_failing_pair_are_retested_beside_a_good_node() -> None:
    asked: list[Pair] = []
    result = find_bad_nodes(nodes(4), fabric_with_bad({"n1", "n2"}, asked))
    assert set(result.bad) == {"n1", "n2"}
    assert asked[2:] == [("n1", "n3"), ("n2", "n4")]


def test_one_bad_node_in_sixteen_costs_eight_pairs_then_two() -> None:
    asked: list[Pair] = []
    find_bad_nodes(nodes(16), fabric_with_bad({"n9"}, asked))
    assert len(asked) == 10 and asked[8:] == [("n9", "n1"), ("n10", "n11")]


def test_with_two_nodes_a_failing_pair_cannot_say_which_node() -> None:
    result = find_bad_nodes(nodes(2), fabric_with_bad({"n2"}))
    assert result.cluster_wide and result.bad == ()


def test_when_every_pair_fails_nothing_is_blamed() -> None:
    result = find_bad_nodes(nodes(4), fabric_with_bad(set(nodes(4))))
    assert result.cluster_wide and result.bad == ()


def test_a_healthy_fabric_convicts_nobody() -> None:
    result = find_bad_nodes(nodes(6), fabric_with_bad(set()))
    assert result.bad == () and not result.cluster_wide


def test_the_evidence_names_the_failing_pairs() -> None:
    result = find_bad_nodes(nodes(3), fabric_with_bad({"n2"}))
    assert result.evidence("n2") == "failed in pair n1+n2"


def test_bisection_needs_two_nodes() -> None:
    with pytest.raises(ValueError):
        find_bad_nodes(["n1"], fabric_with_bad(set()))
