"""Acceptance runs every check on every path: a line a log may lack changes no failure.

nccl-tests before 2.10 print no `# Collective test starting` line and no `# nccl-tests version`; jobs without
NCCL_DEBUG=INFO print no INFO lines; some launchers drop the `#  Rank` list. Issue 37: with the benchmark line
removed, the verdict said "judged as all_reduce_perf" while the physics checks got no collective and were
skipped, so a busbw above the fabric's ceiling, an in-place time too short for the op to have run and a busbw
contradicting its own time PASSED. The properties below remove every optional line from generated logs and
from the nccl-tests fixtures and assert the set of failure codes does not change. A line is optional for a log
when it is not the evidence of one of its failures (the `#  Rank` lines are the evidence of a duplicate GPU;
a benchmark name other than the one expected is the evidence of a mismatch).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fmcluster.acceptance.expectation import (
    Expectation,
    collective_of_benchmark,
    expectation_for,
    resolve_expectation,
)
from fmcluster.acceptance.model import ParsedLog
from fmcluster.acceptance.parser import parse_text
from fmcluster.acceptance.verdict import Verdict, judge, judged_collective, render
from fmcluster.catalog import load_catalog
from acceptance.test_properties import Spec, build, specs

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PUBLIC = Path(__file__).resolve().parent / "public_logs"
LOGS = sorted([*(FIXTURES / "nccl").glob("*.log"), *(FIXTURES / "nccl" / "public").glob("*.log"),
               *(FIXTURES / "doctor" / "acceptance").glob("*.log"), *PUBLIC.glob("*.log")])

_BENCH_NAME = re.compile(r"# Collective test (?:starting|concluded):")
_TESTS_VERSION = re.compile(r"# nccl-tests version ")
_RANK_LINE = re.compile(r"#?\s*Rank\s+\d+\s.*\bPid\s+\d+\s+on\s")
# INFO lines the parser reads something from (transport, channels, rank and node counts, versions, failures);
# every other INFO line (cudaDriverVersion, Bootstrap, DMA-BUF, tuner, affinity ...) is noise to the verdict.
_NEEDED_INFO = re.compile(r"Using network|NET/|Channel|Ring|channels|Trees|NVLS|n[Rr]anks|nNodes|NCCL version|"
                          r"platform|Plugin|ailure|rror|memory|Killed|CANCELLED|signal|Terminated|Socket|interface")
RANK_EVIDENCE = {"host_count", "duplicate_device", "ranks_missing", "device_model", "rank_count_conflict"}
"""Failures whose evidence is the `#  Rank` lines themselves."""


def _bench_line(line: str) -> bool:
    return bool(_BENCH_NAME.search(line))


def _version_line(line: str) -> bool:
    return bool(_TESTS_VERSION.search(line))


def _rank_line(line: str) -> bool:
    return bool(_RANK_LINE.search(line))


def _noise_info(line: str) -> bool:
    return " NCCL INFO " in line and not _NEEDED_INFO.search(line)


OPTIONAL: dict[str, Callable[[str], bool]] = {
    "benchmark name": _bench_line, "nccl-tests version": _version_line, "rank lines": _rank_line,
    "noise INFO": _noise_info,
}


def fail_codes(v: Verdict) -> set[str]:
    return {f.code for f in v.failures}


def removable(kind: str, log: ParsedLog, verdict: Verdict, exp: Expectation | None) -> bool:
    """Whether lines of `kind` are optional for this log: not the evidence of one of its failures."""
    if kind == "benchmark name":  # optional when the log is judged as the same collective without it
        unnamed = ParsedLog(**{**log.__dict__, "benchmark": None, "benchmark_printed": None})
        return judged_collective(log, exp) == judged_collective(unnamed, exp)
    if kind == "rank lines":  # optional when NCCL says the rank count and no failure rests on the list
        return bool(log.rows) and log.nccl_nranks is not None and not fail_codes(verdict) & RANK_EVIDENCE
    return True


def assert_invariant(lines: list[str], exp: Expectation | None, kinds: set[str]) -> None:
    log = parse_text("\n".join(lines))
    before = judge(log, exp)
    drop = [OPTIONAL[k] for k in sorted(kinds) if removable(k, log, before, exp)]
    kept = [line for line in lines if not any(f(line) for f in drop)]
    stripped = parse_text("\n".join(kept))
    after = judge(stripped, exp)
    assert fail_codes(after) == fail_codes(before), (
        f"removing {sorted(kinds)} changed the failures\nbefore:\n{render(before, log)}\nafter:\n{render(after, stripped)}")
    assert after.status == before.status


# --- the three false passes of issue 37, each in the shape the issue found them -------------------------
@pytest.mark.parametrize("name", ["r2_busbw_10x_ceiling.log", "r2_inplace_did_not_run.log",
                                  "r2_busbw_inconsistent.log"])
@pytest.mark.parametrize("collective", ["all_reduce", None])
def test_a_log_without_its_benchmark_line_is_judged_by_the_physics_of_the_collective_it_is_judged_as(
        name: str, collective: str | None) -> None:
    text = (FIXTURES / "nccl" / name).read_text()
    bare = "\n".join(line for line in text.splitlines() if not _bench_line(line))
    log = parse_text(bare)
    assert log.benchmark is None
    v = judge(log, expectation_for(load_catalog()["p5.48xlarge"], 2, collective=collective))
    assert not v.passed and "non_physical" in fail_codes(v), render(v, log)
    unnamed = next(f for f in v.findings if f.code == "benchmark_unnamed")
    assert "judged as all_reduce_perf" in unnamed.message


def test_a_log_judged_on_its_own_reads_an_unnamed_table_as_all_reduce_only_when_its_shape_proves_it() -> None:
    text = (FIXTURES / "nccl" / "r2_busbw_inconsistent.log").read_text()
    bare = parse_text("\n".join(line for line in text.splitlines() if not _bench_line(line)))
    assert judged_collective(bare, None) == "all_reduce"
    assert "non_physical" in fail_codes(judge(bare, None))
    gather = parse_text((FIXTURES / "nccl" / "p4d_2node_all_gather_pre210.log").read_text())
    assert gather.benchmark is None and judged_collective(gather, None) is None  # no redop: not provably all_reduce


# --- the property over generated logs --------------------------------------------------------------------
PHYSICS = ("none", "above_ceiling", "inplace_too_short", "busbw_contradicts_time")
ROW = 4 << 20  # a row the generator's own faults never touch


def physics_fault(spec: Spec, lines: list[str], fault: str) -> list[str]:
    """The generated log with one non-reference row made impossible in the way `fault` names."""
    if fault == "none":
        return lines
    start = f"{ROW:12d}  {ROW // 4:12d}"
    at = next(i for i, line in enumerate(lines) if start in line)
    head, row = lines[at][: lines[at].index(start)], lines[at][lines[at].index(start):]
    tokens = row.split()
    lead = 4 if spec.layout == "pre210" else 5
    if fault == "above_ceiling":  # 7,500 GB/s where 2x p5 can carry 750, with time and algbw that agree
        algbw = 7500 / (2 * 15 / 16)
        for half in (0, 4):
            tokens[lead + half: lead + half + 3] = [f"{ROW / (algbw * 1e3):.2f}", f"{algbw:.2f}", "7500.00"]
    elif fault == "inplace_too_short":  # 0.05 µs for 4 MiB: the op cannot have run
        tokens[lead + 4] = "0.05"
    else:
        tokens[lead + 2] = f"{float(tokens[lead + 2]) * 3:.2f}"
    return [*lines[:at], head + "  ".join(tokens), *lines[at + 1:]]


@settings(max_examples=150, deadline=None)
@given(specs(), st.sampled_from(PHYSICS), st.sets(st.sampled_from(sorted(OPTIONAL)), min_size=1),
       st.sampled_from(["all_reduce", None]))
def test_removing_optional_lines_from_generated_logs_changes_no_failure(
        spec: Spec, fault: str, kinds: set[str], collective: str | None) -> None:
    assume(fault == "none" or spec.prefix != "intel")  # Intel MPI tags mid-row: the row is rewritten whole above
    lines = physics_fault(spec, build(spec), fault)
    exp = expectation_for(load_catalog()["p5.48xlarge"], 2, collective=collective,
                          require_data_check=spec.require_check)
    if fault != "none":
        assert "non_physical" in fail_codes(judge(parse_text("\n".join(lines)), exp))
    assert_invariant(lines, exp, kinds)


# --- the property over the fixtures ------------------------------------------------------------------------
def fixture_expectation(log: ParsedLog) -> Expectation | None:
    """What the deploy's gate would hold the log to: its instance type and node count, the collective it named."""
    catalog = load_catalog()
    named = collective_of_benchmark(log.benchmark)
    found = resolve_expectation(log, catalog, collective=named).expectation
    if found is None and log.tool != "nccom-test":
        nodes = max(len(log.hosts), log.nccl_nodes or 0, 1)
        found = resolve_expectation(log, catalog, instance_type="p5.48xlarge", nodes=nodes,
                                    collective=named).expectation
    return found


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_removing_optional_lines_from_the_fixtures_changes_no_failure(path: Path) -> None:
    lines = path.read_text(errors="replace").splitlines()
    log = parse_text("\n".join(lines))
    for exp in (fixture_expectation(log), None):
        for kind in OPTIONAL:
            assert_invariant(lines, exp, {kind})
        assert_invariant(lines, exp, set(OPTIONAL))


