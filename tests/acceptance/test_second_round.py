"""Issue 24: every wrong verdict of the second-round corpus, one test per class, on the `r2_*` fixtures
(tests/fixtures/nccl/make_second_round.py: an existing fixture edited the same way; each file's first line
names its source and edit), then the reading cases and property tests over generated tables."""

from __future__ import annotations

import bz2
import gzip
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fmcluster.acceptance.expectation import ceiling_gbps, expectation_for
from fmcluster.acceptance.parser import LogReadError, parse_file, parse_stream, sniff_encoding
from fmcluster.acceptance.verdict import judge, render
from fmcluster.catalog import load_catalog
from fmcluster.cli import main
from fmcluster.exits import ExitCode

from acceptance.judging import fails_with, verdict

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"
SRC = Path(__file__).resolve().parents[2] / "src"
GIB = 1 << 30




def test_every_r2_fixture_names_its_source() -> None:
    files = sorted(FIXTURES.glob("r2_*.log"))
    assert len(files) >= 16
    for f in files:
        assert f.read_text().startswith("# source: "), f.name


# transport, every rank -----------------------------------------------------------------------------
def test_one_node_on_tcp_fails_although_the_last_provider_line_says_efa() -> None:
    log = parse_file(FIXTURES / "r2_provider_tcp_one_node.log")
    assert log.network.ofi_provider == "efa"  # the last line: what the first round judged
    fails_with(verdict("r2_provider_tcp_one_node.log"), "rank_off_efa", "rank 0 on p5-st-p5-1 selected provider tcp")


def test_one_rank_over_sockets_fails_naming_the_rank_and_host() -> None:
    v = verdict("r2_rank13_socket.log")
    fails_with(v, "rank_off_efa", "rank 13 on p5-st-p5-2 sends over NET/Socket")
    assert v.blames_node


# physics -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "words"), [
    ("r2_negative_time.log", ("1 GiB out-of-place", "time -4583.68 µs is not positive")),
    ("r2_busbw_10x_ceiling.log", ("busbw 4392.2 GB/s is above the physical ceiling 750.0 GB/s", "EFA 3200 Gbps")),
    ("r2_inplace_did_not_run.log", ("1 GiB in-place", "above the physical ceiling")),
    ("r2_busbw_inconsistent.log", ("busbw 439.77 GB/s but size/time × 1.875 is 43.92",)),
])
def test_a_row_that_breaks_physics_fails_naming_the_row(name: str, words: tuple[str, ...]) -> None:
    fails_with(verdict(name), "non_physical", *words)
    if "ceiling" not in " ".join(words):  # figures that disagree fail even without an instance type
        assert judge(parse_file(FIXTURES / name), None).status == "fail"
    assert main(["acceptance", "parse", str(FIXTURES / name)]) == 1  # judged as the platform line's p5


def test_the_ceilings_are_derived_from_the_catalog_and_healthy_public_figures_sit_under_them() -> None:
    catalog = load_catalog()
    p5, p4d = catalog["p5.48xlarge"], catalog["p4d.24xlarge"]
    assert ceiling_gbps(p5, "all_reduce", 2, 16)[0] == pytest.approx(750)  # type: ignore[index]
    assert ceiling_gbps(p5, "all_reduce", 1, 8)[0] == 900  # type: ignore[index]
    assert ceiling_gbps(p5, "alltoall", 2, 16)[0] == pytest.approx(93.75)  # type: ignore[index]
    assert ceiling_gbps(p4d, "all_reduce", 2, 16)[0] == pytest.approx(93.75)  # type: ignore[index]
    for instance in catalog.values():
        for cls, figures in instance.acceptance.public.items():
            for fig in figures:
                ceiling = ceiling_gbps(instance, "all_reduce", fig.nodes, fig.nodes * instance.accelerators_per_node)
                if ceiling is not None:
                    assert fig.gbps <= ceiling[0], (instance.name, cls, fig)


