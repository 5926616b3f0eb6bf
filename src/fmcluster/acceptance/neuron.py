"""AWS Neuron's collective benchmark, nccom-test: what its output looks like and what a Trainium run must show.

Source for every format fact here: AWS Neuron, "NCCOM-TEST User Guide"
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-sys-tools/nccom-test.html; the page's source
is tools/neuron-sys-tools/nccom-test.rst in github.com/aws-neuron/aws-neuron-sdk):

- the command: `nccom-test -r <workers> [-N <nodes>] [-b/-e/-f sizes] [-d type] [-c|--check] <operation>
  [--hosts h1 h2 ...]`; the operations `all_reduce`/`allr`, `all_gather`/`allg`, `all_gatherv`/`allgv`,
  `reduce_scatter`/`redsct`, `sendrecv`, `alltoall`, `alltoallv`, `permute`; `-N` defaults to 1;
- one table, one half (no in-place run): `size(B) count(elems) type time(us) algbw(GB/s) busbw(GB/s)`, later
  releases `time:avg(us)` and, with `--stats`, one `time:<stat>(us)` column per statistic, with
  `--show-input-output-size` `total_input_size(B) total_output_size(B)`, with `--show-algorithm` an `algorithm`
  column; then `Avg bus bandwidth:      40.6901GB/s` (no `#`, unlike nccl-tests);
- failures: `Neuron DKMS Driver is not running! ...` before any table, or a row that reads
  `33554432    Failure running neuron-bench - log file /tmp/nccom_test_log_....log` and `1 errors found - test
  failed`;
- `--check` verifies every result (pseudo-random data against a golden output computed on the CPU); there is no
  per-row check column, a failed check fails the test;
- bus factors: All-Reduce 2(r-1)/r; All-Gather, Reduce-Scatter, All-to-All, All-to-Allv (r-1)/r; Send-Receive and
  Permute 1 (its "Bus Bandwidth Calculation" table).

The parser (fmcluster.acceptance.parser) feeds lines to `NccomBuilder`; the verdict (`verdict.judge`) judges the
`NccomRun` it builds against an Expectation whose `tool` is "nccom-test" (`expectation_for` on a Neuron type).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from fmcluster.acceptance.model import NccomCommand, NccomRow, NccomRun
from fmcluster.catalog import PublicFigure

OPERATIONS: dict[str, str] = {
    "all_reduce": "all_reduce", "allr": "all_reduce", "all_gather": "all_gather", "allg": "all_gather",
    "all_gatherv": "all_gatherv", "allgv": "all_gatherv", "reduce_scatter": "reduce_scatter",
    "redsct": "reduce_scatter", "sendrecv": "sendrecv", "alltoall": "alltoall", "alltoallv": "alltoallv",
    "permute": "permute",
}
"""nccom-test's operation arguments and the collective each runs (its CLI's `<cc operation>`)."""

BUS_FACTORS: dict[str, str] = {
    "all_reduce": "2(r-1)/r", "all_gather": "(r-1)/r", "reduce_scatter": "(r-1)/r", "alltoall": "(r-1)/r",
    "alltoallv": "(r-1)/r", "sendrecv": "1", "permute": "1",
}
"""The user guide's "Bus Bandwidth Calculation" table (all_gatherv has no entry there: its busbw is not checked)."""


def bus_factor(operation: str | None, ranks: int | None) -> float | None:
    """busbw / algbw for `operation` over `ranks` workers, per nccom-test's own table; None when not known."""
    rule = BUS_FACTORS.get(operation or "")
    if rule is None or not ranks or ranks < 1:
        return None
    if rule == "1":
        return 1.0
    share = (ranks - 1) / ranks
    return 2 * share if rule.startswith("2") else share


GIB = float(1 << 30)
"""nccom-test's 2023 releases printed algbw and busbw in GiB/s (the user guide still says "gibibytes"); later ones
print decimal GB/s. `units` tells which from a row's own size and time."""


def units(row: NccomRow) -> tuple[tuple[str, float], ...]:
    """(unit, bytes per printed unit) candidates for a row, the one its algbw matches best first."""
    if row.time_us <= 0:
        return (("GB/s", 1e9), ("GiB/s", GIB))
    decimal = row.size_bytes / (row.time_us * 1e3)
    binary = row.size_bytes / (row.time_us * 1e-6) / GIB
    if abs(binary - row.algbw_gbps) < abs(decimal - row.algbw_gbps):
        return (("GiB/s", GIB), ("GB/s", 1e9))
    return (("GB/s", 1e9), ("GiB/s", GIB))


# --- the command line --------------------------------------------------------------------------------------------

