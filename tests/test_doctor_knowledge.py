"""The knowledge base is valid data whose every detection refers to a check that exists, fires on its recorded
input (tests/fixtures/doctor/cases.yml) and stays silent on a healthy cluster's evidence; docs/doctor.md lists
every entry from the data file."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from fmcluster.doctor import docs, knowledge
from fmcluster.doctor.detect import Evidence, detect, findings
from fmcluster.doctor.report import judge_log

CASES: dict[str, Any] = yaml.safe_load((ROOT / "tests" / "fixtures" / "doctor" / "cases.yml").read_text())
ENTRIES = knowledge.by_id()


def evidence(raw: dict[str, Any]) -> Evidence:
    ev = Evidence(reports=copy.deepcopy(raw.get("reports", {})), logs=dict(raw.get("logs", {})),
                  sinfo=raw.get("sinfo"), targets=raw.get("targets"),
                  facts={k: [(str(w), str(v)) for w, v in values] for k, values in raw.get("facts", {}).items()})
    for path, instance_type, *bound in raw.get("log_files", []):
        full = ROOT / "tests" / "fixtures" / path
        if bound:
            ev.verdicts[path] = _judge_with(full, instance_type, **bound[0])
        else:
            _, ev.verdicts[path] = judge_log(full, instance_type=instance_type)
        ev.logs[path] = full.read_bytes().decode("utf-8", "replace")
    for path in raw.get("texts", []):
        ev.logs[path] = (ROOT / "tests" / "fixtures" / path).read_text(encoding="utf-8")
    return ev


def _judge_with(path: Path, instance_type: str | None, max_bytes: int = 4 << 30,
                require_data_check: bool = False) -> Any:
    """judge_log with options doctor does not take: a lower byte bound (the parser's 4 GiB is too large for a
    fixture) or the deploy gate's required data check."""
    from fmcluster.acceptance.expectation import resolve_expectation
    from fmcluster.acceptance.parser import LogParser, LogReader
    from fmcluster.acceptance.verdict import judge
    from fmcluster.catalog import load_catalog

    reader, parser = LogReader(path, max_bytes=max_bytes), LogParser(str(path))
    for line, length in reader:
        parser.feed(line, length)
    log = parser.result(encoding=reader.encoding, bytes_capped=reader.capped)
    found = resolve_expectation(log, load_catalog(), instance_type=instance_type,
                                require_data_check=require_data_check)
    return judge(log, found.expectation, not_judged_reason=found.reason)


HEALTHY = evidence(CASES["healthy"])


def test_the_knowledge_base_is_valid_with_at_least_twenty_sourced_entries() -> None:
    raw = knowledge.load_raw()
    assert knowledge.problems(raw) == []
    assert len(ENTRIES) >= 20
    for entry in ENTRIES.values():
        assert entry.url.startswith("https://"), entry.id


@pytest.mark.parametrize("broken, message", [
    (lambda raw: raw["entries"][0].pop("fix"), "'fix' is a required property"),
    (lambda raw: raw["entries"][0]["detect"].update(kind="psychic"), "entries/0/detect"),
    (lambda raw: raw["entries"][0].update(source="nowhere"), "source 'nowhere' is not in `sources`"),
    (lambda raw: raw["entries"][13]["detect"].update(check="no-such-check"), "no health check 'no-such-check'"),
    (lambda raw: raw["entries"][0]["detect"].update(code="no_such_code"), "no acceptance finding 'no_such_code'"),
    (lambda raw: raw["entries"][-1]["detect"].update(fact="vibes"), "doctor gathers no fact 'vibes'"),
    (lambda raw: raw["entries"][1].update(id=raw["entries"][0]["id"]), "duplicate id"),
    (lambda raw: raw["sources"].update({"nccl-env": "a page somewhere"}), "does not match"),
])
def test_a_broken_entry_is_refused_with_where_and_why(broken: Any, message: str) -> None:
    raw = knowledge.load_raw()
    assert raw["entries"][13]["detect"]["kind"] == "health"
    broken(raw)
    assert any(message in p for p in knowledge.problems(raw)), knowledge.problems(raw)


def test_every_entry_has_a_recorded_input_and_every_input_an_entry() -> None:
    assert set(CASES["fires"]) == set(ENTRIES)


@pytest.mark.parametrize("entry_id", sorted(ENTRIES))
def test_each_entry_fires_on_its_recorded_input_and_stays_silent_on_a_healthy_cluster(entry_id: str) -> None:
    entry = ENTRIES[entry_id]
    hits = detect(entry, evidence(CASES["fires"][entry_id]))
    assert hits, f"{entry_id} ({entry.reference}) did not fire on its recorded input"
    assert all(h.where and h.evidence for h in hits)
    assert detect(entry, HEALTHY) == [], f"{entry_id} fired on the healthy cluster"


def test_a_healthy_cluster_has_no_finding_at_all() -> None:
    assert findings(ENTRIES, HEALTHY) == []


def test_evidence_that_was_not_read_is_silent_not_a_pass() -> None:
    """Absent evidence fires nothing; it is the gatherer's job to say it could not read it (a fact)."""
    assert findings(ENTRIES, Evidence()) == []
    with pytest.raises(KeyError):
        Evidence().add_fact("not-a-fact", "x", "y")


def test_docs_doctor_md_lists_every_entry_from_the_data_file() -> None:
    page = (ROOT / "docs" / "doctor.md").read_text()
    assert docs.render_page(page) == page, "run: .venv/bin/python -m fmcluster.doctor.docs"
    for entry_id in ENTRIES:
        assert f"`{entry_id}`" in page


def test_a_real_health_run_s_report_is_what_the_health_entries_read(tmp_path: Path) -> None:
    """The node program's own report (munged down, /fsx gone), not a hand-written one, fires the entries."""
    from health_helpers import Recorded, healthy_answers, p5_config

    from fmcluster.health import engine

    config = p5_config(tmp_path)
    (tmp_path / "mountinfo").write_text("22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n")
    answers = healthy_answers()
    answers[("munge", "-n")] = ("", 1, "munge: Error: Failed to access \"/run/munge/munge.socket.2\": No such file")
    report = engine.run_checks(config, "manual", "gpu-1", Recorded(answers), ["munge", "mounts"]).as_dict()
    fired = {f.entry.id for f in findings(ENTRIES, Evidence(reports={"gpu-1": report}))}
    assert fired == {"munged-down", "fsx-not-mounted"}
