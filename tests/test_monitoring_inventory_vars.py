"""The tenant's monitoring section becomes the role variables the monitoring playbook expects."""

from __future__ import annotations

import subprocess
from pathlib import Path

from fmcluster import monitoring
from fmcluster.model import load_tenant


def test_demo_keeps_two_days_locally_without_remote_write_or_receivers() -> None:
    values = monitoring.inventory_vars(load_tenant("demo"))
    assert {k: values[k] for k in ("prometheus_retention_days", "prometheus_remote_write_url",
                                   "prometheus_remote_write_region", "grafana_enabled", "alertmanager_receivers")} == {
        "prometheus_retention_days": 2, "prometheus_remote_write_url": "", "prometheus_remote_write_region": "",
        "grafana_enabled": True, "alertmanager_receivers": []}


def test_local_nodes_install_nothing_and_keep_every_file_under_the_tenant_s_runtime_root() -> None:
    values = monitoring.inventory_vars(load_tenant("demo"))
    assert (values["node_exporter_install"], values["prometheus_install"], values["alertmanager_install"]) == (
        False, False, False)
    paths = {k: v for k, v in values.items() if k.endswith(("_dir",))}
    assert len(paths) == 12
    assert all(v.startswith("{{ fmcluster_local_root") for v in paths.values()), paths
    assert "{{ inventory_hostname }}" in values["node_exporter_run_dir"]


def test_aws_tenants_install_the_packages() -> None:
    values = monitoring.inventory_vars(load_tenant("stockmark"))
    assert not {"node_exporter_install", "prometheus_install", "alertmanager_install"} & set(values)


def test_remote_write_is_signed_for_the_tenant_s_region() -> None:
    tenant = load_tenant("neuronlab")
    values = monitoring.inventory_vars(tenant)
    assert values["prometheus_remote_write_url"].startswith("https://aps-workspaces.us-east-2.amazonaws.com/")
    assert values["prometheus_remote_write_region"] == tenant.region == "us-east-2"


def test_alert_receivers_are_passed_through_as_plain_dicts() -> None:
    values = monitoring.inventory_vars(load_tenant("stockmark"))
    assert values["alertmanager_receivers"] == [
        {"name": "oncall", "type": "email", "target": "ml-infra-oncall@example.org"}]
    assert values["prometheus_retention_days"] == 30


def test_every_variable_is_a_documented_role_or_playbook_variable(repo_root: Path) -> None:
    documented = (repo_root / "docs" / "monitoring.md").read_text()
    for name in monitoring.inventory_vars(load_tenant("stockmark")):
        assert f"`{name}`" in documented


def test_the_playbook_path_exists() -> None:
    assert monitoring.playbook_path().is_file()


def test_stop_daemons_stops_each_process_by_its_pidfile(tmp_path: Path) -> None:
    run_dir = tmp_path / "nodes" / "n1" / "node_exporter"
    run_dir.mkdir(parents=True)
    pidfile = run_dir / "fmcluster-node-exporter.pid"
    subprocess.run(["start-stop-daemon", "--start", "--background", "--make-pidfile", f"--pidfile={pidfile}",
                    "--exec=/bin/sleep", "--", "300"], check=True)
    pid = int(pidfile.read_text())
    assert Path(f"/proc/{pid}").exists()
    assert monitoring.stop_daemons(tmp_path) == [pidfile]
    assert not Path(f"/proc/{pid}").exists()
    assert monitoring.stop_daemons(tmp_path) == []  # nothing left; no error
