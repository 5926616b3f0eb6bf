"""`invoke fleet`: one row per tenant, nothing faked (undeployed local tenants are 'not deployed', AWS tenants
without credentials 'planned'), acceptance figures from the records, and an HTML page where every value is data."""

from __future__ import annotations

import html
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, venv_tool
from fmcluster.doctor import knowledge
from fmcluster.doctor.detect import Finding, Hit
from fmcluster.commands.diagnose import fleet
from fmcluster.doctor.fleet import Row, html_page, last_acceptance, table, tenants
from fmcluster.doctor.report import Diagnosis

HOSTILE = "<img src=x onerror=alert(1)>\"'&\x1b[31m"


def fleet_root(tmp_path: Path, *orgs: str) -> Path:
    for org in orgs:
        shutil.copytree(ROOT / "inventories" / org / "group_vars", tmp_path / "inventories" / org / "group_vars")
    return tmp_path


def record(root: Path, org: str, run: str, result: dict[str, object]) -> None:
    path = root / "inventories" / org / "generated" / "acceptance" / run
    path.mkdir(parents=True)
    (path / "result.json").write_text(json.dumps(result))


def test_the_fleet_lists_every_tenant_and_fakes_nothing(tmp_path: Path, no_aws: None) -> None:
    root = fleet_root(tmp_path, "demo", "stockmark")
    lines: list[str] = []
    asked: list[str] = []

    def diagnose(org: str) -> Diagnosis:
        asked.append(org)
        raise AssertionError("no tenant here is deployed")

    code = fleet(out=lines.append, root=root, diagnose=diagnose)
    text = "\n".join(lines)
    assert code == 0 and asked == []
    assert tenants(root) == ["demo", "stockmark"]
    demo = next(line for line in text.splitlines() if line.startswith("demo "))
    stockmark = next(line for line in text.splitlines() if line.startswith("stockmark "))
    assert "local" in demo and "not deployed" in demo and "none recorded" in demo
    assert "aws" in stockmark and "planned (no AWS credentials: unknown)" in stockmark and "?/" in stockmark
    assert (root / "inventories" / "fleet.html").is_file()


def test_a_deployed_tenant_shows_nodes_alerts_findings_and_degraded(tmp_path: Path, no_aws: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.providers.local import emulator

    root = fleet_root(tmp_path, "demo")
    monkeypatch.setattr(emulator, "running_emulator", lambda org, root=None: object())  # "its emulator runs"
    entry = knowledge.by_id()["fsx-not-mounted"]
    diagnosis = Diagnosis("demo", [Finding(entry, (Hit("ip-10-77-128-6", "mounts: /fsx is not mounted"),))],
                          checked=["sinfo"], nodes={"expected": 3, "up": 3, "drained": 1}, alerts_firing=2,
                          facts={"stack_status": [("fmc-demo-network", "CREATE_COMPLETE")]})
    lines: list[str] = []
    code = fleet(out=lines.append, root=root, diagnose=lambda org: diagnosis)
    text = "\n".join(lines)
    assert code == 1
    assert "CREATE_COMPLETE" in text and "3/3 up, 1 drained" in text and "degraded" in text
    assert "demo: fsx-not-mounted (invoke doctor --org=demo)" in text


def test_the_last_acceptance_run_and_its_ratio_to_the_catalog_floor(tmp_path: Path) -> None:
    record(tmp_path, "demo", "20261201T100000Z", {"passed": False, "tests": []})
    record(tmp_path, "demo", "20261202T100000Z", {
        "passed": True, "tests": [{"name": "all_reduce", "busbw_gbps": 3.0}],
        "verdicts": {"all_reduce": {"expectation": {"catalog_floor_gbps": 2.0}}}})
    text, ratio = last_acceptance("demo", tmp_path)
    assert text == "PASS 20261202T100000Z, 3 GB/s" and ratio == 1.5
    record(tmp_path, "demo", "20261203T100000Z", {"passed": True, "tests": [{"name": "x", "busbw_gbps": None}]})
    assert last_acceptance("demo", tmp_path) == ("PASS 20261203T100000Z", None)
    (tmp_path / "inventories" / "demo" / "generated" / "acceptance" / "20261204T1" ).mkdir()
    (tmp_path / "inventories" / "demo" / "generated" / "acceptance" / "20261204T1" / "result.json").write_text("{")
    assert last_acceptance("demo", tmp_path) == ("unreadable (20261204T1)", None)


def test_every_value_in_the_html_page_is_escaped() -> None:
    row = Row(HOSTILE, HOSTILE, HOSTILE, HOSTILE, 1, 1, 0, HOSTILE, 1.0, 0, 1, HOSTILE, (HOSTILE,))
    page = html_page([row], HOSTILE)
    assert "<img" not in page and "onerror=alert(1)>" not in page.replace(html.escape("onerror=alert(1)>"), "")
    assert html.escape(HOSTILE) in page
    assert "\x1b" not in table([row])


def test_invoke_fleet_runs_here_and_writes_the_page() -> None:
    done = subprocess.run([venv_tool("invoke"), "fleet"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                               "AWS_CONFIG_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true",
                               "HOME": str(ROOT / ".cache")})
    assert "stockmark" in done.stdout and "planned" in done.stdout, done.stdout + done.stderr
    assert (ROOT / "inventories" / "fleet.html").is_file()
