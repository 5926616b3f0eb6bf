"""Property: never PASS without a finite, correct, at-floor reference-size row over the expected transport.

Hypothesis writes nccl-tests logs from a spec (table layout of old and new nccl-tests, launcher prefix,
benchmark name, the reference row's figures as %f/%g/%e or nan/inf, its check cells, a skipped or
unreadable reference row, the transport the INFO lines show, the footer, NCCL's rank count) and the spec
alone says whether the run deserves to pass. The verdict must agree both ways: it never passes a run that
does not deserve it (safety), and it passes every one that does in a supported shape (the parser reads
them all). A second property deletes lines from a healthy log: whatever is left passes only while the
evidence is still there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from fmcluster.acceptance.expectation import expectation_for
from fmcluster.acceptance.model import json_safe
from fmcluster.acceptance.parser import parse_stream
from fmcluster.acceptance.verdict import judge, render
from fmcluster.catalog import load_catalog

REF = 1 << 30
FLOOR = 250.0
SIZES = [1 << k for k in range(20, 35)]  # 1 MiB .. 16 GiB
HOSTS = ("p5-st-p5-1", "p5-st-p5-2")
PROPERTY = settings(max_examples=150, deadline=None)


@dataclass(frozen=True)
class Spec:
    layout: str  # new | pre210 | timestamp
    prefix: str  # none | srun | openmpi | intel | kubectl | cri
    bench: str | None
    ref: str  # present | missing | unreadable
    oop: str
    ip: str
    check: tuple[str, str]
    other_nonfinite: bool
    transport: str  # efa | efa_nogdr | socket | tcp | silent
    footer: str  # plain | ok | failed | nan | missing
    nranks: int
    require_check: bool

    def deserves_pass(self) -> bool:
        """The pass rule, computed from what was written, not from what was parsed."""
        if self.ref != "present" or self.other_nonfinite or self.nranks != 16:
            return False
        if self.transport not in ("efa", "efa_nogdr") or self.footer not in ("plain", "ok"):
            return False
        if self.bench not in ("all_reduce_perf", "all_reduce_perf_mpi", None):
            return False
        busbw = [float(x) for x in (self.oop, self.ip)]
        if not all(math.isfinite(b) and b >= FLOOR for b in busbw):
            return False
        for cell in self.check:
            if cell == "N/A":
                if self.require_check:
                    return False
            elif self.layout == "pre210":
                if float(cell) > 1e-3:
                    return False
            elif cell != "0":
                return False
        return True


def figure(lo: float, hi: float) -> st.SearchStrategy[str]:
    """A busbw figure printed the ways nccl-tests versions print one: %.2f, %g, %.1e."""
    return st.tuples(st.floats(lo, hi, allow_nan=False), st.sampled_from(["{:.2f}", "{:g}", "{:.1e}"])).map(
        lambda t: t[1].format(t[0]))


BAD_FIGURES = st.one_of(figure(0, 249.9), st.sampled_from(["nan", "-nan", "inf", "-inf", "249.99", "0.00"]))
FAULTS = ("ref_missing", "ref_unreadable", "oop_bad", "ip_bad", "check_bad", "unchecked_required", "other_nonfinite",
          "transport", "footer", "nranks", "bench")


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    """A healthy run in any supported shape, with none, one or two faults applied."""
    layout = draw(st.sampled_from(["new", "pre210", "timestamp"]))
    good_check = st.sampled_from(["0e+00", "2e-07", "N/A"] if layout == "pre210" else ["0", "0", "N/A"])
    c = draw(good_check)
    spec = Spec(
        layout=layout,
        prefix=draw(st.sampled_from(["none", "srun", "openmpi", "intel", "kubectl", "cri"])),
        bench=None if layout == "pre210" else draw(st.sampled_from(["all_reduce_perf", "all_reduce_perf_mpi"])),
        ref="present",
        oop=draw(st.one_of(figure(250, 600), st.just("250.00"), st.just("2.5e+02"))),
        ip=draw(figure(250, 600)),
        check=(c, c),
        other_nonfinite=False,
        transport=draw(st.sampled_from(["efa", "efa_nogdr"])),
        footer=draw(st.sampled_from(["plain", "ok"])),
        nranks=16,
        require_check=c != "N/A" and draw(st.booleans()),
    )
    changes: dict[str, object] = {}
    for fault in draw(st.sets(st.sampled_from(FAULTS), max_size=2)):
        if fault in ("ref_missing", "ref_unreadable"):
            changes["ref"] = fault.removeprefix("ref_")
        elif fault in ("oop_bad", "ip_bad"):
            changes[fault[:-4]] = draw(BAD_FIGURES)
        elif fault == "check_bad":
            bad = ["5e-01", "3"] if layout == "pre210" else ["3", "1.04858e+06", "2e-07", "-1"]
            changes["check"] = (draw(st.sampled_from(bad)), draw(st.sampled_from([c, *bad])))
        elif fault == "unchecked_required":
            changes.update(check=("N/A", "N/A"), require_check=True)
        elif fault == "other_nonfinite":
            changes["other_nonfinite"] = True
        elif fault == "transport":
            changes["transport"] = draw(st.sampled_from(["socket", "tcp", "silent"]))
        elif fault == "footer":
            changes["footer"] = draw(st.sampled_from(["failed", "nan", "missing"]))
        elif fault == "nranks":
            changes["nranks"] = 8
        elif fault == "bench" and layout != "pre210":
            changes["bench"] = "all_gather_perf"
    return Spec(**{**spec.__dict__, **changes})


def _info(host: str, msg: str) -> str:
    return f"{host}:41230:41241 [0] NCCL INFO {msg}"


def transport_lines(kind: str) -> list[str]:
    h0, h1 = HOSTS
    if kind == "silent":
        return []
    if kind == "socket":
        return [_info(h0, "NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin."),
                _info(h0, "NET/Socket : Using [0]enp71s0:10.1.0.11<0>"), _info(h0, "Using network Socket"),
                _info(h0, "Channel 00/0 : 15[7] -> 0[0] [receive] via NET/Socket/0")]
    provider = "tcp" if kind == "tcp" else "efa"
    via = "NET/Libfabric/0" + ("" if kind == "efa_nogdr" else "/GDRDMA")
    return [_info(h0, "NET/OFI Initializing aws-ofi-nccl 1.16.0"),
            _info(h0, f"NET/OFI Selected provider is {provider}, fabric is {provider} (found 32 nics)"),
            _info(h0, "Using network Libfabric"),
            _info(h1, f"Channel 00/0 : 7[7] -> 8[0] [receive] via {via}"),
            _info(h0, "Channel 00/0 : 1[1] -> 2[2] via P2P/CUMEM/read")]


def cells(size: int, busbw: str) -> str:
    """time, algbw, busbw of one half, consistent with each other as nccl-tests computes them (2 nodes, 16 ranks)."""
    try:
        value = float(busbw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        return f"{'4583.68':>8}  {'234.25':>6}  {busbw:>6}"  # `non_finite` is the finding; the rest is moot
    algbw = value / (2 * 15 / 16)
    time_us = size / (algbw * 1e3) if algbw > 0 else 1e12
    return f"{time_us:8.2f}  {algbw:6.2f}  {busbw:>6}"


def row_parts(spec: Spec, size: int, busbw: tuple[str, str], check: tuple[str, str]) -> tuple[str, str, str, str]:
    """(preamble, out-of-place cells, in-place cells, trailing) as nccl-tests prints them in pieces."""
    count = size // 4
    if spec.layout == "pre210":
        pre = f"{size:12d}  {count:12d}  {'float':>6}  {'sum':>6}"
    else:
        pre = f"{size:12d}  {count:12d}  {'float':>8}  {'sum':>6}  {-1:6d}"
    halves = tuple(f"  {cells(size, b)}  {c:>6}" for b, c in zip(busbw, check))
    trailing = "  2026-11-30 03:10:00" if spec.layout == "timestamp" else ""
    return pre, halves[0], halves[1], trailing


def build(spec: Spec) -> list[str]:
    lines: list[str] = []
    if spec.layout != "pre210":
        lines += ["# nccl-tests version 2.18.3 (cbe2cd5) nccl-headers=22703 nccl-library=22703",
                  f"# Collective test starting: {spec.bench}"]
    lines.append("# nThread 1 nGpus 1 minBytes 1048576 maxBytes 17179869184 step: 2(factor) warmup iters: 5 iters: 20")
    lines += ["#", "# Using devices"]
    for r in range(16):
        group = "" if spec.layout == "pre210" else "Group  0 "
        lines.append(f"#  Rank {r:2d} {group}Pid {41230 + r:6d} on {HOSTS[r // 8]:>10} device {r % 8:2d} [0x53] "
                     "NVIDIA H100 80GB HBM3")
    lines.append("NCCL version 2.27.3+cuda12.8")
    lines += transport_lines(spec.transport)
    if spec.transport != "silent":
        lines.append(_info(HOSTS[0], f"comm 0x55d0 rank 0 nranks {spec.nranks} cudaDev 0 nvmlDev 0 busId 53000 "
                                     "commId 0x9d3c - Init COMPLETE"))
    check_col = "error" if spec.layout == "pre210" else "#wrong"
    lead = "size         count    type   redop" if spec.layout == "pre210" else \
        "size         count      type   redop    root"
    stamp = " timestamp" if spec.layout == "timestamp" else ""
    lines += ["#", f"#       {lead}     time   algbw   busbw  {check_col}     time   algbw   busbw  {check_col}{stamp}",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)"]
    ok = ("0e+00", "0e+00") if spec.layout == "pre210" else ("0", "0")
    ok = ("N/A", "N/A") if spec.check == ("N/A", "N/A") else ok  # -c 0 leaves every row unchecked
    rows: list[tuple[str, str, str, str]] = []
    for size in SIZES:
        if size == REF:
            if spec.ref == "missing":
                continue
            busbw = (spec.oop, spec.ip) if spec.ref == "present" else ("N/A", "N/A")
            rows.append(row_parts(spec, size, busbw, spec.check))
        elif size == 2 << 20 and spec.other_nonfinite:
            rows.append(row_parts(spec, size, ("nan", "31.50"), ok))
        else:
            rows.append(row_parts(spec, size, ("440.00", "441.00") if size > REF else ("100.00", "101.00"), ok))
    row_lines = {len(lines) + i for i in range(len(rows))}
    lines += ["".join(parts) for parts in rows]
    if spec.footer != "missing":
        lines.append("# Out of bounds values : 0 OK")
        value = "nan" if spec.footer == "nan" else "149.4081"
        verdict = {"ok": " OK", "failed": " FAILED"}.get(spec.footer, "")
        lines.append(f"# Avg bus bandwidth    : {value}{verdict}")
        lines += ["#", f"# Collective test concluded: {spec.bench or 'all_reduce_perf'}"]
    return [prefixed(spec, i, line, i in row_lines, rows[i - min(row_lines)] if i in row_lines else None)
            for i, line in enumerate(lines)]


def prefixed(spec: Spec, i: int, line: str, is_row: bool, parts: tuple[str, str, str, str] | None) -> str:
    if spec.prefix == "srun":
        return f" 0: {line}"
    if spec.prefix == "openmpi":
        return f"[1,0]<stdout>:{line}"
    if spec.prefix == "intel":
        if is_row and parts is not None:  # Intel MPI tags every chunk a rank writes, so mid-row too
            return f"[0] {parts[0]}[0] {parts[1]}[0] {parts[2]}{parts[3]}"
        return f"[0] {line}"
    if spec.prefix == "kubectl":
        return f"[pod/nccl-tests-launcher-x7k2p/mpi-launcher] 2026-11-30T03:10:{i % 60:02d}.123456789Z {line}"
    if spec.prefix == "cri":
        return f"2026-11-30T03:10:{i % 60:02d}.123456789Z stdout F {line}"
    return line


def expectation(require_check: bool):  # type: ignore[no-untyped-def]
    return expectation_for(load_catalog()["p5.48xlarge"], 2, require_data_check=require_check)


@PROPERTY
@given(specs())
def test_a_run_passes_exactly_when_its_reference_row_is_finite_correct_at_floor_over_efa(spec: Spec) -> None:
    log = parse_stream(build(spec))
    verdict = judge(log, expectation(spec.require_check))
    assert verdict.passed == spec.deserves_pass(), f"{spec}\n{render(verdict, log)}"
    if verdict.passed:
        assert verdict.busbw_gbps is not None and math.isfinite(verdict.busbw_gbps) and verdict.busbw_gbps >= FLOOR
    json.dumps(verdict.to_dict(), allow_nan=False)
    json.dumps(json_safe(log.to_dict())[0], allow_nan=False)


HEALTHY = Spec("new", "none", "all_reduce_perf", "present", "439.22", "432.33", ("0", "0"), False, "efa", "plain",
               16, True)
ESSENTIAL = ("  1073741824 ", "# Avg bus bandwidth", "Selected provider is efa")


@PROPERTY
@given(st.sets(st.integers(0, len(build(HEALTHY)) - 1), max_size=25))
def test_deleting_lines_never_leaves_a_pass_without_its_evidence(dropped: set[int]) -> None:
    lines = [line for i, line in enumerate(build(HEALTHY)) if i not in dropped]
    verdict = judge(parse_stream(lines), expectation(True))
    if verdict.passed:
        for needle in ESSENTIAL:
            assert any(needle in line for line in lines), f"passed without {needle!r}\n{render(verdict)}"


@PROPERTY
@given(st.lists(st.text(max_size=120), max_size=40), st.lists(st.integers(0, 200), max_size=8))
def test_junk_spliced_into_a_log_never_raises_and_never_makes_a_failing_log_pass(junk: list[str], at: list[int]) -> None:
    slow = Spec(**{**HEALTHY.__dict__, "oop": "120.00"})
    lines = build(slow)
    for pos, text in zip(at, junk):
        lines.insert(min(pos, len(lines)), text)
    lines += junk[len(at):]
    verdict = judge(parse_stream(lines), expectation(True))
    assert not verdict.passed, render(verdict)
    json.dumps(verdict.to_dict(), allow_nan=False)
