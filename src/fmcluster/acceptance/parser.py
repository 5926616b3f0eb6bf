"""Read nccl-tests output (and the fmcluster CPU bench, which prints the same format) into a ParsedLog.

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

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fmcluster.acceptance.model import CheckKind, Measurement, NetworkInfo, ParsedLog, SizeRow

MAX_LINE_CHARS = 64 * 1024
"""Longest line read whole; nccl-tests rows are ~150 characters and NCCL INFO lines a few hundred."""
MAX_ROWS = 10_000
"""Distinct size rows kept; `-f 2` from 8 B to 16 GiB is 32."""
MAX_RANKS = 1 << 16
MAX_LIST = 20

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
_TEST_START = re.compile(r"^# (?:Collective test starting|fmcluster acceptance job): (\S+)")
_HEADER_KEYS = re.compile(
    r"(nThread|nGpus|minBytes|maxBytes|step:|warmup iters:|iters:|agg iters:|validation:|graph:|unalign:)\s+(\S+)"
)
_RANK = re.compile(r"^#?\s*Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+\d+\s+on\s+(\S+)\s+device")
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
_CONNECTION = re.compile(r"(?:Channel|Ring) \d+(?:/\d+)? : .*? via (.+?)\s*$")
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
    if trailing not in ([], ["timestamp"]):
        return None
    return Layout(lead, half, _CHECK_COLUMNS[first[3]], 2 if trailing else 0)


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
            transport = m.group(1)
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

    def feed(self, raw: str, length: int | None = None) -> None:
        """Read one line. `length` is the line's real length when the caller already cut it to the bound."""
        self.line_no += 1
        length = len(raw) if length is None else length
        if length > MAX_LINE_CHARS:
            self.long_lines += 1
            self.longest = max(self.longest, length)
            raw = raw[:MAX_LINE_CHARS]
        line = _strip_prefixes(raw.rstrip("\r\n"))
        if not line.strip():
            return
        if " INFO " in line or " WARN " in line:
            lib = _LIB_LINE.search(line)
            if lib:
                self._library_line(line, lib)
                return
        if line.startswith("#"):
            self._comment(line)
            return
        if "NCCL version" in line and (m := _NCCL_VERSION.match(line.strip())):
            self.library = self.library or f"NCCL {m.group(1)}"
            return
        if m := _RANK.match(line):  # some launchers drop the leading '#'
            self._rank(m)
            return
        if "[" in line:
            line = _INNER_TAG.sub(" ", line)
        if _ROW_START.match(line):
            self._row(line)
            return
        if _NUMBERS_ONLY.match(line):
            self.garbled += 1
            return
        self._maybe_error(line.strip())

    def _library_line(self, line: str, lib: re.Match[str]) -> None:
        before = line[: lib.start()]
        if before.strip() and not _HOST_PREFIX.match(before):
            self.garbled += 1  # another rank's text spliced in front of this INFO line
            if _ROW_START.match(before):
                self._unreadable_row(before)
        msg = lib.group("msg")
        if "NCCL version" in msg and (m := _NCCL_VERSION.search(msg)):
            self.library = self.library or f"NCCL {m.group(1)}"
        if "anks " in msg and (m := _NRANKS.search(msg)):
            self.nranks = max(self.nranks or 0, int(m.group(1)))
        if "nNodes" in msg and (m := _NNODES.search(msg)):
            self.nnodes = max(self.nnodes or 0, int(m.group(1)))
        self.net.feed(lib.group("level"), msg)

    def _comment(self, line: str) -> None:
        if m := _TESTS_VERSION.match(line):
            self.tests_version = m.group(1)
        elif m := _BENCH_VERSION.match(line):
            self.tests_version = f"fmcluster-cpu-bench {m.group(1)}"
        elif m := _GLOO_VERSION.match(line):
            self.library = m.group(1)
        elif m := _TEST_START.match(line):
            self.benchmark = m.group(1)
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
        if len(self.rank_ids) < MAX_RANKS:
            self.rank_ids.add(int(m.group(1)))
        host = m.group(2)
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
        for pattern in _ERROR_PATTERNS:
            if pattern.search(stripped):
                if stripped not in self.errors and len(self.errors) < MAX_LIST:
                    self.errors.append(stripped[:500])
                if _KILL.search(stripped):
                    self.killed = True
                break

    def result(self) -> ParsedLog:
        rank_lines = len(self.rank_ids) or None
        readable = {r.size_bytes for r in self.rows.values()}
        return ParsedLog(
            source=self.source,
            benchmark=canonical_benchmark(self.benchmark) if self.benchmark else None,
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
        )


def parse_stream(lines: Iterable[str], source: str = "<text>") -> ParsedLog:
    """Parse a log given as lines (an open text file, a generator, a list). Never raises on odd content."""
    parser = LogParser(source)
    for line in lines:
        parser.feed(line)
    return parser.result()


def parse_text(text: str, source: str = "<text>") -> ParsedLog:
    return parse_stream(text.splitlines(), source)


def read_bounded(path: Path, limit: int = MAX_LINE_CHARS) -> Iterator[tuple[str, int]]:
    """(line, its real length in bytes) for each line of `path`, each cut to `limit` bytes.

    The rest of an over-long line is read in `limit`-sized pieces and dropped, so memory stays bounded
    however long a line is. Undecodable bytes (a job killed mid-write) are replaced, not fatal.
    """
    with path.open("rb") as f:
        while chunk := f.readline(limit + 1):
            if len(chunk) <= limit or chunk.endswith(b"\n"):
                yield chunk.decode("utf-8", errors="replace"), len(chunk.rstrip(b"\r\n"))
                continue
            total = len(chunk)
            while (more := f.readline(limit)) and not more.endswith(b"\n"):
                total += len(more)
            total += len(more.rstrip(b"\r\n"))
            yield chunk[:limit].decode("utf-8", errors="replace"), total


def parse_file(path: Path) -> ParsedLog:
    """Parse a log file line by line with bounded lines. Raises OSError only when the file cannot be read."""
    parser = LogParser(str(path))
    for line, length in read_bounded(path):
        parser.feed(line, length)
    return parser.result()
