"""The prometheus role's configuration passes `promtool check config` in each supported shape."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from monitoring_helpers import PROMTOOL, ROOT, RULES_FILE

pytestmark = pytest.mark.slow
TEMPLATES = ROOT / "roles" / "prometheus" / "templates"


def _render(tmp_path: Path, **overrides: Any) -> Path:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir(exist_ok=True)
    (rules_dir / RULES_FILE.name).write_text(RULES_FILE.read_text())
    values: dict[str, Any] = {
        "inventory_hostname": "controller", "prometheus_scrape_interval": "15s",
        "prometheus_evaluation_interval": "15s", "prometheus_external_labels": {},
        "prometheus_rules_dir": str(rules_dir), "prometheus_alertmanager_targets": [],
        "prometheus_api_host": "127.0.0.1", "prometheus_port": 9090,
        "prometheus_file_sd_jobs": ["node", "dcgm", "efa"], "prometheus_file_sd_dir": str(tmp_path / "file_sd"),
        "prometheus_remote_write_url": "", "prometheus_remote_write_region": "",
    }
    values.update(overrides)
    out = tmp_path / "prometheus.yml"
    out.write_text(env.get_template("prometheus.yml.j2").render(**values))
    return out


def _check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True)


def test_the_default_configuration_passes_promtool_and_loads_the_rules(tmp_path: Path) -> None:
    result = _check(_render(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rules found" in result.stdout


def test_every_exporter_job_reads_its_own_file_sd_files(tmp_path: Path) -> None:
    config = yaml.safe_load(_render(tmp_path).read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for name in ("node", "dcgm", "efa"):
        assert jobs[name]["file_sd_configs"][0]["files"] == [f"{tmp_path}/file_sd/{name}-*.yml"]


def test_remote_write_to_amazon_managed_prometheus_uses_sigv4_and_passes_promtool(tmp_path: Path) -> None:
    url = "https://aps-workspaces.ap-northeast-1.amazonaws.com/workspaces/ws-1234/api/v1/remote_write"
    path = _render(tmp_path, prometheus_remote_write_url=url, prometheus_remote_write_region="ap-northeast-1",
                   prometheus_external_labels={"cluster": "stockmark"},
                   prometheus_alertmanager_targets=["10.1.0.10:9093"])
    result = _check(path)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(path.read_text())
    assert config["remote_write"][0] == {
        "url": url, "sigv4": {"region": "ap-northeast-1"},
        "queue_config": {"max_samples_per_send": 1000, "max_shards": 200, "capacity": 2500}}
    assert config["global"]["external_labels"] == {"cluster": "stockmark"}


def test_without_remote_write_no_remote_write_section_is_emitted(tmp_path: Path) -> None:
    assert "remote_write" not in yaml.safe_load(_render(tmp_path).read_text())
