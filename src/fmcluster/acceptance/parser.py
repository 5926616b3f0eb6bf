"""Read nccl-tests output (and the fmcluster CPU bench, which prints the same format) into a ParsedLog.

Any log a user has: plain, gzip/bzip2/xz, UTF-8/16/32 (by BOM or NUL pattern), with ANSI colour codes; a
device, FIFO or directory is refused at once (LogReadError, an OSError). Per process and per rank it keeps
what the last line of a kind would hide: every provider selected, the NICs found, each rank's NET transport,
the rank -> host -> device map and every NCCL version. AWS Neuron's nccom-test output (its command line, table,
footer and failure lines) is read into `ParsedLog.nccom` (fmcluster.acceptance.neuron).

Streaming and bounded: `parse_stream` takes lines one at a time and keeps only what the verdict needs
(rows, counters, capped lists), and `parse_file` reads the file in bounded pieces, so a 200 MB log of
INFO lines or a single 20 MB line costs a few MB, not the file's size. Lines longer than MAX_LINE_CHARS
are cut to that bound and counted (`ParsedLog.long_lines`).

Tolerant by design: logs come from real jobs, so lines may carry launcher prefixes (`[1,0]<stdout>:` from
Open MPI, `[0] ` from Intel MPI even in the middle of a row, `0: ` from `srun -l`, `[pod/x/c] ` from
`kubectl logs --prefix`, CRI `stdout F`, timestamps), ranks' lines interleave or splice, the job may have
been killed, and the file may stop mid-line. The size table is read by its own header, so every
nccl-tests layout reads right: with and without `redop`/`root` (before 2.10 all_gather had neither and
broadcast had `root` where all_reduce has `redop`), `#wrong` (2.10+, printed with %g) or `error` (max
error, older), per-iteration and timestamp columns. The parser never raises on content: it records what
it saw and what was odd, and leaves judging to verdict.py.
"""

from __future__ import annotations

import codecs
import gzip
import io
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from fmcluster.acceptance import neuron
from fmcluster.acceptance.model import (
    CheckKind,
    Measurement,
    NetworkInfo,
    ParsedLog,
    ProcessNet,
    RankDevice,
    RankTransport,
    SizeRow,
)
from fmcluster.escape import neutral

MAX_LINE_CHARS = 64 * 1024
"""Longest line read whole; nccl-tests rows are ~150 characters and NCCL INFO lines a few hundred."""
MAX_ROWS = 10_000
"""Distinct size rows kept; `-f 2` from 8 B to 16 GiB is 32."""
MAX_RANKS = 1 << 16
MAX_LIST = 20
MAX_RANK_RECORDS = 4096
"""Rank map entries, processes and (rank, transport) pairs kept: 512 nodes of 8 GPUs; beyond, counted only."""
MAX_LOG_BYTES = 4 << 30
"""Bytes read from one log (after decompression); a real run's log is a few MB, a chatty one a few hundred. A plain
file larger than this is refused before a byte is read (its size is known)."""
MAX_LOG_LINES = 2_000_000
"""Lines read from one log: NCCL_DEBUG=INFO on 1,024 ranks prints a few hundred thousand; each line costs about a
microsecond, however short, so a file of newlines is bounded by lines, not bytes."""
MAX_EXPANSION = 250
"""A compressed log is read while its text stays within this many times the compressed bytes consumed (plus
EXPANSION_ALLOWANCE): job logs compress 8-40 times; a file that expands further is a decompression bomb (785 bytes
of bzip2 hold 1 GB of newlines) and stops at once, saying so."""
EXPANSION_ALLOWANCE = 64 * 1024
MAX_LINES_PER_COMPRESSED_BYTE = 2
"""The same for lines: job logs hold 0.1-0.5 lines per compressed byte (lines of 100-150 characters compressed 8-40
times); a file of short lines that expands further costs microseconds a line and stops at this bound (plus
LINE_ALLOWANCE): the 785-byte bzip2 of newlines after ~18,000 lines."""
LINE_ALLOWANCE = 16 * 1024

# Colour and cursor codes some launchers and terminals leave in captured output (CSI, OSC, 2-byte escapes).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")

# A leading launcher/shipper prefix; stripped repeatedly (e.g. a timestamp, then `[pod/x/c] `, then `0: `).
_LEADING = re.compile(
    r"^(?:"
    r"\[\d+,\d+\]<(?:stdout|stderr)>:\s?"  # mpirun --tag-output
    r"|\[\d+\]\s"  # Intel MPI -prepend-rank
    r"|\[[\w.\-]+(?:/[\w.\-]+)+\]\s"  # kubectl logs --prefix: [pod/name/container]
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+"  # ISO timestamps
    r"|(?:stdout|stderr) [FP] "  # CRI container log format, after its timestamp
    r"|\s{0,4}\d{1,5}: "  # srun --label
    r")"
)
# Rank tags spliced into a row (Intel MPI prefixes each chunk it forwards, Open MPI each line).
_INNER_TAG = re.compile(r"\[\d+(?:,\d+)?\](?:<(?:stdout|stderr)>:)?")
# FMCTCP: fmcluster's CPU bench (its own TCP ring); GLOO: the same bench's logs from before, when it ran gloo.
_LIB_LINE = re.compile(r"\b(?P<lib>NCCL|GLOO|FMCTCP) (?P<level>INFO|WARN) (?P<msg>.*)$")
_HOST_PREFIX = re.compile(r"^\s*(?:\S+:\d+:\d+ )?\[\d+\](?: \S+:\d+)? ?$")

