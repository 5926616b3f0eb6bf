"""Read nccl-tests output (and the fmcluster CPU bench, which prints the same format) into a ParsedLog.

Tolerant by design: logs come from real jobs, so lines may carry launcher prefixes (`[1,0]<stdout>:` from
Open MPI, `0: ` from `srun -l`, timestamps), ranks' lines interleave or splice, the job may have been
killed, and the file may stop mid-line. The parser never raises on content: it records what it saw and
what was odd (garbled lines, duplicated tables, kill messages) and leaves judging to verdict.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from fmcluster.acceptance.model import Measurement, NetworkInfo, ParsedLog, SizeRow

_PREFIXES = (
    re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:"),  # mpirun --tag-output
    re.compile(r"^\d{4}-\d\d-\d\d[T ][\d:.,]+Z?\s+"),  # log shipper timestamps
    re.compile(r"^\s{0,4}\d{1,5}: "),  # srun --label
)
_LIB_LINE = re.compile(r"\b(?P<lib>NCCL|GLOO) (?P<level>INFO|WARN) (?P<msg>.*)$")
_HOST_PREFIX = re.compile(r"^\s*(?:\S+:\d+:\d+ )?\[\d+\](?: \S+:\d+)? ?$")

_NCCL_VERSION = re.compile(r"NCCL version (\S+)")
_GLOO_VERSION = re.compile(r"^# Using (gloo \(torch [^)]+\))")
_TESTS_VERSION = re.compile(r"^# nccl-tests version (\S+)")
_BENCH_VERSION = re.compile(r"^# fmcluster cpu-bench version (\S+)")
_TEST_START = re.compile(r"^# (?:Collective test starting|fmcluster acceptance job): (\S+)")
_HEADER_KEYS = re.compile(
    r"(nThread|nGpus|minBytes|maxBytes|step:|warmup iters:|iters:|agg iters:|validation:|graph:)\s+(\S+)"
)
_RANK = re.compile(r"^#?\s*Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+\d+\s+on\s+(\S+)\s+device")
_TABLE_HEADER = re.compile(r"^#\s+size\s+count\s+type\s+redop")
_OOB = re.compile(r"^# Out of bounds values\s*:\s*(\d+)")
_AVG = re.compile(r"^# Avg bus bandwidth\s*:\s*([\d.eE+\-]+|nan|inf)")
_ROW_START = re.compile(r"^\s*\d+\s+\d+\s+[A-Za-z]")
_NUMBERS_ONLY = re.compile(r"^\s*[\d.]+(?:\s+[\d.N/A]+){2,}\s*$")  # the tail of a row split by another rank

_USING_NETWORK = re.compile(r"Using network (.+?)\s*$")
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (\S+?)(?:,|\s|$)(?:.*?found (\d+) nics)?")
_OFI_VERSION = re.compile(r"aws-ofi-nccl (?:v)?(\d[\w.\-]*)")
_PLUGIN_MISSING = re.compile(
    r"NET/Plugin\s*:?.*(?:No plugin found|Could not find: libnccl-net|libnccl-net[\w\-]*\.so: cannot open)"
)
_SOCKET_IFACES = re.compile(r"NET/Socket : Using (.*)$")
_IFACE = re.compile(r"\[\d+\]([\w.\-@]+):")
_CONNECTION = re.compile(r"(?:Channel|Ring) \d+(?:/\d+)? : .*? via (.+?)\s*$")
_RING = re.compile(r"^Channel (\d+)(?:/(\d+))? :((?:\s+\d+)+)\s*$")
_COLL_CHANNELS = re.compile(r"^(\d+) coll channels")
_NRANKS = re.compile(r"\bnranks (\d+)\b")

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


def _strip_prefixes(line: str) -> str:
    for pattern in _PREFIXES:
        line = pattern.sub("", line, count=1)
    return line.rstrip("\r\n")


def _number(token: str) -> float:
    return float(token)


def _wrong(token: str) -> tuple[int | None, float | None]:
    """`#wrong` is an integer count; `N/A` when the check was off; old versions printed a max error."""
    if token == "N/A":
        return None, None
    if re.fullmatch(r"\d+", token):
        return int(token), None
    return None, float(token)


def parse_row(line: str) -> SizeRow | None:
    """One size row, with or without the `root` column (nccl-tests < 2.10 had none). None if unreadable."""
    tokens = line.split()
    if len(tokens) not in (12, 13):
        return None
    try:
        size, count = int(tokens[0]), int(tokens[1])
        dtype, redop = tokens[2], tokens[3]
        if not dtype.isidentifier():
            return None
        root: int | None = None
        rest = tokens[4:]
        if len(tokens) == 13:
            root = int(tokens[4])
            rest = tokens[5:]
        halves = []
        for part in (rest[:4], rest[4:]):
            wrong, max_error = _wrong(part[3])
            halves.append(Measurement(_number(part[0]), _number(part[1]), _number(part[2]), wrong, max_error))
    except ValueError:
        return None
    return SizeRow(size, count, dtype, redop, root, halves[0], halves[1])


class _NetworkBuilder:
    def __init__(self) -> None:
        self.network: str | None = None
        self.provider: str | None = None
        self.plugin_version: str | None = None
        self.nics: int | None = None
        self.plugin_missing = False
        self.ifaces: list[str] = []
        self.transports: list[str] = []
        self.rings: dict[int, tuple[int, ...]] = {}
        self.ring_total: int | None = None
        self.coll_channels: int | None = None
        self.trees = 0
        self.warnings: list[str] = []

    def feed(self, level: str, msg: str) -> None:
        if level == "WARN":
            if msg not in self.warnings and len(self.warnings) < 20:
                self.warnings.append(msg)
            return
        if m := _USING_NETWORK.search(msg):
            self.network = m.group(1)
        if m := _OFI_PROVIDER.search(msg):
            self.provider = m.group(1)
            if m.group(2):
                self.nics = int(m.group(2))
        if "NET/OFI" in msg and (m := _OFI_VERSION.search(msg)):
            self.plugin_version = m.group(1)
        if _PLUGIN_MISSING.search(msg):
            self.plugin_missing = True
        if m := _SOCKET_IFACES.search(msg):
            for iface in _IFACE.findall(m.group(1)):
                if iface not in self.ifaces:
                    self.ifaces.append(iface)
        if m := _RING.match(msg):
            channel = int(m.group(1))
            self.rings.setdefault(channel, tuple(int(x) for x in m.group(3).split()))
            if m.group(2):
                self.ring_total = int(m.group(2))
        elif m := _CONNECTION.search(msg):
            transport = m.group(1)
            if transport.startswith("NET/") and transport not in self.transports:
                self.transports.append(transport)
        if m := _COLL_CHANNELS.match(msg):
            self.coll_channels = int(m.group(1))
        if msg.startswith("Trees ") or msg.startswith("Trees["):
            self.trees += 1

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
            plugin_missing=self.plugin_missing,
            socket_interfaces=tuple(self.ifaces),
            transports=tuple(self.transports),
            gdr=gdr,
            channels=channels,
            rings=tuple(self.rings[c] for c in sorted(self.rings)),
            trees=self.trees,
            warnings=tuple(self.warnings),
        )


def parse_lines(lines: Iterable[str], source: str = "<text>") -> ParsedLog:
    """Parse a log given as lines. Never raises on odd content; see ParsedLog's fields for what was odd."""
    net = _NetworkBuilder()
    benchmark = library = tests_version = None
    header: dict[str, str] = {}
    hosts: list[str] = []
    rank_ids: set[int] = set()
    nranks: int | None = None
    rows: dict[tuple[int, str, str], SizeRow] = {}
    avg: float | None = None
    oob: int | None = None
    tables = duplicates = garbled = 0
    errors: list[str] = []
    killed = False

    for raw in lines:
        line = _strip_prefixes(raw)
        if not line.strip():
            continue
        lib = _LIB_LINE.search(line)
        if lib:
            before = line[: lib.start()]
            if before.strip() and not _HOST_PREFIX.match(before):
                garbled += 1  # another rank's text spliced in front of this INFO line
            msg = lib.group("msg")
            if m := _NCCL_VERSION.search(msg):
                library = library or f"NCCL {m.group(1)}"
            if m := _NRANKS.search(msg):
                nranks = max(nranks or 0, int(m.group(1)))
            net.feed(lib.group("level"), msg)
            continue
        if m := _NCCL_VERSION.match(line.strip()):
            library = library or f"NCCL {m.group(1)}"
            continue
        if line.startswith("#"):
            if m := _TESTS_VERSION.match(line):
                tests_version = m.group(1)
            elif m := _BENCH_VERSION.match(line):
                tests_version = f"fmcluster-cpu-bench {m.group(1)}"
            elif m := _GLOO_VERSION.match(line):
                library = m.group(1)
            elif m := _TEST_START.match(line):
                benchmark = m.group(1)
            elif _TABLE_HEADER.match(line):
                tables += 1
            elif m := _OOB.match(line):
                oob = int(m.group(1))
            elif m := _AVG.match(line):
                avg = float(m.group(1))
            elif m := _RANK.match(line):
                rank_ids.add(int(m.group(1)))
                if m.group(2) not in hosts:
                    hosts.append(m.group(2))
            elif "nThread" in line:
                header.update({k.rstrip(":"): v for k, v in _HEADER_KEYS.findall(line)})
            continue
        if m := _RANK.match(line):  # some launchers drop the leading '#'
            rank_ids.add(int(m.group(1)))
            if m.group(2) not in hosts:
                hosts.append(m.group(2))
            continue
        if _ROW_START.match(line):
            row = parse_row(line)
            if row is None:
                garbled += 1
                continue
            key = (row.size_bytes, row.dtype, row.redop)
            if key in rows:
                duplicates += 1
            else:
                rows[key] = row
            continue
        if _NUMBERS_ONLY.match(line):
            garbled += 1
            continue
        stripped = line.strip()
        for pattern in _ERROR_PATTERNS:
            if pattern.search(stripped):
                if stripped not in errors and len(errors) < 20:
                    errors.append(stripped)
                if _KILL.search(stripped):
                    killed = True
                break

    ranks = len(rank_ids) or nranks
    return ParsedLog(
        source=source,
        benchmark=benchmark,
        library=library,
        tests_version=tests_version,
        header=header,
        ranks=ranks,
        hosts=tuple(hosts),
        rows=tuple(rows.values()),
        avg_busbw_gbps=avg,
        out_of_bounds=oob,
        network=net.build(),
        completed=avg is not None,
        tables=tables,
        duplicate_rows=duplicates,
        garbled_lines=garbled,
        errors=tuple(errors),
        killed=killed,
    )


def parse_text(text: str, source: str = "<text>") -> ParsedLog:
    return parse_lines(text.splitlines(), source)


def parse_file(path: Path) -> ParsedLog:
    """Parse a log file; undecodable bytes (a job killed mid-write) are replaced, not fatal."""
    return parse_text(path.read_text(encoding="utf-8", errors="replace"), str(path))
