"""XID events in the kernel log since boot, classified by src/fmcluster/data/xid.yml.

The NVIDIA driver logs `NVRM: Xid (PCI:0000:53:00): 79, pid=..., GPU has fallen off the bus.` to the kernel
ring buffer. The health program reads /dev/kmsg (one record per read(), each with a sequence number) and keeps,
per boot, the XIDs it has seen and the last sequence number read: so an XID is remembered after the ring buffer
overwrote it, and records overwritten *before* they were read are noticed (a gap in the numbers). Such a gap
fails the check until the next boot: absence of XIDs can no longer be shown (fail closed).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)")


@dataclass(frozen=True)
class Record:
    seq: int
    message: str


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str
    seq: int
    text: str


def parse_record(raw: str) -> Optional[Record]:
    """One /dev/kmsg record: `prio,seq,usec,flags[,...];message` (continuation lines start with a space)."""
    head, sep, message = raw.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 3 or not fields[1].strip().isdigit():
        return None
    return Record(int(fields[1]), message.split("\n", 1)[0].rstrip())


def read_kmsg(path: str) -> List[Record]:
    """Every record still in the kernel's ring buffer (a character device), or in a recorded dump (a file
    with one record per line, as `cat /dev/kmsg` prints them). OSError propagates: the caller fails closed."""
    if stat.S_ISCHR(os.stat(path).st_mode):
        return list(_read_device(path))
    records = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.startswith(" "):
                continue  # a dictionary line of the previous record
            record = parse_record(line)
            if record is not None:
                records.append(record)
    return records


def _read_device(path: str) -> Iterable[Record]:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                return
            except OSError as err:
                if err.errno == errno.EPIPE:  # overwritten while we read: the sequence numbers show the gap
                    continue
                raise
            if not chunk:
                return
            record = parse_record(chunk.decode("utf-8", "replace"))
            if record is not None:
                yield record
    finally:
        os.close(fd)


def xid_events(records: Iterable[Record]) -> List[XidEvent]:
    events = []
    for record in records:
        match = XID_RE.search(record.message)
        if match:
            events.append(XidEvent(int(match.group(2)), match.group(1), record.seq, match.group(3)[:200]))
    return events


@dataclass
class Scan:
    """The XIDs of this boot so far, and whether every record since boot was read."""

    events: List[XidEvent]
    lost: Optional[Tuple[int, int]]  # first and last sequence number overwritten before being read


def scan(records: List[Record], state: Mapping[str, Any], boot_id: str) -> Tuple[Scan, Dict[str, Any]]:
    """Merge this read with the state of earlier runs of the same boot; return the scan and the new state."""
    same_boot = state.get("boot_id") == boot_id
    last_seq: Optional[int] = state.get("last_seq") if same_boot else None
    known = [XidEvent(**e) for e in state.get("events", [])] if same_boot else []
    lost: Optional[Tuple[int, int]] = None
    if same_boot and state.get("lost"):
        lost = (int(state["lost"][0]), int(state["lost"][1]))
    if records:
        first = min(r.seq for r in records)
        expected = 0 if last_seq is None else last_seq + 1
        if first > expected and lost is None:
            lost = (expected, first - 1)
        fresh = [r for r in records if last_seq is None or r.seq > last_seq]
        seen = {e.seq for e in known}
        known += [e for e in xid_events(fresh) if e.seq not in seen]
        last_seq = max([r.seq for r in records] + ([last_seq] if last_seq is not None else []))
    new_state = {"boot_id": boot_id, "last_seq": last_seq, "events": [e.__dict__ for e in known],
                 "lost": list(lost) if lost else None}
    return Scan(known, lost), new_state


@dataclass(frozen=True)
class XidRule:
    xid: int
    name: str
    action: str
    why: str
    source: str


class XidTable:
    """src/fmcluster/data/xid.yml as loaded (the `xids` document, from YAML or from the node's JSON config)."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.rules = {int(r["xid"]): XidRule(int(r["xid"]), str(r["name"]), str(r["action"]), str(r.get("why", "")),
                                             str(r.get("source", ""))) for r in doc.get("xids", [])}
        self.unknown_action = str(doc.get("unknown_action", "drain"))
        self.sources: Dict[str, str] = dict(doc.get("sources", {}))

    def action(self, xid: int) -> str:
        rule = self.rules.get(xid)
        return rule.action if rule else self.unknown_action

    def describe(self, xid: int) -> str:
        rule = self.rules.get(xid)
        return rule.name if rule else "not in fmcluster's XID table"


def load_state(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            loaded = json.load(handle)
        return loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        return {}
