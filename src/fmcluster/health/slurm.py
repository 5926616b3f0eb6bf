"""Slurm's view, from its commands' text output (Slurm 22.05 as Debian ships it; the text formats have been
stable for years, unlike the JSON shapes): `scontrol show node`, `sinfo -R`, `squeue`; drain and resume."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from fmcluster.health import REASON_PREFIX

#: Keys whose value runs to the end of the line in `scontrol show node` (they may contain spaces and '=').
LINE_KEYS = ("OS", "Reason", "Comment", "Extra")
#: State flags (after '+') that take a node out of scheduling.
DRAIN_FLAGS = ("DRAIN",)
BUSY_STATES = ("ALLOCATED", "MIXED", "COMPLETING")


@dataclass
class Node:
    name: str
    state: str  # base state, upper case: IDLE, ALLOCATED, MIXED, DOWN, UNKNOWN, ...
    flags: Tuple[str, ...]  # DRAIN, NOT_RESPONDING, COMPLETING, ...
    address: str = ""
    partitions: Tuple[str, ...] = ()
    reason: str = ""
    reason_by: str = ""
    reason_time: str = ""
    cpus_alloc: int = 0
    cpus_total: int = 0
    slurmd_start: str = ""
    fields: Dict[str, str] = field(default_factory=dict)

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    @property
    def ours(self) -> bool:
        """Drained (or down) with a reason the health program wrote."""
        return self.reason.startswith(REASON_PREFIX)

    @property
    def display_state(self) -> str:
        """One word, as sinfo's %T prints it: drained / draining / down / idle / allocated / mixed ..."""
        if self.drained:
            return "draining" if self.state in BUSY_STATES or "COMPLETING" in self.flags else "drained"
        return self.state.lower()


def _state(value: str) -> Tuple[str, Tuple[str, ...]]:
    parts = [p for p in value.split("+") if p]
    if not parts:
        return "UNKNOWN", ()
    base = parts[0].rstrip("*~#!%$@^-")
    return base.upper(), tuple(p.upper() for p in parts[1:])


_REASON_TAIL = re.compile(r"^(.*?)\s*\[([^@\]]+)@([^\]]+)\]\s*$")


def _node(fields: Dict[str, str]) -> Node:
    state, flags = _state(fields.get("State", "UNKNOWN"))
    reason, by, when = fields.get("Reason", ""), "", ""
    match = _REASON_TAIL.match(reason)
    if match:
        reason, by, when = match.group(1), match.group(2), match.group(3)
    partitions = tuple(p for p in fields.get("Partitions", "").split(",") if p)

    def number(key: str) -> int:
        return int(fields[key]) if fields.get(key, "").isdigit() else 0

    return Node(fields.get("NodeName", "?"), state, flags, fields.get("NodeAddr", ""), partitions, reason, by, when,
                number("CPUAlloc"), number("CPUTot"), fields.get("SlurmdStartTime", ""), fields)


def parse_show_node(text: str) -> List[Node]:
    """Nodes from `scontrol show node` (one block per node) or `scontrol -o show node` (one line per node)."""
    nodes: List[Node] = []
    current: Optional[Dict[str, str]] = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("NodeName="):
            if current is not None:
                nodes.append(_node(current))
            current = {}
        if current is None:
            continue
        _parse_line(line, current)
    if current is not None:
        nodes.append(_node(current))
    return nodes


def _parse_line(line: str, out: Dict[str, str]) -> None:
    # Walk tokens; a LINE_KEYS key takes the rest of the line, except that on a one-line (-o) record the
    # value ends where the next known key starts.
    tokens = line.split(" ")
    i = 0
    while i < len(tokens):
        token = tokens[i]
        key, eq, value = token.partition("=")
        if not eq or not key.replace("_", "").isalnum():
            i += 1
            continue
        if key in LINE_KEYS:
            rest = [value]
            j = i + 1
            while j < len(tokens) and not _starts_field(tokens[j], key):
                rest.append(tokens[j])
                j += 1
            out[key] = " ".join(rest).strip()
            i = j
            continue
        out[key] = value
        i += 1


