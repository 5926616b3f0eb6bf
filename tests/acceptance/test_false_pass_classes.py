"""Issue 15: every shape of nccl-tests output that a gate once judged PASS (or misread) now fails closed.

One test per class, each on a fixture written by tests/fixtures/nccl/make_fixtures.py from the public
shapes (nccl-tests before 2.10 and 2.18+, MPI builds, NCCL_TESTS_MIN_BW, -c 0, Intel MPI and kubectl
prefixes, nan/-nan/inf). Each asserts the verdict and its diagnosis code and words.
"""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path

import pytest

from fmcluster.acceptance.parser import MAX_LINE_CHARS, canonical_benchmark, parse_file
from fmcluster.acceptance.verdict import judge, render
from fmcluster.catalog import CatalogError, load_catalog
from fmcluster.cli import main
from fmcluster.exits import ExitCode

from acceptance.judging import fails_with, verdict

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"
GIB = 1 << 30




# 1 ------------------------------------------------------------------------------------------------
def test_1_nan_and_inf_figures_fail_and_the_json_stays_strict(capsys: pytest.CaptureFixture[str]) -> None:
    v = verdict("p5_2node_nan_busbw.log")
    fails_with(v, "non_finite", "1 GiB out-of-place: time nan, algbw nan, busbw nan", "1 GiB in-place",
               "2 GiB out-of-place: algbw inf, busbw inf", "the footer's average 'nan'")
    assert v.busbw_gbps is None and "no finite result at 1 GiB" in v.baseline
    assert main(["acceptance", "parse", str(FIXTURES / "p5_2node_nan_busbw.log"), "--json",
                 "--instance-type", "p5.48xlarge"]) == 1
    text = capsys.readouterr().out
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in --json output"))
    assert "non_finite" in data["codes"] and "$.log.rows[27].out_of_place.busbw_gbps" in data["non_finite"]
    assert data["log"]["rows"][27]["out_of_place"]["busbw_gbps"] is None
    assert data["log"]["avg_busbw_gbps"] is None and data["log"]["avg_busbw_text"] == "nan"


# 2 ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "words"), [
    ("p5_2node_reference_na.log", "the 1 GiB row could not be read"),
    ("p5_2node_sizes_skip_reference.log", "the sizes run skip it (512 MiB, then 2 GiB)"),
])
def test_2_a_missing_or_unreadable_reference_row_fails_whatever_larger_sizes_show(name: str, words: str) -> None:
    v = verdict(name)
    fails_with(v, "reference_size_missing", words, "a larger size is not a substitute (the 2 GiB row shows 89")
    assert v.busbw_gbps is None and v.measured_at_bytes is None
    assert "no result at 1 GiB" in v.baseline and "%" not in v.baseline.split("no result at 1 GiB")[1][:40]


# 3 ------------------------------------------------------------------------------------------------
def test_3_the_mpi_build_is_gated_like_the_plain_binary() -> None:
    log = parse_file(FIXTURES / "p5_2node_all_reduce_mpi_slow.log")
    assert (log.benchmark, log.benchmark_printed) == ("all_reduce_perf", "all_reduce_perf_mpi")
    fails_with(verdict("p5_2node_all_reduce_mpi_slow.log"), "below_floor", "busbw 119.87 GB/s", "floor of 250")
    assert canonical_benchmark("reduce_scatter_perf_mpi") == "reduce_scatter_perf"
    assert canonical_benchmark("/opt/nccl-tests/build/all_gather_perf_mpi") == "all_gather_perf"


# 4 ------------------------------------------------------------------------------------------------
def test_4_nccl_tests_own_failed_footer_fails_even_when_the_reference_row_clears_the_floor() -> None:
    v = verdict("p5_2node_min_bw_failed.log")
    assert v.busbw_gbps is not None and v.busbw_gbps > 250
    fails_with(v, "nccl_tests_failed", "`# Avg bus bandwidth : 149.145 FAILED`", "NCCL_TESTS_MIN_BW")
    assert judge(parse_file(FIXTURES / "p5_2node_min_bw_failed.log"), None).status == "fail"


