"""Judge a parsed log against an Expectation: pass, fail or not judged, every finding with a stable code,
its likely cause and fix, and one sentence that answers "is my bandwidth right?".

This is the one judging function: the deploy's gate, its bisection probes, `fmcluster acceptance parse`
and `invoke doctor` all call `judge(parse_file(log), expectation)`.

Fail closed: a run passes only on positive evidence, namely a completed table whose row at the reference
size is finite, correct (`#wrong` 0 in every half nccl-tests checks, or explicitly unchecked and allowed; alltoall's
and sendrecv's in-place half is never checked, see `IN_PLACE_UNCHECKED`), at or above the floor in both
halves (out-of-place and in-place), over the transport the node-count class must use, on every rank. Every
row must also obey physics (algbw = size/time, busbw = that x the collective's factor, under the fabric's
ceiling), and the rank -> host -> device map must match itself and the catalog. Anything missing,
unreadable, non-finite or non-physical is a failure with a diagnosis. `_missing_evidence` re-checks that rule after all
findings, so no combination of findings can pass a run without it.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from fmcluster.acceptance.expectation import (
    CEILING_TOLERANCE,
    IN_PLACE_UNCHECKED,
    TRANSPORT_WORDS,
    Expectation,
    bus_factor,
    ceiling_gbps,
    checked_halves,
    collective_from_table,
    collective_of_benchmark,
    moved_bytes,
    row_correct,
)
from fmcluster.acceptance import neuron
from fmcluster.acceptance.model import Measurement, NccomRow, NccomRun, ParsedLog, SizeRow, json_safe
from fmcluster.acceptance.parser import parse_file
from fmcluster.catalog import NODE_CLASS_WORDS

Severity = Literal["fail", "warn"]
Status = Literal["pass", "fail", "not_judged"]
_CUDA_INSUFFICIENT = re.compile(r"CUDA driver version is insufficient for CUDA runtime version|"
                                r"cudaErrorInsufficientDriver")
_CONTAINER_CHECK = re.compile(r"fmcluster acceptance: (?:container check failed on |no EFA device |locked memory is )")
_BAD_IFACE = re.compile(r"Unable to find address for|no socket interface found|No usable listening interface")
GATED_BENCHMARK = "all_reduce_perf"
PHYSICS_TOLERANCE = 0.02
"""Relative slack when checking algbw = size/time and busbw = algbw x factor; nccl-tests prints 3-6 digits."""
PHYSICS_SLACK_GBPS = 0.011
"""Absolute slack: figures printed with %.2f are off by up to 0.005 each."""
_DEVICE_GENERATION = re.compile(r"\b[A-Z]\d{2,3}\b")


@dataclass(frozen=True)
class Code:
    """One finding the verdict can raise; docs/acceptance.md's table of codes is generated from these
    (`python -m fmcluster.acceptance.docs`)."""

    when: str
    """When the finding is raised."""
    severity: str
    """fail, warn, or when it is which (e.g. "fail (warn on 1 node)")."""
    blames_node: bool
    """Whether one node can cause it, so that bisection and drain make sense (config-wide causes cannot)."""
    source: str
    """What the check rests on: the tool's own documentation or output, the catalog, or fmcluster's own rule."""
    explained_by_configuration: bool = False
    """A configuration finding beside it (_CONFIG_CAUSES) names the cause instead of a node."""


CODES: dict[str, Code] = {
    "non_finite": Code(
        when="a figure in the size table or the footer is nan, -nan or inf (or not a number)",
        severity="fail", blames_node=True,
        source="nccl-tests doc/PERFORMANCE.md (every figure is a measurement; nan/inf is none)"),
    "nccl_tests_failed": Code(
        when="nccl-tests' own check: `# Avg bus bandwidth : X FAILED` (NCCL_TESTS_MIN_BW)",
        severity="fail", blames_node=True, explained_by_configuration=True,
        source="nccl-tests src/common.cu (NCCL_TESTS_MIN_BW: the footer says FAILED)"),
    "wrong_data": Code(
        when="`#wrong` > 0 (also in %g form, counted, \"about N\"), out-of-bounds values, an old max error > 1e-3, a "
             "check cell that cannot be read",
        severity="fail", blames_node=True,
        source="nccl-tests doc/PERFORMANCE.md, \"#wrong\" (nccl-tests -c 1)"),
    "data_unchecked": Code(
        when="`#wrong` is N/A (`-c 0`) in a half nccl-tests checks (the out-of-place half only, for alltoall and "
             "sendrecv); fails when data checks are required (the gate, `--require-data-check`)",
        severity="warn / fail", blames_node=False,
        source="nccl-tests doc/PERFORMANCE.md, \"#wrong\" (N/A with -c 0)"),
    "no_results": Code(
        when="no size table: the benchmark never started, or not an nccl-tests log",
        severity="fail", blames_node=False,
        source="nccl-tests doc/PERFORMANCE.md (the size table is the result)"),
    "table_unreadable": Code(
        when="row-shaped lines but not one readable row",
        severity="fail", blames_node=False,
        source="nccl-tests doc/PERFORMANCE.md (the size table's columns)"),
    "run_failed": Code(
        when="failure lines (Test NCCL failure, srun/slurmstepd errors, tracebacks) and no table",
        severity="fail", blames_node=True,
        source="nccl-tests src/common.h error macros; Slurm srun/slurmstepd messages"),
    "cuda_driver_insufficient": Code(
        when="no table, and CUDA said `CUDA driver version is insufficient for CUDA runtime version` (its error 35): "
             "the CUDA runtime (an image's, or a build's) is newer than the node's NVIDIA driver supports",
        severity="fail", blames_node=False,
        source="NVIDIA CUDA Compatibility (minor version and forward compatibility); CUDA Runtime API "
               "(cudaErrorInsufficientDriver)"),
    "container_check_failed": Code(
        when="no table, and the container job's check before nccl-tests refused: the host against the image (CUDA "
             "runtime and driver, aws-ofi-nccl, libfabric's efa provider) or the EFA devices and memlock inside "
             "(`fmcluster acceptance: container check failed on NODE: ...`)",
        severity="fail", blames_node=False,
        source="the job script's check (roles/nccl_tests/templates/nccl-tests.sbatch.j2; its rules: NVIDIA CUDA "
               "Compatibility, NCCL's net plugin loading, the EC2 EFA user guide's `fi_info -p efa -t FI_EP_RDM`)"),
    "plugin_init_failed": Code(
        when="no table and an aws-ofi-nccl `NET/OFI` WARN",
        severity="fail", blames_node=False,
        source="aws-ofi-nccl (NET/OFI messages)"),
    "bad_socket_interface": Code(
        when="no table, and NCCL/gloo could not find the socket interface it was told to use",
        severity="fail", blames_node=False,
        source="NCCL environment variables (NCCL_SOCKET_IFNAME); PyTorch gloo (GLOO_SOCKET_IFNAME)"),
    "killed": Code(
        when="no footer, and Slurm or the kernel killed the job (TIME LIMIT, CANCELLED, Killed, OOM)",
        severity="fail", blames_node=True,
        source="Slurm (sbatch --time: \"DUE TO TIME LIMIT\", scancel: \"CANCELLED\"); the kernel's OOM killer"),
    "truncated": Code(
        when="no footer and no kill message: the output stops",
        severity="fail", blames_node=True,
        source="nccl-tests doc/PERFORMANCE.md (a run ends with the `# Avg bus bandwidth` footer)"),
    "ranks_not_wired": Code(
        when="several result tables of 1 rank each (`srun` without `--mpi=pmix`, or no `MPI=1` build)",
        severity="fail", blames_node=False,
        source="nccl-tests README (MPI=1 build, one process per GPU); Slurm MPI guide (--mpi=pmix)"),
    "multiple_tables": Code(
        when="several result tables of several ranks: more than one run in one log",
        severity="fail", blames_node=False,
        source="nccl-tests doc/PERFORMANCE.md (one run, one table)"),
    "rank_count_conflict": Code(
        when="nccl-tests' `# Rank` lines and NCCL's own `nranks` disagree (NCCL's count is used)",
        severity="fail", blames_node=False,
        source="nccl-tests `# Rank` lines; NCCL INFO `nranks`"),
    "rank_count": Code(
        when="ranks ≠ nodes × GPUs per node",
        severity="fail", blames_node=True,
        source="catalog (instances.yml accelerators_per_node); nccl-tests `# Rank` lines"),
    "rank_count_unknown": Code(
        when="neither `# Rank` lines nor NCCL's `nranks` say how many ranks ran",
        severity="warn", blames_node=False,
        source="nccl-tests `# Rank` lines; NCCL INFO `nranks`"),
    "garbled": Code(
        when="lines that could not be read (spliced by concurrently writing ranks, cut off)",
        severity="warn", blames_node=False,
        source="fmcluster's parser (a line it cannot read is said, never guessed)"),
    "line_too_long": Code(
        when="lines over the parser's bound (64 KiB) were cut to it",
        severity="warn", blames_node=False,
        source="fmcluster's parser bounds (fmcluster.acceptance.parser)"),
    "rows_dropped": Code(
        when="more distinct sizes than the parser keeps (10,000)",
        severity="warn", blames_node=False,
        source="fmcluster's parser bounds (fmcluster.acceptance.parser)"),
    "benchmark_mismatch": Code(
        when="the log ran another collective than expected, or its table cannot be that collective's (no redop "
             "column for all_reduce)",
        severity="fail", blames_node=False,
        source="nccl-tests `# Collective test starting` line and table columns; nccom-test's command line"),
    "benchmark_unnamed": Code(
        when="the log does not name its benchmark (old nccl-tests): judged as the expected one",
        severity="warn", blames_node=False,
        source="nccl-tests before 2.10 print no `# Collective test starting` line"),
    "bandwidth_not_gated": Code(
        when="a collective other than all_reduce with no hardware ceiling to derive a floor from (the CPU stand-in "
             "over TCP): bandwidth reported, not gated",
        severity="warn", blames_node=False,
        source="nccl_profiles.yml collective_floors (no ceiling, no floor)"),
    "non_physical": Code(
        when="a row's figures break physics: time not positive, algbw ≠ size/time or busbw ≠ size/time × the "
             "collective's factor (beyond 2% + 0.011 GB/s), or busbw above the fabric's ceiling (+5%)",
        severity="fail", blames_node=True,
        source="nccl-tests doc/PERFORMANCE.md (algbw = S/t, busbw factors); AWS Neuron, nccom-test user guide, \"Bus "
               "Bandwidth Calculation\"; catalog network_gbps and nvlink (ceilings)"),
    "test_failure": Code(
        when="an nccl-tests failure line (`Test NCCL failure`, `Test failure`) anywhere in the log, also after a "
             "clean footer",
        severity="fail", blames_node=True,
        source="nccl-tests src/common.h error macros"),
    "rank_off_efa": Code(
        when="some ranks on EFA, others not: a process selected another provider (e.g. tcp) or says it uses another "
             "network (`Using network Socket`), or a rank's channels go via `NET/Socket` (names rank and host)",
        severity="fail", blames_node=True,
        source="aws-ofi-nccl and NCCL INFO output per process and rank"),
    "duplicate_device": Code(
        when="two ranks on the same GPU (same host and device in the `# Rank` lines)",
        severity="fail", blames_node=False,
        source="nccl-tests `# Rank` lines (host, device)"),
    "ranks_missing": Code(
        when="the `# Rank` lines skip rank numbers or list one twice",
        severity="fail", blames_node=False,
        source="nccl-tests `# Rank` lines"),
    "host_count": Code(
        when="the ranks ran on another number of hosts than the run's node count (`--nodes`, the gate's node list)",
        severity="fail", blames_node=False,
        source="nccl-tests `# Rank` lines; nccom-test's -N; the gate's node list"),
    "device_model": Code(
        when="a rank's GPU is not the catalog's model for the instance type (H100 on p5, A100 on p4d), or ranks "
             "report different models",
        severity="fail", blames_node=True,
        source="catalog (instances.yml accelerator_model); nccl-tests `# Rank` lines"),
    "nic_count": Code(
        when="aws-ofi-nccl `found N nics` ≠ the catalog's `efa_interfaces` for the instance type",
        severity="fail", blames_node=True,
        source="catalog (instances.yml efa_interfaces); aws-ofi-nccl `found N nics`"),
    "nccl_version_mixed": Code(
        when="ranks print different `NCCL version` strings",
        severity="fail", blames_node=True,
        source="NCCL INFO `NCCL version`"),
    "neuron_not_judged": Code(
        when="AWS Neuron `nccom-test` output and no instance type to judge it against: read, checked for what fails "
             "any run, not judged (exit 5), never \"unreadable\"",
        severity="warn", blames_node=False,
        source="AWS Neuron, nccom-test user guide"),
    "nccom_test_failed": Code(
        when="nccom-test's own failure output (`N errors found - test failed`, a `Failure running neuron-bench - log "
             "file ...` row, `Neuron DKMS Driver is not running!`), with or without a table",
        severity="fail", blames_node=True,
        source="AWS Neuron, nccom-test user guide (its failure examples)"),
    "log_capped": Code(
        when="the log is larger than the parser reads (4 GiB of text, 2,000,000 lines, or a compressed log expanding "
             "like a decompression bomb): the rest was not read",
        severity="fail", blames_node=False,
        source="fmcluster's parser bounds (fmcluster.acceptance.parser)"),
    "socket_fallback": Code(
        when="`Using network Socket` / `via NET/Socket` / no net plugin on an EFA GPU instance",
        severity="fail (warn on 1 node)", blames_node=False,
        source="NCCL INFO output (`Using network Socket`, `via NET/Socket`); aws-ofi-nccl"),
    "provider_not_efa": Code(
        when="`NET/OFI Selected provider is tcp` (or anything but efa)",
        severity="fail", blames_node=False,
        source="aws-ofi-nccl (`NET/OFI Selected provider is ...`)"),
    "no_efa_selection": Code(
        when="no `NET/OFI Selected provider` line at all: EFA use cannot be confirmed",
        severity="fail", blames_node=False,
        source="aws-ofi-nccl (`NET/OFI Selected provider is efa`)"),
    "gdr_off": Code(
        when="inter-node channels without `/GDRDMA`; named as the cause of a low bandwidth",
        severity="warn", blames_node=False,
        source="NCCL INFO channel lines (`/GDRDMA`)"),
    "nvlink_not_used": Code(
        when="one GPU node whose ranks connect only through SHM, not P2P/NVLS",
        severity="fail", blames_node=False,
        source="NCCL INFO channel lines (P2P, NVLS, SHM)"),
    "transport_unconfirmed": Code(
        when="no INFO line shows the expected transport (run with `NCCL_DEBUG=INFO`)",
        severity="fail", blames_node=False,
        source="NCCL environment variables (NCCL_DEBUG=INFO)"),
    "reference_size_missing": Code(
        when="no readable row at the reference size (not run, skipped, or unreadable), whatever larger sizes show",
        severity="fail", blames_node=False,
        source="catalog (instances.yml reference_bytes)"),
    "below_floor": Code(
        when="busbw at the reference size (either half) under the floor",
        severity="fail", blames_node=True, explained_by_configuration=True,
        source="catalog (instances.yml floors, each with its own source); nccl_profiles.yml collective_floors"),
    "not_judged": Code(
        when="no expectation (instance type or node count unknown): read, not judged",
        severity="warn", blames_node=False,
        source="catalog (an instance type and node count to judge against)"),
    "no_positive_evidence": Code(
        when="no other finding failed, yet the pass rule is not met (a safety net)",
        severity="fail", blames_node=False,
        source="fmcluster's pass rule (docs/acceptance.md, \"The verdict: pass only on positive evidence\")"),
}
# Findings that explain a low bandwidth by configuration rather than by a node.
_CONFIG_CAUSES = ("socket_fallback", "provider_not_efa", "no_efa_selection", "gdr_off", "nvlink_not_used",
                  "transport_unconfirmed", "rank_count", "rank_off_efa", "nic_count")


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    message: str
    fix: str
    blames_node: bool = False


def _f(code: str, severity: Severity, message: str, fix: str, blames_node: bool | None = None) -> Finding:
    return Finding(code, severity, message, fix, CODES[code].blames_node if blames_node is None else blames_node)


@dataclass(frozen=True)
class Verdict:
    status: Status
    expectation: Expectation | None
    busbw_gbps: float | None
    """The gated figure: the lower of the two halves' busbw at the reference size; None when not finite."""
    measured_at_bytes: int | None
    findings: tuple[Finding, ...]
    baseline: str
    """One sentence: measured figure, floor and its source, public figure of the same class and size."""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def failures(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "fail")

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(f.code for f in self.findings)

    @property
    def cause(self) -> str:
        """The first failure's message, 'passed', or why the log was not judged."""
        if self.failures:
            return self.failures[0].message
        if self.status == "not_judged":
            return next((f.message for f in self.findings if f.code == "not_judged"), "not judged")
        return "passed"

    @property
    def blames_node(self) -> bool:
        """A failure one node can cause: bisect and drain. False for configuration-wide failures."""
        return any(f.blames_node for f in self.failures)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for strict JSON: non-finite floats are None (the findings say where they were)."""
        data = asdict(self)
        data.update(passed=self.passed, cause=self.cause, blames_node=self.blames_node)
        return dict(json_safe(data)[0])


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def _num(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) else str(x)


# --- findings that need no expectation ---------------------------------------------------------------

def _integrity(log: ParsedLog) -> list[Finding]:
    out: list[Finding] = []
    bad: list[str] = []
    for row in log.rows:
        for half, m in (("out-of-place", row.out_of_place), ("in-place", row.in_place)):
            cells = [f"{name} {value}" for name, value in (("time", m.time_us), ("algbw", m.algbw_gbps),
                                                           ("busbw", m.busbw_gbps)) if not math.isfinite(value)]
            if cells:
                bad.append(f"{human_bytes(row.size_bytes)} {half}: {', '.join(cells)}")
    if log.avg_busbw_text is not None and (log.avg_busbw_gbps is None or not math.isfinite(log.avg_busbw_gbps)):
        bad.append(f"the footer's average '{log.avg_busbw_text}'")
    if bad:
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        out.append(_f("non_finite", "fail", f"the log has figures that are not finite numbers: {'; '.join(bad[:4])}"
                      f"{more}. A NaN compares false against every floor, so it can never count as a measurement",
                      "rerun; NaN/inf usually means a broken timer or a failed collective on some rank: read the "
                      "ranks' NCCL WARN lines and bisect if it repeats"))
    return out


def _close(printed: float, computed: float, relative: float = PHYSICS_TOLERANCE) -> bool:
    return abs(printed - computed) <= relative * max(abs(printed), abs(computed)) + PHYSICS_SLACK_GBPS


def _time_resolution(time_us: float) -> float:
    """Half the last printed digit of a time cell: nccl-tests prints %7.2f under 100 µs, %7.1f under 10 ms, %7.0f
    above, so a sub-µs time ('0.22') carries up to 2.3% rounding that algbw, computed before rounding, does not."""
    return 0.005 if time_us < 100 else 0.05 if time_us < 10_000 else 0.5


def judged_collective(log: ParsedLog, exp: Expectation | None) -> str | None:
    """The one collective every check reads the table as (the benchmark finding, the floor, the bus factor and
    the ceiling of the physics checks): the one the log names; else the expected one; else, with an
    expectation, all_reduce (the gate's benchmark, and what the verdict says it judged); else, judged on its
    own, the collective the table's shape proves (`collective_from_table`). None for an unknown benchmark.

    A log without its `# Collective test starting` line (nccl-tests before 2.10 print none) is so judged as
    the same collective as with it, so no check is skipped for want of a name.
    """
    if log.benchmark is not None:
        return collective_of_benchmark(log.benchmark)
    if exp is not None:
        return exp.collective or "all_reduce"
    return collective_from_table(log)


def _half_physics(m: Measurement, sizes: tuple[int, ...], factor: float | None,
                  ceiling: tuple[float, str] | None) -> list[str]:
    """`sizes`: the printed size, then the bytes nccl-tests' formula moves (`moved_bytes`) where they differ; the
    printed algbw must be one of them over the time."""
    if not m.finite:
        return []  # `non_finite` says so
    if m.time_us <= 0:
        return [f"time {m.time_us:g} µs is not positive"]
    problems = []
    algbw = min((s / (m.time_us * 1e3) for s in sizes), key=lambda a: abs(a - m.algbw_gbps))
    relative = PHYSICS_TOLERANCE + _time_resolution(m.time_us) / m.time_us
    if not _close(m.algbw_gbps, algbw, relative):
        problems.append(f"algbw {m.algbw_gbps:g} GB/s but size/time is {algbw:.4g}")
    # against size/time, not the printed algbw: that one is rounded to 0.01 and the factor would scale the error
    if factor is not None and not _close(m.busbw_gbps, algbw * factor, relative):
        problems.append(f"busbw {m.busbw_gbps:g} GB/s but size/time × {factor:.4g} is {algbw * factor:.4g}")
    if ceiling is not None and m.busbw_gbps > ceiling[0] * (1 + CEILING_TOLERANCE):
        problems.append(f"busbw {m.busbw_gbps:g} GB/s is above the physical ceiling {ceiling[0]:.1f} GB/s "
                        f"({ceiling[1]})")
    return problems


def _physics(log: ParsedLog, exp: Expectation | None, collective: str | None) -> list[Finding]:
    """Every row's figures must agree with each other and with the hardware; a figure that cannot be true is a
    failure naming the row, never a pass. `collective` is `judged_collective`'s, the one the verdict names."""
    ranks = log.ranks or (exp.expected_ranks if exp is not None else None)
    factor = bus_factor(collective, ranks) if collective and ranks else None
    ceiling = None
    # The ceilings are the EC2 hardware's; the CPU stand-in's TCP runs (rehearsal over veth) are not bound by them.
    if exp is not None and exp.instance is not None and collective and ranks and exp.transport != "socket":
        ceiling = ceiling_gbps(exp.instance, collective, exp.nodes, ranks)
    bad: list[str] = []
    for row in log.rows:
        moved = moved_bytes(collective, row.count, row.dtype, ranks)
        sizes = (row.size_bytes,) if moved is None or moved == row.size_bytes else (row.size_bytes, moved)
        for half, m in (("out-of-place", row.out_of_place), ("in-place", row.in_place)):
            problems = _half_physics(m, sizes, factor, ceiling)
            if problems:
                line = f" (line {row.line_no})" if row.line_no else ""
                bad.append(f"{human_bytes(row.size_bytes)} {half}{line}: {'; '.join(problems)}")
    if not bad:
        return []
    more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
    return [_f("non_physical", "fail", f"{len(bad)} figure(s) cannot be a real measurement: {' | '.join(bad[:3])}"
               f"{more}. A row whose figures disagree, or that exceeds what the fabric can carry, proves nothing",
               "rerun; a non-positive time or busbw in the millions means the op did not run (check every rank's "
               "WARN lines); numbers edited or post-processed by a script are not evidence")]


def _test_failures(log: ParsedLog) -> list[Finding]:
    if not log.test_failures or not log.rows:  # without a table, `run_failed` already says so
        return []
    return [_f("test_failure", "fail", f"nccl-tests reported a failure: {log.test_failures[0]}"
               + (f" (and {len(log.test_failures) - 1} more)" if len(log.test_failures) > 1 else "")
               + "; a table and a footer printed before or after do not make the run good",
               "read the failing rank's NCCL WARN lines (NCCL_DEBUG=INFO) and rerun; bisect if it repeats")]


def _completeness(log: ParsedLog) -> list[Finding]:
    kills = [e for e in log.errors if "CANCELLED" in e or "Killed" in e or "oom" in e.lower()]
    tail = (kills or list(log.errors) or [""])[0]
    if not log.rows:
        refused = next((e for e in log.errors if _CONTAINER_CHECK.search(e)), None)
        if refused:
            return [_f("container_check_failed", "fail", "the container job's check refused to run nccl-tests: "
                       f"{refused[refused.index('fmcluster acceptance: '):]}",
                       "do what the line's fix says (its host value, image value and rule name the mismatch); "
                       "docs/containers.md, \"Host against image\", lists the checks")]
        insufficient = next((e for e in log.errors if _CUDA_INSUFFICIENT.search(e)), None)
        if insufficient:
            return [_f("cuda_driver_insufficient", "fail", "the CUDA runtime is newer than the node's NVIDIA driver "
                       f"supports: {insufficient}",
                       "run an image (or a build) made for the CUDA version the nodes' driver supports (nvidia-smi's "
                       "`CUDA Version`), or upgrade the nodes' NVIDIA driver; a newer major CUDA release needs its "
                       "driver or the cuda-compat forward-compatibility package")]
        if log.killed:
            return [_f("killed", "fail", f"the job was killed before the first result: {tail}",
                       "look at the job's time limit and at `sacct -j JOBID -o JobID,State,ExitCode`")]
        warn = next((w for w in log.network.warnings if "NET/OFI" in w), None)
        if warn:
            return [_f("plugin_init_failed", "fail", f"aws-ofi-nccl failed to initialise: {warn}",
                       "check the EFA devices (`fi_info -p efa`), the EFA installer version and that the "
                       "security group allows all traffic from itself")]
        iface = next((e for e in log.errors + log.network.warnings if _BAD_IFACE.search(e)), None)
        if iface:
            return [_f("bad_socket_interface", "fail",
                       f"the socket interface setting names an interface the node lacks: {iface}",
                       "fix NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME / FMC_BENCH_SOCKET_IFNAME (or unset it "
                       "to let the library choose)")]
        if log.errors:
            return [_f("run_failed", "fail", f"the benchmark failed before printing results: {tail}",
                       "rerun with NCCL_DEBUG=INFO and read the first WARN line of the failing rank")]
        if log.unreadable_sizes or log.garbled_lines:
            return [_f("table_unreadable", "fail", f"{log.garbled_lines} row-shaped line(s) but not one readable "
                       f"row (table header: {' '.join(log.columns) or 'none seen'})",
                       "check the launcher's line prefixes and the nccl-tests version; "
                       "`fmcluster acceptance parse LOG` shows what was read")]
        if log.rank_lines_seen or log.header:
            # nccl-tests printed its header or rank list, so it started: it hung or died in NCCL's set-up (a
            # public hang report stops exactly there); "never started" would send the user to the wrong place
            return [_f("truncated", "fail", "the benchmark started (header and rank list printed) but the log stops "
                       "before the first result: it hung or died while NCCL set up its communicator",
                       "rerun with NCCL_DEBUG=INFO and read where each rank stops; check every node reaches the "
                       "others (security group, NCCL_SOCKET_IFNAME) and bisect if it repeats")]
        return [_f("no_results", "fail", "the log has no size table (the benchmark never started, or this is "
                   "not an nccl-tests log)", "read the job's stderr; check the sbatch script ran")]
    if log.completed:
        return []
    reached = human_bytes(log.max_size_bytes or 0)
    if log.killed:
        return [_f("killed", "fail", f"the job was killed mid-run after {reached}: {tail}",
                   "raise the job's time limit or lower -e; a hang at one size often means one slow node")]
    return [_f("truncated", "fail", f"the log stops after {reached} without the '# Avg bus bandwidth' line "
               "(truncated output, or a node died)", "rerun; if it stops again at the same place, bisect")]


def _shape(log: ParsedLog, exp: Expectation | None) -> list[Finding]:
    out: list[Finding] = []
    if log.tables > 1:
        if (log.ranks or 1) <= 1:
            out.append(_f("ranks_not_wired", "fail",
                          f"{log.tables} separate result tables with {log.ranks or 1} rank(s) each: the ranks "
                          "ran as independent 1-rank jobs", "launch with `srun --mpi=pmix` (or mpirun) and "
                          "build nccl-tests with MPI=1"))
        else:
            out.append(_f("multiple_tables", "fail", f"{log.tables} result tables in one log: more than one run "
                          "was written to this file, so no single run can be judged", "write one run per log "
                          "(a fresh --output per job)"))
    if log.rank_lines and log.nccl_nranks and log.rank_lines != log.nccl_nranks and log.tables <= 1:
        out.append(_f("rank_count_conflict", "fail",
                      f"the log disagrees with itself: nccl-tests listed {log.rank_lines} rank(s) (`# Rank` lines) "
                      f"but NCCL's communicator has {log.nccl_nranks}; NCCL's count is what the collective ran on",
                      "check that every process joined one communicator (MPI launch, NCCL_COMM_ID) and that "
                      "the log holds one job only"))
    if exp is not None and exp.expected_ranks and log.tables <= 1:
        if log.ranks is None:
            out.append(_f("rank_count_unknown", "warn", "the log says neither how many ranks ran (`# Rank` lines) "
                          "nor NCCL's communicator size", "run with NCCL_DEBUG=INFO"))
        elif log.ranks != exp.expected_ranks:
            out.append(_f("rank_count", "fail", f"{log.ranks} ranks took part, {exp.expected_ranks} expected "
                          f"({exp.nodes} node(s) of {exp.instance_type})",
                          "check --ntasks-per-node/--gpus-per-node and that every GPU is visible (nvidia-smi)"))
    if log.garbled_lines:
        out.append(_f("garbled", "warn", f"{log.garbled_lines} line(s) could not be read (spliced by "
                      "concurrently writing ranks, or cut off) and were skipped",
                      "harmless unless a needed row is among them; run with `srun -l` to label lines"))
    if log.long_lines:
        out.append(_f("line_too_long", "warn", f"{log.long_lines} line(s) longer than the parser's bound were cut "
                      f"to it (the longest: {log.longest_line} bytes)", "find what writes such lines into the job "
                      "output (progress bars, binary data) and send it elsewhere"))
    if log.rows_dropped:
        out.append(_f("rows_dropped", "warn", f"{log.rows_dropped} row(s) beyond the parser's bound on distinct "
                      "sizes were not kept", "run with -f 2 (factor steps) rather than byte steps"))
    return out


def _data(log: ParsedLog, exp: Expectation | None) -> list[Finding]:
    """Wrong and unchecked data, over the halves nccl-tests checks for the judged collective: alltoall and sendrecv
    run their in-place half unchecked (`IN_PLACE_UNCHECKED`), so their in-place `N/A` (or, before nccl-tests 2.13,
    the unchecked buffer's figure) is neither wrong nor unchecked data; their out-of-place `#wrong` must still be
    0, and N/A there still fails a gate that requires checked data."""
    out: list[Finding] = []
    if not log.rows:
        return out
    collective = judged_collective(log, exp)
    bad = [r for r in log.rows if row_correct(r, collective) is False]
    if bad or log.out_of_bounds:
        checked = [m for r in bad for m in checked_halves(r, collective)]
        rounded = any(m.wrong_rounded for m in checked)
        unreadable = [r for r in bad if any(m.check == "unreadable" for m in checked_halves(r, collective))]
        wrong = sum(m.wrong or 0 for r in log.rows for m in checked_halves(r, collective))
        sizes = ", ".join(human_bytes(r.size_bytes) for r in bad[:4]) + (", ..." if len(bad) > 4 else "")
        count = f"{'about ' if rounded else ''}{wrong} wrong element(s){' (counts printed rounded, %g)' if rounded else ''}"
        extra = f"; the check column could not be read at {len(unreadable)} size(s)" if unreadable else ""
        out.append(_f("wrong_data", "fail",
                      f"results were wrong at {len(bad)} size(s) ({sizes or 'see the out-of-bounds line'}; {count}, "
                      f"{log.out_of_bounds or 0} out-of-bounds value(s){extra})",
                      "a faulty GPU, NVLink or NIC corrupts data: bisect the nodes, run `dcgmi diag -r 3` and "
                      "read the XID errors on the drained node"))
    ref = log.row_at(exp.message_bytes) if exp is not None else None
    judged_rows = [ref] if ref is not None else list(log.rows)
    unchecked = [r for r in judged_rows if row_correct(r, collective) is None]
    if unchecked and (ref is not None or len(unchecked) == len(judged_rows)):
        required = exp is not None and exp.require_data_check
        where = f"at {human_bytes(ref.size_bytes)}" if ref is not None else "anywhere"
        half = (f" (its out-of-place half: {collective}'s in-place half is never checked by nccl-tests)"
                if collective in IN_PLACE_UNCHECKED else "")
        out.append(_f("data_unchecked", "fail" if required else "warn",
                      f"nccl-tests did not check its results {where}{half} (`#wrong` is N/A: run with -c 0), so "
                      f"nothing shows the data were right{'; this gate requires checked data' if required else ''}",
                      "run with -c 1 (the acceptance job scripts do; keep `nccl_tests_args` with -c 1)"))
    return out


# --- findings against the expectation --------------------------------------------------------------

@dataclass(frozen=True)
class Gate:
    """The collective a log is judged as and its floor (None: no floor applies, e.g. an unknown benchmark)."""

    collective: str | None
    floor_gbps: float | None = None
    floor_source: str = ""
    floor_from: str = ""


def _benchmark(log: ParsedLog, exp: Expectation) -> tuple[list[Finding], Gate]:
    """Findings and the collective (with its own floor) the log is judged as."""
    out: list[Finding] = []
    expected = exp.collective
    name = log.benchmark
    collective = judged_collective(log, exp)
    if name is None:
        out.append(_f("benchmark_unnamed", "warn", "the log does not name its benchmark (older nccl-tests print "
                      f"no `# Collective test starting` line); judged as {collective}_perf",
                      "use a recent nccl-tests, which names the test it runs"))
        if collective == "all_reduce" and log.has_redop is False:
            out.append(_f("benchmark_mismatch", "fail", "benchmark mismatch: the size table has no redop column, "
                          "so it is not an all_reduce table (all_gather, alltoall and broadcast have none)",
                          "judge this log as the collective it is, or run all_reduce_perf"))
    else:
        shown = f" (printed as {log.benchmark_printed})" if log.benchmark_printed != name else ""
        if collective is None:
            out.append(_f("benchmark_mismatch", "fail", f"benchmark mismatch: the log ran {name}{shown}, not an "
                          "nccl-tests collective fmcluster knows, so no floor applies",
                          "run one of nccl-tests' <collective>_perf binaries"))
        elif expected and collective != expected:
            out.append(_f("benchmark_mismatch", "fail", f"benchmark mismatch: the log ran {name}{shown}, "
                          f"{expected}_perf was expected", "check the job script and the binary it runs"))
    if collective is None:
        return out, Gate(None)
    floor, source, origin = exp.floor_for(collective, log.ranks)
    if floor is None:
        out.append(_f("bandwidth_not_gated", "warn", f"{collective}'s bandwidth is reported, not gated: {source}",
                      "gate fabric bandwidth with all_reduce_perf"))
    return out, Gate(collective, floor, source, origin)


def _transport(log: ParsedLog, exp: Expectation) -> tuple[list[Finding], bool]:
    """Findings and whether the log positively shows the expected transport."""
    net = log.network
    on_socket = net.network == "Socket" or any(t.startswith("NET/Socket") for t in net.transports)
    if exp.transport == "socket":
        if on_socket:
            return [], True
        return [_f("transport_unconfirmed", "fail", "no INFO line shows the ranks' TCP transport (`Using network "
                   "Socket` or `via NET/Socket`)", "run with NCCL_DEBUG=INFO (the CPU bench always prints it)")], False
    out: list[Finding] = []
    if on_socket or net.plugin_missing:
        if net.plugin_missing:
            cause = ("the aws-ofi-nccl plugin was not loaded (NCCL found no libnccl-net.so and used its "
                     "internal transports)")
            fix = ("put the plugin's lib directory (e.g. /opt/amazon/ofi-nccl/lib) on LD_LIBRARY_PATH in the "
                   "job, or set NCCL_NET_PLUGIN; check the efa role converged on this node")
        else:
            cause = "NCCL chose its Socket transport"
            fix = "unset NCCL_NET/NCCL_IB_DISABLE overrides and check the plugin loads (NCCL_DEBUG=INFO)"
        if log.container_image:
            # the image's NCCL and plugin ran, not the node's: the node's efa role cannot be the cause
            cause += f", running from the image {log.container_image}"
            fix = ("the image's aws-ofi-nccl must load, not the node's: build the image with the plugin where the "
                   "gate looks (fmcluster.containers.NCCL_TESTS_IMAGE_LAYOUT) and its libfabric from an EFA installer "
                   "no older than the host's; the job's `fmcluster acceptance: container check` line names both "
                   "(docs/containers.md, \"Host against image\")")
        severity: Severity = "fail" if exp.transport == "efa" else "warn"
        out.append(_f("socket_fallback", severity, f"the fabric fell back to sockets on an EFA instance: {cause}",
                      fix))
        if exp.transport == "efa":
            return out, False
    if exp.transport == "nvlink":
        if net.nvls or any(t.startswith("P2P") for t in net.intra_transports):
            return out, True
        if net.intra_transports:
            out.append(_f("nvlink_not_used", "fail", f"the ranks of this one node connect through "
                          f"{', '.join(net.intra_transports)}, not NVLink P2P/NVLS",
                          "unset NCCL_P2P_DISABLE / NCCL_P2P_LEVEL, check Fabric Manager runs and "
                          "`nvidia-smi topo -m` shows NV18 links"))
        else:
            out.append(_f("transport_unconfirmed", "fail", "no INFO line shows how the GPUs were connected "
                          "(`Channel ... via P2P/...` or NVLS)", "run with NCCL_DEBUG=INFO (the acceptance job "
                          "scripts set it)"))
        return out, False
    if net.ofi_provider is None:
        out.append(_f("no_efa_selection", "fail", "no `NET/OFI Selected provider is efa` line: EFA use cannot be "
                      "confirmed", "run with NCCL_DEBUG=INFO; if it is set, the plugin did not load"))
        return out, False
    if net.ofi_provider != "efa":
        out.append(_f("provider_not_efa", "fail", f"libfabric selected the '{net.ofi_provider}' provider, not efa",
                      "remove FI_PROVIDER overrides, check the EFA driver (`fi_info -p efa`) and that the "
                      "security group allows all traffic from itself"))
        return out, False
    if net.gdr is False:
        out.append(_f("gdr_off", "warn", "GPUDirect RDMA is off: inter-node channels run without /GDRDMA",
                      "remove stale FI_EFA_USE_DEVICE_RDMA=0 / NCCL_NET_GDR_LEVEL settings; with "
                      "aws-ofi-nccl >= 1.7 no variable is needed"))
    return out, True


def _ranks_off_efa(log: ParsedLog, exp: Expectation) -> list[Finding]:
    """Every rank's own provider and channel lines, not the last line of each kind, must show EFA."""
    if exp.transport != "efa":
        return []
    by_proc = {(r.host, r.pid): r.rank for r in log.rank_map}
    off: list[str] = []
    for proc in log.processes:
        others = [p for p in proc.providers if p != "efa"]
        if others:
            rank = by_proc.get((proc.host, proc.pid))
            who = f"rank {rank}" if rank is not None else f"pid {proc.pid}"
            off.append(f"{who} on {proc.host} selected provider {', '.join(others)}")
        # A process that says it uses another network is off EFA whatever its channel lines claim.
        elsewhere = [n for n in proc.networks if "Libfabric" not in n]
        if elsewhere:
            rank = by_proc.get((proc.host, proc.pid))
            who = f"rank {rank}" if rank is not None else f"pid {proc.pid}"
            off.append(f"{who} on {proc.host} uses network {', '.join(elsewhere)}")
    for rt in log.rank_transports:
        if "Libfabric" not in rt.transport:
            off.append(f"rank {rt.rank} on {rt.host} sends over NET/{rt.transport}")
    on_efa = (any("efa" in p.providers for p in log.processes)
              or any("Libfabric" in rt.transport for rt in log.rank_transports))
    if not off or not on_efa:  # nobody on EFA: the run-level findings (socket_fallback, ...) say it, not a node
        return []
    more = f" and {len(off) - 4} more" if len(off) > 4 else ""
    return [_f("rank_off_efa", "fail", f"not every rank used EFA: {'; '.join(off[:4])}{more}",
               "on the named host: check `fi_info -p efa`, the EFA devices and that the job's environment sets no "
               "FI_PROVIDER/NCCL_NET override; drain the node if its EFA is broken")]


def _topology(log: ParsedLog, exp: Expectation) -> list[Finding]:
    """The rank → host → device map against itself and the catalog."""
    out: list[Finding] = []
    ranks = log.rank_map
    per_device = exp.instance is not None and exp.instance.accelerators_per_node > 0  # CPU ranks share "device 0"
    if ranks:
        seen: dict[tuple[str, str], list[int]] = {}
        for r in ranks:
            if r.device != "?" and per_device:
                seen.setdefault((r.host, r.device), []).append(r.rank)
        dup = [f"ranks {', '.join(map(str, rs))} on {host} device {dev}" for (host, dev), rs in seen.items()
               if len(rs) > 1]
        if dup and log.tables <= 1:  # two runs in one log list every GPU twice; `multiple_tables` says so
            out.append(_f("duplicate_device", "fail", f"two or more ranks on one GPU: {'; '.join(dup[:4])}",
                          "bind one rank per GPU (--gpus-per-task=1 / CUDA_VISIBLE_DEVICES per local rank)"))
        ids = [r.rank for r in ranks]
        total = max(log.ranks or 0, max(ids) + 1)
        missing = sorted(set(range(total)) - set(ids))
        twice = sorted({i for i in ids if ids.count(i) > 1}) if len(ids) <= 4096 else []
        if (missing or twice) and log.tables <= 1:
            words = []
            if missing:
                words.append(f"rank(s) {', '.join(map(str, missing[:8]))}{' ...' if len(missing) > 8 else ''} "
                             f"of 0..{total - 1} not listed")
            if twice:
                words.append(f"rank(s) {', '.join(map(str, twice[:8]))} listed twice")
            out.append(_f("ranks_missing", "fail", f"the rank list is not one rank per number: {'; '.join(words)}",
                          "launch one process per GPU in one job (srun --mpi=pmix or mpirun) and keep one run per "
                          "log"))
        hosts = sorted({r.host for r in ranks})
        if len(hosts) != exp.nodes and log.tables <= 1:
            out.append(_f("host_count", "fail", f"the ranks ran on {len(hosts)} host(s) ({', '.join(hosts[:4])}"
                          f"{', ...' if len(hosts) > 4 else ''}), the run is judged as {exp.nodes} node(s)",
                          "give the node count the job used (--nodes), or check the job's node list"))
        instance = exp.instance
        if instance is not None and instance.accelerator == "cuda":
            generation = _DEVICE_GENERATION.findall(instance.accelerator_model)
            models = {r.model for r in ranks if r.model}
            wrong = sorted({f"{r.model} on {r.host}" for r in ranks if r.model
                            and generation and not any(g.lower() in r.model.lower() for g in generation)})
            if wrong or len(models) > 1:
                what = f"{'; '.join(wrong[:4])}" if wrong else f"ranks report {', '.join(sorted(models)[:4])}"
                out.append(_f("device_model", "fail", f"GPU model ≠ the catalog's {instance.accelerator_model} for "
                              f"{instance.name}: {what}", "check the node's instance type (a different queue or "
                              "a wrong launch template) and `nvidia-smi -L` on it"))
    instance = exp.instance
    if exp.transport == "efa" and instance is not None and instance.efa_interfaces:
        odd = sorted({f"{p.host} found {n}" for p in log.processes for n in p.nics if n != instance.efa_interfaces})
        if odd:
            out.append(_f("nic_count", "fail", f"aws-ofi-nccl found another number of EFA NICs than "
                          f"{instance.name}'s {instance.efa_interfaces}: {'; '.join(odd[:4])}",
                          "check the launch template attaches every EFA interface and `fi_info -p efa -t "
                          "FI_EP_RDM | grep -c domain` on the node"))
    if len(log.nccl_versions) > 1:
        out.append(_f("nccl_version_mixed", "fail", f"the ranks run different NCCL versions: "
                      f"{', '.join(log.nccl_versions[:4])}", "install one NCCL on every node (one image, one "
                      "container); mixed versions hang or corrupt collectives"))
    return out


def _slowness(known: list[Finding]) -> tuple[str, str, bool]:
    """(cause, fix, blames_node) for a low bandwidth, from the configuration findings already made."""
    likely = [f.message for f in known if f.code in _CONFIG_CAUSES]
    if likely:
        return "likely cause: " + "; ".join(likely), "fix the configuration above and rerun", False
    return ("no configuration problem is visible in the log, so a node or link is slow (degraded NIC, link "
            "errors, throttled GPU, a noisy neighbour)",
            "bisect node pairs to find the node (done automatically when drain_on_failure is on)", True)


def _reference_missing(log: ParsedLog, exp: Expectation) -> Finding:
    ref = exp.message_bytes
    sizes = sorted({r.size_bytes for r in log.rows})
    below = [s for s in sizes if s < ref]
    above = [s for s in sizes if s > ref]
    if ref in log.unreadable_sizes:
        what = f"the {human_bytes(ref)} row could not be read (spliced, cut, or a non-numeric cell)"
    elif below and above:
        what = (f"the sizes run skip it ({human_bytes(below[-1])}, then {human_bytes(above[0])})")
    elif above:
        what = f"the smallest size run was {human_bytes(above[0])}"
    else:
        what = f"the largest size run was {human_bytes(below[-1]) if below else 'none'}"
    larger = [r for s in above[:1] if (r := log.row_at(s)) is not None and r.finite]
    seen = (f"; a larger size is not a substitute (the {human_bytes(larger[0].size_bytes)} row shows "
            f"{_num(larger[0].min_busbw_gbps)} GB/s)") if larger else ""
    return _f("reference_size_missing", "fail",
              f"no readable result at the reference size {human_bytes(ref)}: {what}{seen}",
              f"run with -b/-e covering {human_bytes(ref)} (e.g. -b 8 -e 16G -f 2)")


def _bandwidth(log: ParsedLog, exp: Expectation, gate: Gate, known: list[Finding]
               ) -> tuple[list[Finding], float | None, SizeRow | None]:
    out: list[Finding] = []
    row = log.row_at(exp.message_bytes)
    if row is None:
        if log.rows:
            out.append(_reference_missing(log, exp))
        return out, None, None
    if not row.finite:
        return out, None, row  # `non_finite` already says which figure
    busbw = row.min_busbw_gbps
    if gate.floor_gbps is not None and busbw < gate.floor_gbps:
        cause, fix, blames = _slowness(known)
        half = "in-place" if row.in_place.busbw_gbps < row.out_of_place.busbw_gbps else "out-of-place"
        which = "" if gate.collective == "all_reduce" else f" {gate.collective}"
        out.append(_f("below_floor", "fail", f"busbw {busbw:.2f} GB/s ({half}) at {human_bytes(row.size_bytes)} is "
                      f"under the{which} floor of {gate.floor_gbps:g} GB/s; {cause}", fix, blames))
    return out, busbw, row


def _nccl_tests_verdict(log: ParsedLog, known: list[Finding]) -> list[Finding]:
    if log.avg_verdict != "FAILED":
        return []
    cause, fix, blames = _slowness(known)
    return [_f("nccl_tests_failed", "fail", f"nccl-tests' own check failed: `# Avg bus bandwidth : "
               f"{log.avg_busbw_text or '?'} FAILED` (the average is under 90% of NCCL_TESTS_MIN_BW); {cause}",
               fix, blames)]


def _missing_evidence(log: ParsedLog, exp: Expectation, row: SizeRow | None, transport_ok: bool,
                      gate: Gate) -> str | None:
    """Why the pass rule is not met, or None when it is. Independent of the findings above."""
    if not log.completed or log.tables != 1:
        return "no single completed result table"
    if row is None:
        return f"no row at the reference size {human_bytes(exp.message_bytes)}"
    if not row.finite:
        return "the reference row is not finite"
    correct = row_correct(row, gate.collective)
    if correct is False or (correct is None and exp.require_data_check):
        return "the reference row is not shown correct"
    if gate.collective is None:
        return "the benchmark is not a collective with a floor"
    if gate.floor_gbps is not None and not row.min_busbw_gbps >= gate.floor_gbps:
        return "the reference row is under the floor"
    if not transport_ok:
        return f"no evidence of {TRANSPORT_WORDS[exp.transport]}"
    return None


def judge(log: ParsedLog, expectation: Expectation | None, *, not_judged_reason: str = "") -> Verdict:
    """The verdict on `log`. With no expectation, a log fails only on what fails any run; else not judged."""
    if log.tool == "nccom-test":
        return _neuron(log, expectation, not_judged_reason)
    if expectation is not None and expectation.tool == "nccom-test":
        mismatch = _f("benchmark_mismatch", "fail", f"benchmark mismatch: {expectation.instance_type} is a Trainium "
                      "instance, judged on AWS Neuron's nccom-test output; this log is not nccom-test's",
                      "run nccom-test on Neuron queues (the acceptance job does), or give the instance type the log "
                      "ran on")
        findings = _reading(log) + _integrity(log) + _completeness(log) + [mismatch]
        return Verdict("fail", expectation, None, None, tuple(findings), f"not comparable: {expectation.instance_type}"
                       " is judged on nccom-test output")
    findings = (_integrity(log) + _completeness(log) + _test_failures(log) + _shape(log, expectation)
                + _data(log, expectation) + _reading(log))
    if expectation is None:
        findings += _physics(log, None, judged_collective(log, None))
        findings += _nccl_tests_verdict(log, findings)
        failed = any(f.severity == "fail" for f in findings)
        findings.append(_f("not_judged", "warn", "not judged against a floor or a transport: "
                           f"{not_judged_reason or 'no instance type or node count given'}",
                           "give --instance-type (or --org) and, if the log names no hosts, --nodes"))
        return Verdict("fail" if failed else "not_judged", None, None, None, tuple(findings),
                       "not judged: no instance type or node count to compare with")
    exp = expectation
    bench, gate = _benchmark(log, exp)
    transport, transport_ok = _transport(log, exp)
    if log.rows:  # without a table the completeness finding is the cause; more would be noise
        findings += (bench + transport + _ranks_off_efa(log, exp) + _topology(log, exp)
                     + _physics(log, exp, gate.collective))
    findings += _nccl_tests_verdict(log, findings)
    bw, busbw, row = _bandwidth(log, exp, gate, findings)
    findings += bw
    if not any(f.severity == "fail" for f in findings):
        missing = _missing_evidence(log, exp, row, transport_ok, gate)
        if missing:
            findings.append(_f("no_positive_evidence", "fail", f"no positive evidence to pass on: {missing}",
                               "read the findings above; report this log to the fmcluster maintainers"))
    status: Status = "fail" if any(f.severity == "fail" for f in findings) else "pass"
    return Verdict(status, exp, busbw, row.size_bytes if row is not None else None, tuple(findings),
                   baseline_sentence(log, exp, row, gate))


# --- AWS Neuron's nccom-test (fmcluster.acceptance.neuron) -------------------------------------------------------

NCCOM_FIX = ("read the neuron-bench log file nccom-test names (`/tmp/nccom_test_log_*.log`); check the Neuron driver and "
             "devices on every node (`neuron-ls`, `lsmod | grep neuron`), that no other process holds the NeuronCores "
             "(`neuron-top`), and for several instances NEURON_RT_ROOT_COMM_ID and the EFA devices; rerun")


def _neuron(log: ParsedLog, exp: Expectation | None, not_judged_reason: str) -> Verdict:
    """nccom-test output, judged by the same rule as nccl-tests' (pass only on positive evidence): one completed
    table with its command line; no failure line; every row physical (algbw = size/time in the unit nccom-test
    printed, busbw = that x nccom-test's own bus factor for the command's workers); and, against a Neuron instance
    type, the expected operation, workers (NeuronCores x nodes) and nodes, `--check` where data checks are
    required, a finite row at the reference size and all_reduce's busbw at or above the floor."""
    run = log.nccom or NccomRun()
    command = run.command
    findings = _reading(log) + _neuron_completeness(log, run) + _neuron_integrity(log, run)
    if run.garbled_lines:
        findings.append(_f("garbled", "warn", f"{run.garbled_lines} row-shaped line(s) under nccom-test's header could "
                           "not be read and were skipped", "check what wraps the output (a launcher prefix, a pager)"))
    if exp is None:
        findings += _neuron_physics(run, None)
        if command is not None and not command.check and run.rows:
            findings.append(_f("data_unchecked", "warn", "nccom-test ran without --check, so nothing shows the "
                               "results were right", "run nccom-test with --check (the acceptance job does)"))
        failed = any(f.severity == "fail" for f in findings)
        findings.append(_f("neuron_not_judged", "warn", "AWS Neuron nccom-test output: read, not judged against a "
                           f"floor or a rank count: {not_judged_reason or 'no instance type given'}",
                           "give --instance-type (trn1.32xlarge, ...) or --org and, when the log does not show the "
                           "nccom-test command line, --nodes"))
        return Verdict("fail" if failed else "not_judged", None, None, None, tuple(findings),
                       "not judged: nccom-test output without an instance type to compare with")
    if exp.tool != "nccom-test":
        findings.append(_f("benchmark_mismatch", "fail", f"benchmark mismatch: this is AWS Neuron nccom-test output; "
                           f"{exp.instance_type} runs nccl-tests", "judge it against the Trainium instance type it "
                           "ran on (--instance-type trn1.32xlarge, ...)"))
        return Verdict("fail", exp, None, None, tuple(findings), f"not comparable: nccom-test output judged as "
                       f"{exp.instance_type}")
    operation = (command.operation if command is not None else None) or exp.collective or "all_reduce"
    if run.rows:
        findings += _neuron_command(run, exp) + _neuron_physics(run, exp)
    floor, source, origin = exp.floor_for(operation, exp.expected_ranks)
    if floor is None and run.rows:
        findings.append(_f("bandwidth_not_gated", "warn", f"{operation}'s bandwidth is reported, not gated: {source}",
                           "gate Trainium bandwidth with nccom-test all_reduce (`allr`)"))
    row = run.row_at(exp.message_bytes)
    busbw = _nccom_gbps(row)
    if row is None and run.rows:
        findings.append(_neuron_reference_missing(run, exp))
    elif row is not None and busbw is not None and floor is not None and busbw < floor:
        cause, fix, blames = _slowness(findings)
        findings.append(_f("below_floor", "fail", f"busbw {busbw:.2f} GB/s at {human_bytes(row.size_bytes)} is under "
                           f"the floor of {floor:g} GB/s; {cause}", fix, blames))
    if not any(f.severity == "fail" for f in findings):
        missing = _neuron_missing_evidence(log, run, exp, row, floor)
        if missing:
            findings.append(_f("no_positive_evidence", "fail", f"no positive evidence to pass on: {missing}",
                               "echo the nccom-test command in the job (the acceptance job script does) and run the "
                               "reference size with --check"))
    status: Status = "fail" if any(f.severity == "fail" for f in findings) else "pass"
    gate = Gate(operation, floor, source, origin)
    return Verdict(status, exp, busbw, row.size_bytes if row is not None else None, tuple(findings),
                   _neuron_baseline(run, exp, row, gate))


def _nccom_gbps(row: NccomRow | None) -> float | None:
    """A row's busbw in decimal GB/s (the unit of every floor), whatever unit nccom-test printed it in."""
    if row is None or not row.finite:
        return None
    return row.busbw_gbps * neuron.units(row)[0][1] / 1e9


def _neuron_completeness(log: ParsedLog, run: NccomRun) -> list[Finding]:
    if run.failures:
        where = "before printing results" if not run.rows else "(a table printed before it proves nothing)"
        return [_f("nccom_test_failed", "fail", f"nccom-test failed {where}: {run.failures[0]}"
                   + (f" (and {len(run.failures) - 1} more)" if len(run.failures) > 1 else ""), NCCOM_FIX)]
    kills = [e for e in log.errors if "CANCELLED" in e or "Killed" in e or "oom" in e.lower()]
    if not run.rows:
        if log.killed:
            return [_f("killed", "fail", f"the job was killed before nccom-test's first result: "
                       f"{(kills or list(log.errors) or [''])[0]}", "look at the job's time limit and at `sacct -j JOBID`")]
        if log.errors:
            return [_f("run_failed", "fail", f"the job failed before nccom-test printed results: {log.errors[0]}",
                       NCCOM_FIX)]
        if run.unreadable_sizes or run.garbled_lines:
            return [_f("table_unreadable", "fail", f"{run.garbled_lines} row-shaped line(s) under nccom-test's header "
                       f"({' '.join(run.columns)}) but not one readable row", "`fmcluster acceptance parse LOG` shows "
                       "what was read; report the log if it is nccom-test's own output")]
        if run.columns or run.commands:
            return [_f("truncated", "fail", "nccom-test started (its command or header is there) but the log stops "
                       "before the first result: it hung or died while the collectives set up",
                       "rerun; for several instances check NEURON_RT_ROOT_COMM_ID and that every node reaches it")]
        return [_f("no_results", "fail", "the log has no nccom-test size table", "read the job's output and stderr")]
    out: list[Finding] = []
    if run.tables > 1 or len(run.commands) > 1:
        out.append(_f("multiple_tables", "fail", f"{max(run.tables, len(run.commands))} nccom-test runs or result "
                      "tables in one log (several commands, or --streams-json's one table per stream): no single run "
                      "can be judged", "write one nccom-test run per log, one collective per run"))
    if not log.completed:
        largest = human_bytes(max(r.size_bytes for r in run.rows))
        if log.killed:
            out.append(_f("killed", "fail", f"the job was killed mid-run after {largest}: "
                          f"{(kills or list(log.errors) or [''])[0]}", "raise the job's time limit or lower -e"))
        else:
            out.append(_f("truncated", "fail", f"the log stops after {largest} without nccom-test's `Avg bus "
                          "bandwidth:` line (truncated output, or a node died)", "rerun; bisect if it repeats"))
    return out


def _neuron_integrity(log: ParsedLog, run: NccomRun) -> list[Finding]:
    bad = [f"{human_bytes(r.size_bytes)}: " + ", ".join(f"{name} {value}" for name, value in
                                                      (("time", r.time_us), ("algbw", r.algbw_gbps),
                                                       ("busbw", r.busbw_gbps)) if not math.isfinite(value))
           for r in run.rows if not r.finite]
    if log.avg_busbw_text is not None and (log.avg_busbw_gbps is None or not math.isfinite(log.avg_busbw_gbps)):
        bad.append(f"the footer's average '{log.avg_busbw_text}'")
    if not bad:
        return []
    return [_f("non_finite", "fail", f"nccom-test printed figures that are not finite numbers: {'; '.join(bad[:4])}",
               NCCOM_FIX)]


def _neuron_command(run: NccomRun, exp: Expectation) -> list[Finding]:
    """The command line against the expectation: operation, workers, nodes, whole-run groups, --check."""
    command = run.command
    if command is None:
        return [_f("rank_count_unknown", "warn", "the log does not show the nccom-test command line, and nccom-test "
                   "prints no rank list: the operation, workers, nodes and --check are not shown",
                   "echo the command in the job script (`set -x`, or the acceptance job's "
                   "`# fmcluster acceptance job: nccom-test ...` line)")] + (
            [_f("data_unchecked", "fail" if exp.require_data_check else "warn", "nothing shows nccom-test ran with "
                "--check (its command line is not in the log)", "run nccom-test with --check and echo the command")])
    out: list[Finding] = []
    expected = exp.collective
    if expected and command.operation is not None and command.operation != expected:
        out.append(_f("benchmark_mismatch", "fail", f"benchmark mismatch: nccom-test ran {command.operation}, "
                      f"{expected} was expected", "check the job script's nccom-test operation"))
    if command.replica_groups:
        out.append(_f("benchmark_mismatch", "fail", "nccom-test ran its collectives over sub-groups "
                      "(--data-parallel-dimension, --custom-replica-groups or --streams-json), not over every worker "
                      "the floor is defined for", "run the whole-cluster collective without replica groups"))
    if command.ranks is None:
        out.append(_f("rank_count_unknown", "warn", f"the nccom-test command line does not give a number of workers "
                      f"(`{command.text[:120]}`)", "echo the expanded command (`set -x`)"))
    elif exp.expected_ranks and command.ranks != exp.expected_ranks:
        per = exp.expected_ranks // max(exp.nodes, 1)
        out.append(_f("rank_count", "fail", f"nccom-test ran {command.ranks} workers (-r), {exp.expected_ranks} "
                      f"expected: {exp.nodes} node(s) of {exp.instance_type} with {per} NeuronCores each",
                      "run one worker per NeuronCore (`-r` = NeuronCores per instance x instances); check `neuron-ls` "
                      "shows every device on every node"))
    if command.nodes is None or command.nodes != exp.nodes:
        out.append(_f("host_count", "fail", f"nccom-test ran on {command.nodes if command.nodes else 'an unknown number of'}"
                      f" node(s) (-N), the run is judged as {exp.nodes}", "give the node count the job used "
                      "(--nodes), or check the job's -N and --hosts"))
    if not command.check:
        required = exp.require_data_check
        out.append(_f("data_unchecked", "fail" if required else "warn", "nccom-test ran without --check, so nothing "
                      f"shows the results were right{'; this gate requires checked data' if required else ''}",
                      "run nccom-test with --check (the acceptance job does)"))
    return out


def _neuron_physics(run: NccomRun, exp: Expectation | None) -> list[Finding]:
    """algbw = size/time (in GiB/s or GB/s: nccom-test has printed both), busbw = that x nccom-test's bus factor for
    the command's workers (else the expected ones), and, across instances, all_reduce under the EFA ceiling."""
    command = run.command
    operation = (command.operation if command else None) or (exp.collective if exp else None)
    ranks = (command.ranks if command else None) or (exp.expected_ranks if exp else None)
    factor = None if command is not None and command.replica_groups else neuron.bus_factor(operation, ranks)
    ceiling = None
    if exp is not None and exp.instance is not None and operation == "all_reduce" and ranks:
        ceiling = ceiling_gbps(exp.instance, "all_reduce", exp.nodes, ranks)
    bad: list[str] = []
    for row in run.rows:
        if not row.finite:
            continue
        where = f"{human_bytes(row.size_bytes)} (line {row.line_no})"
        if row.time_us <= 0:
            bad.append(f"{where}: time {row.time_us:g} µs is not positive")
            continue
        relative = PHYSICS_TOLERANCE + row.time_resolution_us / row.time_us
        (unit, scale), (other, other_scale) = neuron.units(row)
        algbw = row.size_bytes / (row.time_us * 1e-6) / scale
        problems = []
        if not _close(row.algbw_gbps, algbw, relative):
            problems.append(f"algbw {row.algbw_gbps:g} but size/time is {algbw:.4g} {unit} "
                            f"({row.size_bytes / (row.time_us * 1e-6) / other_scale:.4g} {other})")
        elif factor is not None and not _close(row.busbw_gbps, algbw * factor, relative):
            problems.append(f"busbw {row.busbw_gbps:g} but size/time x {factor:.4g} is {algbw * factor:.4g} {unit}")
        if ceiling is not None and row.busbw_gbps * scale / 1e9 > ceiling[0] * (1 + CEILING_TOLERANCE):
            problems.append(f"busbw {row.busbw_gbps * scale / 1e9:.2f} GB/s is above the physical ceiling "
                            f"{ceiling[0]:.1f} GB/s ({ceiling[1]})")
        if problems:
            bad.append(f"{where}: {'; '.join(problems)}")
    if not bad:
        return []
    more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
    return [_f("non_physical", "fail", f"{len(bad)} nccom-test row(s) cannot be a real measurement: "
               f"{' | '.join(bad[:3])}{more}", "rerun; figures edited or post-processed by a script are not evidence")]


def _neuron_reference_missing(run: NccomRun, exp: Expectation) -> Finding:
    ref = exp.message_bytes
    sizes = sorted({r.size_bytes for r in run.rows})
    if ref in run.unreadable_sizes:
        what = f"the {human_bytes(ref)} row could not be read"
    elif sizes and sizes[-1] < ref:
        what = f"the largest size run was {human_bytes(sizes[-1])}"
    else:
        what = f"the sizes run skip it ({', '.join(human_bytes(s) for s in sizes[:3])}, ...)"
    return _f("reference_size_missing", "fail", f"no readable nccom-test result at the reference size "
              f"{human_bytes(ref)}: {what}", f"run nccom-test with -b/-e covering {human_bytes(ref)} (e.g. -b 8 -e 1G -f 2)")


def _neuron_missing_evidence(log: ParsedLog, run: NccomRun, exp: Expectation, row: NccomRow | None,
                             floor: float | None) -> str | None:
    """Why the pass rule is not met, or None when it is. Independent of the findings above."""
    command = run.command
    if not log.completed or run.tables != 1 or len(run.commands) > 1 or run.failures:
        return "no single completed nccom-test table"
    if command is None:
        return "the nccom-test command line (operation, workers, nodes, --check) is not in the log"
    if command.ranks != exp.expected_ranks or command.nodes != exp.nodes:
        return "the command line does not show the expected workers and nodes"
    if exp.require_data_check and not command.check:
        return "nccom-test did not run with --check"
    if row is None or not row.finite:
        return f"no finite row at the reference size {human_bytes(exp.message_bytes)}"
    busbw = _nccom_gbps(row)
    if floor is not None and not (busbw is not None and busbw >= floor):
        return "the reference row is under the floor"
    return None


def _neuron_baseline(run: NccomRun, exp: Expectation, row: NccomRow | None, gate: Gate) -> str:
    size = human_bytes(exp.message_bytes)
    klass = "1 instance: NeuronLink only" if exp.nodes <= 1 else "2+ instances: crosses EFA"
    head = (f"{exp.instance_type} x{exp.nodes} node{'s' if exp.nodes > 1 else ''} ({klass}), nccom-test "
            f"{gate.collective} busbw at {size}")
    if row is None:
        measured = f"no result at {size}"
    elif not row.finite:
        measured = f"no finite result at {size}"
    else:
        unit = neuron.units(row)[0][0]
        measured = f"measured {_nccom_gbps(row):.2f} GB/s (nccom-test printed {row.busbw_gbps:g} {unit})"
    if gate.floor_gbps is None:
        floor = f"not gated ({gate.floor_source})"
    elif gate.floor_from == "tenant override":
        floor = f"floor {gate.floor_gbps:g} GB/s (tenant override; the catalog's is {exp.catalog_floor_gbps:g})"
    else:
        floor = f"floor {gate.floor_gbps:g} GB/s (catalog: {gate.floor_source})"
    same = next((f for f in exp.public if f.message_bytes == exp.message_bytes), None)
    busbw = _nccom_gbps(row)
    if same is not None and gate.collective == "all_reduce":
        share = f": this run is at {100 * busbw / same.gbps:.0f}% of it" if busbw is not None else ""
        public = (f"healthy clusters show ~{same.gbps:g} GB/s at {size} on {same.nodes} node(s) ({same.source})"
                  f"{share}")
    else:
        public = "no public nccom-test figure for this instance type, node class and size"
    return f"{head}: {measured}; {floor}; {public}"


def _reading(log: ParsedLog) -> list[Finding]:
    if not log.bytes_capped:
        return []
    bound = log.capped_by or "4 GiB of text"
    return [_f("log_capped", "fail", f"the log is larger than the parser reads ({bound}); the rest was not read, so "
               "failures in it could not be seen", "write one run per log; send verbose output elsewhere")]


def judge_file(path: Path, expectation: Expectation | None) -> tuple[ParsedLog, Verdict]:
    """parse_file + judge. A missing or unreadable file is a log with nothing in it: it fails, never passes."""
    try:
        log = parse_file(path)
    except OSError as err:
        log = ParsedLog(source=str(path), errors=(f"the job's output cannot be read: {err.strerror or err}",))
    return log, judge(log, expectation)


def baseline_sentence(log: ParsedLog, exp: Expectation, row: SizeRow | None, gate: Gate | None = None) -> str:
    """Measured figure, floor and where it comes from, public figure of the same node class and size."""
    gate = gate or Gate("all_reduce", exp.min_busbw_gbps, exp.floor_source, exp.floor_from)
    size = human_bytes(exp.message_bytes)
    bench = f"{gate.collective or log.benchmark or '?'} busbw"
    head = (f"{exp.instance_type} x{exp.nodes} node{'s' if exp.nodes > 1 else ''} "
            f"({NODE_CLASS_WORDS[exp.node_class]}), {bench} at {size}")
    if row is None:
        measured = f"no result at {size}"
    elif not row.finite:
        measured = f"no finite result at {size} ({_num(row.out_of_place.busbw_gbps)}/{_num(row.in_place.busbw_gbps)})"
    else:
        o, i = row.out_of_place.busbw_gbps, row.in_place.busbw_gbps
        measured = f"measured {row.min_busbw_gbps:.2f} GB/s (out-of-place {o:.2f}, in-place {i:.2f})"
    if gate.floor_gbps is None:
        floor = f"not gated ({gate.floor_source})" if gate.collective else "no floor (an unknown benchmark)"
    elif gate.floor_from == "catalog":
        floor = f"floor {gate.floor_gbps:g} GB/s (catalog: {gate.floor_source})"
    elif gate.floor_from == "derived":
        floor = f"floor {gate.floor_gbps:g} GB/s ({gate.floor_source})"
    elif gate.floor_from == "published":
        floor = f"floor {gate.floor_gbps:g} GB/s (published: {gate.floor_source})"
    else:
        floor = f"floor {gate.floor_gbps:g} GB/s (tenant override; the catalog's is {exp.catalog_floor_gbps:g})"
    return f"{head}: {measured}; {floor}; {_public_words(log, exp, row, gate.collective == 'all_reduce')}"


def _public_words(log: ParsedLog, exp: Expectation, row: SizeRow | None, gated: bool) -> str:
    if not gated:
        return "no public figure compared (the public figures are all_reduce figures)"
    nodes_note = ""
    same = next((f for f in exp.public if f.message_bytes == exp.message_bytes), None)
    if same is not None:
        if same.nodes != exp.nodes:
            nodes_note = f" (a {same.nodes}-node figure; this run has {exp.nodes})"
        share = (f": this run is at {100 * row.min_busbw_gbps / same.gbps:.0f}% of it"
                 if row is not None and row.finite else "")
        return (f"healthy clusters show ~{same.gbps:g} GB/s at {human_bytes(exp.message_bytes)} on {same.nodes} "
                f"node(s){nodes_note} ({same.source}){share}")
    parts = []
    for fig in exp.public:
        if fig.message_bytes is None:
            finite = [r for r in log.rows if r.finite]
            best = max(finite, key=lambda r: r.min_busbw_gbps) if finite else None
            mine = (f"; this run's best is {best.min_busbw_gbps:.2f} GB/s at {human_bytes(best.size_bytes)}"
                    if best else "")
            parts.append(f"~{fig.gbps:g} GB/s peak at large sizes on {fig.nodes} node(s) ({fig.source}){mine}")
            continue
        at = log.row_at(fig.message_bytes)
        mine = (f"; this run shows {at.min_busbw_gbps:.2f} GB/s there ({100 * at.min_busbw_gbps / fig.gbps:.0f}%)"
                if at is not None and at.finite else "")
        parts.append(f"~{fig.gbps:g} GB/s at {human_bytes(fig.message_bytes)} on {fig.nodes} node(s) ({fig.source})"
                     f"{mine}")
    if not parts:
        return "no public figure for this instance type and node class"
    return f"no public figure at {human_bytes(exp.message_bytes)}; healthy clusters show " + "; ".join(parts)


def render(v: Verdict, log: ParsedLog | None = None) -> str:
    word = {"pass": "PASS", "fail": "FAIL", "not_judged": "NOT JUDGED"}[v.status]
    lines = [f"verdict: {word} — {v.cause}"]
    if log is not None:
        net = log.network
        lines.append(f"  benchmark {log.benchmark or '?'}, {log.library or 'library version unknown'}, "
                     f"{log.ranks or '?'} ranks on {len(log.hosts) or '?'} host(s), {len(log.rows)} sizes")
        lines.append(f"  network {net.network or '?'}, provider {net.ofi_provider or '-'}"
                     f"{f' ({net.ofi_nics} nics)' if net.ofi_nics else ''}, GDR "
                     f"{'on' if net.gdr else 'off' if net.gdr is False else '-'}, channels {net.channels or '?'}, "
                     f"rings {len(net.rings)}")
    if v.expectation is not None and v.expectation.basis:
        lines.append(f"  judged as: {v.expectation.basis}")
    lines.append(f"  baseline: {v.baseline}")
    for f in v.findings:
        lines.append(f"  [{f.severity}] {f.code}: {f.message}")
        lines.append(f"         fix: {f.fix}")
    return "\n".join(lines)
