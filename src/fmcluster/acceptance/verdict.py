"""Judge a parsed log against the catalog: pass/fail, every finding with its likely cause and fix, and the
baseline that answers "is my bandwidth right?".

Thresholds come from one place: the instance catalog (`InstanceType.acceptance`: floor by node count,
reference message size, the public expected figure and its source), overridable per tenant
(`tenant.acceptance.min_busbw_gbps`). Floors apply to all_reduce; other collectives are reported, not gated.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

from fmcluster.acceptance.model import ParsedLog
from fmcluster.catalog import InstanceType

Severity = Literal["fail", "warn"]
GATED_BENCHMARKS = ("all_reduce_perf", None)
MAX_ERROR = 1e-3
_BAD_IFACE = re.compile(r"Unable to find address for|no socket interface found|No usable listening interface")  # old nccl-tests printed a max error instead of #wrong; above this the data are wrong


@dataclass(frozen=True)
class Thresholds:
    instance_type: str
    nodes: int
    message_bytes: int
    min_busbw_gbps: float
    expected_busbw_gbps: float
    floor_from: str
    """"catalog" or "tenant override"."""
    source: str
    expect_efa: bool
    expect_gdr: bool
    expected_ranks: int | None


def thresholds_for(instance: InstanceType, nodes: int, override_gbps: float | None = None,
                   ranks_per_node: int | None = None) -> Thresholds:
    """The floor for `nodes` nodes of `instance`; a tenant override replaces the catalog's floor."""
    acc = instance.acceptance
    per_node = ranks_per_node if ranks_per_node is not None else (instance.accelerators_per_node or None)
    return Thresholds(
        instance_type=instance.name,
        nodes=nodes,
        message_bytes=acc.message_bytes,
        min_busbw_gbps=override_gbps if override_gbps is not None else acc.min_busbw_gbps(nodes),
        expected_busbw_gbps=acc.expected_busbw_gbps,
        floor_from="tenant override" if override_gbps is not None else "catalog",
        source=acc.source,
        expect_efa=instance.has_efa and instance.accelerator == "cuda",
        expect_gdr=instance.has_efa and instance.accelerator == "cuda",
        expected_ranks=per_node * nodes if per_node else None,
    )


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    message: str
    fix: str


@dataclass(frozen=True)
class Verdict:
    passed: bool
    thresholds: Thresholds
    busbw_gbps: float | None
    measured_at_bytes: int | None
    findings: tuple[Finding, ...]
    baseline: str
    """One sentence: floor, expected figure and its source, what was measured."""

    @property
    def failures(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "fail")

    @property
    def cause(self) -> str:
        """The first failure's message, or 'passed'."""
        return self.failures[0].message if self.failures else "passed"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cause"] = self.cause
        return data


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def _completeness(log: ParsedLog) -> list[Finding]:
    kills = [e for e in log.errors if "CANCELLED" in e or "Killed" in e or "oom" in e.lower()]
    tail = (kills or list(log.errors) or [""])[0]
    if not log.rows:
        if log.killed:
            return [Finding("killed", "fail", f"the job was killed before the first result: {tail}",
                            "look at the job's time limit and at `sacct -j JOBID -o JobID,State,ExitCode`")]
        warn = next((w for w in log.network.warnings if "NET/OFI" in w), None)
        if warn:
            return [Finding("plugin_init_failed", "fail", f"aws-ofi-nccl failed to initialise: {warn}",
                            "check the EFA devices (`fi_info -p efa`), the EFA installer version and that the "
                            "security group allows all traffic from itself")]
        iface = next((e for e in log.errors + log.network.warnings if _BAD_IFACE.search(e)), None)
        if iface:
            return [Finding("bad_socket_interface", "fail",
                            f"the socket interface setting names an interface the node lacks: {iface}",
                            "fix NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME / FMC_BENCH_SOCKET_IFNAME (or unset it "
                            "to let the library choose)")]
        if log.errors:
            return [Finding("run_failed", "fail", f"the benchmark failed before printing results: {tail}",
                            "rerun with NCCL_DEBUG=INFO and read the first WARN line of the failing rank")]
        return [Finding("no_results", "fail", "the log has no size table (the benchmark never started, or "
                        "this is not an nccl-tests log)", "read the job's stderr; check the sbatch script ran")]
    if log.completed:
        return []
    reached = human_bytes(log.max_size_bytes or 0)
    if log.killed:
        return [Finding("killed", "fail", f"the job was killed mid-run after {reached}: {tail}",
                        "raise the job's time limit or lower -e; a hang at one size often means one slow node")]
    return [Finding("truncated", "fail", f"the log stops after {reached} without the '# Avg bus bandwidth' line "
                    "(truncated output, or a node died)", "rerun; if it stops again at the same place, bisect")]


