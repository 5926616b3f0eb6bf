"""What an nccl-tests (or fmcluster CPU bench) log says, as typed, immutable values.

The parser fills these; the verdict reads them; results.py and the CLI write them as JSON. Nothing here
parses or judges: it is the vocabulary shared by those modules, plus `json_safe`, which turns any of
them into strict JSON (non-finite floats become null and are listed, never emitted as bare NaN).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

CheckKind = Literal["count", "max_error", "unchecked", "unreadable"]
"""How a row's check column reads: a `#wrong` count, an old max-error figure, `N/A` (-c 0), or garbage."""

MAX_ERROR = 1e-3
"""nccl-tests < 2.10 printed the largest relative error instead of `#wrong`; above this the data are wrong."""


@dataclass(frozen=True)
class Measurement:
    """One half of a size row: the out-of-place or the in-place run."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None
    """Elements that failed the check (`#wrong`); None unless `check` is "count"."""
    max_error: float | None = None
    """Old nccl-tests (< 2.10) printed a max error instead of `#wrong`."""
    check: CheckKind = "count"
    wrong_rounded: bool = False
    """`#wrong` was printed in %g form (`1.04858e+06`): the count is rounded to 6 significant digits."""

    @property
    def finite(self) -> bool:
        return all(math.isfinite(x) for x in (self.time_us, self.algbw_gbps, self.busbw_gbps))

    @property
    def correct(self) -> bool | None:
        """True when checked and right, False when wrong or unreadable, None when not checked."""
        if self.check == "count":
            return self.wrong == 0
        if self.check == "max_error":
            return self.max_error is not None and math.isfinite(self.max_error) and self.max_error <= MAX_ERROR
        if self.check == "unchecked":
            return None
        return False


@dataclass(frozen=True)
class SizeRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    """None for tables without a `redop` column (old all_gather/alltoall/broadcast layouts)."""
    root: int | None
    """-1 for collectives without a root; None in layouts that have no `root` column."""
    out_of_place: Measurement
    in_place: Measurement
    line_no: int = 0

    @property
    def halves(self) -> tuple[Measurement, Measurement]:
        return self.out_of_place, self.in_place

    @property
    def wrong(self) -> int:
        return sum(m.wrong or 0 for m in self.halves)

    @property
    def finite(self) -> bool:
        return all(m.finite for m in self.halves)

    @property
    def correct(self) -> bool | None:
        """False if either half is wrong or unreadable; None if either was not checked; else True."""
        states = [m.correct for m in self.halves]
        if False in states:
            return False
        if None in states:
            return None
        return True

    @property
    def min_busbw_gbps(self) -> float:
        """The lower of the two halves' busbw (NaN when either is not a number)."""
        o, i = self.out_of_place.busbw_gbps, self.in_place.busbw_gbps
        return o if math.isnan(o) or o <= i else i

    def badness(self) -> tuple[int, int, float]:
        """Sort key: higher is worse (non-finite, then wrong, then slower). Duplicates keep the worst."""
        slow = self.min_busbw_gbps
        return (0 if self.finite else 1, 0 if self.correct is not False else 1, -slow if math.isfinite(slow) else 0.0)


@dataclass(frozen=True)
class NetworkInfo:
    """Which transport the collective library chose, from its INFO lines."""

    network: str | None = None
    """From `Using network X` (Libfabric, AWS Libfabric, IB, Socket) or, lacking it, the channel transports."""
    ofi_provider: str | None = None
    """From `NET/OFI Selected provider is efa` (aws-ofi-nccl); None when the plugin printed no selection."""
    ofi_plugin_version: str | None = None
    ofi_nics: int | None = None
    platform: str | None = None
    """The instance type aws-ofi-nccl says it runs on (`NET/OFI Running on p5.48xlarge platform`)."""
    plugin_missing: bool = False
    """NCCL said it found no net plugin (libnccl-net.so) and uses its internal transports."""
    socket_interfaces: tuple[str, ...] = ()
    """Interfaces named by `NET/Socket : Using [0]eth0:10.0.0.1<0>` (bootstrap or data)."""
    transports: tuple[str, ...] = ()
    """Distinct inter-node transports of channel connections, e.g. `NET/Libfabric/0/GDRDMA`, `NET/Socket/0`."""
    intra_transports: tuple[str, ...] = ()
    """Distinct intra-node transports of channel connections, e.g. `P2P/CUMEM/read`, `SHM/direct/direct`."""
    nvls: bool = False
    """NCCL connected NVLink SHARP (`Connected NVLS`, `via NVLS`)."""
    gdr: bool | None = None
    """GPUDirect RDMA on inter-node channels: True if any `/GDRDMA`, False if NET channels without it."""
    channels: int | None = None
    """Channels per communicator, from `Channel 00/32 :` ring lines or `N coll channels`."""
    rings: tuple[tuple[int, ...], ...] = ()
    """Each ring's rank order, from rank 0's `Channel NN/MM : 0 1 2 ...` lines."""
    trees: int = 0
    warnings: tuple[str, ...] = ()
    """`NCCL WARN` lines, deduplicated, first 20."""


