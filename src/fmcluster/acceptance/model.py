"""What an nccl-tests (or fmcluster CPU bench) log says, as typed, immutable values.

The parser fills these; the verdict reads them; results.py writes them as JSON. Nothing here parses or
judges: it is the vocabulary shared by those modules.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Measurement:
    """One half of a size row: the out-of-place or the in-place run."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None
    """Elements that failed the check (`#wrong`); None when the check was off (`N/A`)."""
    max_error: float | None = None
    """Old nccl-tests (< 2.10) printed a max error instead of `#wrong`."""


@dataclass(frozen=True)
class SizeRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int | None
    """-1 for collectives without a root; None in old logs that had no `root` column."""
    out_of_place: Measurement
    in_place: Measurement

    @property
    def wrong(self) -> int:
        return sum(m.wrong or 0 for m in (self.out_of_place, self.in_place))


@dataclass(frozen=True)
class NetworkInfo:
    """Which transport the collective library chose, from its INFO lines."""

    network: str | None = None
    """From `Using network X` (Libfabric, AWS Libfabric, IB, Socket) or, lacking it, the channel transports."""
    ofi_provider: str | None = None
    """From `NET/OFI Selected Provider is efa` (aws-ofi-nccl); None when the plugin printed no selection."""
    ofi_plugin_version: str | None = None
    ofi_nics: int | None = None
    plugin_missing: bool = False
    """NCCL said it found no net plugin (libnccl-net.so) and uses its internal transports."""
    socket_interfaces: tuple[str, ...] = ()
    """Interfaces named by `NET/Socket : Using [0]eth0:10.0.0.1<0>` (bootstrap or data)."""
    transports: tuple[str, ...] = ()
    """Distinct inter-node transports of channel connections, e.g. `NET/Libfabric/0/GDRDMA`, `NET/Socket/0`."""
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
class ParsedLog:
    """Everything read from one log, plus what the parser noticed about its shape."""

    source: str
    benchmark: str | None = None
    """all_reduce_perf, all_gather_perf, ... from `# Collective test starting:` or the header."""
    library: str | None = None
    """`NCCL 2.18.5+cuda12.2` or, for the CPU stand-in, `gloo (torch 2.13.0+cpu)`."""
    tests_version: str | None = None
    header: dict[str, str] = field(default_factory=dict)
    """`# nThread 1 nGpus 1 minBytes 8 ...` as key/value pairs."""
    ranks: int | None = None
    hosts: tuple[str, ...] = ()
    rows: tuple[SizeRow, ...] = ()
    avg_busbw_gbps: float | None = None
    out_of_bounds: int | None = None
    network: NetworkInfo = field(default_factory=NetworkInfo)
    completed: bool = False
    """The footer (`# Avg bus bandwidth`) was reached."""
    tables: int = 0
    """Number of table headers seen; > 1 means several independent runs (ranks not wired together)."""
    duplicate_rows: int = 0
    garbled_lines: int = 0
    """Row-shaped lines that could not be read, e.g. two ranks' output spliced on one line."""
    errors: tuple[str, ...] = ()
    """Lines saying the run failed: nccl-tests failures, slurmstepd/srun kills, tracebacks, OOM."""
    killed: bool = False
    """Slurm or the kernel ended the job (CANCELLED, TIME LIMIT, Killed, oom-kill)."""

    def row_at(self, size_bytes: int) -> SizeRow | None:
        """The row for `size_bytes`, or the largest one below it when that size was not reached."""
        exact = [r for r in self.rows if r.size_bytes == size_bytes]
        if exact:
            return exact[0]
        below = [r for r in self.rows if r.size_bytes < size_bytes]
        return max(below, key=lambda r: r.size_bytes) if below else None

    @property
    def max_size_bytes(self) -> int | None:
        return max((r.size_bytes for r in self.rows), default=None)

    @property
    def wrong(self) -> int:
        return sum(r.wrong for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
