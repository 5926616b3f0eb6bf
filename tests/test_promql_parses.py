"""Every PromQL expression in the alert rules and the Grafana dashboards parses in a real Prometheus.

A Prometheus server (the Debian package) is started on a free 127.0.0.1 port; each expression is sent
to /api/v1/query. A parse error comes back as status "error", errorType "bad_data".
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
import yaml

from fmcluster import dashboards
from monitoring_helpers import PROMETHEUS, ROOT, RULES_FILE, api_get, free_port, wait_ready

pytestmark = pytest.mark.slow
DASHBOARD_FILES = sorted((ROOT / "roles" / "grafana" / "files" / "dashboards").glob("*.json"))
# Grafana's own variables, replaced the way Grafana does before the query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$node": ".*"}


def _grafana_expr(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def _rule_exprs() -> list[tuple[str, str]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [(rule.get("alert") or rule["record"], rule["expr"]) for g in groups for rule in g["rules"]]


def _dashboard_exprs() -> list[tuple[str, str]]:
    found = []
    for path in DASHBOARD_FILES:
        model = json.loads(path.read_text())
        for panel in model["panels"]:
            for target in panel["targets"]:
                found.append((f"{path.stem}: {panel['title']}", _grafana_expr(target["expr"])))
    return found


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("promql")
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    port = free_port()
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(workdir / "prometheus.log").open("wb"))
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, process)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_a_malformed_expression_is_reported_as_bad_data(prometheus: str) -> None:
    answer = api_get(prometheus, "/api/v1/query", query="sum by (node (up)")
    assert (answer["status"], answer["errorType"]) == ("error", "bad_data")


@pytest.mark.parametrize(("where", "expr"), _rule_exprs(), ids=[name for name, _ in _rule_exprs()])
def test_alert_rule_expression_parses(prometheus: str, where: str, expr: str) -> None:
    answer = api_get(prometheus, "/api/v1/query", query=expr)
    assert answer["status"] == "success", f"{where}: {answer.get('error')}"


@pytest.mark.parametrize(("where", "expr"), _dashboard_exprs(), ids=[w for w, _ in _dashboard_exprs()])
def test_dashboard_expression_parses(prometheus: str, where: str, expr: str) -> None:
    answer = api_get(prometheus, "/api/v1/query", query=expr)
    assert answer["status"] == "success", f"{where}: {answer.get('error')}"


def test_the_three_dashboards_are_shipped() -> None:
    assert {p.stem for p in DASHBOARD_FILES} == {
        "fmcluster-gpu-health", "fmcluster-efa-network", "fmcluster-cluster-overview"}


def test_shipped_dashboard_files_match_their_definitions_in_the_package() -> None:
    for dashboard in dashboards.DASHBOARDS:
        shipped = ROOT / "roles" / "grafana" / "files" / "dashboards" / dashboards.file_name(dashboard)
        assert shipped.read_text() == dashboards.serialise(dashboard), (
            f"{shipped.name} is stale: run `invoke dashboards`")


def test_gpu_health_dashboard_covers_the_health_signals() -> None:
    text = (ROOT / "roles" / "grafana" / "files" / "dashboards" / "fmcluster-gpu-health.json").read_text()
    for metric in ("DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                   "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                   "DCGM_FI_DEV_THERMAL_VIOLATION", "fmcluster_node_expected_accelerators"):
        assert metric in text


def test_every_dashboard_queries_the_provisioned_datasource() -> None:
    for path in DASHBOARD_FILES:
        model = json.loads(path.read_text())
        for panel in model["panels"]:
            assert panel["datasource"] == dashboards.DATASOURCE, (path.name, panel["title"])
