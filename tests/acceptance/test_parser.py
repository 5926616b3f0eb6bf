"""The nccl-tests parser reads real-shaped logs of every size and failure shape without raising."""

from __future__ import annotations

from pathlib import Path

import pytest

from fmcluster.acceptance.parser import parse_file, parse_row, parse_text

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"
GIB = 1 << 30


def parsed(name: str):
    return parse_file(FIXTURES / name)


@pytest.mark.parametrize(
    ("name", "ranks", "hosts"),
    [
        ("p5_1node_all_reduce_ok.log", 8, 1),
        ("p5_2node_all_reduce_ok.log", 16, 2),
        ("p5_4node_all_reduce_ok.log", 32, 4),
        ("p5_16node_all_reduce_ok.log", 128, 16),
        ("p4d_2node_all_reduce_ok.log", 16, 2),
    ],
)
def test_healthy_runs_give_every_size_row_the_footer_and_the_rank_layout(name: str, ranks: int, hosts: int) -> None:
    log = parsed(name)
    assert log.completed and log.tables == 1
    assert len(log.rows) == 32  # -b 8 -e 16G -f 2
    assert log.rows[0].size_bytes == 8 and log.rows[-1].size_bytes == 16 * GIB
    assert (log.ranks, len(log.hosts)) == (ranks, hosts)
    assert log.benchmark == "all_reduce_perf"
    assert log.library == "NCCL 2.27.3+cuda12.8"
    assert log.tests_version == "2.16.9"
    assert log.avg_busbw_gbps is not None and log.out_of_bounds == 0
    assert log.header["minBytes"] == "8" and log.header["iters"] == "100"