_NCCL_VERSION = re.compile(r"NCCL version (\S+)")
_GLOO_VERSION = re.compile(r"^# Using (gloo \(torch [^)]+\)|fmcluster TCP ring \(Python [^)]+\))")
_TESTS_VERSION = re.compile(r"^# nccl-tests version (\S+)")
_BENCH_VERSION = re.compile(r"^# fmcluster cpu-bench version (\S+)")
_TEST_START = re.compile(r"^# (?:Collective test starting|fmcluster acceptance job): (\S+)(?: in (\S+))?")
_HEADER_KEYS = re.compile(
    r"(nThread|nGpus|minBytes|maxBytes|step:|warmup iters:|iters:|agg iters:|validation:|graph:|unalign:)\s+(\S+)"
)
_RANK = re.compile(r"^#?\s*Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device"
                   r"(?:\s+(\S+)(?:\s+\[[^\]]*\])?\s*(.*?))?\s*$")
_OOB = re.compile(r"^# Out of bounds values\s*:\s*(\d+)")
_AVG = re.compile(r"^# Avg bus bandwidth\s*:\s*(\S+)?\s*(OK|FAILED)?")
_ROW_START = re.compile(r"^\s*\d+\s+\d+\s+[A-Za-z]")
_NUMBERS_ONLY = re.compile(r"^\s*[\d.]+(?:\s+[\d.N/A]+){2,}\s*$")  # the tail of a row split by another rank
_INT = re.compile(r"[+-]?\d+")
_IDENT = re.compile(r"[A-Za-z_]\w*")

_USING_NETWORK = re.compile(r"Using network (.+?)\s*$")
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (\S+?)(?:,|\s|$)(?:.*?found (\d+) nics)?")
_OFI_VERSION = re.compile(r"aws-ofi-nccl (?:v)?(\d[\w.\-]*)")
_OFI_PLATFORM = re.compile(r"NET/OFI Running on (\S+?),? platform")
_PLUGIN_MISSING = re.compile(
    r"NET/Plugin\s*:?.*(?:No plugin found|Could not find: libnccl-net|libnccl-net[\w\-]*\.so: cannot open)"
)
_SOCKET_IFACES = re.compile(r"NET/Socket : Using (.*)$")
_IFACE = re.compile(r"\[\d+\]([\w.\-@]+):")
_CONNECTION = re.compile(r"(?:Channel|Ring) \d+(?:/\d+)? : (.*?) via (.+?)\s*$")
_ENDS = re.compile(r"^(\d+)\[[^\]]*\] -> (\d+)\[[^\]]*\](?: \[(send|receive)\])?")
_PROC = re.compile(r"^\s*([^\s:]+):(\d+):\d+ \[\d+\]")
_TEST_FAILURE = re.compile(r"Test (?:NCCL |CUDA )?failure")
_RING = re.compile(r"^Channel (\d+)(?:/(\d+))? :((?:\s+\d+)+)\s*$")
_COLL_CHANNELS = re.compile(r"^(\d+) coll channels")
_NRANKS = re.compile(r"\bn[Rr]anks (\d+)\b")
_NNODES = re.compile(r"\bnNodes (\d+)\b")
_NVLS = re.compile(r"Connected NVLS|via NVLS")

_ERROR_PATTERNS = (
    re.compile(r"Test (?:NCCL |CUDA )?failure"),
    re.compile(r"slurmstepd: error: .*"),
    re.compile(r"srun: error: .*"),
    re.compile(r"srun: (?:Job step aborted|forcing job termination).*"),
    re.compile(r"mpirun noticed that .*"),
    re.compile(r"^\w*(?:Error|Exception): .+"),
    re.compile(r"(?i)out of memory|oom-kill"),
    re.compile(r"^sbatch: error: .*"),
    # CUDA's cudaErrorInsufficientDriver (35): the runtime is newer than the driver supports (nccl-tests prints it as
    # `Test CUDA failure common.cu:N '...'`, older ones as `Cuda failure common.cu:N '...'`)
    re.compile(r"CUDA driver version is insufficient for CUDA runtime version|cudaErrorInsufficientDriver"),
    # the container job's own checks before nccl-tests (roles/nccl_tests/templates/nccl-tests.sbatch.j2)
    re.compile(r"fmcluster acceptance: (?:container check failed on |no EFA device |locked memory is )"),
)
_KILL = re.compile(r"CANCELLED|TIME LIMIT|: Killed|Terminated|signal 9|oom-kill|(?i:out of memory)|forcing job termination")

# Table header names across nccl-tests versions, normalised.
_COLUMN_ALIASES = {"bytes": "size", "n": "count", "op": "redop", "res": "error", "cputime": "time"}
_CHECK_COLUMNS: dict[str, CheckKind] = {"#wrong": "count", "error": "max_error"}


