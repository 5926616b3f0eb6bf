"""The field corpus (tests/fixtures/field_logs/): real logs from public issue threads and owners' documentation, each
with a sidecar that says where it comes from, what the expert found and what doctor must name. Every log is a test:
doctor's log mode names the expected root cause in a finding's title or fix (not only in the echoed evidence), keeps
the findings that cause explains out of the way, and exits 0 on a healthy log. Adding a log here is how a failure
one organization met becomes knowledge for all (docs/doctor.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from fmcluster.commands.diagnose import doctor
from fmcluster.doctor import knowledge
from fmcluster.doctor.report import diagnose_log

CORPUS = ROOT / "tests" / "fixtures" / "field_logs"
LOGS = sorted(CORPUS.glob("*.log"))
SIDECAR_KEYS = {"source", "licence", "trimmed", "cause", "fix", "expect"}
MAX_LOG_LINES = 40
"""Excerpts stay short: the lines a test needs, never a whole log."""


def sidecar(log: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(log.with_suffix(".yml").read_text(encoding="utf-8"))
    return loaded


def diagnosis(log: Path) -> dict[str, Any]:
    lines: list[str] = []
    meta = sidecar(log)
    code = doctor(log=str(log), as_json=True, instance_type=meta.get("instance_type", ""), out=lines.append)
    result: dict[str, Any] = json.loads("\n".join(lines))
    result["exit"] = code
    return result


def test_the_corpus_is_real_sourced_and_large_enough() -> None:
    assert len(LOGS) >= 40
    assert sorted(p.stem for p in CORPUS.glob("*.yml")) == [p.stem for p in LOGS], "a log without a sidecar, or back"
    healthy = [p for p in LOGS if sidecar(p)["expect"].get("healthy")]
    assert len(healthy) >= 2


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_each_sidecar_names_its_source_licence_trimming_cause_and_expectation(log: Path) -> None:
    meta = sidecar(log)
    assert SIDECAR_KEYS <= set(meta), SIDECAR_KEYS - set(meta)
    assert re.match(r"https://\S+$", meta["source"])
    assert all(str(meta[k]).strip() for k in SIDECAR_KEYS)
    expect = meta["expect"]
    assert expect.get("healthy") is True or expect["entry"] in knowledge.by_id(), expect
    assert all(i in knowledge.by_id() for i in expect.get("not", []))
    assert 0 < len(log.read_text(encoding="utf-8").splitlines()) <= MAX_LOG_LINES


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_doctor_names_the_experts_root_cause(log: Path) -> None:
    expect = sidecar(log)["expect"]
    result = diagnosis(log)
    found = {f["id"]: f for f in result["findings"]}
    if expect.get("healthy"):
        assert result["exit"] == 0 and result["healthy"], [f"{f['id']}: {f['evidence']}" for f in result["findings"]]
        return
    assert result["exit"] == 1
    assert expect["entry"] in found, f"expected [{expect['entry']}], got {sorted(found)}; notes: {result['notes']}"
    named = f"{found[expect['entry']]['title']} {found[expect['entry']]['fix']}".lower()
    for words in expect.get("words", []):
        assert words.lower() in named, f"{words!r} not in the finding's title or fix: {named}"
    assert not set(expect.get("not", [])) & set(found), "a symptom of the cause is shown beside it"


def test_a_non_benchmark_log_gets_no_benchmark_findings() -> None:
    """A munge failure in slurmctld's log is not an nccl-tests run: no 'no nccl-tests output', no 'not judged'."""
    result = diagnose_log(CORPUS / "trinity-477-munge-decode.log")
    assert result.acceptance is None
    assert [f.entry.id for f in result.findings] == ["munge-key-mismatch"]
    assert any("not benchmark output" in n for n in result.notes)


def test_the_first_failing_rank_and_its_prefix_free_message_are_the_evidence() -> None:
    result = diagnose_log(CORPUS / "llamafactory-7396-watchdog.log")
    (finding,) = [f for f in result.findings if f.entry.id == "collective-timeout"]
    assert finding.hits[0].where.endswith(":1 (rank 0)")
    assert finding.hits[0].evidence.startswith("[Rank 0] Watchdog caught collective operation timeout")


def test_the_cause_after_last_error_is_read_and_explains_the_remote_error() -> None:
    result = diagnose_log(CORPUS / "nccl-1928-undeliverable.log")
    ids = [f.entry.id for f in result.findings]
    assert ids == ["efa-peer-unreachable"]
    assert "[nccl-peer-gone] not shown: a symptom of [efa-peer-unreachable]" in result.notes


def test_a_plugin_set_nccl_proto_is_not_a_user_override() -> None:
    result = diagnose_log(CORPUS / "training-on-eks-p4d-pods-healthy.log")
    assert result.findings == [] and result.healthy


def test_efa_findings_are_expected_on_an_instance_without_efa_and_flagged_unknown_without_one() -> None:
    log = CORPUS / "aws-ofi-nccl-1020-efa-not-in-container.log"
    unknown = diagnose_log(log)
    assert [f.entry.id for f in unknown.findings] == ["efa-devices-not-visible"]
    assert any("whether this instance has EFA" in n and "--instance-type" in n for n in unknown.notes)
    no_efa = diagnose_log(log, instance_type="m5.xlarge")
    assert no_efa.findings == [] and no_efa.healthy
    assert any("m5.xlarge has no EFA" in n for n in no_efa.notes)


def test_nic_counts_are_judged_against_the_catalog_only_for_an_instance_type_the_user_gave() -> None:
    """The log's own platform line says p4d, but a pod may be given one of its four EFA interfaces on purpose."""
    log = CORPUS / "training-on-eks-p4d-pods-healthy.log"
    assert diagnose_log(log).healthy
    given = diagnose_log(log, instance_type="p4d.24xlarge")
    (finding,) = given.findings
    assert finding.entry.id == "efa-nic-count"
    assert finding.hits[0].where == "llama-3-8b-node-0-0"
    assert "found 1 NIC(s)" in finding.hits[0].evidence and "p4d.24xlarge has 4 EFA interfaces" in finding.hits[0].evidence


def test_the_first_failure_in_the_log_is_named_with_its_rank() -> None:
    result = diagnose_log(CORPUS / "llamafactory-7396-watchdog.log")
    assert any(n.endswith("llamafactory-7396-watchdog.log:1 (rank 0) [collective-timeout]") for n in result.notes)


def test_a_long_log_is_read_at_both_ends_and_never_called_healthy_with_its_middle_unread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure of a long training job is usually at its end; what lies between the two ends is noted."""
    from fmcluster.doctor import report

    monkeypatch.setattr(report, "LOG_SCAN_BYTES", 2000)
    monkeypatch.setattr(report, "LOG_TAIL_BYTES", 2000)
    log = tmp_path / "train.out"
    step = "[rank0]: step 100 loss 2.34 lr 0.0001\n"
    oom = (CORPUS / "pytorch-16417-cuda-oom.log").read_text(encoding="utf-8")
    log.write_text(step * 500 + oom, encoding="utf-8")
    result = diagnose_log(log)
    assert [f.entry.id for f in result.findings] == ["cuda-out-of-memory"]
    assert result.findings[0].hits[0].where.startswith(f"{log} (end):")
    log.write_text(step * 500, encoding="utf-8")
    clean = diagnose_log(log)
    assert clean.findings == [] and not clean.healthy
    assert any("in the middle of the log were not read" in n for n in clean.notes)
    short = tmp_path / "short.out"
    short.write_text(step * 10, encoding="utf-8")
    assert diagnose_log(short).healthy