# a failure line anywhere ------------------------------------------------------------------------------
def test_a_test_failure_after_a_clean_footer_fails_the_run() -> None:
    fails_with(verdict("r2_failure_after_footer.log"), "test_failure", "Test NCCL failure common.cu:1005",
               "unhandled system error")


# the rank -> host -> device map -------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "code", "words"), [
    ("r2_two_ranks_one_gpu.log", "duplicate_device", "ranks 8, 9 on p5-st-p5-2 device 0"),
    ("r2_third_host.log", "host_count", "3 host(s)"),
    ("r2_a100_node.log", "device_model", "NVIDIA A100-SXM4-40GB on p5-st-p5-2"),
    ("r2_mixed_nccl.log", "nccl_version_mixed", "2.18.5+cuda12.2, 2.22.3+cuda12.4"),
    ("r2_16_nics_on_p5.log", "nic_count", "p5-st-p5-2 found 16"),
])
def test_the_rank_map_is_checked_against_itself_and_the_catalog(name: str, code: str, words: str) -> None:
    fails_with(verdict(name), code, words)


def test_a_rank_listed_twice_or_missing_fails() -> None:
    text = (FIXTURES / "p5_2node_all_reduce_ok.log").read_text().replace(
        "#  Rank  3 Group  0 Pid  41233 on p5-st-p5-1 device  3", "#  Rank  2 Group  0 Pid  41233 on p5-st-p5-1 device  3")
    v = judge(parse_stream(text.splitlines()), expectation_for(load_catalog()["p5.48xlarge"], 2))
    fails_with(v, "ranks_missing", "rank(s) 3 of 0..15 not listed", "rank(s) 2 listed twice")


# every collective ------------------------------------------------------------------------------------
def test_alltoall_is_gated_on_its_own_floor() -> None:
    slow = verdict("r2_alltoall_slow.log", collective="alltoall")
    fails_with(slow, "below_floor", "busbw 4.21 GB/s", "alltoall floor of 11.72 GB/s")
    ok = verdict("r2_alltoall_ok.log", collective="alltoall")
    assert ok.passed and "derived: 0.125 x the alltoall ceiling 93.8 GB/s" in ok.baseline, render(ok)


def test_a_healthy_old_layout_alltoall_is_read_and_passes() -> None:
    log = parse_file(FIXTURES / "r2_alltoall_pre210_ok.log")
    assert len(log.rows) == 32 and log.garbled_lines == 0 and log.rows[0].redop is None
    assert verdict("r2_alltoall_pre210_ok.log", "p4d.24xlarge", collective="alltoall").passed


def test_a_log_of_another_collective_fails_with_benchmark_mismatch(capsys: pytest.CaptureFixture[str]) -> None:
    fails_with(verdict("p5_2node_all_gather_ok.log", collective="all_reduce"), "benchmark_mismatch",
               "benchmark mismatch: the log ran all_gather_perf, all_reduce_perf was expected")
    assert main(["acceptance", "parse", str(FIXTURES / "p5_2node_all_gather_ok.log"), "--instance-type",
                 "p5.48xlarge", "--collective", "all_reduce_perf"]) == 1
    assert "benchmark mismatch" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--collective", "allreduce"], ["--min-busbw", "-5"], ["--min-busbw", "inf"],
                                  ["--min-busbw", "nan"], ["--min-busbw", "0"]])
def test_a_bad_option_is_exit_2_and_never_blames_a_node(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acceptance", "parse", str(FIXTURES / "p5_2node_all_reduce_ok.log"), "--instance-type",
                 "p5.48xlarge", "--json", *args]) == 2
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "unreadable" and args[0] in data["error"]


