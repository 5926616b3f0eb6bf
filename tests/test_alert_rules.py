"""fmcluster's alert rules are valid, and every alert is unit-tested both firing and silent."""

from __future__ import annotations

import subprocess

import yaml

from monitoring_helpers import PROMTOOL, RULE_TESTS, RULES_FILE



def _alerts() -> list[str]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_check_rules_accepts_the_rules_file() -> None:
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES_FILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_promtool_test_rules_passes_every_alert_case() -> None:
    result = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_case_and_a_silent_case() -> None:
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    fires = {case["alertname"] for case in cases if case.get("exp_alerts")}
    silent = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    missing = {alert: [kind for kind, seen in (("firing", fires), ("silent", silent)) if alert not in seen]
               for alert in _alerts()}
    assert {alert: kinds for alert, kinds in missing.items() if kinds} == {}


def test_the_brief_s_conditions_each_have_an_alert() -> None:
    assert {"NodeDown", "ExporterDown", "FsxMountMissing", "GpuMissing", "GpuXidCritical", "GpuXidError",
            "GpuUncorrectableRemappedRows", "GpuCorrectableRemappedRowsIncreasing", "GpuRowRemapFailure",
            "GpuThermalViolation", "GpuDoubleBitEccErrors", "GpuNvlinkErrors", "EfaDeviceMissing"} <= set(_alerts())


def test_xid_alerts_use_the_count_metric_not_the_last_value_gauge() -> None:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    for rule in (r for g in groups for r in g["rules"] if r.get("alert", "").startswith("GpuXid")):
        assert "DCGM_EXP_XID_ERRORS_COUNT" in rule["expr"]
        assert "DCGM_FI_DEV_XID_ERRORS" not in rule["expr"]