_KNOWN_AFTER = {"OS": ("RealMemory=",), "Comment": ("Extra=", "RealMemory="), "Extra": ("RealMemory=",),
                "Reason": ()}


def _starts_field(token: str, key: str) -> bool:
    """Whether a one-line record's LINE_KEYS value ends before `token` (Reason always runs to the end)."""
    return any(token.startswith(k) for k in _KNOWN_AFTER.get(key, ()))


def expand_hostlist(expr: str) -> List[str]:
    """`cpu-[1-3,5],gpu-1` → [cpu-1, cpu-2, cpu-3, cpu-5, gpu-1] (Slurm's hostlist syntax, zero padding kept)."""
    names: List[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expr):
        match = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
        if not match:
            if part:
                names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            lo, _, hi = item.partition("-")
            if hi:
                width = len(lo)
                for n in range(int(lo), int(hi) + 1):
                    names.extend(expand_hostlist(f"{prefix}{n:0{width}d}{suffix}"))
            else:
                names.extend(expand_hostlist(f"{prefix}{lo}{suffix}"))
    return names


@dataclass(frozen=True)
class ReasonLine:
    reason: str
    user: str
    time: str
    nodes: Tuple[str, ...]


def parse_sinfo_reasons(text: str) -> List[ReasonLine]:
    """`sinfo -R` as printed by default (REASON USER TIMESTAMP NODELIST; the reason truncated to 20 characters)
    or with `-o '%E|%U|%H|%N'` (full reason). The header line is skipped."""
    lines = []
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("REASON"):
            continue
        if "|" in raw:
            reason, user, when, nodes = (raw.rsplit("|", 3) + ["", "", ""])[:4]
        else:
            match = re.match(r"^(.{1,20}?)\s+(\S+)\s+(\d{4}-\d\d-\d\dT\S+|Unknown)\s+(\S+)\s*$", raw)
            if not match:
                continue
            reason, user, when, nodes = match.groups()
        user = re.sub(r"\(\d+\)$", "", user.strip())
        lines.append(ReasonLine(reason.strip(), user, when.strip(), tuple(expand_hostlist(nodes.strip()))))
    return lines


@dataclass(frozen=True)
class Job:
    job_id: str
    partition: str
    state: str


def parse_squeue(text: str) -> List[Job]:
    """`squeue --noheader --all --array --format=%i|%P|%T` lines."""
    jobs = []
    for raw in text.splitlines():
        parts = raw.strip().split("|")
        if len(parts) >= 3 and parts[0]:
            jobs.append(Job(parts[0], parts[1], parts[2].lower()))
    return jobs


SQUEUE_FORMAT = "%i|%P|%T"


def drain_argv(scontrol: Sequence[str], node: str, reason: str) -> List[str]:
    """Arguments (never a shell line: a reason is data) that drain `node` with `reason`."""
    return [*scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason}"]


def resume_argv(scontrol: Sequence[str], node: str) -> List[str]:
    return [*scontrol, "update", f"nodename={node}", "state=resume"]


def reason_check(reason: str) -> Optional[Tuple[str, str]]:
    """(check, detail) of a reason the health program wrote, else None."""
    if not reason.startswith(REASON_PREFIX):
        return None
    check, _, detail = reason[len(REASON_PREFIX):].strip().partition(":")
    return check.strip(), detail.strip()


def same_check(current: str, wanted: str) -> bool:
    """Whether two reasons are the same, or both the health program's for the same check."""
    a, b = reason_check(current), reason_check(wanted)
    return current == wanted or (a is not None and b is not None and a[0] == b[0])


#: Errors a Slurm client prints when slurmctld closed the connection on it: on a node whose munge key differs
#: from the controller's, every RPC ends like this (measured on Slurm 22.05: "Zero Bytes were transmitted or
#: received"; slurmctld logs "Protocol authentication error").
REJECTED = ("Zero Bytes were transmitted or received", "Protocol authentication error",
            "Invalid authentication credential")
UNREACHABLE = ("Unable to contact slurm controller", "Connection refused", "Connection timed out")