# 5 ------------------------------------------------------------------------------------------------
def test_5_unchecked_data_is_a_visible_warning_and_fails_when_checks_are_required() -> None:
    relaxed = verdict("p5_2node_data_check_off.log")
    assert relaxed.passed and "data_unchecked" in relaxed.codes
    assert next(f for f in relaxed.findings if f.code == "data_unchecked").severity == "warn"
    strict = verdict("p5_2node_data_check_off.log", require_data_check=True)
    fails_with(strict, "data_unchecked", "`#wrong` is N/A", "this gate requires checked data")


# 6 ------------------------------------------------------------------------------------------------
def test_6_wrong_counts_printed_with_g_are_counted_not_taken_for_a_max_error() -> None:
    log = parse_file(FIXTURES / "p5_2node_wrong_g_format.log")
    ref = log.row_at(GIB)
    assert ref is not None and ref.out_of_place.check == "count" and ref.out_of_place.wrong == 1048580
    assert ref.out_of_place.wrong_rounded and ref.in_place.wrong == 2097150
    fails_with(verdict("p5_2node_wrong_g_format.log"), "wrong_data", "about 99876800 wrong element(s)",
               "printed rounded, %g", "1 GiB")


# 7 ------------------------------------------------------------------------------------------------
def test_7_layouts_before_nccl_tests_2_10_are_read_column_by_column() -> None:
    reduce_ = parse_file(FIXTURES / "p4d_2node_all_reduce_pre210.log")
    gather = parse_file(FIXTURES / "p4d_2node_all_gather_pre210.log")
    bcast = parse_file(FIXTURES / "p4d_2node_broadcast_pre210.log")
    for log in (reduce_, gather, bcast):
        assert len(log.rows) == 32 and log.garbled_lines == 0 and log.ranks == 16 and log.completed
    assert (reduce_.rows[0].redop, reduce_.rows[0].root, reduce_.rows[0].out_of_place.check) == ("sum", None, "max_error")
    assert (gather.rows[0].redop, gather.rows[0].root) == (None, None)  # 11 tokens: no redop, no root
    assert (bcast.rows[0].redop, bcast.rows[0].root) == (None, 0)  # root is a root, not a redop
    assert verdict("p4d_2node_all_reduce_pre210.log", "p4d.24xlarge").passed
    assert verdict("p4d_2node_all_gather_pre210.log", "p4d.24xlarge", collective="all_gather").passed
    fails_with(verdict("p4d_2node_broadcast_pre210.log", "p4d.24xlarge"), "benchmark_mismatch", "no redop column")


# 8 ------------------------------------------------------------------------------------------------
def test_8_launcher_prefixes_do_not_hide_the_table() -> None:
    intel = parse_file(FIXTURES / "p5_2node_intelmpi_prefix.log")
    kube = parse_file(FIXTURES / "p5_2node_kubectl_prefix_slow.log")
    for log in (intel, kube):
        assert len(log.rows) == 32 and log.garbled_lines == 0 and log.ranks == 16
        assert log.network.ofi_provider == "efa" and log.completed
    assert verdict("p5_2node_intelmpi_prefix.log").passed
    fails_with(verdict("p5_2node_kubectl_prefix_slow.log"), "below_floor", "117.57 GB/s")


# 9 ------------------------------------------------------------------------------------------------
def test_9_parse_without_an_instance_type_is_not_judged_or_judged_by_the_platform_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acceptance", "parse", str(FIXTURES / "p5_2node_socket_fallback.log")]) == ExitCode.NOT_JUDGED
    out = capsys.readouterr().out
    assert "verdict: NOT JUDGED" in out and "give --instance-type" in out
    assert main(["acceptance", "parse", str(FIXTURES / "p5_2node_gdr_off.log")]) == 1
    assert "judged as: instance type p5.48xlarge from aws-ofi-nccl's" in capsys.readouterr().out
    assert main(["acceptance", "parse", str(FIXTURES / "p5_2node_socket_fallback.log"),
                 "--instance-type", "p5.48xlarge"]) == 1