def canonical_benchmark(name: str) -> str:
    """`all_reduce_perf` for `all_reduce_perf`, `all_reduce_perf_mpi` (nccl-tests 2.18 MPI builds) or a path."""
    base = re.split(r"[\\/]", name)[-1]
    if base.endswith(".exe"):
        base = base[:-4]
    m = re.fullmatch(r"([A-Za-z0-9_]+?_perf)(?:_mpi)?", base)
    return m.group(1) if m else base


def _strip_prefixes(line: str) -> str:
    for _ in range(6):
        m = _LEADING.match(line)
        if not m or not m.end():
            break
        line = line[m.end():]
    return line


def _float(token: str) -> float:
    """A figure as nccl-tests prints it: `%.2f`, `%g`, `%e`, and C's `nan`, `-nan`, `inf`."""
    value = float(token)  # accepts nan, -nan, inf, -inf, infinity; raises on N/A and garbage
    return value


@dataclass(frozen=True)
class Layout:
    """Where each field sits in a row: from the table's header, or inferred from one row's tokens."""

    lead: tuple[str, ...]
    """Leading columns: size, count, type, then redop and/or root when the layout has them."""
    half: int
    """Tokens per half (time, algbw, busbw, check, then any per-iteration columns)."""
    check: CheckKind | None
    """"count" (`#wrong`), "max_error" (`error`), or None when unknown (no header)."""
    trailing: int = 0
    """Tokens after the two halves (a `timestamp` column prints date and time: 2)."""

    @property
    def width(self) -> int:
        return len(self.lead) + 2 * self.half + self.trailing


def layout_from_header(columns: list[str]) -> Layout | None:
    """The layout a table header describes, or None if it is not one nccl-tests prints."""
    times = [i for i, c in enumerate(columns) if c == "time"]
    if len(times) != 2 or columns[:3] != ["size", "count", "type"]:
        return None
    lead = tuple(columns[: times[0]])
    if any(c not in ("size", "count", "type", "redop", "root") for c in lead):
        return None
    first, second = columns[times[0]: times[1]], columns[times[1]:]
    half = len(first)
    if half < 4 or first[1:3] != ["algbw", "busbw"] or first[3] not in _CHECK_COLUMNS:
        return None
    if second[:half] != first:
        return None
    trailing = second[half:]
    if any(not _IDENT.fullmatch(c.lstrip("#%")) for c in trailing):
        return None
    # extra columns after the two halves (`timestamp` prints a date and a time: two tokens)
    return Layout(lead, half, _CHECK_COLUMNS[first[3]], sum(2 if c == "timestamp" else 1 for c in trailing))


def _infer_layout(tokens: list[str]) -> Layout | None:
    """A layout for a row seen before any header: by token count and what the 4th token looks like."""
    n = len(tokens)
    if n == 13:
        return Layout(("size", "count", "type", "redop", "root"), 4, None)
    if n == 12:
        fourth = "root" if _INT.fullmatch(tokens[3]) else "redop"
        return Layout(("size", "count", "type", fourth), 4, None)
    if n == 11:
        return Layout(("size", "count", "type"), 4, None)
    return None


def _check(token: str, kind: CheckKind | None) -> tuple[int | None, float | None, CheckKind, bool]:
    """(wrong, max_error, kind, rounded) for a check cell. A count printed with %g is still a count."""
    if token == "N/A":
        return None, None, "unchecked", False
    try:
        value = float(token)
    except ValueError:
        return None, None, "unreadable", False
    if not math.isfinite(value) or value < 0:
        return None, None, "unreadable", False
    if kind == "max_error" or (kind is None and value < 1 and value != 0):
        return None, value, "max_error", False
    if value != int(value):
        return None, None, "unreadable", False  # a count is whole; 2.5 wrong elements is garbage
    return int(value), None, "count", not _INT.fullmatch(token)


def parse_row(line: str, layout: Layout | None = None, line_no: int = 0) -> SizeRow | None:
    """One size row read with `layout` (inferred from the row when None). None if unreadable."""
    tokens = line.split()
    layout = layout or _infer_layout(tokens)
    if layout is not None and len(tokens) == layout.width - 1 and "redop" in layout.lead and len(tokens) > 3 \
            and not _IDENT.fullmatch(tokens[3]):
        # old alltoall (and all_gather) printed the shared header's `redop` but an empty cell under it
        layout = Layout(tuple(c for c in layout.lead if c != "redop"), layout.half, layout.check, layout.trailing)
    if layout is None or len(tokens) != layout.width:
        return None
    lead = dict(zip(layout.lead, tokens))
    try:
        size, count = int(lead["size"]), int(lead["count"])
        dtype = lead["type"]
        redop = lead.get("redop")
        root = int(lead["root"]) if "root" in lead else None
    except ValueError:
        return None
    if size < 0 or count < 0 or not _IDENT.fullmatch(dtype) or (redop is not None and not _IDENT.fullmatch(redop)):
        return None
    halves = []
    start = len(layout.lead)
    for h in range(2):
        cells = tokens[start + h * layout.half: start + h * layout.half + 4]
        try:
            time_us, algbw, busbw = (_float(t) for t in cells[:3])
        except ValueError:
            return None
        wrong, max_error, kind, rounded = _check(cells[3], layout.check)
        halves.append(Measurement(time_us, algbw, busbw, wrong, max_error, kind, rounded))
    return SizeRow(size, count, dtype, redop, root, halves[0], halves[1], line_no)