def _shape(log: ParsedLog, th: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    if log.tables > 1:
        out.append(Finding("ranks_not_wired", "fail",
                           f"{log.tables} separate result tables with {log.ranks or 1} rank(s) each: the ranks "
                           "ran as independent 1-rank jobs", "launch with `srun --mpi=pmix` (or mpirun) and "
                           "build nccl-tests with MPI=1"))
    elif th.expected_ranks and log.ranks and log.ranks != th.expected_ranks:
        out.append(Finding("rank_count", "fail",
                           f"{log.ranks} ranks took part, {th.expected_ranks} expected "
                           f"({th.nodes} nodes of {th.instance_type})",
                           "check --ntasks-per-node/--gpus-per-node and that every GPU is visible (nvidia-smi)"))
    if log.garbled_lines:
        out.append(Finding("garbled", "warn", f"{log.garbled_lines} line(s) could not be read (spliced by "
                           "concurrently writing ranks, or cut off) and were skipped", "harmless; run with `srun -l` to label lines"))
    return out


def _data(log: ParsedLog) -> list[Finding]:
    bad = [r for r in log.rows if r.wrong > 0 or any(
        m.max_error is not None and m.max_error > MAX_ERROR for m in (r.out_of_place, r.in_place))]
    if not bad and not log.out_of_bounds:
        return []
    sizes = ", ".join(human_bytes(r.size_bytes) for r in bad[:4]) or "see the out-of-bounds line"
    return [Finding("wrong_data", "fail",
                    f"results were wrong at {len(bad)} size(s) ({sizes}; {log.wrong} wrong elements, "
                    f"{log.out_of_bounds or 0} out-of-bounds values)",
                    "a faulty GPU, NVLink or NIC corrupts data: bisect the nodes, run `dcgmi diag -r 3` and "
                    "read the XID errors on the drained node")]


def _fabric(log: ParsedLog, th: Thresholds) -> list[Finding]:
    net = log.network
    if not th.expect_efa:
        return []
    multi = th.nodes > 1
    severity: Severity = "fail" if multi else "warn"
    out: list[Finding] = []
    on_socket = net.network == "Socket" or any(t.startswith("NET/Socket") for t in net.transports)
    if on_socket or net.plugin_missing:
        if net.plugin_missing:
            cause = ("the aws-ofi-nccl plugin was not loaded (NCCL found no libnccl-net.so and used its "
                     "internal transports)")
            fix = ("put the plugin's lib directory (e.g. /opt/amazon/ofi-nccl/lib) on LD_LIBRARY_PATH in the "
                   "job, or set NCCL_NET_PLUGIN; check the efa role converged on this node")
        else:
            cause = "NCCL chose its Socket transport"
            fix = "unset NCCL_NET/NCCL_IB_DISABLE overrides and check the plugin loads (NCCL_DEBUG=INFO)"
        out.append(Finding("socket_fallback", severity, f"the fabric fell back to sockets on an EFA instance: "
                           f"{cause}", fix))
        return out
    if net.ofi_provider is None:
        out.append(Finding("no_efa_selection", severity,
                           "no `NET/OFI Selected provider is efa` line: EFA use cannot be confirmed",
                           "run with NCCL_DEBUG=INFO; if it is set, the plugin did not load"))
    elif net.ofi_provider != "efa":
        out.append(Finding("provider_not_efa", severity,
                           f"libfabric selected the '{net.ofi_provider}' provider, not efa",
                           "remove FI_PROVIDER overrides, check the EFA driver (`fi_info -p efa`) and that the "
                           "security group allows all traffic from itself"))
    if th.expect_gdr and net.gdr is False:
        out.append(Finding("gdr_off", "warn",
                           "GPUDirect RDMA is off: inter-node channels run without /GDRDMA",
                           "remove stale FI_EFA_USE_DEVICE_RDMA=0 / NCCL_NET_GDR_LEVEL settings; with "
                           "aws-ofi-nccl >= 1.7 no variable is needed"))
    return out


def _bandwidth(log: ParsedLog, th: Thresholds, known: list[Finding]) -> tuple[list[Finding], float | None, int | None]:
    if not log.rows or log.benchmark not in GATED_BENCHMARKS:
        return [], None, None
    row = log.row_at(th.message_bytes)
    if row is None:
        return [Finding("floor_size_not_reached", "fail",
                        f"no result at or below {human_bytes(th.message_bytes)} to compare with the floor",
                        "run with -e at least the catalog's message size")], None, None
    busbw = row.out_of_place.busbw_gbps
    out: list[Finding] = []
    if row.size_bytes != th.message_bytes:
        # a smaller message never reaches peak bandwidth: report it, but do not gate on it
        if log.completed:
            out.append(Finding("reference_size_not_run", "warn",
                               f"the largest size run was {human_bytes(row.size_bytes)}; the floor is defined "
                               f"at {human_bytes(th.message_bytes)}, so bandwidth was not gated",
                               "run with -e covering the reference size"))
        return out, busbw, row.size_bytes
    if busbw < th.min_busbw_gbps:
        likely = [f.message for f in known if f.code in ("socket_fallback", "provider_not_efa", "gdr_off",
                                                          "no_efa_selection", "rank_count")]
        if likely:
            cause = "likely cause: " + "; ".join(likely)
            fix = "fix the configuration above and rerun"
        else:
            cause = ("no configuration problem is visible in the log, so a node or link is slow "
                     "(degraded NIC, link errors, throttled GPU, a noisy neighbour)")
            fix = "bisect node pairs to find the node (done automatically when drain_on_failure is on)"
        out.append(Finding("below_floor", "fail",
                           f"busbw {busbw:.2f} GB/s at {human_bytes(row.size_bytes)} is under the floor of "
                           f"{th.min_busbw_gbps:g} GB/s; {cause}", fix))
    return out, busbw, row.size_bytes


def judge(log: ParsedLog, th: Thresholds) -> Verdict:
    findings = _completeness(log)
    findings += _shape(log, th)
    findings += _data(log)
    findings += _fabric(log, th)
    bw_findings, busbw, at = _bandwidth(log, th, findings)
    findings += bw_findings
    if busbw is not None and th.expected_busbw_gbps:
        share = f" = {100 * busbw / th.expected_busbw_gbps:.0f}% of what healthy clusters show"
        measured = f"measured {busbw:.2f} GB/s at {human_bytes(at or 0)}{share}"
    else:
        measured = "no busbw measured at the reference size"
    baseline = (f"{th.instance_type} x{th.nodes}: floor {th.min_busbw_gbps:g} GB/s all_reduce busbw at "
                f"{human_bytes(th.message_bytes)} ({th.floor_from}); expected ~{th.expected_busbw_gbps:g} GB/s "
                f"({th.source}); {measured}")
    # gdr_off becomes a failure only as the explanation of a bandwidth failure, never on its own
    return Verdict(
        passed=not any(f.severity == "fail" for f in findings),
        thresholds=th,
        busbw_gbps=busbw,
        measured_at_bytes=at,
        findings=tuple(findings),
        baseline=baseline,
    )


def render(v: Verdict, log: ParsedLog | None = None) -> str:
    lines = [f"verdict: {'PASS' if v.passed else 'FAIL'} — {v.cause}"]
    if log is not None:
        net = log.network
        lines.append(f"  benchmark {log.benchmark or '?'}, {log.library or 'library version unknown'}, "
                     f"{log.ranks or '?'} ranks on {len(log.hosts) or '?'} host(s), {len(log.rows)} sizes")
        lines.append(f"  network {net.network or '?'}, provider {net.ofi_provider or '-'}"
                     f"{f' ({net.ofi_nics} nics)' if net.ofi_nics else ''}, GDR "
                     f"{'on' if net.gdr else 'off' if net.gdr is False else '-'}, channels {net.channels or '?'}, "
                     f"rings {len(net.rings)}")
    lines.append(f"  baseline: {v.baseline}")
    for f in v.findings:
        lines.append(f"  [{f.severity}] {f.code}: {f.message}")
        lines.append(f"         fix: {f.fix}")
    return "\n".join(lines)
