"""Every failure code the gate can raise has a knowledge-base entry (what it means, what to do, a public source),
so `invoke doctor --log` explains every failure it shows; the doctor tests then hold each entry to a recorded log.

Warning-only codes have none on purpose: doctor reports every entry that fires, and a log that passes with a
harmless warning (an old nccl-tests that does not name its benchmark) must not read as unhealthy."""

from __future__ import annotations

from fmcluster.acceptance.verdict import CODES
from fmcluster.doctor import knowledge

WARNING_ONLY = {"benchmark_unnamed", "garbled", "line_too_long", "rows_dropped", "rank_count_unknown",
                "bandwidth_not_gated"}
# A safety net no known log reaches (it fires only when no other finding failed yet the pass rule is unmet), so
# there is no recorded input to hold an entry to; its own fix tells the user to report the log.
NO_RECORDED_INPUT = {"no_positive_evidence"}


def test_every_failure_code_has_a_knowledge_entry() -> None:
    covered = {e.detect["code"] for e in knowledge.load() if e.kind == "acceptance"}
    missing = sorted(set(CODES) - covered - WARNING_ONLY - NO_RECORDED_INPUT)
    assert missing == [], f"codes without a knowledge entry: {missing}"
    assert not (WARNING_ONLY | NO_RECORDED_INPUT) & covered


def test_the_codes_left_without_an_entry_are_warnings_as_the_gate_describes_them() -> None:
    for code in WARNING_ONLY:
        assert CODES[code].severity == "warn", code
    assert NO_RECORDED_INPUT <= set(CODES)