class _NetworkBuilder:
    def __init__(self) -> None:
        self.network: str | None = None
        self.provider: str | None = None
        self.plugin_version: str | None = None
        self.platform: str | None = None
        self.nics: int | None = None
        self.plugin_missing = False
        self.ifaces: list[str] = []
        self.transports: list[str] = []
        self.intra: list[str] = []
        self.nvls = False
        self.rings: dict[int, tuple[int, ...]] = {}
        self.ring_total: int | None = None
        self.coll_channels: int | None = None
        self.trees = 0
        self.warnings: list[str] = []

    def feed(self, level: str, msg: str) -> None:
        if level == "WARN":
            if msg not in self.warnings and len(self.warnings) < MAX_LIST:
                self.warnings.append(msg)
            return
        if "Using network" in msg and (m := _USING_NETWORK.search(msg)):
            self.network = m.group(1)
        if "NET/" in msg:
            self._net(msg)
        if msg.startswith(("Channel", "Ring")):
            self._channel(msg)
        elif "coll channels" in msg and (m := _COLL_CHANNELS.match(msg)):
            self.coll_channels = int(m.group(1))
        elif msg.startswith(("Trees ", "Trees[")):
            self.trees += 1
        if "NVLS" in msg and _NVLS.search(msg):
            self.nvls = True

    def _net(self, msg: str) -> None:
        if m := _OFI_PROVIDER.search(msg):
            self.provider = m.group(1)
            if m.group(2):
                self.nics = int(m.group(2))
        if "NET/OFI" in msg:
            if m := _OFI_VERSION.search(msg):
                self.plugin_version = m.group(1)
            if m := _OFI_PLATFORM.search(msg):
                self.platform = m.group(1)
        if _PLUGIN_MISSING.search(msg):
            self.plugin_missing = True
        if m := _SOCKET_IFACES.search(msg):
            for iface in _IFACE.findall(m.group(1)):
                if iface not in self.ifaces and len(self.ifaces) < MAX_LIST:
                    self.ifaces.append(iface)

    def _channel(self, msg: str) -> None:
        if m := _RING.match(msg):
            channel = int(m.group(1))
            if channel not in self.rings and len(self.rings) < 256:
                self.rings[channel] = tuple(int(x) for x in m.group(3).split()[:MAX_RANKS])
            if m.group(2):
                self.ring_total = int(m.group(2))
        elif m := _CONNECTION.search(msg):
            transport = m.group(2)
            target = self.transports if transport.startswith("NET/") else self.intra
            if transport not in target and len(target) < MAX_LIST:
                target.append(transport)

    def build(self) -> NetworkInfo:
        network = self.network
        if network is None and self.transports:
            network = self.transports[0].split("/")[1]
        gdr: bool | None = None
        rdma = [t for t in self.transports if not t.startswith("NET/Socket")]
        if rdma:  # GPUDirect is a question for RDMA-capable transports only
            gdr = any("GDRDMA" in t for t in rdma)
        channels = self.ring_total or self.coll_channels or (len(self.rings) or None)
        return NetworkInfo(
            network=network,
            ofi_provider=self.provider,
            ofi_plugin_version=self.plugin_version,
            ofi_nics=self.nics,
            platform=self.platform,
            plugin_missing=self.plugin_missing,
            socket_interfaces=tuple(self.ifaces),
            transports=tuple(self.transports),
            intra_transports=tuple(self.intra),
            nvls=self.nvls,
            gdr=gdr,
            channels=channels,
            rings=tuple(self.rings[c] for c in sorted(self.rings)),
            trees=self.trees,
            warnings=tuple(self.warnings),
        )