def test_the_fixtures_hold_every_kind_of_optional_line() -> None:
    """The property above is not vacuous: the fixtures hold each kind of line it removes."""
    text = "\n".join(p.read_text(errors="replace") for p in LOGS).splitlines()
    for kind, is_kind in OPTIONAL.items():
        assert sum(map(is_kind, text)) >= 10, kind


# --- alltoall against nccl-tests' own definitions ----------------------------------------------------------
def test_bus_factors_are_nccl_tests_own() -> None:
    """doc/PERFORMANCE.md, "Summary": AllReduce 2(n-1)/n; ReduceScatter, AllGather, AlltoAll (n-1)/n; Broadcast and
    Reduce 1."""
    from fmcluster.acceptance.expectation import bus_factor

    for n in (2, 8, 16, 64):
        assert bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
        for ring in ("reduce_scatter", "all_gather", "alltoall"):
            assert bus_factor(ring, n) == pytest.approx((n - 1) / n)
        assert bus_factor("broadcast", n) == bus_factor("reduce", n) == 1.0


def _small_rows_sub_microsecond(text: str) -> str:
    """Rows whose per-rank count rounds to 0 move nothing: nccl-tests returns at once, in well under a µs."""
    out = []
    for line in text.splitlines():
        tokens = line.split()
        if len(tokens) == 13 and tokens[1] == "0" and tokens[0].isdigit():
            tokens[5], tokens[9] = "0.31", "0.30"
            line = "  ".join(tokens)
        out.append(line)
    return "\n".join(out)


def test_small_alltoall_rows_that_move_nothing_are_not_called_non_physical() -> None:
    """alltoall's count column is each rank's share and its algbw is count x ranks x element size / time
    (AlltoAllGetBw): `8  0  float ... 0.31  0.00  0.00` is a healthy row, not 8 B in 0.31 µs printed as 0.00."""
    text = _small_rows_sub_microsecond((FIXTURES / "nccl" / "r2_alltoall_ok.log").read_text())
    assert "           8             0     float" not in text and "8  0  float  none  -1  0.31" in text
    log = parse_text(text)
    v = judge(log, expectation_for(load_catalog()["p5.48xlarge"], 2, collective="alltoall"))
    assert v.passed, render(v, log)
    forged = text.replace("8  0  float  none  -1  0.31  0.00", "8  0  float  none  -1  0.31  5.00")
    bad = judge(parse_text(forged), expectation_for(load_catalog()["p5.48xlarge"], 2, collective="alltoall"))
    assert "non_physical" in fail_codes(bad), render(bad)