@dataclass(frozen=True)
class RankDevice:
    """One `# Rank N Group G Pid P on HOST device D [BUS] MODEL` line: where a rank ran."""

    rank: int
    host: str
    pid: int
    device: str
    model: str


@dataclass(frozen=True)
class ProcessNet:
    """What one process's aws-ofi-nccl said: every provider it selected and the NICs it found; and every network
    NCCL said that process uses (`Using network AWS Libfabric`, `Using network Socket`)."""

    host: str
    pid: int
    providers: tuple[str, ...]
    nics: tuple[int, ...]
    networks: tuple[str, ...] = ()


@dataclass(frozen=True)
class RankTransport:
    """An inter-node transport one rank's channels used (`Channel 00/0 : 7[7] -> 8[0] [send] via NET/...`)."""

    rank: int
    host: str
    transport: str
    """The NET transport's name: `Libfabric`, `Socket`, `IB`, ..."""


@dataclass(frozen=True)
class NccomRow:
    """One size row of AWS Neuron's nccom-test: `size(B) count(elems) type time(us) algbw(GB/s) busbw(GB/s)`.

    One half only (nccom-test has no in-place run). The figures are as printed: nccom-test releases of 2023 printed
    GiB/s (its user guide says so: 33554432 B in 768 us is 40.69), later ones decimal GB/s (536870912 B in
    9689.51 us is 55.41); the verdict tells the unit from the row's own size and time."""

    size_bytes: int
    count: int
    dtype: str
    time_us: float
    """The `time(us)` cell, or `time:avg(us)` when the table has several time statistics (`--stats`)."""
    algbw_gbps: float
    busbw_gbps: float
    time_resolution_us: float = 0.5
    """Half the last printed digit of the time cell (`768` 0.5, `312.4` 0.05, `63.52` 0.005)."""
    algorithm: str | None = None
    line_no: int = 0

    @property
    def finite(self) -> bool:
        return all(math.isfinite(x) for x in (self.time_us, self.algbw_gbps, self.busbw_gbps))


@dataclass(frozen=True)
class NccomCommand:
    """The `nccom-test ...` command line as the log shows it (a job script's echo, `set -x`, a pasted prompt)."""

    text: str
    operation: str | None
    """The collective, canonical: all_reduce, all_gather, reduce_scatter, sendrecv, alltoall, alltoallv, permute,
    all_gatherv (from `allr`, `allg`, `redsct`, ... as nccom-test accepts them); None when none is named."""
    ranks: int | None
    """`-r/--nworkers`: workers (NeuronCores) over all nodes; None when absent or not a number (`$NWORKERS`)."""
    nodes: int | None
    """`-N/--nnodes`, 1 (nccom-test's default) when the option is absent; None when not a number."""
    check: bool
    """`-c/--check` given: nccom-test verifies every result and fails the test on a wrong one."""
    datatype: str | None = None
    hosts: tuple[str, ...] = ()
    replica_groups: bool = False
    """`--data-parallel-dimension` / `--custom-replica-groups` / `--streams-json`: collectives over sub-groups, whose
    bus factor is not the whole run's."""
    line_no: int = 0


@dataclass(frozen=True)
class NccomRun:
    """What a log of AWS Neuron's nccom-test shows (ParsedLog.nccom); its footer is ParsedLog's `avg_busbw_*`."""

    commands: tuple[NccomCommand, ...] = ()
    columns: tuple[str, ...] = ()
    time_column: str = ""
    rows: tuple[NccomRow, ...] = ()
    tables: int = 0
    unreadable_sizes: tuple[int, ...] = ()
    garbled_lines: int = 0
    duplicate_rows: int = 0
    failures: tuple[str, ...] = ()
    """nccom-test's own failure lines: `Failure running neuron-bench - log file ...`, `1 errors found - test
    failed`, `Neuron DKMS Driver is not running!`, a failed data check."""

    @property
    def command(self) -> NccomCommand | None:
        return self.commands[0] if self.commands else None

    def row_at(self, size_bytes: int) -> NccomRow | None:
        """The row for exactly `size_bytes`, or None. Never a neighbour."""
        return next((r for r in self.rows if r.size_bytes == size_bytes), None)