_VALUE_OPTIONS = frozenset({
    "-r", "--nworkers", "-N", "--nnodes", "-b", "--minbytes", "-e", "--maxbytes", "-i", "--stepbytes", "-f",
    "--stepfactor", "-n", "--iters", "-w", "--warmup_iters", "-I", "--neff_iters", "-W", "--neff_warmup_iters", "-d",
    "--datatype", "--seed", "--coalesced-cc-size-ratio", "--variable-size-op-metadata", "--mpi-log-dir",
    "--hosts-file", "-u", "--slurm-vcpus-per-node", "--slurm-setup-script", "--slurm-job-id", "--report-to-json-file",
    "--input-shape", "--output-shape", "--cc-dim", "--data-parallel-dimension", "--custom-replica-groups",
    "--custom-src-target-pairs", "--streams-json", "--data-collector-port", "--data-collector-host",
})
_LIST_OPTIONS = frozenset({"-s", "--hosts", "-t", "--stats"})
_GROUP_OPTIONS = frozenset({"--data-parallel-dimension", "--custom-replica-groups", "--streams-json"})
_CHECK_MODES = frozenset({"random", "all_ones"})


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def parse_command(line: str, line_no: int = 0) -> NccomCommand | None:
    """The nccom-test invocation on `line` (after env assignments, `+ ` of `set -x`, a prompt, a `#` echo), or None
    when the line only mentions nccom-test (prose, a path): a command names an operation or a worker count."""
    try:
        tokens = shlex.split(line, comments=False, posix=True)
    except ValueError:
        tokens = line.split()
    start = next((i for i, t in enumerate(tokens) if t == "nccom-test" or t.endswith("/nccom-test")), None)
    if start is None:
        return None
    args = tokens[start + 1:]
    values: dict[str, str] = {}
    hosts: list[str] = []
    operation: str | None = None
    check = groups = False
    i = 0
    while i < len(args):
        arg = args[i]
        name, _, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in ("-c", "--check"):
            check = True
            if i + 1 < len(args) and args[i + 1] in _CHECK_MODES:
                i += 1
        elif name in _VALUE_OPTIONS:
            value = inline or (args[i + 1] if i + 1 < len(args) and not inline else "")
            if not inline:
                i += 1
            values[name] = value
            groups = groups or name in _GROUP_OPTIONS
        elif name in _LIST_OPTIONS:
            taken = [inline] if inline else []
            while i + 1 < len(args) and not args[i + 1].startswith("-") and args[i + 1] not in OPERATIONS:
                i += 1
                taken.append(args[i])
            if name in ("-s", "--hosts"):
                hosts += taken
        elif arg in OPERATIONS and operation is None:
            operation = OPERATIONS[arg]
        i += 1
    ranks = _int(values.get("-r") or values.get("--nworkers"))
    nodes_text = values.get("-N") or values.get("--nnodes")
    if operation is None and ranks is None:
        return None
    return NccomCommand(text=line.strip()[:500], operation=operation, ranks=ranks,
                        nodes=1 if nodes_text is None else _int(nodes_text), check=check,
                        datatype=values.get("-d") or values.get("--datatype"), hosts=tuple(hosts[:64]),
                        replica_groups=groups, line_no=line_no)


# --- the table ---------------------------------------------------------------------------------------------------

HEADER = re.compile(r"^\s*size\(B\)\s+count\(elems\)\s.*\btype\s.*\btime[:\w]*\(us\)")
FOOTER = re.compile(r"^\s*Avg bus bandwidth:\s*(?P<value>[^\sG]+)\s*(?:GB/s)?\s*$")
FAILURE = re.compile(r"Failure running neuron-bench|\b\d+ errors? found - test failed|Neuron DKMS Driver is not running|"
                     r"nccom-test: error|[Cc]orrectness check failed|[Gg]olden (?:check|comparison) failed")
_ROW_START = re.compile(r"^\s*\d+\s+\S")
_IDENT = re.compile(r"[A-Za-z_]\w*")
MAX_ROWS = 10_000


def _resolution(token: str) -> float:
    """Half the last printed digit of a time cell."""
    decimals = len(token.split(".", 1)[1]) if "." in token else 0
    return 0.5 * 10.0 ** -decimals


