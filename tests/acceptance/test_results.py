"""Each run is saved under the tenant's generated dir and compared with the previous one."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import os
import subprocess

import pytest

from conftest import ROOT, venv_tool
from fmcluster.acceptance import results
from fmcluster.acceptance.slurm import _fields


def test_runs_are_saved_per_timestamp_and_compared_with_the_previous(tmp_path: Path) -> None:
    first = results.new_run_dir("acme", datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc), root=tmp_path)
    assert first == tmp_path / "inventories" / "acme" / "generated" / "acceptance" / "20261201T100000Z"
    results.write(first, {"passed": True, "tests": [{"name": "cpu-all_reduce-3nodes", "busbw_gbps": 0.25}]}, "ok\n")
    second = results.new_run_dir("acme", datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc), root=tmp_path)
    current = {"tests": [{"name": "cpu-all_reduce-3nodes", "busbw_gbps": 0.02}, {"name": "new", "busbw_gbps": 1.0}]}
    lines = results.compare(current, results.previous_result("acme", second, root=tmp_path))
    assert lines[0] == "compared with run 20261201T100000Z (PASS)"
    assert lines[1] == "cpu-all_reduce-3nodes: busbw 0.020 GB/s (before 0.250, -92%)"
    assert lines[2] == "new: new test"
    assert json.loads((first / "result.json").read_text())["passed"] is True


def test_the_first_run_says_there_is_nothing_to_compare(tmp_path: Path) -> None:
    run = results.new_run_dir("acme", root=tmp_path)
    assert results.compare({}, results.previous_result("acme", run, root=tmp_path)) == [
        "first recorded run: nothing to compare with"]


def test_two_runs_in_the_same_second_get_distinct_directories(tmp_path: Path) -> None:
    when = datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert results.new_run_dir("a", when, tmp_path) != results.new_run_dir("a", when, tmp_path)


def test_scontrol_one_line_output_keeps_a_reason_with_spaces() -> None:
    line = "NodeName=fma-n2 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 Reason=fmcluster acceptance: below_floor [root@2026-12-02T13:28:40]"
    fields = _fields(line)
    assert fields["State"] == "IDLE+DRAIN"
    assert fields["Reason"] == "fmcluster acceptance: below_floor [root@2026-12-02T13:28:40]"


def test_run_records_beside_the_generated_inventory_are_not_read_as_inventory(tmp_path: Path) -> None:
    generated = tmp_path / "inventories" / "acme" / "generated"
    generated.mkdir(parents=True)
    (generated / "hosts.yml").write_text("all:\n  hosts:\n    n1: {}\n")
    run = results.new_run_dir("acme", root=tmp_path)
    results.write(run, {"passed": True, "tests": []}, "# summary\n")
    (run / "cpu-all_reduce-3nodes.log").write_text("#  Rank  0 Group  0 Pid 1 on cpu-1 device 0 [cpu]\nnot ini\n")
    proc = subprocess.run([venv_tool("ansible-inventory"), "-i", f"{generated}/", "--list"], capture_output=True,
                          text=True, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr


def test_result_json_is_strict_json_with_non_finite_figures_as_null(tmp_path: Path) -> None:
    run = results.new_run_dir("acme", root=tmp_path)
    results.write(run, {"tests": [{"name": "t", "avg_busbw_gbps": float("nan"), "busbw_gbps": float("inf")}]}, "")
    text = (run / "result.json").read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in result.json"))
    assert data["tests"][0]["avg_busbw_gbps"] is None and data["tests"][0]["busbw_gbps"] is None
    assert data["non_finite"] == ["$.tests[0].avg_busbw_gbps", "$.tests[0].busbw_gbps"]
