"""The tenant's monitoring section becomes the role variables the monitoring playbook expects."""

from __future__ import annotations

from pathlib import Path

from fmcluster import monitoring
from fmcluster.model import load_tenant


def test_demo_keeps_two_days_locally_without_remote_write_or_receivers_and_installs_nothing() -> None:
    assert monitoring.inventory_vars(load_tenant("demo")) == {
        "prometheus_retention_days": 2, "prometheus_remote_write_url": "", "prometheus_remote_write_region": "",
        "grafana_enabled": True, "alertmanager_receivers": [],
        "fmcluster_lustre_mount_point": load_tenant("demo").storage.lustre.mount_point,
        "node_exporter_install": False, "prometheus_install": False, "alertmanager_install": False}


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
