"""Reading any job or system log as the knowledge base's log detections need it: launcher and log-shipper prefixes
stripped, multi-line messages joined, every entry's pattern tried in one pass over the lines.

What a line looks like depends on who wrote it down: PyTorch prefixes `[rank3]:`, Open MPI `[1,0]<stdout>:`,
`srun -l` `0: `, journald and syslog a date, host and process, the kernel `[ 1843.308145]`, CloudWatch's console a
`| 2025-05-16T16:39:51.208-07:00 |` column. A pattern sees the message without them, and the hit keeps the rank and
the host the prefix (or NCCL's own `host:pid:tid [dev]`) named. Two messages span lines: NCCL prints the cause on the
line after `Last error:`, and the NVIDIA driver continues one message over several `NVRM:` lines; both are also
read joined.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from fmcluster.doctor.knowledge import Entry

MAX_HITS = 5
MAX_EVIDENCE = 240
MAX_PREFIXES = 8
"""Prefixes stripped from one line at most (they nest: CloudWatch column, timestamp, srun label, rank)."""

_RANK_PREFIXES = (
    re.compile(r"\[rank(?P<rank>\d+)\]:\s*"),                      # PyTorch (TORCH_DISTRIBUTED / torchrun)
    re.compile(r"\[(?P<job>\d+),(?P<rank>\d+)\]<std(?:out|err)>:\s*"),  # Open MPI --tag-output
    re.compile(r"(?P<rank>\d+):\s+"),                              # srun --label
)
_PREFIXES = (
    re.compile(r"\|?\s*\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[-+]\d\d:?\d\d)?\s*\|?\s*"),   # CloudWatch / ISO time column
    re.compile(r"\[\d{4}-\d\d-\d\d[T ][\d:.]+\]\s*"),              # [2015-10-09T08:50:15.259] (slurmd), [2026-01-02 10:24:27]
    re.compile(r"\d{4}-[A-Z][a-z]{2}-\d\d \d\d:\d\d:\d\d\.\d+\s+"),    # Neuron runtime: 2023-Aug-01 16:12:43.0204
    re.compile(r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w./-]+(?:\[\d+\])?:\s+"),  # syslog / journald
    re.compile(r"\[\s*\d+\.\d+\]\s*"),                             # kernel ring buffer time
    re.compile(r"\[task [^\]]*\]\s*(?:\[\w+\]\s*)?(?:\[[\w-]+\((?:stdout|stderr)\)\]\s*)?"),  # task runners
    re.compile(r"\[\d+\]\s+(?=\[)"),                               # a log viewer's line number before a rank
    re.compile(r"\[[EWIF](?:\d{3,4} [\d:.]+(?: \d+)?)? ?[\w./-]+:\d+\]\s*"),  # c10/glog: [E321 02:07:08.408 ProcessGroupNCCL.cpp:607]
    re.compile(r"kernel:\s+"),
    re.compile(r"\d{1,3}(?:\.\d{1,3}){3}:\s+"),                    # pdsh / mpirun host tags
)
_NCCL_HOST = re.compile(r"^(?P<host>[\w.-]+):\d+:\d+ \[\d+\]")
_SLURM_HOST = re.compile(r"(?:failed on node |\[\[)(?P<host>[\w.-]+)")
_LAST_ERROR = re.compile(r"Last error:\s*$")
_NVRM = re.compile(r"^NVRM:\s*(?!Xid)(?P<rest>.*)")


@dataclass(frozen=True)
class LogLine:
    number: int
    text: str
    """The message without its prefixes."""
    rank: str = ""
    host: str = ""

    @property
    def where(self) -> str:
        return f"{self.number}" + (f" (rank {self.rank})" if self.rank else "") + (f" on {self.host}" if self.host else "")


@dataclass(frozen=True)
class Hit:
    where: str
    evidence: str
    line: int = 0
    """The log line it was read on (0: not a log line)."""


def short(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= MAX_EVIDENCE else one[:MAX_EVIDENCE - 3] + "..."


def strip_prefixes(raw: str, number: int) -> LogLine:
    """One raw line as a message: prefixes off, the rank and host they named kept."""
    text, rank = raw.strip(), ""
    for _ in range(MAX_PREFIXES):
        match = next((m for p in _PREFIXES if (m := p.match(text)) and m.end() > 0), None)
        rank_match = None if match else next((m for p in _RANK_PREFIXES if (m := p.match(text))), None)
        if rank_match:
            rank = rank or rank_match.group("rank")
        match = match or rank_match
        if not match:
            break
        text = text[match.end():].lstrip()
    host = next((m.group("host") for p in (_NCCL_HOST, _SLURM_HOST) if (m := p.search(text))), "")
    return LogLine(number, text, rank, host)


def logical_lines(text: str) -> Iterator[LogLine]:
    """Every line as a message, then the joined ones: `Last error:` with the line after it, and a run of `NVRM:`
    continuation lines as one message (numbered where they start)."""
    after_last_error: LogLine | None = None
    nvrm: list[LogLine] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = strip_prefixes(raw, number)
        yield line
        if after_last_error is not None and line.text:
            yield LogLine(after_last_error.number, f"{after_last_error.text} {line.text}", after_last_error.rank or
                          line.rank, after_last_error.host or line.host)
            after_last_error = None
        if _LAST_ERROR.search(line.text):
            after_last_error = line
        if _NVRM.match(line.text):
            nvrm.append(line)
            continue
        yield from _joined_nvrm(nvrm)
        nvrm = []
    yield from _joined_nvrm(nvrm)


def _joined_nvrm(run: list[LogLine]) -> Iterator[LogLine]:
    if len(run) > 1:
        rest = " ".join(m.group("rest") for line in run if (m := _NVRM.match(line.text)))
        yield LogLine(run[0].number, f"NVRM: {rest}", run[0].rank, run[0].host)


def scan(entries: Sequence[Entry], logs: Mapping[str, str]) -> dict[str, list[Hit]]:
    """entry id → where its log pattern matched, in one pass over each log's lines; an entry whose `unless` line is
    in a log is silent for that log."""
    patterns = [(e.id, re.compile(e.log_pattern)) for e in entries if e.log_pattern]
    vetoes = [(e.id, re.compile(e.unless)) for e in entries if e.log_pattern and e.unless]
    found: dict[str, list[Hit]] = {}
    for name, text in sorted(logs.items()):
        hits: dict[str, list[Hit]] = {}
        vetoed: set[str] = set()
        for line in logical_lines(text):
            for entry_id, pattern in patterns:
                if len(hits.get(entry_id, ())) < MAX_HITS and pattern.search(line.text):
                    hits.setdefault(entry_id, []).append(Hit(f"{name}:{line.where}", short(line.text), line.number))
            vetoed.update(entry_id for entry_id, veto in vetoes if veto.search(line.text))
        for entry_id, entry_hits in hits.items():
            if entry_id not in vetoed:
                found.setdefault(entry_id, []).extend(entry_hits)
    return found


def explained(fired: Sequence[Entry]) -> dict[str, str]:
    """entry id → the id of a fired entry that explains it (its finding is a symptom of that cause)."""
    ids = {e.id for e in fired}
    return {symptom: cause.id for cause in fired for symptom in cause.explains if symptom in ids}