# Neuron ----------------------------------------------------------------------------------------------
def test_nccom_test_output_is_read_never_unreadable_and_judged_given_its_instance_type(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without an instance type: not judged (exit 5). As a trn1.32xlarge: judged (tests/acceptance/test_nccom_test.py);
    this generated log runs 32 workers over 2 nodes, half a trn1's NeuronCores."""
    path = str(FIXTURES / "r2_nccom_test_trn1.log")
    assert main(["acceptance", "parse", path, "--json"]) == ExitCode.NOT_JUDGED
    data = json.loads(capsys.readouterr().out)
    assert data["codes"] == ["data_unchecked", "neuron_not_judged"] and data["log"]["tool"] == "nccom-test"
    assert data["log"]["nccom"]["commands"][0]["ranks"] == 32 and data["log"]["nccom"]["commands"][0]["nodes"] == 2
    assert main(["acceptance", "parse", path, "--instance-type", "trn1.32xlarge"]) == ExitCode.FAILED
    assert "nccom-test ran 32 workers (-r), 64 expected" in capsys.readouterr().out


# reading ---------------------------------------------------------------------------------------------
HEALTHY = FIXTURES / "p5_2node_all_reduce_ok.log"


@pytest.mark.parametrize("form", ["ansi", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "gzip",
                                  "bzip2", "gzip-utf-16", "crlf"])
def test_a_healthy_log_passes_in_every_encoding(tmp_path: Path, form: str) -> None:
    text = HEALTHY.read_text()
    path = tmp_path / "log"
    if form == "ansi":
        path.write_text("".join(f"\x1b[32m{line}\x1b[0m\x1b]0;title\x07" if i % 3 else line
                                for i, line in enumerate(text.splitlines(keepends=True))))
    elif form == "crlf":
        path.write_bytes(text.replace("\n", "\r\n").encode())
    elif form == "gzip":
        path.write_bytes(gzip.compress(text.encode()))
    elif form == "bzip2":
        path.write_bytes(bz2.compress(text.encode()))
    elif form == "gzip-utf-16":
        path.write_bytes(gzip.compress(text.encode("utf-16")))
    else:
        path.write_bytes(text.encode(form))
    log = parse_file(path)
    v = judge(log, expectation_for(load_catalog()["p5.48xlarge"], 2))
    assert v.passed and len(log.rows) == 32, render(v, log)
    read_as = {"utf-16": "utf-16-le", "utf-32": "utf-32-le", "gzip": "gzip+utf-8", "bzip2": "bzip2+utf-8",
               "gzip-utf-16": "gzip+utf-16-le", "ansi": "utf-8", "crlf": "utf-8"}
    assert log.encoding == read_as.get(form, form)


def test_encodings_are_sniffed_by_bom_or_nul_pattern() -> None:
    assert sniff_encoding("# x\n".encode("utf-16-le")) == ("utf-16-le", 0)
    assert sniff_encoding("# x\n".encode("utf-16-be")) == ("utf-16-be", 0)
    assert sniff_encoding("# x\n".encode("utf-32-le")) == ("utf-32-le", 0)
    assert sniff_encoding("# x\n".encode("utf-32")) == ("utf-32-le", 4)
    assert sniff_encoding(b"\xef\xbb\xbf# x") == ("utf-8", 3)
    assert sniff_encoding(b"# plain\n") == ("utf-8", 0)


def test_an_unknown_compression_is_exit_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 64)
    assert main(["acceptance", "parse", str(path)]) == 2
    assert "zstd-compressed" in capsys.readouterr().out


def test_dev_zero_and_a_fifo_return_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in (("/dev/zero", "a character device"), (str(fifo), "a FIFO"), (str(tmp_path), "a directory")):
        start = time.monotonic()
        assert main(["acceptance", "parse", path]) == 2
        assert time.monotonic() - start < 1.0
        assert kind in capsys.readouterr().out
    with pytest.raises(LogReadError):
        parse_file(Path("/dev/zero"))


