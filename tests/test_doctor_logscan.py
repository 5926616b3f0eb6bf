"""Reading any log: the prefixes launchers and log shippers put before a message come off (the rank and host they
name are kept), NCCL's `Last error:` and the driver's `NVRM:` continuation lines are also read joined, and the data
behind the log patterns stays consistent with the XID table."""

from __future__ import annotations

import re

import pytest
import yaml

from fmcluster.doctor import knowledge
from fmcluster.doctor.logscan import Normalized, logical_lines, required_literals, strip_prefixes
from fmcluster.paths import DATA_DIR

MESSAGE = "NCCL WARN NET/OFI Initializing plugin failed"


@pytest.mark.parametrize("raw, rank, host", [
    (f"[rank3]: {MESSAGE}", "3", ""),
    (f"[1,12]<stdout>:{MESSAGE}", "12", ""),
    (f"0: {MESSAGE}", "0", ""),
    (f"  | 2025-05-16T16:39:51.208-07:00 | {MESSAGE}", "", ""),
    (f"[2026-01-02 10:24:27] {MESSAGE}", "", ""),
    (f"May 24 07:06:46 login slurmctld[15918]: {MESSAGE}", "", ""),
    (f"[ 1843.308145] {MESSAGE}", "", ""),
    (f"[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] {MESSAGE}", "", ""),
    (f"[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] {MESSAGE}", "0", ""),
    (f"10.3.35.83: {MESSAGE}", "", ""),
])
def test_a_launcher_or_shipper_prefix_comes_off_and_its_rank_is_kept(raw: str, rank: str, host: str) -> None:
    line = strip_prefixes(raw, 7)
    assert (line.text, line.rank, line.host) == (MESSAGE, rank, host)


def test_nccls_own_host_prefix_names_the_host_and_stays_in_the_message() -> None:
    line = strip_prefixes("1: p5-st-p5-2:41238:41250 [0] NCCL WARN NET/OFI Initializing plugin failed", 3)
    assert line.rank == "1" and line.host == "p5-st-p5-2" and line.where == "3 (rank 1) on p5-st-p5-2"


def test_the_line_after_last_error_is_read_with_it() -> None:
    text = "[rank3]: Last error:\n[rank3]: NET/OFI Request completed with error. Error: 2 (UNDELIVERABLE)\n"
    joined = [line.text for line in logical_lines(text)]
    assert "Last error: NET/OFI Request completed with error. Error: 2 (UNDELIVERABLE)" in joined


def test_nvrm_continuation_lines_are_read_as_one_message() -> None:
    text = ("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
            "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
            "               NVRM: fallen off the bus and is not responding to commands.\n")
    lines = list(logical_lines(text))
    assert lines[-1].number == 1
    assert lines[-1].text == ("NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has "
                              "fallen off the bus and is not responding to commands.")


def test_the_xid_log_pattern_leaves_out_exactly_the_xids_the_table_gives_no_action() -> None:
    doc = yaml.safe_load((DATA_DIR / "xid.yml").read_text(encoding="utf-8"))
    none = {int(x["xid"]) for x in doc["xids"] if x["action"] == "none"}
    pattern = knowledge.by_id()["gpu-xid"].log_pattern
    left_out = {int(x) for x in re.search(r"\(\?!\(\?:([\d|]+)\),\)", pattern).group(1).split("|")}  # type: ignore[union-attr]
    assert left_out == none
    matcher = re.compile(pattern)
    for xid in (13, 48, 79, 94, 149):
        hit = matcher.search(f"NVRM: Xid (PCI:0000:9b:00): {xid}, pid=1234, name=python3, message")
        assert bool(hit) == (xid not in none), xid


def test_no_two_entries_explain_each_other() -> None:
    entries = knowledge.by_id()
    for entry in entries.values():
        for symptom in entry.explains:
            assert entry.id not in entries[symptom].explains, (entry.id, symptom)


@pytest.mark.parametrize("raw, literals", [
    (r"Watchdog caught collective operation timeout|Some NCCL operations", ("Watchdog caught collective operation timeout",
                                                                            "Some NCCL operations")),
    (r"mount\.lustre: .* failed", ("mount.lustre: ",)),
    (r"(?:Expired|Rewound) credential|Job credential expired", (" credential", "Job credential expired")),
    (r"NVRM: Xid \([^)]*\): 79,", ("NVRM: Xid (",)),
    (r"abcd?efgh", ("efgh",)),
    (r"x{1023}yz", None),
    (r"ab{2,3}cdef", ("cdef",)),
    (r"(?i)system not yet initialized", None),
    (r"x|[Ss]ys", None),
])
def test_the_literals_every_match_contains_are_found_or_the_pattern_is_searched_as_it_is(
        raw: str, literals: tuple[str, ...] | None) -> None:
    assert required_literals(raw) == literals


def test_the_fast_path_finds_exactly_the_lines_a_line_by_line_search_finds() -> None:
    """Over every field log and every entry: str.find on the required literals, then the pattern on the line, gives
    the same lines as searching every line (a joined message counts only where no line it joins matches alone)."""
    from conftest import ROOT

    for path in sorted((ROOT / "tests" / "fixtures" / "field_logs").glob("*.log")):
        log = Normalized.of(path.read_text(encoding="utf-8"))
        for entry in knowledge.load():
            for raw in filter(None, (entry.log_pattern, entry.unless)):
                pattern = re.compile(raw, re.MULTILINE)
                naive = [line for line in log.lines if pattern.search(line.text)
                         and not any(pattern.search(part) for part in line.parts)][:5]
                assert list(log.matching(pattern, 5)) == naive, (path.name, entry.id)


def test_a_joined_message_is_not_a_second_hit_when_its_own_line_already_matches() -> None:
    text = "[rank3]: Last error:\n[rank3]: NET/OFI Request completed with error. Error: 2 (UNDELIVERABLE)\n"
    hits = list(Normalized.of(text).matching(re.compile("UNDELIVERABLE"), 5))
    assert [(h.number, h.text) for h in hits] == [(2, "NET/OFI Request completed with error. Error: 2 (UNDELIVERABLE)")]
    both = list(Normalized.of(text).matching(re.compile("Last error: NET/OFI"), 5))
    assert [h.number for h in both] == [1]