class NccomBuilder:
    """Incremental reader of nccom-test output; bounded like the rest of the parser."""

    def __init__(self) -> None:
        self.commands: list[NccomCommand] = []
        self.columns: list[str] = []
        self.rows: dict[tuple[int, str], NccomRow] = {}
        self.tables = self.garbled = self.duplicates = 0
        self.unreadable: list[int] = []
        self.failures: list[str] = []

    @property
    def seen(self) -> bool:
        return bool(self.commands or self.columns or self.failures)

    def command(self, cmd: NccomCommand) -> None:
        if len(self.commands) < 20:
            self.commands.append(cmd)

    def header(self, line: str) -> None:
        self.tables += 1
        self.columns = line.split()

    def failure(self, line: str) -> None:
        """A failure line; one in the table's place (`33554432    Failure running neuron-bench ...`) also marks its
        size as run and unreadable."""
        if line not in self.failures and len(self.failures) < 20:
            self.failures.append(line[:500])
        tokens = line.split()
        if self.columns and len(tokens) > 1 and tokens[1] == "Failure":
            self._unreadable(tokens[0])

    def row(self, line: str, line_no: int) -> None:
        """A line that starts with a size, under an nccom-test header."""
        tokens = line.split()
        parsed = self._parse(tokens, line_no) if len(tokens) == len(self.columns) else None
        if parsed is None:
            self.garbled += 1
            self._unreadable(tokens[0])
            return
        key = (parsed.size_bytes, parsed.dtype)
        old = self.rows.get(key)
        if old is not None:
            self.duplicates += 1
            if not parsed.finite or (old.finite and parsed.busbw_gbps < old.busbw_gbps):
                self.rows[key] = parsed  # judge the worst reading of a size, never the best
        elif len(self.rows) < MAX_ROWS:
            self.rows[key] = parsed

    def time_column(self) -> str:
        times = [c for c in self.columns if c.startswith("time")]
        return next((c for c in times if c in ("time(us)", "time:avg(us)")), times[0] if times else "")

    def _parse(self, tokens: list[str], line_no: int) -> NccomRow | None:
        cells = dict(zip(self.columns, tokens))
        time_token = cells.get(self.time_column(), "")
        try:
            size, count = int(cells["size(B)"]), int(cells["count(elems)"])
            time_us, algbw, busbw = float(time_token), float(cells["algbw(GB/s)"]), float(cells["busbw(GB/s)"])
        except (KeyError, ValueError):
            return None
        dtype = cells.get("type", "")
        if size < 0 or count < 0 or not _IDENT.fullmatch(dtype):
            return None
        return NccomRow(size, count, dtype, time_us, algbw, busbw, _resolution(time_token),
                        cells.get("algorithm"), line_no)

    def _unreadable(self, first: str) -> None:
        if first.isdigit() and len(self.unreadable) < 1000 and int(first) not in self.unreadable:
            self.unreadable.append(int(first))

    def build(self) -> NccomRun:
        readable = {r.size_bytes for r in self.rows.values()}
        return NccomRun(commands=tuple(self.commands), columns=tuple(self.columns), time_column=self.time_column(),
                        rows=tuple(self.rows.values()), tables=self.tables,
                        unreadable_sizes=tuple(s for s in self.unreadable if s not in readable),
                        garbled_lines=self.garbled, duplicate_rows=self.duplicates, failures=tuple(self.failures))


def is_row(line: str) -> bool:
    return bool(_ROW_START.match(line))


# --- what a Trainium run must show -------------------------------------------------------------------------------

@dataclass(frozen=True)
class NeuronCores:
    """nccom-test workers (ranks) of one full instance: its NeuronCores, logical ones where they are grouped."""

    per_node: int
    source: str


_TRN1_CORES = NeuronCores(32, "16 Trainium chips x 2 NeuronCore-v2 (AWS Neuron, 'Amazon EC2 Trn1/Trn1n Architecture' "
                              "and 'Trainium Architecture', about-neuron/arch/neuron-hardware/ in aws-neuron-sdk)")
NEURON_CORES: dict[str, NeuronCores] = {
    "trn1.32xlarge": _TRN1_CORES,
    "trn1n.32xlarge": _TRN1_CORES,
    "trn2.48xlarge": NeuronCores(64, "16 Trainium2 chips x 8 NeuronCore-v3 (AWS Neuron, 'Trainium2 Architecture'), "
                                     "2 physical per logical NeuronCore by default on trn2 (NEURON_LOGICAL_NC_CONFIG, "
                                     "nccom-test user guide)"),
}

DOCS_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-sys-tools/nccom-test.html"
PUBLIC_FIGURES: dict[str, dict[str, tuple[PublicFigure, ...]]] = {
    "trn1.32xlarge": {"multi_node": (PublicFigure(
        round(47.09 * GIB / 1e9, 1), 1 << 30, 2,
        "AWS Neuron, nccom-test user guide, 'Multiple Instances Example': all_reduce, 64 ranks on two instances of "
        "32 NeuronCores (trn1, 2023), fp32, 47.09 GiB/s busbw at 1 GiB; the guide says its figures are not kept "
        f"up to date ({DOCS_URL})"),)},
}
"""Public nccom-test figures, in decimal GB/s like every catalog figure (the guide's 47.09 GiB/s is 50.6 GB/s)."""


def public_figures(instance_type: str, node_class: str) -> tuple[PublicFigure, ...]:
    return PUBLIC_FIGURES.get(instance_type, {}).get(node_class, ())
