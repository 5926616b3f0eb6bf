"""The alertmanager role turns the tenant's receivers into a configuration amtool accepts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import yaml

from monitoring_helpers import ROOT

AMTOOL = "/usr/bin/amtool"
TEMPLATES = ROOT / "roles" / "alertmanager" / "templates"

RECEIVERS = [
    {"name": "oncall", "type": "email", "target": "ml-infra-oncall@example.org"},
    {"name": "chat", "type": "slack", "target": "https://hooks.slack.com/services/T000/B000/XXXX"},
    {"name": "pager", "type": "sns", "target": "arn:aws:sns:ap-northeast-1:123456789012:fmcluster-alerts"},
    {"name": "hook", "type": "webhook", "target": "http://10.0.0.5:8080/alerts"},
]


def _render(tmp_path: Path, receivers: list[dict[str, str]]) -> Path:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    values: dict[str, Any] = {
        "alertmanager_receivers": receivers, "alertmanager_group_by": ["alertname", "node"],
        "alertmanager_group_wait": "30s", "alertmanager_group_interval": "5m", "alertmanager_repeat_interval": "4h",
        "alertmanager_smtp_smarthost": "localhost:25", "alertmanager_smtp_from": "alertmanager@controller",
        "alertmanager_smtp_require_tls": False,
    }
    out = tmp_path / "alertmanager.yml"
    out.write_text(env.get_template("alertmanager.yml.j2").render(**values))
    return out


def test_all_four_receiver_types_pass_amtool_check_config(tmp_path: Path) -> None:
    result = subprocess.run([AMTOOL, "check-config", str(_render(tmp_path, RECEIVERS))],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 receivers" in result.stdout  # the four plus the catch-all


def test_every_alert_reaches_every_receiver(tmp_path: Path) -> None:
    config = yaml.safe_load(_render(tmp_path, RECEIVERS).read_text())
    assert config["route"]["routes"] == [{"receiver": r["name"], "continue": True} for r in RECEIVERS]


def test_sns_receivers_sign_for_the_topic_s_own_region(tmp_path: Path) -> None:
    config = yaml.safe_load(_render(tmp_path, RECEIVERS).read_text())
    pager = next(r for r in config["receivers"] if r["name"] == "pager")
    assert pager["sns_configs"][0]["sigv4"] == {"region": "ap-northeast-1"}


def test_smtp_settings_appear_only_with_an_email_receiver(tmp_path: Path) -> None:
    config = yaml.safe_load(_render(tmp_path, RECEIVERS[1:]).read_text())
    assert "smtp_smarthost" not in config["global"]