class LogParser:
    """Incremental parser: `feed` one line at a time, then `result()`. Memory does not grow with the log."""

    def __init__(self, source: str = "<text>") -> None:
        self.source = source
        self.net = _NetworkBuilder()
        self.benchmark: str | None = None
        self.container_image: str | None = None
        self.library: str | None = None
        self.tests_version: str | None = None
        self.header: dict[str, str] = {}
        self.columns: list[str] = []
        self.layout: Layout | None = None
        self.hosts: list[str] = []
        self.rank_ids: set[int] = set()
        self.nranks: int | None = None
        self.nnodes: int | None = None
        self.rows: dict[tuple[int, str, str | None], SizeRow] = {}
        self.unreadable: list[int] = []
        self.avg: float | None = None
        self.avg_text: str | None = None
        self.avg_verdict: str | None = None
        self.oob: int | None = None
        self.completed = False
        self.tables = self.duplicates = self.garbled = self.dropped = 0
        self.long_lines = self.longest = self.line_no = 0
        self.errors: list[str] = []
        self.killed = False
        self.test_failures: list[str] = []
        self.tool = "nccl-tests"
        self.nccom = neuron.NccomBuilder()
        self.rank_map: dict[int, RankDevice] = {}
        self.rank_lines_seen = 0
        self.procs: dict[tuple[str, int], tuple[list[str], list[int], list[str]]] = {}
        self.rank_net: dict[tuple[int, str], str] = {}
        self.versions: list[str] = []

    def feed(self, raw: str, length: int | None = None) -> None:
        """Read one line. `length` is the line's real length when the caller already cut it to the bound."""
        self.line_no += 1
        length = len(raw) if length is None else length
        if length > MAX_LINE_CHARS:
            self.long_lines += 1
            self.longest = max(self.longest, length)
            raw = raw[:MAX_LINE_CHARS]
        if "\x1b" in raw:
            raw = _ANSI.sub("", raw)
        # lstrip: logs pasted into docs and tickets are indented (Markdown lists, `kubectl logs | sed`), and a
        # footer read as "not a comment" would turn a complete run into a truncated one
        line = _strip_prefixes(raw.rstrip("\r\n").lstrip())
        if not line.strip():
            return
        if " INFO " in line or " WARN " in line:
            lib = _LIB_LINE.search(line)
            if lib:
                self._library_line(line, lib)
                return
        if "nccom-test" in line and (cmd := neuron.parse_command(line, self.line_no)) is not None:
            self.nccom.command(cmd)
            self.tool = "nccom-test"
            return
        if line.startswith("#"):
            self._comment(line)
            return
        if "NCCL version" in line and (m := _NCCL_VERSION.match(line.strip())):
            self._version(m.group(1))
            return
        if m := _RANK.match(line):  # some launchers drop the leading '#'
            self._rank(m)
            return
        if "[" in line:
            line = _INNER_TAG.sub(" ", line)
        if self._nccom_line(line):
            return
        if _ROW_START.match(line):
            self._row(line)
            return
        if _NUMBERS_ONLY.match(line):
            self.garbled += 1
            return
        self._maybe_error(line.strip())

    def _nccom_line(self, line: str) -> bool:
        """nccom-test's header, rows under it, footer and failure lines (True when the line was one of them)."""
        if "count(elems)" in line and neuron.HEADER.match(line):
            self.nccom.header(line)
            self.tool = "nccom-test"
            return True
        if neuron.FAILURE.search(line):
            self.nccom.failure(line.strip())
            self.tool = "nccom-test"
            return True
        if self.nccom.columns and neuron.is_row(line):
            self.nccom.row(line, self.line_no)
            return True
        if "Avg bus bandwidth:" in line and (m := neuron.FOOTER.match(line)):
            self.tool = "nccom-test"
            self.completed = True
            self.avg_text = m.group("value")
            try:
                self.avg = _float(self.avg_text)
            except ValueError:
                self.avg = None
            return True
        return False

    def _library_line(self, line: str, lib: re.Match[str]) -> None:
        before = line[: lib.start()]
        if before.strip() and not _HOST_PREFIX.match(before):
            self.garbled += 1  # another rank's text spliced in front of this INFO line
            if _ROW_START.match(before):
                self._unreadable_row(before)
        msg = lib.group("msg")
        if "NCCL version" in msg and (m := _NCCL_VERSION.search(msg)):
            self._version(m.group(1))
        if lib.group("lib") == "NCCL" and lib.group("level") == "INFO" and ("NET/" in msg or "Using network" in msg):
            self._per_rank(before, msg)
        if "anks " in msg and (m := _NRANKS.search(msg)):
            self.nranks = max(self.nranks or 0, int(m.group(1)))
        if "nNodes" in msg and (m := _NNODES.search(msg)):
            self.nnodes = max(self.nnodes or 0, int(m.group(1)))
        self.net.feed(lib.group("level"), msg)

    def _version(self, version: str) -> None:
        self.library = self.library or f"NCCL {version}"
        if version not in self.versions and len(self.versions) < MAX_LIST:
            self.versions.append(version)

    def _per_rank(self, before: str, msg: str) -> None:
        """Per process and per rank, what the last line of a kind would hide: providers, NICs, channel transports."""
        proc = _PROC.match(before)
        host = proc.group(1) if proc else "?"
        if "elected" in msg and (m := _OFI_PROVIDER.search(msg)) and proc:
            key = (host, int(proc.group(2)))
            if key not in self.procs and len(self.procs) >= MAX_RANK_RECORDS:
                return
            providers, nics, _ = self.procs.setdefault(key, ([], [], []))
            if m.group(1) not in providers:
                providers.append(m.group(1))
            if m.group(2) and int(m.group(2)) not in nics:
                nics.append(int(m.group(2)))
        elif "Using network" in msg and (m := _USING_NETWORK.search(msg)) and proc:
            key = (host, int(proc.group(2)))
            if key not in self.procs and len(self.procs) >= MAX_RANK_RECORDS:
                return
            networks = self.procs.setdefault(key, ([], [], []))[2]
            if m.group(1) not in networks:
                networks.append(m.group(1))
        elif " via NET/" in msg and (m := _CONNECTION.search(msg)) and (ends := _ENDS.match(m.group(1))):
            rank = int(ends.group(2) if ends.group(3) == "receive" else ends.group(1))
            kind = m.group(2).split("/")[1] if "/" in m.group(2) else m.group(2)
            if (rank, kind) not in self.rank_net and len(self.rank_net) < MAX_RANK_RECORDS:
                self.rank_net[(rank, kind)] = host

    def _comment(self, line: str) -> None:
        if m := _TESTS_VERSION.match(line):
            self.tests_version = m.group(1)
        elif m := _BENCH_VERSION.match(line):
            self.tests_version = f"fmcluster-cpu-bench {m.group(1)}"
        elif m := _GLOO_VERSION.match(line):
            self.library = m.group(1)
        elif m := _TEST_START.match(line):
            self.benchmark = m.group(1)
            if m.group(2):
                self.container_image = m.group(2)[:300]
        elif m := _OOB.match(line):
            self.oob = (self.oob or 0) + int(m.group(1))
        elif line.startswith("# Avg bus bandwidth") and (m := _AVG.match(line)):
            self._footer(m)
        elif m := _RANK.match(line):
            self._rank(m)
        elif "nThread" in line:
            self.header.update({k.rstrip(":"): v for k, v in _HEADER_KEYS.findall(line)})
        else:
            self._table_header(line)

    def _footer(self, m: re.Match[str]) -> None:
        self.completed = True
        self.avg_text = m.group(1)
        if m.group(2):
            self.avg_verdict = m.group(2) if self.avg_verdict != "FAILED" else "FAILED"
        elif m.group(1) in ("OK", "FAILED"):  # `: FAILED` with no figure
            self.avg_text, self.avg_verdict = None, m.group(1)
        try:
            self.avg = _float(self.avg_text) if self.avg_text else None
        except ValueError:
            self.avg = None

    def _table_header(self, line: str) -> None:
        names = [_COLUMN_ALIASES.get(t.lower(), t.lower()) for t in line.lstrip("#").split()]
        if len(names) < 5 or names[0] != "size" or "count" not in names[:3]:
            return
        self.tables += 1
        self.columns = names
        self.layout = layout_from_header(names)

    def _rank(self, m: re.Match[str]) -> None:
        rank, host = int(m.group(1)), m.group(3)
        if len(self.rank_ids) < MAX_RANKS:
            self.rank_ids.add(rank)
        self.rank_lines_seen += 1
        if rank in self.rank_map:  # the same rank listed twice: keep both as two entries of the map
            rank = -self.rank_lines_seen
        if len(self.rank_map) < MAX_RANK_RECORDS:
            self.rank_map[rank] = RankDevice(abs(int(m.group(1))), host, int(m.group(2)), m.group(4) or "?",
                                             (m.group(5) or "").strip())
        if host not in self.hosts and len(self.hosts) < MAX_RANKS:
            self.hosts.append(host)

    def _row(self, line: str) -> None:
        row = parse_row(line, self.layout, self.line_no)
        if row is None:
            self.garbled += 1
            self._unreadable_row(line)
            return
        key = (row.size_bytes, row.dtype, row.redop)
        old = self.rows.get(key)
        if old is not None:
            self.duplicates += 1
            if row.badness() > old.badness():
                self.rows[key] = row  # judge the worst reading of a size, never the best
        elif len(self.rows) < MAX_ROWS:
            self.rows[key] = row
        else:
            self.dropped += 1

    def _unreadable_row(self, line: str) -> None:
        first = line.split()[0]
        if len(self.unreadable) < 1000 and first.isdigit() and int(first) not in self.unreadable:
            self.unreadable.append(int(first))

    def _maybe_error(self, stripped: str) -> None:
        if "ailure" in stripped and _TEST_FAILURE.search(stripped) and len(self.test_failures) < MAX_LIST:
            if stripped[:500] not in self.test_failures:
                self.test_failures.append(stripped[:500])
        for pattern in _ERROR_PATTERNS:
            if pattern.search(stripped):
                if stripped not in self.errors and len(self.errors) < MAX_LIST:
                    self.errors.append(stripped[:500])
                if _KILL.search(stripped):
                    self.killed = True
                break

    def result(self, encoding: str = "utf-8", bytes_capped: bool = False, capped_by: str = "") -> ParsedLog:
        rank_lines = len(self.rank_ids) or None
        readable = {r.size_bytes for r in self.rows.values()}
        return ParsedLog(
            source=self.source,
            benchmark=canonical_benchmark(self.benchmark) if self.benchmark else None,
            container_image=self.container_image,
            benchmark_printed=self.benchmark,
            library=self.library,
            tests_version=self.tests_version,
            header=self.header,
            columns=tuple(self.columns),
            ranks=self.nranks if self.nranks is not None else rank_lines,
            rank_lines=rank_lines,
            nccl_nranks=self.nranks,
            nccl_nodes=self.nnodes,
            hosts=tuple(self.hosts),
            rows=tuple(self.rows.values()),
            unreadable_sizes=tuple(s for s in self.unreadable if s not in readable),
            avg_busbw_gbps=self.avg,
            avg_busbw_text=self.avg_text,
            avg_verdict=self.avg_verdict,
            out_of_bounds=self.oob,
            network=self.net.build(),
            completed=self.completed,
            tables=self.tables,
            duplicate_rows=self.duplicates,
            garbled_lines=self.garbled,
            long_lines=self.long_lines,
            longest_line=self.longest,
            rows_dropped=self.dropped,
            lines_read=self.line_no,
            errors=tuple(self.errors),
            killed=self.killed,
            test_failures=tuple(self.test_failures),
            tool=self.tool,
            nccom=self.nccom.build() if self.nccom.seen else None,
            encoding=encoding,
            bytes_capped=bytes_capped,
            capped_by=capped_by if bytes_capped else "",
            rank_map=tuple(self.rank_map[r] for r in sorted(self.rank_map, key=lambda r: (r < 0, abs(r)))),
            rank_lines_seen=self.rank_lines_seen,
            processes=tuple(ProcessNet(h, pid, tuple(p), tuple(n), tuple(w))
                            for (h, pid), (p, n, w) in self.procs.items()),
            rank_transports=tuple(RankTransport(r, h, k) for (r, k), h in sorted(self.rank_net.items())),
            nccl_versions=tuple(self.versions),
        )


