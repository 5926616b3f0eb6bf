"""End to end: playbooks/monitoring.yml converges a namespace cluster and Prometheus scrapes every node.

A small cluster shaped like the demo tenant is built from network namespaces (prefix fmo-, subnet
10.78.0.0/24, a bridge with the controller's address on the host): one login node and three compute
nodes in queue `cpu` (c5.2xlarge, catalog facts from the instance catalog). The real playbook runs
against it twice (converge, then idempotence); a real Prometheus on the controller must then report
every node_exporter target `up` through its HTTP API, and an alert must reach the tenant's webhook
receiver through the Alertmanager the playbook deployed. Everything created is removed afterwards.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.request
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from fmcluster.catalog import load_catalog
from monitoring_helpers import ROOT, api_get, free_port

pytestmark = pytest.mark.e2e

BRIDGE = "fmo-br0"
HOST_ADDRESS = "10.78.0.1"
NODES = {"fmo-login1": ("login", "10.78.0.10"), "fmo-n1": ("compute", "10.78.0.11"),
         "fmo-n2": ("compute", "10.78.0.12"), "fmo-n3": ("compute", "10.78.0.13")}


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True)


def _teardown_network() -> None:
    for name in NODES:
        _ip("netns", "del", name, check=False)
        _ip("link", "del", f"{name[:10]}-h", check=False)
    _ip("link", "del", BRIDGE, check=False)


def _build_network() -> None:
    _teardown_network()  # leftovers of an interrupted run of this test (only fmo- names)
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{HOST_ADDRESS}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for name, (_, address) in NODES.items():
        host_end, node_end = f"{name[:10]}-h", f"{name[:10]}-n"
        _ip("netns", "add", name)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", node_end)
        _ip("link", "set", host_end, "master", BRIDGE)
        _ip("link", "set", host_end, "up")
        _ip("link", "set", node_end, "netns", name)
        _ip("-n", name, "addr", "add", f"{address}/24", "dev", node_end)
        _ip("-n", name, "link", "set", node_end, "up")
        _ip("-n", name, "link", "set", "lo", "up")


def _stop_processes(workdir: Path) -> None:
    for pidfile in workdir.rglob("*.pid"):
        subprocess.run(["start-stop-daemon", "--stop", "--quiet", "--retry=TERM/10/KILL/5", "--remove-pidfile",
                        f"--pidfile={pidfile}"], check=False)


class _Webhook(BaseHTTPRequestHandler):
    """The tenant's webhook receiver: records what Alertmanager posts."""

    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return