# 10 -----------------------------------------------------------------------------------------------
def test_10_the_baseline_compares_like_with_like_and_names_its_sources() -> None:
    two = verdict("p5_2node_all_reduce_ok.log")
    assert "~437 GB/s at 1 GiB on 2 node(s)" in two.baseline and "this run is at 99% of it" in two.baseline
    sixteen = verdict("p5_16node_all_reduce_ok.log", nodes=16)
    assert "(a 2-node figure; this run has 16)" in sixteen.baseline
    one = verdict("p5_1node_all_reduce_ok.log", nodes=1)
    assert "floor 300 GB/s" in one.baseline and "437" not in one.baseline
    assert "~480 GB/s peak at large sizes on 1 node(s)" in one.baseline and "nccl-tests/issues/212" in one.baseline
    p4d = verdict("p4d_2node_all_reduce_ok.log", "p4d.24xlarge")
    assert "no public figure at 1 GiB" in p4d.baseline and "~78 GB/s at 2 GiB on 2 node(s)" in p4d.baseline
    assert "this run shows 77.16 GB/s there (99%)" in p4d.baseline
    small = verdict("p5_2node_largest_128mib.log")
    fails_with(small, "reference_size_missing", "the largest size run was 128 MiB")
    assert "this run is at" not in small.baseline  # a 128 MiB figure is never set against a 1 GiB one


def test_10_catalog_floors_never_exceed_public_figures_of_their_class_and_size() -> None:
    for instance in load_catalog().values():
        acc = instance.acceptance
        for cls, floor in acc.floors.items():
            assert floor.source.strip()
            for fig in acc.public[cls]:
                assert fig.source.strip()
                if fig.message_bytes in (None, acc.reference_bytes):
                    assert floor.gbps <= fig.gbps, (instance.name, cls, fig)


def test_10_the_catalog_refuses_a_floor_above_the_public_figure(tmp_path: Path) -> None:
    bad = tmp_path / "instances.yml"
    text = (Path(__file__).resolve().parents[2] / "src/fmcluster/data/instances.yml").read_text()
    bad.write_text(text.replace("          gbps: 250\n", "          gbps: 450\n", 1))
    with pytest.raises(CatalogError, match=r"p5\.48xlarge\.acceptance\.public\.multi_node\[0\]: the floor 450"):
        load_catalog(bad)


# 11 -----------------------------------------------------------------------------------------------
def test_11_an_over_long_line_is_cut_and_reported_and_memory_stays_bounded(tmp_path: Path) -> None:
    v = verdict("p5_2node_long_line.log")
    assert v.passed and "line_too_long" in v.codes
    big = tmp_path / "big.log"
    healthy = (FIXTURES / "p5_2node_all_reduce_ok.log").read_text().splitlines(keepends=True)
    with big.open("w") as f:
        f.writelines(healthy[:40])
        f.write("x" * (8 << 20) + "\n")  # one 8 MiB line
        f.writelines(healthy[40:])
    tracemalloc.start()
    try:
        log = parse_file(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert log.long_lines == 1 and log.longest_line == 8 << 20 and len(log.rows) == 32
    assert peak < 16 * MAX_LINE_CHARS, f"peak {peak} bytes while parsing an 8 MiB line"


# 12 -----------------------------------------------------------------------------------------------
def test_12_nccls_own_rank_count_wins_and_a_disagreement_fails() -> None:
    log = parse_file(FIXTURES / "p5_2node_rank_conflict.log")
    assert (log.rank_lines, log.nccl_nranks, log.ranks) == (16, 8, 8)
    v = verdict("p5_2node_rank_conflict.log")
    fails_with(v, "rank_count_conflict", "16 rank(s)", "communicator has 8")
    fails_with(v, "rank_count", "8 ranks took part, 16 expected")


def test_every_class_fixture_is_judged_fail_closed() -> None:
    """None of the shapes above passes except the three that are healthy apart from a warning."""
    healthy = {"p5_2node_data_check_off.log", "p5_2node_intelmpi_prefix.log", "p5_2node_long_line.log"}
    for name in ("p5_2node_nan_busbw.log", "p5_2node_reference_na.log", "p5_2node_sizes_skip_reference.log",
                 "p5_2node_all_reduce_mpi_slow.log", "p5_2node_min_bw_failed.log", "p5_2node_wrong_g_format.log",
                 "p5_2node_kubectl_prefix_slow.log", "p5_2node_largest_128mib.log", "p5_2node_rank_conflict.log",
                 *healthy):
        v = verdict(name)
        assert v.passed == (name in healthy), render(v)
        if v.passed:
            assert v.busbw_gbps is not None and math.isfinite(v.busbw_gbps) and v.busbw_gbps >= 250