@pytest.mark.slow
def test_a_300_mb_log_is_judged_in_under_100_mb(tmp_path: Path) -> None:
    """Peak RSS of a fresh interpreter that imports the package and judges a 300 MB log (INFO lines between
    the healthy log's lines, a realistic NCCL_DEBUG=TRACE-like flood)."""
    big = tmp_path / "big.log"
    healthy = HEALTHY.read_text().splitlines(keepends=True)
    noise = "".join(f"p5-st-p5-1:41230:41241 [0] NCCL INFO Channel {c:02d}/0 : 0[0] -> 1[1] via P2P/CUMEM/read "
                    f"comm 0x55d0c8a1e2b0 nRanks 16 padding {'x' * 40}\n" for c in range(64)).encode()
    with big.open("wb") as f:
        f.write("".join(healthy[:60]).encode())
        while f.tell() < 300 << 20:
            f.write(noise)
        f.write("".join(healthy[60:]).encode())
    script = ("import resource, sys; from pathlib import Path\n"
              "from fmcluster.acceptance.parser import parse_file\n"
              "from fmcluster.acceptance.expectation import expectation_for\n"
              "from fmcluster.acceptance.verdict import judge\nfrom fmcluster.catalog import load_catalog\n"
              "v = judge(parse_file(Path(sys.argv[1])), expectation_for(load_catalog()['p5.48xlarge'], 2))\n"
              # VmHWM, not ru_maxrss: Linux carries the parent's peak into ru_maxrss across fork and exec, so a
              # large pytest process would be measured instead of the parse.
              "print(v.status, next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')))\n")
    out = subprocess.run([sys.executable, "-c", script, str(big)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(SRC)}, check=True).stdout.split()
    assert out[0] == "pass"
    assert int(out[1]) < 100 * 1024, f"peak RSS {int(out[1]) // 1024} MB"


# property tests over generated tables -------------------------------------------------------------------
SIZES = [1 << k for k in range(20, 35)]
HOSTS = ("p5-st-p5-1", "p5-st-p5-2")
FACTOR = 2 * 15 / 16
PROPERTY = settings(max_examples=60, deadline=None)


def _row(size: int, busbw: tuple[float, float], extra: str) -> list[str]:
    cells = []
    for b in busbw:
        algbw = b / FACTOR
        cells.append(f"{size / (algbw * 1e3):10.2f}  {algbw:7.2f}  {b:7.2f}  {0:6d}")
    return [f"{size:12d}  {size // 4:12d}  {'float':>8}  {'sum':>6}  {-1:6d}  {cells[0]}  {cells[1]}{extra}"]


def healthy_lines(busbw: list[tuple[float, float]], extra_cols: int) -> list[str]:
    lines = ["# nccl-tests version 2.18.3 (cbe2cd5) nccl-headers=22703 nccl-library=22703",
             "# Collective test starting: all_reduce_perf",
             "# nThread 1 nGpus 1 minBytes 1048576 maxBytes 17179869184 step: 2(factor) warmup iters: 5 iters: 20",
             "#", "# Using devices"]
    for r in range(16):
        lines.append(f"#  Rank {r:2d} Group  0 Pid {41230 + r:6d} on {HOSTS[r // 8]:>10} device {r % 8:2d} "
                     "[0x53] NVIDIA H100 80GB HBM3")
    lines.append("NCCL version 2.27.3+cuda12.8")
    for r in range(16):
        pre = f"{HOSTS[r // 8]}:{41230 + r}:{41241 + r} [{r % 8}] NCCL INFO"
        lines += [f"{pre} NET/OFI Selected provider is efa, fabric is efa (found 32 nics)",
                  f"{pre} Using network Libfabric",
                  f"{pre} Channel 00/0 : {r}[{r % 8}] -> {(r + 8) % 16}[{r % 8}] [send] via NET/Libfabric/{r % 8}/GDRDMA"]
    lines.append(f"{HOSTS[0]}:41230:41241 [0] NCCL INFO comm 0x55d0 rank 0 nranks 16 cudaDev 0 - Init COMPLETE")
    names = "".join(f"  extra{i}" for i in range(extra_cols))
    lines += ["#", "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   "
              f"algbw   busbw  #wrong{names}"]
    extra = "".join(f"  {i}" for i in range(extra_cols))
    for size, b in zip(SIZES, busbw):
        lines += _row(size, b, extra)
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 300.1 ", "#",
              "# Collective test concluded: all_reduce_perf"]
    return lines


