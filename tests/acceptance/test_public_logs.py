"""Real output from public threads and owners' documentation (tests/acceptance/public_logs/, README.md there): every
sidecar's expected verdict is a test, and the rules these logs pinned are tested on their own.

Issue 37: a healthy alltoall_perf log failed the gate with `data_unchecked`. nccl-tests runs alltoall's (and
sendrecv's) in-place half unchecked (`reportErrors = in_place ? 0 : 1`, src/alltoall.cu) and since 2.13 prints
`N/A` in its `#wrong` cell even with -c 1; the verdict now judges those collectives' data by the out-of-place half
alone, and still fails closed when that one is N/A.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fmcluster.acceptance.expectation import IN_PLACE_UNCHECKED, expectation_for, row_correct
from fmcluster.acceptance.parser import parse_file, parse_text
from fmcluster.acceptance.verdict import Verdict, judge, render
from fmcluster.catalog import load_catalog

PUBLIC = Path(__file__).resolve().parent / "public_logs"
LOGS = sorted(PUBLIC.glob("*.log"))
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"
MAX_LOG_LINES = 40


def sidecar(log: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(log.with_suffix(".yml").read_text(encoding="utf-8"))
    return loaded


def cases() -> list[tuple[str, dict[str, Any]]]:
    return [(log.name, case) for log in LOGS for case in sidecar(log)["expected"]]


def verdict_for(name: str, case: dict[str, Any]) -> Verdict:
    log = parse_file(PUBLIC / name)
    if case["instance_type"] is None:
        return judge(log, None)
    exp = expectation_for(load_catalog()[case["instance_type"]], case["nodes"], collective=case["collective"],
                          require_data_check=case["require_data_check"])
    return judge(log, exp)


def test_every_log_has_a_sourced_sidecar_and_stays_an_excerpt() -> None:
    assert sorted(p.stem for p in PUBLIC.glob("*.yml")) == [p.stem for p in LOGS]
    for log in LOGS:
        meta = sidecar(log)
        assert re.match(r"https://\S+$", meta["source"]), log.name
        assert all(str(meta[k]).strip() for k in ("licence", "trimmed", "shows")), log.name
        assert meta["expected"] and all(c["why"] for c in meta["expected"]), log.name
        assert 0 < len(log.read_text(encoding="utf-8").splitlines()) <= MAX_LOG_LINES, log.name


@pytest.mark.parametrize(("name", "case"), cases(), ids=lambda x: x if isinstance(x, str) else
                         f"{x['instance_type']}x{x['nodes']}-{x['collective']}")
def test_the_verdict_is_the_one_the_sidecar_writes_down(name: str, case: dict[str, Any]) -> None:
    v = verdict_for(name, case)
    why = f"{name}: {case['why']}\n{render(v)}"
    assert v.status == case["status"], why
    failed = {f.code for f in v.failures}
    warned = {f.code for f in v.findings if f.severity == "warn"}
    assert set(case.get("fails", [])) <= failed, why
    assert set(case.get("warns", [])) <= warned, why
    assert not set(case.get("absent", [])) & set(v.codes), why


# --- alltoall's in-place half ---------------------------------------------------------------------------------

def test_alltoall_and_sendrecv_are_the_collectives_nccl_tests_leaves_unchecked_in_place() -> None:
    assert IN_PLACE_UNCHECKED == {"alltoall", "sendrecv"}
    log = parse_file(PUBLIC / "nccl-tests-314-alltoall-h20.log")
    assert all(r.in_place.check == "unchecked" and r.out_of_place.wrong == 0 for r in log.rows)
    assert all(row_correct(r, "alltoall") is True and row_correct(r, "sendrecv") is True for r in log.rows)
    assert all(r.correct is None and row_correct(r, "all_reduce") is None for r in log.rows)


def _healthy_alltoall(in_place: str = "N/A", out_of_place: str = "0") -> str:
    """The 2x p5 alltoall fixture as nccl-tests >= 2.13 prints it: in-place `#wrong` N/A with -c 1."""
    text = (FIXTURES / "r2_alltoall_ok.log").read_text()
    row = re.compile(r"^(\s*\d+\s+\d+\s+float\s+none\s+-1\s+\S+\s+\S+\s+\S+\s+)(\S+)(\s+\S+\s+\S+\s+\S+\s+)(\S+)$", re.M)
    assert len(row.findall(text)) == 32
    return row.sub(lambda m: f"{m[1]}{out_of_place:>6}{m[3]}{in_place:>6}", text)


def _gate(text: str, collective: str = "alltoall") -> Verdict:
    exp = expectation_for(load_catalog()["p5.48xlarge"], 2, collective=collective, require_data_check=True)
    return judge(parse_text(text), exp)


def test_a_healthy_alltoall_as_nccl_tests_prints_it_passes_the_gate_that_requires_checked_data() -> None:
    v = _gate(_healthy_alltoall())
    assert v.passed, render(v)
    assert "data_unchecked" not in v.codes


def test_an_alltoall_whose_out_of_place_check_is_off_or_wrong_still_fails() -> None:
    unchecked = _gate(_healthy_alltoall(out_of_place="N/A"))
    assert unchecked.status == "fail" and "data_unchecked" in {f.code for f in unchecked.failures}, render(unchecked)
    assert "its out-of-place half" in next(f.message for f in unchecked.findings if f.code == "data_unchecked")
    wrong = _gate(_healthy_alltoall(out_of_place="3"))
    assert "wrong_data" in {f.code for f in wrong.failures}, render(wrong)
    message = next(f.message for f in wrong.findings if f.code == "wrong_data")
    assert " wrong element(s)" in message and "N/A" not in message


def test_an_in_place_figure_of_alltoall_is_not_wrong_data_but_one_of_all_reduce_is() -> None:
    """nccl-tests 2.10-2.12 printed a count for alltoall's unchecked in-place buffer: not evidence either way."""
    odd = _healthy_alltoall(in_place="7")
    assert "wrong_data" not in _gate(odd).codes
    assert "wrong_data" not in judge(parse_text(odd), None).codes  # the log names alltoall_perf
    unnamed = "\n".join(line for line in odd.splitlines() if "# Collective test" not in line)
    assert "wrong_data" in {f.code for f in judge(parse_text(unnamed), None).failures}  # nothing says alltoall
    assert "wrong_data" in {f.code for f in _gate(unnamed, "all_reduce").failures}