@dataclass(frozen=True)
class ParsedLog:
    """Everything read from one log, plus what the parser noticed about its shape."""

    source: str
    benchmark: str | None = None
    """Canonical binary name: `all_reduce_perf` also for `all_reduce_perf_mpi` or a path to it."""
    container_image: str | None = None
    """The image fmcluster's container acceptance job ran nccl-tests from (`# fmcluster acceptance job: X in IMAGE`)."""
    benchmark_printed: str | None = None
    """The name exactly as the log printed it (`# Collective test starting: all_reduce_perf_mpi`)."""
    library: str | None = None
    """`NCCL 2.18.5+cuda12.2` or, for the CPU stand-in, `fmcluster TCP ring (Python 3.11.2)`."""
    tests_version: str | None = None
    header: dict[str, str] = field(default_factory=dict)
    """`# nThread 1 nGpus 1 minBytes 8 ...` as key/value pairs."""
    columns: tuple[str, ...] = ()
    """The size table's header as read (normalised names); empty when no header line was seen."""
    ranks: int | None = None
    """Ranks in the collective: NCCL's own `nranks` when it printed one, else the `# Rank` lines."""
    rank_lines: int | None = None
    """Distinct ranks in nccl-tests' `# Rank N ... on HOST` lines."""
    nccl_nranks: int | None = None
    """Communicator size from NCCL's INFO lines (`comm 0x... rank 0 nranks 16 ...`)."""
    nccl_nodes: int | None = None
    """Node count from NCCL's INFO lines (`nNodes 2`), when printed."""
    hosts: tuple[str, ...] = ()
    rows: tuple[SizeRow, ...] = ()
    unreadable_sizes: tuple[int, ...] = ()
    """Sizes whose row started like a row but could not be read (spliced, cut, non-numeric cells)."""
    avg_busbw_gbps: float | None = None
    avg_busbw_text: str | None = None
    """The footer's figure as printed (`448.212`, `nan`); kept when it does not read as a number."""
    avg_verdict: str | None = None
    """nccl-tests' own verdict after the average (`OK`/`FAILED`, with NCCL_TESTS_MIN_BW), if printed."""
    out_of_bounds: int | None = None
    network: NetworkInfo = field(default_factory=NetworkInfo)
    completed: bool = False
    """The footer (`# Avg bus bandwidth`) was reached."""
    tables: int = 0
    """Number of table headers seen; > 1 means several independent runs (ranks not wired together)."""
    duplicate_rows: int = 0
    garbled_lines: int = 0
    """Row-shaped lines that could not be read, e.g. two ranks' output spliced on one line."""
    long_lines: int = 0
    """Lines longer than the parser's bound; each was cut to the bound before reading."""
    longest_line: int = 0
    rows_dropped: int = 0
    """Rows beyond the parser's bound on distinct sizes (a table that large is not a real run)."""
    lines_read: int = 0
    errors: tuple[str, ...] = ()
    """Lines saying the run failed: nccl-tests failures, slurmstepd/srun kills, tracebacks, OOM."""
    killed: bool = False
    """Slurm or the kernel ended the job (CANCELLED, TIME LIMIT, Killed, oom-kill)."""
    test_failures: tuple[str, ...] = ()
    """nccl-tests' own failure lines (`Test NCCL failure`, `Test failure`), wherever in the log they are."""
    tool: str = "nccl-tests"
    """`nccl-tests` (and the CPU bench, same format) or `nccom-test` (Neuron), from its table, command or failure
    lines."""
    nccom: NccomRun | None = None
    """Neuron nccom-test's table, command line and failures (None for nccl-tests output)."""
    encoding: str = "utf-8"
    """How the file was read: utf-8, utf-16-le, ..., with `gzip+` in front when it was compressed."""
    bytes_capped: bool = False
    """The reading stopped at one of the parser's bounds (bytes, lines, expansion); the rest of the log was not read."""
    capped_by: str = ""
    """Which bound stopped it, e.g. `2,000,000 lines` (empty when none did)."""
    rank_map: tuple[RankDevice, ...] = ()
    rank_lines_seen: int = 0
    """`# Rank` lines read (more than distinct ranks when a rank is listed twice)."""
    processes: tuple[ProcessNet, ...] = ()
    rank_transports: tuple[RankTransport, ...] = ()
    nccl_versions: tuple[str, ...] = ()
    """Every distinct `NCCL version X` printed (one per rank with NCCL_DEBUG=INFO)."""

    def rows_at(self, size_bytes: int) -> tuple[SizeRow, ...]:
        return tuple(r for r in self.rows if r.size_bytes == size_bytes)

    def row_at(self, size_bytes: int) -> SizeRow | None:
        """The row for exactly `size_bytes` (the worst, if the log had several), or None. Never a neighbour."""
        rows = self.rows_at(size_bytes)
        return max(rows, key=SizeRow.badness) if rows else None

    @property
    def max_size_bytes(self) -> int | None:
        return max((r.size_bytes for r in self.rows), default=None)

    @property
    def wrong(self) -> int:
        return sum(r.wrong for r in self.rows)

    @property
    def has_redop(self) -> bool | None:
        """Whether the table has a reduction column (from the header, else from the rows)."""
        if self.columns:
            return "redop" in self.columns
        if self.rows:
            return self.rows[0].redop is not None
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def json_safe(value: Any, path: str = "$") -> tuple[Any, list[str]]:
    """`value` with every non-finite float replaced by None, and the paths where that happened.

    For `json.dumps(..., allow_nan=False)`: NaN and Infinity are not JSON, and a reader must never get a
    number that compares false against every floor.
    """
    found: list[str] = []

    def walk(v: Any, p: str) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            found.append(p)
            return None
        if isinstance(v, dict):
            return {k: walk(x, f"{p}.{k}") for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x, f"{p}[{i}]") for i, x in enumerate(v)]
        return v

    return walk(value, path), found