def parse_stream(lines: Iterable[str], source: str = "<text>") -> ParsedLog:
    """Parse a log given as lines (an open text file, a generator, a list). Never raises on odd content."""
    parser = LogParser(source)
    for line in lines:
        parser.feed(line)
    return parser.result()


def parse_text(text: str, source: str = "<text>") -> ParsedLog:
    return parse_stream(text.splitlines(), source)


class LogReadError(OSError):
    """The path is not a log this parser reads: a device, FIFO or directory, or a compression it cannot open."""


# Compressions by their magic bytes: the stdlib opens the first three; the others are named so the user can fix it.
_COMPRESSED: tuple[tuple[bytes, str, str], ...] = (
    (b"\x1f\x8b", "gzip", ""), (b"BZh", "bzip2", ""), (b"\xfd7zXZ\x00", "xz", ""),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd -d"), (b"PK\x03\x04", "zip", "unzip"), (b"\x04\x22\x4d\x18", "lz4", "lz4 -d"),
)
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8"),
         (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def sniff_encoding(head: bytes) -> tuple[str, int]:
    """(codec, BOM length) of a log from its first bytes: a BOM, else the pattern of NULs a wide encoding leaves
    in ASCII text (`x\\0x\\0` is UTF-16-LE, `x\\0\\0\\0` UTF-32-LE), else UTF-8."""
    for bom, codec in _BOMS:
        if head.startswith(bom):
            return codec, len(bom)
    sample = head[: len(head) - len(head) % 4]
    if len(sample) < 4 or b"\x00" not in sample:
        return "utf-8", 0
    quarter = len(sample) // 4
    zeros4 = [sample[i::4].count(0) for i in range(4)]
    if zeros4[1] == zeros4[2] == zeros4[3] == quarter and zeros4[0] < quarter:
        return "utf-32-le", 0
    if zeros4[0] == zeros4[1] == zeros4[2] == quarter and zeros4[3] < quarter:
        return "utf-32-be", 0
    half = len(sample) // 2
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    if odd >= 0.9 * half and even < 0.5 * half:
        return "utf-16-le", 0
    if even >= 0.9 * half and odd < 0.5 * half:
        return "utf-16-be", 0
    return "utf-8", 0


def _open_regular(path: Path, max_bytes: int = MAX_LOG_BYTES) -> IO[bytes]:
    """The file opened for reading, or LogReadError when it is not a regular file (never blocks on a FIFO) or is
    larger than `max_bytes` (checked on the open file, before a byte is read: a sparse file may claim terabytes)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO without a writer would block a plain open
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                    "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
                    "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
            raise LogReadError(f"{neutral(str(path))} is {kind}, not a log file; give the job's output file")
        if info.st_size > max_bytes:
            raise LogReadError(f"{neutral(str(path))} is {info.st_size:,} bytes, more than the {_size(max_bytes)} a log is "
                               "read to; give one run's output (write one run per log)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class LogReader:
    """(line, its real length) for each line of a log file, each cut to `limit`: plain, gzip/bzip2/xz, UTF-8/16/32.

    Memory stays bounded however long a line or the file is; reading stops after `max_bytes` (decompressed)
    and says so in `capped`. Undecodable bytes (a job killed mid-write) are replaced, not fatal.
    """

    def __init__(self, path: Path, limit: int = MAX_LINE_CHARS, max_bytes: int = MAX_LOG_BYTES,
                 max_lines: int = MAX_LOG_LINES, max_expansion: int = MAX_EXPANSION,
                 max_file_bytes: int = MAX_LOG_BYTES) -> None:
        self.path, self.limit, self.max_bytes, self.max_file_bytes = path, limit, max_bytes, max_file_bytes
        self.max_lines, self.max_expansion = max_lines, max_expansion
        self.encoding = "utf-8"
        self.capped = False
        self.capped_by = ""
        """What stopped the reading: the bytes, the lines or the expansion bound (empty when nothing did)."""
        self.read_bytes = 0
        self.lines = 0
        self._raw: IO[bytes] | None = None  # the compressed file, while a decompressor reads it
        self._next_ratio_check = 0

    def __iter__(self) -> Iterator[tuple[str, int]]:
        with _open_regular(self.path, self.max_file_bytes) as raw:
            stream: IO[bytes] = raw
            head = _peek(raw)
            for magic, name, tool in _COMPRESSED:
                if head.startswith(magic):
                    if tool:
                        raise LogReadError(f"{neutral(str(self.path))} is {name}-compressed; decompress it first (`{tool}`)")
                    stream = _decompressor(name, raw)
                    self._raw = raw
                    head = _peek(stream)
                    self.encoding = f"{name}+"
                    break
            codec, bom = sniff_encoding(head)
            self.encoding = f"{self.encoding if self.encoding != 'utf-8' else ''}{codec}"
            try:
                if codec == "utf-8":
                    if bom:
                        stream.read(bom)
                    lines = self._bytes(stream)
                else:
                    lines = self._text(io.TextIOWrapper(stream, encoding=codec, errors="replace", newline=""),
                                       4 if "32" in codec else 2)
                for line in lines:
                    self.lines += 1
                    if self.lines > self.max_lines:
                        self._cap(f"{self.max_lines:,} lines")
                        return
                    if self._raw is not None and not self.lines % 1024 and self.lines > LINE_ALLOWANCE and \
                            self.lines > MAX_LINES_PER_COMPRESSED_BYTE * self._raw.tell() + LINE_ALLOWANCE:
                        self._cap(f"{MAX_LINES_PER_COMPRESSED_BYTE} lines per compressed byte: a decompression bomb, "
                                  "not a job's output; decompress it yourself if it is real")
                        return
                    yield line
            except EOFError:  # a compressed log cut off mid-stream (job killed while writing): judge what was read
                return

    def _cap(self, why: str) -> None:
        self.capped, self.capped_by = True, why

    def _room(self, size: int) -> bool:
        self.read_bytes += size
        if self.read_bytes > self.max_bytes:
            self._cap(f"{_size(self.max_bytes)} of text")
            return False
        if self._raw is not None and self.read_bytes >= self._next_ratio_check:
            self._next_ratio_check = self.read_bytes + 16 * 1024  # a tell() every 16 KiB, not every line
            consumed = max(self._raw.tell(), 1)
            if self.read_bytes > self.max_expansion * consumed + EXPANSION_ALLOWANCE:
                self._cap(f"{self.max_expansion} times its compressed size: a decompression bomb, not a job's "
                          "output; decompress it yourself if it is real")
                return False
        return True

    def _bytes(self, f: IO[bytes]) -> Iterator[tuple[str, int]]:
        limit = self.limit
        while chunk := f.readline(limit + 1):
            if not self._room(len(chunk)):
                return
            if len(chunk) <= limit or chunk.endswith(b"\n"):
                yield chunk.decode("utf-8", errors="replace"), len(chunk.rstrip(b"\r\n"))
                continue
            total = len(chunk)
            while (more := f.readline(limit)) and not more.endswith(b"\n"):
                total += len(more)
                if not self._room(len(more)):
                    return
            total += len(more.rstrip(b"\r\n"))
            yield chunk[:limit].decode("utf-8", errors="replace"), total

    def _text(self, f: IO[str], width: int) -> Iterator[tuple[str, int]]:
        limit = self.limit
        first = True
        while chunk := f.readline(limit + 1):
            if first:
                chunk, first = chunk.lstrip("\ufeff"), False
            if not self._room(width * len(chunk)):
                return
            if len(chunk) <= limit or chunk.endswith("\n"):
                yield chunk, len(chunk.rstrip("\r\n"))
                continue
            total = len(chunk)
            while (more := f.readline(limit)) and not more.endswith("\n"):
                total += len(more)
                if not self._room(width * len(more)):
                    return
            total += len(more.rstrip("\r\n"))
            yield chunk[:limit], total


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and not n % (1 << 30) else f"{n >> 20} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _decompressor(name: str, raw: IO[bytes]) -> IO[bytes]:
    import bz2
    import lzma

    if name == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]  # a binary IO in all but name
    if name == "bzip2":
        return bz2.BZ2File(raw, "rb")
    return lzma.LZMAFile(raw, "rb")


def _peek(f: IO[bytes], n: int = 4096) -> bytes:
    peek = getattr(f, "peek", None)
    if peek is None:  # pragma: no cover - every stream opened above can peek
        return b""
    return bytes(peek(n)[:n])


def read_bounded(path: Path, limit: int = MAX_LINE_CHARS) -> Iterator[tuple[str, int]]:
    """(line, its real length) for each line of `path`, each cut to `limit` (see LogReader)."""
    return iter(LogReader(path, limit))


def read_head(path: Path, max_bytes: int) -> str:
    """The first `max_bytes` of a log's text, read as parse_file reads it (decompressed, decoded, lines and
    expansion bounded; LogReadError for what is not a regular file or is too large): for pattern scans."""
    reader = LogReader(path, max_bytes=max(max_bytes, 1))
    parts: list[str] = []
    for line, _ in reader:
        parts.append(line)
    return "".join(parts)[:max_bytes]


def parse_file(path: Path) -> ParsedLog:
    """Parse a log file line by line with bounded lines and bytes. Raises OSError (LogReadError included) only when
    the file cannot be read: missing, no permission, not a regular file, or a compression it cannot open."""
    parser = LogParser(str(path))
    reader = LogReader(path)
    for line, length in reader:
        parser.feed(line, length)
    return parser.result(encoding=reader.encoding, bytes_capped=reader.capped, capped_by=reader.capped_by)