def test_a_size_row_has_both_halves_and_the_check_column() -> None:
    row = parsed("p5_2node_all_reduce_ok.log").row_at(GIB)
    assert row is not None
    assert (row.size_bytes, row.count, row.dtype, row.redop, row.root) == (GIB, GIB // 4, "float", "sum", -1)
    assert 400 < row.out_of_place.busbw_gbps < 480 and 400 < row.in_place.busbw_gbps < 480
    assert row.out_of_place.time_us > 0 and row.out_of_place.algbw_gbps < row.out_of_place.busbw_gbps
    assert row.wrong == 0


def test_efa_selection_channels_rings_and_gdr_are_read_from_info_lines() -> None:
    net = parsed("p5_2node_all_reduce_ok.log").network
    assert net.network == "Libfabric"
    assert (net.ofi_provider, net.ofi_nics, net.ofi_plugin_version) == ("efa", 32, "1.16.0")
    assert net.gdr is True and net.transports == ("NET/Libfabric/0/GDRDMA",)
    assert net.channels == 32 and len(net.rings) == 32 and net.rings[0][:3] == (0, 1, 2)
    assert not net.plugin_missing


def test_p4d_run_reports_its_four_efa_nics_and_eight_channels() -> None:
    net = parsed("p4d_2node_all_reduce_ok.log").network
    assert (net.ofi_provider, net.ofi_nics, net.channels) == ("efa", 4, 8)


def test_socket_fallback_is_seen_with_the_missing_plugin_and_the_interface() -> None:
    net = parsed("p5_2node_socket_fallback.log").network
    assert net.network == "Socket" and net.plugin_missing
    assert net.ofi_provider is None and net.socket_interfaces == ("enp71s0",)
    assert net.transports == ("NET/Socket/0",)


def test_provider_other_than_efa_is_recorded() -> None:
    assert parsed("p5_2node_provider_tcp.log").network.ofi_provider == "tcp"


def test_gdr_off_is_seen_from_channels_without_gdrdma() -> None:
    assert parsed("p5_2node_gdr_off.log").network.gdr is False


def test_wrong_data_counts_wrong_elements_and_out_of_bounds_values() -> None:
    log = parsed("p5_2node_wrong_data.log")
    assert log.out_of_bounds == 9 and log.wrong > 0
    assert [r.size_bytes for r in log.rows if r.wrong][0] == 64 << 20


def test_a_job_killed_mid_run_keeps_its_rows_and_says_it_was_killed() -> None:
    log = parsed("p5_4node_killed_mid_run.log")
    assert not log.completed and log.killed
    assert log.max_size_bytes == 256 << 20
    assert any("DUE TO TIME LIMIT" in e for e in log.errors)


def test_a_truncated_log_keeps_the_complete_rows_and_counts_the_cut_line() -> None:
    log = parsed("p5_2node_truncated.log")
    assert not log.completed and not log.killed
    assert log.max_size_bytes == 32 << 20 and log.garbled_lines == 1


def test_interleaved_and_labelled_lines_still_give_the_table() -> None:
    log = parsed("p5_2node_interleaved.log")
    assert log.completed and log.ranks == 16
    assert log.garbled_lines == 2  # both halves of the row another rank's INFO line split
    assert 16 << 20 not in [r.size_bytes for r in log.rows] and log.unreadable_sizes == (16 << 20,)
    assert len(log.rows) == 12 and log.network.ofi_provider == "efa"


def test_ranks_not_wired_show_as_several_one_rank_tables() -> None:
    log = parsed("p5_2node_ranks_not_wired.log")
    assert log.tables == 4 and log.ranks == 1 and log.duplicate_rows > 0


def test_a_launch_failure_has_no_rows_and_keeps_the_failure_lines() -> None:
    log = parsed("p5_2node_launch_failed.log")
    assert log.rows == () and not log.completed
    assert any("Test NCCL failure" in e for e in log.errors)
    assert any("initialization failed" in w for w in log.network.warnings)


def test_old_logs_without_root_column_and_with_max_error_parse() -> None:
    row = parse_row("     1048576        262144     float     sum    412.3    2.54    4.77  5e-07    409.9    2.56    4.80  5e-07")
    assert row is not None and row.root is None
    assert row.out_of_place.wrong is None and row.out_of_place.max_error == 5e-07


def test_open_mpi_tagged_lines_and_na_checks_parse() -> None:
    log = parse_text(
        "[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
        "[1,0]<stdout>:        2048            32     float    none      -1   106.88    0.02    0.02       0   111.25    0.02    0.02    N/A\n"
        "[1,0]<stdout>:# Avg bus bandwidth    : 0.02 \n"
    )
    assert log.completed and log.rows[0].in_place.wrong is None and log.rows[0].redop == "none"


@pytest.mark.parametrize("text", ["", "\x00\x01garbage\n", "#\n# Avg bus bandwidth : nan\n", "1 2 3 4 5 6 7 8 9 10 11 12\n"])
def test_junk_never_raises(text: str) -> None:
    parse_text(text)


def test_per_iteration_and_timestamp_columns_are_read_by_the_header() -> None:
    log = parse_text(
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99"
        "    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%            timestamp\n"
        "  1073741824     268435456     float     sum      -1   4583.7  234.25  439.22       0   4501.2   4702.9   4699.0"
        "      1.2   4656.7  230.58  432.33       0   4590.0   4720.1   4719.5      0.9  2026-11-30 03:10:00\n"
    )
    row = log.row_at(GIB)
    assert row is not None and (row.out_of_place.busbw_gbps, row.in_place.busbw_gbps) == (439.22, 432.33)
    assert log.garbled_lines == 0


def test_a_row_that_does_not_fit_its_header_is_unreadable_not_guessed() -> None:
    log = parse_text(
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n"
        "  1073741824     268435456     float     sum      -1   4583.68  234.25  439.22       0   4656.73  230.58\n"
    )
    assert log.rows == () and log.unreadable_sizes == (GIB,)


@pytest.mark.parametrize(("token", "kind", "wrong", "rounded"), [
    ("0", "count", 0, False), ("3", "count", 3, False), ("1.04858e+06", "count", 1048580, True),
    ("N/A", "unchecked", None, False), ("-1", "unreadable", None, False), ("nan", "unreadable", None, False),
    ("2.5", "unreadable", None, False),
])
def test_the_wrong_column_of_2_10_and_later_is_a_count_even_in_g_form(token: str, kind: str, wrong: int | None,
                                                                      rounded: bool) -> None:
    row = parse_row(f"  1073741824  268435456  float  sum  -1  4583.68  234.25  439.22  {token}  4656.73  230.58  432.33  0")
    assert row is not None
    assert (row.out_of_place.check, row.out_of_place.wrong, row.out_of_place.wrong_rounded) == (kind, wrong, rounded)


def test_bounded_reading_keeps_crlf_and_a_last_line_without_newline(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"#  Rank  0 Group  0 Pid 1 on h1 device  0 [0x53] GPU\r\n# Avg bus bandwidth    : 1.5 OK")
    parsed = parse_file(log)
    assert parsed.hosts == ("h1",) and parsed.completed and parsed.avg_busbw_gbps == 1.5
    assert parsed.avg_verdict == "OK" and parsed.long_lines == 0