BUSBW = st.lists(st.tuples(st.floats(260, 700), st.floats(260, 700)), min_size=len(SIZES), max_size=len(SIZES))
EXP = expectation_for(load_catalog()["p5.48xlarge"], 2, require_data_check=True)


@st.composite
def noisy(draw: st.DrawFn, lines: list[str]) -> list[str]:
    """The same log with ANSI codes, CRLF endings and stderr lines between rows."""
    out = []
    for line in lines:
        if draw(st.integers(0, 4)) == 0:
            out.append(draw(st.sampled_from(["srun: Job step 41.0 is using 16 tasks", "warning: stderr says hi",
                                             "\x1b[33mUCX  WARN  unused env variable\x1b[0m", ""])))
        if draw(st.integers(0, 3)) == 0:
            line = f"\x1b[{draw(st.sampled_from(['0', '1;32', '38;5;208']))}m{line}\x1b[0m"
        out.append(line + ("\r" if draw(st.booleans()) else ""))
    return out


@PROPERTY
@given(st.data(), BUSBW, st.integers(0, 2))
def test_a_healthy_table_with_formatting_noise_passes(data: st.DataObject, busbw: list[tuple[float, float]],
                                                      extra_cols: int) -> None:
    lines = data.draw(noisy(healthy_lines(busbw, extra_cols)))
    v = judge(parse_stream(lines), EXP)
    assert v.passed, render(v)


@PROPERTY
@given(BUSBW, st.integers(0, len(SIZES) - 1), st.integers(0, 1), st.sampled_from(["time", "algbw", "busbw"]),
       st.one_of(st.floats(0.2, 0.8), st.floats(1.3, 20), st.just(-1.0), st.just(0.0), st.just(math.inf),
                 st.just(math.nan)))
def test_any_row_made_inconsistent_non_physical_or_non_finite_fails(
        busbw: list[tuple[float, float]], row: int, half: int, field: str, k: float) -> None:
    lines = healthy_lines(busbw, 0)
    at = next(i for i, l in enumerate(lines) if l.lstrip().startswith(str(SIZES[row]) + " "))
    tokens = lines[at].split()
    col = 5 + half * 4 + ["time", "algbw", "busbw"].index(field)
    tokens[col] = f"{float(tokens[col]) * k:.2f}" if math.isfinite(k) else str(k)
    lines[at] = "  ".join(tokens)
    v = judge(parse_stream(lines), EXP)
    assert not v.passed and {"non_physical", "non_finite"} & set(v.codes), render(v)


@PROPERTY
@given(BUSBW, st.integers(0, len(SIZES) - 1), st.floats(3.1, 50))
def test_a_whole_row_above_the_fabric_ceiling_fails(busbw: list[tuple[float, float]], row: int, k: float) -> None:
    scaled = [(b[0] * k, b[1] * k) if i == row else b for i, b in enumerate(busbw)]
    v = judge(parse_stream(healthy_lines(scaled, 0)), EXP)
    assert not v.passed and "non_physical" in v.codes, render(v)


@PROPERTY
@given(BUSBW, st.integers(0, 15), st.sampled_from(["provider", "socket", "ib"]))
def test_any_rank_moved_off_efa_fails_naming_it(busbw: list[tuple[float, float]], rank: int, how: str) -> None:
    lines = healthy_lines(busbw, 0)
    host, pid = HOSTS[rank // 8], 41230 + rank
    prefix = f"{host}:{pid}:"
    for i, line in enumerate(lines):
        if line.startswith(prefix):
            if how == "provider":
                lines[i] = line.replace("provider is efa, fabric is efa", "provider is tcp, fabric is tcp")
            elif "via NET/" in line:
                lines[i] = line.split(" via ")[0] + (" via NET/Socket/0" if how == "socket" else " via NET/IB/0")
    v = judge(parse_stream(lines), EXP)
    fails_with(v, "rank_off_efa", f"rank {rank} on {host}")
