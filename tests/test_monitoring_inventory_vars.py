"""The tenant's monitoring section becomes the role variables the monitoring playbook expects."""

from __future__ import annotations

from pathlib import Path

from fmcluster import monitoring
from fmcluster.manifest import PROMETHEUS_USER
from fmcluster.model import load_tenant


def test_demo_keeps_two_days_locally_without_remote_write_or_receivers() -> None:
    values = monitoring.inventory_vars(load_tenant("demo"))
    assert {k: values[k] for k in ("prometheus_retention_days", "prometheus_remote_write_url",
                                   "prometheus_remote_write_region", "grafana_enabled", "alertmanager_receivers")} == {
        "prometheus_retention_days": 2, "prometheus_remote_write_url": "", "prometheus_remote_write_region": "",
        "grafana_enabled": True, "alertmanager_receivers": []}


def test_the_monitoring_variables_are_the_tenant_s_alone_the_same_shape_on_every_provider() -> None:
    local, aws = monitoring.inventory_vars(load_tenant("demo")), monitoring.inventory_vars(load_tenant("stockmark"))
    assert set(local) == set(aws)
    assert not [k for k in local if k.endswith("_dir") or k.endswith("_install")], "paths and packages are the substrate's"


def test_every_node_runs_node_exporter_and_only_gpu_and_efa_instance_types_the_other_exporters() -> None:
    assert monitoring.scrape_jobs(load_tenant("demo")) == [{"job": "node", "port": 9100, "instance_types": []}]
    assert monitoring.scrape_jobs(load_tenant("stockmark")) == [
        {"job": "node", "port": 9100, "instance_types": []},
        {"job": "dcgm", "port": 9400, "instance_types": ["p5.48xlarge"]},
        {"job": "efa", "port": 9109, "instance_types": ["p5.48xlarge"]}]
    neuron = monitoring.scrape_jobs(load_tenant("neuronlab"))
    assert [j["job"] for j in neuron] == ["node", "efa"], "Trainium has EFA, no NVIDIA GPU"


def test_gpu_nodes_whose_image_ships_no_container_runtime_get_no_dcgm_target() -> None:
    """pclab's p5 queue boots ParallelCluster's AMI, which ships no container runtime (contract container_runtime):
    no dcgm-exporter runs there by design, so Prometheus expects no dcgm target; its EFA exporter is still scraped."""
    assert monitoring.scrape_jobs(load_tenant("pclab")) == [
        {"job": "node", "port": 9100, "instance_types": []},
        {"job": "efa", "port": 9109, "instance_types": ["p5.48xlarge"]}]
    # the same tenant on an image with a container runtime would be scraped: the image decides, not the scheduler
    dlami = monitoring.scrape_jobs(load_tenant("pclab"), lambda accelerator: "dlami-base-gpu-ubuntu-24.04")
    assert {"job": "dcgm", "port": 9400, "instance_types": ["p5.48xlarge"]} in dlami


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


def test_alerts_go_to_the_alertmanager_the_role_starts_and_only_when_there_is_a_receiver(repo_root: Path) -> None:
    import yaml

    defaults = {role: yaml.safe_load((repo_root / "roles" / role / "defaults" / "main.yml").read_text())
                for role in ("alertmanager", "prometheus")}
    assert (defaults["alertmanager"]["alertmanager_listen_address"], defaults["alertmanager"]["alertmanager_port"],
            defaults["prometheus"]["prometheus_port"]) == (monitoring.ALERTMANAGER_ADDRESS, monitoring.ALERTMANAGER_PORT,
                                                           monitoring.PROMETHEUS_PORT)
    assert defaults["prometheus"]["prometheus_user"] == PROMETHEUS_USER  # the IMDS rule's account on the controller
    with_receiver, without = (monitoring.inventory_vars(load_tenant(org)) for org in ("stockmark", "demo"))
    assert with_receiver["prometheus_alertmanager_targets"] == ["127.0.0.1:9093"]
    assert without["prometheus_alertmanager_targets"] == []
    assert with_receiver["prometheus_external_labels"] == {"cluster": "stockmark"}