@dataclass
class Cluster:
    workdir: Path
    inventory: Path
    prometheus: str
    alertmanager: str
    webhook: list[dict[str, Any]] = field(default_factory=list)

    def playbook(self, *extra: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0",
               "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(self.workdir / "facts")}
        return subprocess.run(
            [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(self.inventory),
             str(ROOT / "playbooks" / "monitoring.yml"), *extra],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _inventory(workdir: Path, prometheus_port: int, controller_exporter_port: int, alertmanager_port: int,
               webhook_port: int) -> dict[str, Any]:
    catalog = load_catalog()
    compute = {name: {"fmcluster_address": addr, "fmcluster_netns": name}
               for name, (role, addr) in NODES.items() if role == "compute"}
    login = {name: {"fmcluster_address": addr, "fmcluster_netns": name}
             for name, (role, addr) in NODES.items() if role == "login"}
    base = str(workdir)
    return {"all": {
        "vars": {
            "ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3",
            "fmcluster_org": "fmo", "fmcluster_provider": "local",
            "prometheus_config_dir": f"{base}/prometheus/etc", "prometheus_data_dir": f"{base}/prometheus/data",
            "prometheus_run_dir": f"{base}/prometheus/run", "prometheus_port": prometheus_port,
            "prometheus_listen_address": "127.0.0.1", "prometheus_scrape_interval": "2s",
            "prometheus_evaluation_interval": "2s", "prometheus_retention_days": 2,
            "grafana_provisioning_dir": f"{base}/grafana/provisioning",
            "grafana_dashboards_dir": f"{base}/grafana/dashboards",
            "node_exporter_run_dir": base + "/{{ inventory_hostname }}/node_exporter",
            "efa_exporter_run_dir": base + "/{{ inventory_hostname }}/efa_exporter",
            "dcgm_exporter_run_dir": base + "/{{ inventory_hostname }}/dcgm_exporter",
            "alertmanager_receivers": [{"name": "fmo-hook", "type": "webhook",
                                        "target": f"http://127.0.0.1:{webhook_port}/alerts"}],
            "alertmanager_port": alertmanager_port, "alertmanager_group_wait": "1s",
            "alertmanager_config_dir": f"{base}/alertmanager/etc", "alertmanager_data_dir": f"{base}/alertmanager/data",
            "alertmanager_run_dir": f"{base}/alertmanager/run",
        },
        "children": {
            "controller": {"hosts": {"fmo-ctl": {"fmcluster_address": HOST_ADDRESS,
                                                 "node_exporter_port": controller_exporter_port}}},
            "login": {"hosts": login},
            "compute": {"children": {"queue_cpu": {
                "hosts": compute,
                "vars": {"fmcluster_instance_type": "c5.2xlarge",
                         "fmcluster_instance": catalog["c5.2xlarge"].as_vars()}}}}},
    }}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")
    workdir = Path(tempfile.mkdtemp(prefix="fmo-e2e-"))
    workdir.chmod(0o755)  # the exporters and Prometheus run as unprivileged users
    prometheus_port, alertmanager_port = free_port(), free_port()
    webhook = ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=webhook.serve_forever, daemon=True).start()
    inventory = workdir / "hosts.yml"
    inventory.write_text("# generated by fmcluster tests (monitoring e2e); edits will be reverted\n" + yaml.safe_dump(
        _inventory(workdir, prometheus_port, free_port(), alertmanager_port, webhook.server_address[1])))
    try:
        _build_network()
        yield Cluster(workdir, inventory, f"http://127.0.0.1:{prometheus_port}",
                      f"http://127.0.0.1:{alertmanager_port}", _Webhook.received)
    finally:
        webhook.shutdown()
        webhook.server_close()
        _stop_processes(workdir)
        _teardown_network()
        shutil.rmtree(workdir, ignore_errors=True)


def _recap(output: str) -> dict[str, dict[str, int]]:
    return {m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
            for m in re.finditer(r"^(\S+)\s+:\s+(ok=.*)$", output, re.MULTILINE)}


def _targets(base: str) -> list[dict[str, Any]]:
    return list(api_get(base, "/api/v1/targets", state="active")["data"]["activeTargets"])


def _wait_all_up(base: str, expected: int, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    targets: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        targets = _targets(base)
        if len(targets) == expected and all(t["health"] == "up" for t in targets):
            return targets
        time.sleep(1)
    raise AssertionError(json.dumps([(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets], indent=1))


def test_playbook_converges_then_changes_nothing_on_a_second_run(cluster: Cluster) -> None:
    first = cluster.playbook()
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-3000:]
    assert set(_recap(first.stdout)) == {"fmo-ctl", *NODES}
    started = time.monotonic()
    second = cluster.playbook()
    assert second.returncode == 0, second.stdout[-6000:] + second.stderr[-3000:]
    changed = {host: counts["changed"] for host, counts in _recap(second.stdout).items()}
    assert changed == {host: 0 for host in ("fmo-ctl", *NODES)}, second.stdout[-6000:]
    print(f"\nsecond (idempotent) converge of {len(changed)} hosts: {time.monotonic() - started:.1f}s")


def test_check_mode_on_the_converged_cluster_reports_nothing_to_change(cluster: Cluster) -> None:
    check = cluster.playbook("--check")
    assert check.returncode == 0, check.stdout[-6000:] + check.stderr[-3000:]
    changed = {host: counts["changed"] for host, counts in _recap(check.stdout).items()}
    assert changed == {host: 0 for host in ("fmo-ctl", *NODES)}, check.stdout[-6000:]


def test_prometheus_reports_every_node_exporter_up(cluster: Cluster) -> None:
    targets = _wait_all_up(cluster.prometheus, expected=1 + 1 + len(NODES))  # self + controller + nodes
    nodes = {t["labels"]["node"]: t for t in targets if t["labels"]["job"] == "node"}
    assert set(nodes) == {"fmo-ctl", *NODES}
    assert nodes["fmo-n1"]["scrapeUrl"] == "http://10.78.0.11:9100/metrics"
    assert {t["labels"]["queue"] for name, t in nodes.items() if name.startswith("fmo-n")} == {"cpu"}
    print(f"\nscrape targets up: {len(targets)} ({len(nodes)} node_exporters + Prometheus itself)")


def test_each_exporter_runs_inside_its_node_s_namespace(cluster: Cluster) -> None:
    # The netdev collector reads the exporter's own network namespace (netlink): a namespace node sees
    # its veth end (and loopback, which Debian's defaults exclude) only. (Collectors reading /sys still see the host's sysfs: nsenter --net
    # leaves the mount namespace alone, which is what keeps slurmd's cgroups working.)
    query = 'node_network_receive_bytes_total{node="fmo-n2"}'
    answer = api_get(cluster.prometheus, "/api/v1/query", query=query)
    assert {r["metric"]["device"] for r in answer["data"]["result"]} - {"lo"} == {"fmo-n2-n"}


def test_the_catalog_expectations_reach_prometheus_through_the_textfile(cluster: Cluster) -> None:
    _wait_all_up(cluster.prometheus, expected=2 + len(NODES))
    info = api_get(cluster.prometheus, "/api/v1/query", query='fmcluster_node_info{queue="cpu"}')["data"]["result"]
    assert sorted(r["metric"]["node"] for r in info) == ["fmo-n1", "fmo-n2", "fmo-n3"]
    assert {r["metric"]["instance_type"] for r in info} == {"c5.2xlarge"}
    errors = api_get(cluster.prometheus, "/api/v1/query", query="max(node_textfile_scrape_error)")
    assert errors["data"]["result"][0]["value"][1] == "0"
    gpus = api_get(cluster.prometheus, "/api/v1/query", query="max(fmcluster_node_expected_accelerators)")
    assert gpus["data"]["result"][0]["value"][1] == "0"  # c5.2xlarge: no GPUs in the catalog


def test_the_alert_rules_are_loaded_and_silent_on_a_healthy_cluster(cluster: Cluster) -> None:
    _wait_all_up(cluster.prometheus, expected=2 + len(NODES))
    groups = api_get(cluster.prometheus, "/api/v1/rules")["data"]["groups"]
    assert {g["name"] for g in groups} == {"fmcluster-availability", "fmcluster-gpu", "fmcluster-efa"}
    time.sleep(5)  # a few evaluation intervals
    firing = api_get(cluster.prometheus, "/api/v1/alerts")["data"]["alerts"]
    assert firing == []


def test_no_gpu_and_no_efa_exporter_run_here_and_grafana_files_exist_without_grafana(cluster: Cluster) -> None:
    assert not list((cluster.workdir / "prometheus" / "etc" / "file_sd").glob("dcgm-*.yml"))
    assert not list((cluster.workdir / "prometheus" / "etc" / "file_sd").glob("efa-*.yml"))
    dashboards = sorted(p.name for p in (cluster.workdir / "grafana" / "dashboards").glob("*.json"))
    assert dashboards == ["fmcluster-cluster-overview.json", "fmcluster-efa-network.json",
                          "fmcluster-gpu-health.json"]


def test_a_stopped_node_exporter_shows_as_down(cluster: Cluster) -> None:
    _wait_all_up(cluster.prometheus, expected=2 + len(NODES))
    pidfile = cluster.workdir / "fmo-n3" / "node_exporter" / "fmcluster-node-exporter.pid"
    subprocess.run(["start-stop-daemon", "--stop", "--quiet", "--retry=TERM/10/KILL/5", "--remove-pidfile",
                    f"--pidfile={pidfile}"], check=True)
    deadline = time.monotonic() + 30
    down: list[Any] = []
    while time.monotonic() < deadline and not down:
        down = api_get(cluster.prometheus, "/api/v1/query", query='up{job="node"} == 0')["data"]["result"]
        time.sleep(1)
    assert [r["metric"]["node"] for r in down] == ["fmo-n3"]


def test_prometheus_sends_alerts_to_the_alertmanager_the_playbook_deployed(cluster: Cluster) -> None:
    deadline = time.monotonic() + 30
    active: list[Any] = []
    while time.monotonic() < deadline and not active:
        active = api_get(cluster.prometheus, "/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
        time.sleep(1)
    assert [a["url"] for a in active] == [f"{cluster.alertmanager}/api/v2/alerts"]


def test_an_alert_reaches_the_tenant_s_webhook_receiver(cluster: Cluster) -> None:
    alert = [{"labels": {"alertname": "FmoE2eProbe", "node": "fmo-n1", "severity": "info"},
              "annotations": {"summary": "end-to-end probe"}}]
    request = urllib.request.Request(f"{cluster.alertmanager}/api/v2/alerts", data=json.dumps(alert).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not cluster.webhook:
        time.sleep(0.5)
    assert cluster.webhook, "Alertmanager delivered nothing to the webhook receiver"
    delivered = cluster.webhook[0]
    assert delivered["receiver"] == "fmo-hook"
    assert [a["labels"]["alertname"] for a in delivered["alerts"]] == ["FmoE2eProbe"]


def test_a_node_removed_from_the_inventory_loses_its_target_even_with_limit(cluster: Cluster) -> None:
    file_sd = cluster.workdir / "prometheus" / "etc" / "file_sd"
    retired = file_sd / "node-fmo-retired.yml"
    retired.write_text(yaml.safe_dump([{"targets": ["10.78.0.99:9100"], "labels": {"node": "fmo-retired"}}]))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "fmo-retired" not in {t["labels"]["node"] for t in _targets(cluster.prometheus)}:
        time.sleep(1)
    run = cluster.playbook("--limit", "fmo-ctl")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert not retired.exists()
    assert sorted(p.name for p in file_sd.glob("node-*.yml")) == sorted(f"node-{h}.yml" for h in ("fmo-ctl", *NODES))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "fmo-retired" in {t["labels"]["node"] for t in _targets(cluster.prometheus)}:
        time.sleep(1)
    assert "fmo-retired" not in {t["labels"]["node"] for t in _targets(cluster.prometheus)}
