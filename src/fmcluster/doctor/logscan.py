"""Reading any job or system log as the knowledge base's log detections need it: launcher and log-shipper prefixes
stripped, multi-line messages joined (one pass over the lines), then every entry's pattern run over the result.

What a line looks like depends on who wrote it down: PyTorch prefixes `[rank3]:`, Open MPI `[1,0]<stdout>:`,
`srun -l` `0: `, journald and syslog a date, host and process, the kernel `[ 1843.308145]`, CloudWatch's console a
`| 2025-05-16T16:39:51.208-07:00 |` column. A pattern sees the message without them, and the hit keeps the rank and
the host the prefix (or NCCL's own `host:pid:tid [dev]`) named. Two messages span lines: NCCL prints the cause on the
line after `Last error:`, and the NVIDIA driver continues one message over several `NVRM:` lines; both are also
read joined.
"""

from __future__ import annotations

import re
from bisect import bisect_right
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
_ANY_PREFIX = re.compile("|".join(f"(?:{p.pattern})" for p in _PREFIXES))
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
    parts: tuple[str, ...] = ()
    """For a joined message, the lines it was joined from (each is also read on its own)."""

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
        match = _ANY_PREFIX.match(text)
        match = match if match and match.end() > 0 else None
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
                          line.rank, after_last_error.host or line.host, (after_last_error.text, line.text))
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
        yield LogLine(run[0].number, f"NVRM: {rest}", run[0].rank, run[0].host, tuple(line.text for line in run))


@dataclass(frozen=True)
class Normalized:
    """A log read once: its messages (prefixes off, multi-line messages joined) and the same as one text, so each
    pattern runs over the whole log at the regular-expression engine's speed, not line by line in Python."""

    lines: tuple[LogLine, ...]
    text: str
    starts: tuple[int, ...]
    """Offset of each line in `text`."""

    @classmethod
    def of(cls, raw: str) -> Normalized:
        lines = tuple(logical_lines(raw))
        starts, offset = [], 0
        for line in lines:
            starts.append(offset)
            offset += len(line.text) + 1
        return cls(lines, "\n".join(line.text for line in lines), tuple(starts))

    def matching(self, pattern: re.Pattern[str], limit: int) -> Iterator[LogLine]:
        """The lines the pattern matches within (a match may not run across lines), at most `limit`, in order."""
        anchors = required_literals(pattern.pattern)
        indexes = (self._candidates(anchors) if anchors is not None else self._regex_candidates(pattern))
        found = 0
        for index in indexes:
            if found >= limit:
                return
            line = self.lines[index]
            if pattern.search(line.text) and not any(pattern.search(part) for part in line.parts):
                found += 1
                yield line

    def _line_at(self, offset: int) -> int:
        return bisect_right(self.starts, offset) - 1

    def _next_line(self, index: int) -> int:
        return self.starts[index + 1] if index + 1 < len(self.starts) else len(self.text) + 1

    def _candidates(self, anchors: tuple[str, ...]) -> Iterator[int]:
        """Lines holding one of the literals every match must contain, found with str.find (the fast path)."""
        seen: set[int] = set()
        for anchor in anchors:
            position = 0
            while (offset := self.text.find(anchor, position)) >= 0:
                index = self._line_at(offset)
                seen.add(index)
                position = self._next_line(index)
        yield from sorted(seen)

    def _regex_candidates(self, pattern: re.Pattern[str]) -> Iterator[int]:
        position = 0
        while match := pattern.search(self.text, position):
            index = self._line_at(match.start())
            yield index
            position = self._next_line(index)


_SPECIAL = set("[](){}?*+|^$.")
_MIN_ANCHOR = 4


def required_literals(pattern: str) -> tuple[str, ...] | None:
    """For each top-level alternative of the pattern, the longest literal every match of it contains (text outside
    groups, classes and quantified characters); None when an alternative has none long enough or flags apply, and
    the pattern is then searched as it is."""
    if pattern.startswith("(?") and not pattern.startswith(("(?:", "(?!", "(?=", "(?<")):
        return None
    literals = []
    for branch in _alternatives(pattern):
        runs = _literal_runs(branch)
        best = max(runs, key=len, default="")
        if len(best) < _MIN_ANCHOR:
            return None
        literals.append(best)
    return tuple(literals)


def _alternatives(pattern: str) -> list[str]:
    """The pattern split at its top-level `|`."""
    out: list[str] = []
    current, depth, in_class, escaped = "", 0, False, False
    for char in pattern:
        if escaped or char == "\\":
            escaped = not escaped and char == "\\"
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif char == "|" and depth == 0:
            out.append(current)
            current = ""
            continue
        current += char
    return out + [current]


def _literal_runs(branch: str) -> list[str]:
    """Runs of literal characters outside groups and classes; a character made optional or repeated by a quantifier
    ends the run before it."""
    runs: list[str] = []
    run, depth, in_class, i = "", 0, False, 0
    while i < len(branch):
        char = branch[i]
        if in_class:
            in_class = char != "]" or branch[i - 1] == "\\"
        elif char == "\\" and i + 1 < len(branch):
            nxt = branch[i + 1]
            literal = nxt if not nxt.isalnum() else None
            if literal is not None and depth == 0 and branch[i + 2:i + 3] not in ("?", "*", "{"):
                run += literal
            else:
                runs, run = runs + [run], ""
            i += 2
            continue
        elif char == "[":
            in_class, runs, run = True, runs + [run], ""
        elif char in "()":
            depth += 1 if char == "(" else -1
            runs, run = runs + [run], ""
        elif char == "{":  # a quantifier's bounds are no literal text
            runs, run = runs + [run], ""
            i = branch.find("}", i) + 1 or len(branch)
            continue
        elif char in _SPECIAL or depth > 0:
            runs, run = runs + [run], ""
        elif branch[i + 1:i + 2] in ("?", "*", "{"):
            runs, run = runs + [run], ""
        else:
            run += char
        i += 1
    return runs + [run]


def scan(entries: Sequence[Entry], logs: Mapping[str, str]) -> dict[str, list[Hit]]:
    """entry id → where its log pattern matched: each log is read and normalized once, then every entry's pattern
    runs over it; an entry whose `unless` line is in a log is silent for that log."""
    patterns = [(e, re.compile(e.log_pattern, re.MULTILINE)) for e in entries if e.log_pattern]
    found: dict[str, list[Hit]] = {}
    for name, raw in sorted(logs.items()):
        log = Normalized.of(raw)
        for entry, pattern in patterns:
            if entry.unless and next(log.matching(re.compile(entry.unless, re.MULTILINE), 1), None):
                continue
            found.setdefault(entry.id, []).extend(
                Hit(f"{name}:{line.where}", short(line.text), line.number) for line in log.matching(pattern, MAX_HITS))
    return {entry_id: hits for entry_id, hits in found.items() if hits}


def explained(fired: Sequence[Entry]) -> dict[str, str]:
    """entry id → the id of a fired entry that explains it (its finding is a symptom of that cause)."""
    ids = {e.id for e in fired}
    return {symptom: cause.id for cause in fired for symptom in cause.explains if symptom in ids}
