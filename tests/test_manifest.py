"""The cluster manifest (fmcluster.publish.build_manifest) and the inventory every node assembles from it and the
live node list (fmcluster.manifest.assemble_inventory): what the roles see of a tenant.

The same two functions run on the deploy machine (inventories/<org>/generated/hosts.yml) and on every node
(fmcluster.node.agent), so these tests specify both.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import venv_tool
from fmcluster.catalog import load_catalog
from fmcluster.inventory import HEADER, read_manifest, read_nodes, write_inventory, write_manifest
from fmcluster.manifest import (
    MEMBERSHIP_PLAYBOOK, assemble_inventory, load_inventory_yaml, digest, membership_digest, membership_playbook,
    placement_group_output_key, scrape_configs,
)
from fmcluster.model import Tenant, load_tenant
from fmcluster.nodes import Node, sort_nodes
from fmcluster.publish import systemd_mount_unit
from localtenant import REF, make_root, manifest_for, nodes_for

@pytest.fixture(scope="module")
def demo() -> Tenant:
    return load_tenant("demo")


@pytest.fixture(scope="module")
def stockmark() -> Tenant:
    return load_tenant("stockmark")


def inventory(tenant: Tenant, outputs: dict[str, str] | None = None, nodes: list[Node] | None = None) -> dict[str, Any]:
    document: dict[str, Any] = assemble_inventory(manifest_for(tenant, outputs), nodes_for(tenant) if nodes is None else nodes)
    return document


# --- groups and group vars ---------------------------------------------------------------------------------

def test_groups_are_controller_login_and_one_queue_group_per_queue_named_by_ec2_hostnames(demo: Tenant) -> None:
    groups = inventory(demo)["all"]["children"]
    assert list(groups["controller"]["hosts"]) == ["ip-10-77-128-10"]
    assert list(groups["login"]["hosts"]) == ["ip-10-77-128-11"]
    assert list(groups["compute"]["children"]) == ["queue_cpu"]
    assert list(groups["compute"]["children"]["queue_cpu"]["hosts"]) == [
        "ip-10-77-128-12", "ip-10-77-128-13", "ip-10-77-128-14"]
    host = groups["compute"]["children"]["queue_cpu"]["hosts"]["ip-10-77-128-13"]
    assert {k: host[k] for k in ("ansible_host", "fmcluster_address", "fmcluster_instance_id")} == {
        "ansible_host": "10.77.128.13", "fmcluster_address": "10.77.128.13", "fmcluster_instance_id": "i-00000000000000003"}
    # The exporters' variables, once, here (playbooks/monitoring.yml maps nothing).
    assert {k: v for k, v in host.items() if k.startswith(("node_exporter", "dcgm_", "efa_"))} == {
        "node_exporter_listen_address": "10.77.128.13", "dcgm_exporter_listen_address": "10.77.128.13",
        "efa_exporter_listen_address": "10.77.128.13",
        "node_exporter_node_info": {"cluster": "demo", "role": "compute", "queue": "cpu", "instance_type": "c5.2xlarge"},
        "node_exporter_accelerator": "none", "node_exporter_expected_accelerators": 0,
        "node_exporter_expected_efa_interfaces": 0}
    controller = groups["controller"]["hosts"]["ip-10-77-128-10"]["node_exporter_node_info"]
    assert controller["role"] == "controller" and controller["queue"] == ""


def test_every_group_carries_its_instance_type_the_catalog_entry_and_its_queue_s_nccl_vars(stockmark: Tenant) -> None:
    groups = inventory(stockmark)["all"]["children"]
    gpu = groups["compute"]["children"]["queue_gpu"]["vars"]
    assert gpu["fmcluster_instance_type"] == "p5.48xlarge"
    assert gpu["fmcluster_instance"] == load_catalog()["p5.48xlarge"].as_vars()
    assert gpu["nccl_instance_type"] == "p5.48xlarge" and "nccl_environment" in gpu
    assert groups["controller"]["vars"]["fmcluster_instance_type"] == stockmark.controller.name
    assert groups["login"]["vars"]["fmcluster_instance_type"] == "m5.2xlarge"


def test_without_a_login_node_the_controller_is_the_login_group(tmp_path: Path) -> None:
    tenant = load_tenant("t-nologin", make_root(tmp_path, "t-nologin", "10.93.20.0/24", login=0))
    groups = inventory(tenant)["all"]["children"]
    assert list(groups["login"]["hosts"]) == list(groups["controller"]["hosts"]) == ["ip-10-93-20-138"]
    assert groups["login"]["vars"]["fmcluster_instance_type"] == "m5.xlarge"


def test_all_vars_hold_the_manifest_s_role_variables_and_the_membership(demo: Tenant) -> None:
    manifest = manifest_for(demo)
    nodes = nodes_for(demo)
    all_vars = assemble_inventory(manifest, nodes)["all"]["vars"]
    assert all_vars["fmcluster_org"] == "demo"
    assert all_vars["fmcluster_manifest_digest"] == digest(manifest)
    assert all_vars["fmcluster_nodes"] == [n.as_dict() for n in nodes]
    assert all_vars["common_hosts"] == [{"name": n.name, "address": n.address} for n in nodes]
    assert (all_vars["slurm_controller_hostname"], all_vars["slurm_controller_address"]) == (
        "ip-10-77-128-10", "10.77.128.10")
    assert all_vars["slurm_cluster_name"] == "demo"
    assert all_vars["munge_key_src"] == "/etc/fmcluster/secrets/munge-key"


def test_local_nodes_install_their_packages_as_aws_nodes_do(demo: Tenant, stockmark: Tenant) -> None:
    """The local image is pristine (nothing lent): no install switch is turned off for provider local."""
    switches = {"common_install_packages", "munge_install_packages", "slurm_install_packages", "node_exporter_install",
                "prometheus_install", "alertmanager_install", "slurm_accounting_install_packages",
                "imds_guard_install_packages"}
    for tenant in (demo, stockmark):
        variables = manifest_for(tenant)["vars"]
        assert not switches & set(variables), (tenant.org, switches & set(variables))
    assert manifest_for(stockmark)["vars"]["grafana_install"] is True


def test_extra_vars_of_the_node_are_added_and_reach_the_scrape_configs(demo: Tenant) -> None:
    all_vars = assemble_inventory(manifest_for(demo), nodes_for(demo),
                                  {"fmcluster_aws_endpoint_url": "http://10.77.128.1:4566", "fmcluster_bucket": "b"})["all"]["vars"]
    assert all_vars["fmcluster_bucket"] == "b"
    assert {c["ec2_sd_configs"][0]["endpoint"] for c in all_vars["prometheus_scrape_configs"]} == {"http://10.77.128.1:4566"}


def test_the_scheduler_gate_is_one_group_holding_every_node_whose_slurm_fmcluster_installs(demo: Tenant) -> None:
    import dataclasses

    children = inventory(demo)["all"]["children"]
    assert children["fmcluster_slurm"] == {"children": {"controller": {}, "login": {}, "compute": {}}}
    pcdemo_on_aws = dataclasses.replace(load_tenant("pcdemo"), provider="aws")  # ParallelCluster installs Slurm
    assert inventory(pcdemo_on_aws)["all"]["children"]["fmcluster_slurm"] == {}  # declared, no node
    assert inventory(load_tenant("pcdemo"))["all"]["children"]["fmcluster_slurm"]["children"]  # its stand-in: ours


def test_a_manifest_without_the_capabilities_is_refused_not_guessed(demo: Tenant) -> None:
    manifest = manifest_for(demo)
    del manifest["vars"]["fmcluster_capabilities"]
    with pytest.raises(ValueError, match="fmcluster_capabilities.slurm_owner is None"):
        assemble_inventory(manifest, nodes_for(demo))


# --- Slurm ---------------------------------------------------------------------------------------------------

def test_slurm_nodes_and_partitions_are_the_live_compute_nodes_of_each_queue(tmp_path: Path) -> None:
    tenant = load_tenant("t-queues", make_root(tmp_path, "t-queues", "10.93.21.0/24", login=1, queues={"cpu": 2, "big": 1}))
    big = next(n.name for n in nodes_for(tenant) if n.queue == "big")
    all_vars = inventory(tenant)["all"]["vars"]
    assert [(n["name"], n["partition"]) for n in all_vars["slurm_nodes"]] == [
        (big, "big"), ("ip-10-93-21-140", "cpu"), ("ip-10-93-21-141", "cpu")]
    assert all_vars["slurm_partitions"] == [
        {"name": "cpu", "nodes": ["ip-10-93-21-140", "ip-10-93-21-141"], "default": True},
        {"name": "big", "nodes": [big], "default": False}]
    # A queue with no live node has no partition (Slurm refuses a partition of unknown nodes).
    shrunk = inventory(tenant, nodes=nodes_for(tenant, drop=[big]))["all"]["vars"]
    assert [p["name"] for p in shrunk["slurm_partitions"]] == ["cpu"]
    assert "queue_big" in inventory(tenant, nodes=nodes_for(tenant, drop=[big]))["all"]["children"]["compute"]["children"]


def test_local_nodes_offer_this_machine_s_cpus_and_a_share_of_its_memory_and_no_gpus(demo: Tenant) -> None:
    node = inventory(demo)["all"]["vars"]["slurm_nodes"][0]
    mem_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    assert node["cpus"] == os.cpu_count()
    assert 0.85 * mem_mib <= node["real_memory_mb"] <= 0.9 * mem_mib
    assert "gres" not in node


def test_aws_gpu_nodes_get_gres_the_catalog_s_cpus_and_95_percent_of_its_memory(stockmark: Tenant) -> None:
    all_vars = inventory(stockmark)["all"]["vars"]
    p5 = load_catalog()["p5.48xlarge"]
    assert len(all_vars["slurm_nodes"]) == 16
    node = all_vars["slurm_nodes"][0]
    assert (node["cpus"], node["gres"], node["gres_files"]) == (p5.vcpus, "gpu:8", "/dev/nvidia[0-7]")
    assert node["real_memory_mb"] == int(p5.memory_gib * 1024 * 0.95)


def test_a_placement_group_output_becomes_a_topology_switch_of_its_queue(stockmark: Tenant) -> None:
    outputs = {placement_group_output_key("gpu"): "fmc-stockmark-gpu-pg"}
    all_vars = inventory(stockmark, outputs)["all"]["vars"]
    assert all_vars["slurm_topology"] == [{"name": "fmc-stockmark-gpu-pg",
                                           "nodes": [n["name"] for n in all_vars["slurm_nodes"]]}]
    assert inventory(stockmark)["all"]["vars"]["slurm_topology"] == []  # the emulator makes no placement group
    assert placement_group_output_key("gpu-big") == "GpuBigPlacementGroup"


def test_before_the_controller_runs_there_is_no_controller_address(demo: Tenant) -> None:
    nodes = [n for n in nodes_for(demo) if n.role != "controller"]
    document = inventory(demo, nodes=nodes)
    assert "slurm_controller_address" not in document["all"]["vars"]
    assert document["all"]["children"]["controller"] == {"vars": document["all"]["children"]["controller"]["vars"]}


def test_the_membership_digest_changes_when_a_node_joins_or_leaves_never_with_order(demo: Tenant) -> None:
    nodes = nodes_for(demo)
    assert membership_digest(nodes) == membership_digest(list(reversed(nodes)))
    assert membership_digest(nodes) != membership_digest(nodes[:-1])
    replaced = nodes[:-1] + [Node("ip-10-77-128-99", "10.77.128.99", "compute", "cpu", "i-new", "c5.2xlarge")]
    assert membership_digest(replaced) != membership_digest(nodes)
    # The manifest does not depend on the nodes: a node joining changes the membership, not the manifest.
    assert inventory(demo, nodes=nodes[:-1])["all"]["vars"]["fmcluster_manifest_digest"] == \
        inventory(demo)["all"]["vars"]["fmcluster_manifest_digest"]


# --- membership changes without a converge ----------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
#: The inventory variables derived from the live node list (assemble_inventory).
MEMBERSHIP_VARS = ("common_hosts", "slurm_nodes", "slurm_partitions", "slurm_topology", "fmcluster_nodes",
                   "fmcluster_membership_digest")
#: What playbooks/membership.yml runs: the /etc/hosts task, and the slurm role (a dependency of
#: slurm_controller's service entry) with its templates.
MEMBERSHIP_FILES = {"roles/common/tasks/hosts.yml", "roles/slurm/tasks/main.yml", "roles/slurm/templates/slurm.conf.j2",
                    "roles/slurm/templates/restart-settings.j2", "roles/slurm/templates/gres.conf.j2",
                    "roles/slurm/templates/topology.conf.j2"}
#: Readers of a membership variable that a membership pass need not rerun, and why.
NOT_MEMBERSHIP = {
    "roles/slurm_metrics/tasks/main.yml": "only whether the inventory has a Slurm cluster at all",
}


def test_a_membership_change_runs_the_membership_playbook_where_prometheus_finds_the_nodes_itself(
        demo: Tenant, stockmark: Tenant) -> None:
    for tenant in (demo, stockmark, load_tenant("pclab")):  # EC2 discovery: joins need only Slurm's node list
        assert membership_playbook(manifest_for(tenant)) == MEMBERSHIP_PLAYBOOK
    assert (ROOT / MEMBERSHIP_PLAYBOOK).is_file()
    # HyperPod lists Prometheus's targets in the inventory: a join re-renders prometheus.yml, so a whole converge.
    assert membership_playbook(manifest_for(load_tenant("neuronlab"))) is None
    assert membership_playbook({"vars": {}}) is None


def test_every_task_or_template_reading_the_node_list_is_rerun_by_the_membership_playbook() -> None:
    readers = set()
    for path in [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/templates/*"), *ROOT.glob("playbooks/*.yml")]:
        text = path.read_text()
        if any(re.search(rf"\b{name}\b", text) for name in MEMBERSHIP_VARS):
            readers.add(str(path.relative_to(ROOT)))
    assert readers - MEMBERSHIP_FILES - set(NOT_MEMBERSHIP) == set(), (
        "these read the node list but a membership change does not rerun them: add them to playbooks/membership.yml")
    played = yaml.safe_load((ROOT / MEMBERSHIP_PLAYBOOK).read_text())
    used = {(task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role") or {}).get("name")
            for play in played for task in play.get("tasks", [])} | {
            role["role"] for play in played for role in play.get("roles", [])}
    assert used == {"common", "slurm_controller", "slurm"}
    assert yaml.safe_load((ROOT / "roles/slurm_controller/meta/main.yml").read_text())["dependencies"] == [{"role": "slurm"}]


# --- Prometheus discovery ----------------------------------------------------------------------------------

def test_slurm_ec2_tenants_find_exporters_with_ec2_service_discovery_of_their_tag(stockmark: Tenant) -> None:
    configs = {c["job_name"]: c for c in inventory(stockmark)["all"]["vars"]["prometheus_scrape_configs"]}
    assert list(configs) == ["node", "dcgm", "efa"]
    node_sd = configs["node"]["ec2_sd_configs"][0]
    assert node_sd["region"] == stockmark.region and node_sd["port"] == 9100
    assert node_sd["filters"] == [{"name": "tag:fmcluster:org", "values": ["stockmark"]},
                                  {"name": "instance-state-name", "values": ["running"]}]
    assert "endpoint" not in node_sd  # AWS's own endpoint: nothing stands in
    assert configs["dcgm"]["ec2_sd_configs"][0]["filters"][-1] == {"name": "instance-type", "values": ["p5.48xlarge"]}
    relabel = {r["target_label"]: r for r in configs["efa"]["relabel_configs"]}
    assert relabel["__address__"]["replacement"] == "${1}:9109"
    assert set(relabel) == {"__address__", "node", "role", "queue", "instance_type"}


def test_inventory_discovery_lists_each_node_with_the_same_labels() -> None:
    nodes = [Node("ip-10-0-0-5", "10.0.0.5", "controller", None, "i-1", "m5.xlarge"),
             Node("ip-10-0-0-9", "10.0.0.9", "compute", "gpu", "i-2", "p5.48xlarge")]
    jobs = [{"job": "node", "port": 9100, "instance_types": []},
            {"job": "dcgm", "port": 9400, "instance_types": ["p5.48xlarge"]}]
    configs = scrape_configs({"prometheus_node_discovery": {"kind": "inventory"}, "prometheus_scrape_jobs": jobs}, nodes)
    assert configs == [
        {"job_name": "node", "static_configs": [
            {"targets": ["10.0.0.5:9100"], "labels": {"node": "ip-10-0-0-5", "role": "controller", "queue": "",
                                                     "instance_type": "m5.xlarge"}},
            {"targets": ["10.0.0.9:9100"], "labels": {"node": "ip-10-0-0-9", "role": "compute", "queue": "gpu",
                                                     "instance_type": "p5.48xlarge"}}]},
        {"job_name": "dcgm", "static_configs": [
            {"targets": ["10.0.0.9:9400"], "labels": {"node": "ip-10-0-0-9", "role": "compute", "queue": "gpu",
                                                     "instance_type": "p5.48xlarge"}}]}]


def test_hyperpod_tenants_scrape_the_nodes_their_inventory_lists(tmp_path: Path) -> None:
    root = make_root(tmp_path, "t-hp", "10.93.22.0/24", provider="aws", scheduler="hyperpod")
    tenant = load_tenant("t-hp", root)
    manifest = manifest_for(tenant)  # published before the cluster stack: the name is the template's, not an output
    assert manifest["discovery"]["kind"] == "hyperpod" and manifest["discovery"]["cluster_name"] == "fmc-t-hp"
    configs = assemble_inventory(manifest, nodes_for(tenant))["all"]["vars"]["prometheus_scrape_configs"]
    assert [len(c["static_configs"]) for c in configs] == [len(nodes_for(tenant))]


def test_a_queue_named_with_a_dash_has_the_same_label_on_node_info_and_on_its_prometheus_target(tmp_path: Path) -> None:
    tenant = load_tenant("t-dash", make_root(tmp_path, "t-dash", "10.93.23.0/24", provider="aws",
                                                 scheduler="hyperpod", queues={"gpu-1": 1}))
    document = assemble_inventory(manifest_for(tenant), nodes_for(tenant))
    group = document["all"]["children"]["compute"]["children"]["queue_gpu_1"]  # a group name cannot hold `-`
    (host,) = group["hosts"].values()
    node_info_queue = host["node_exporter_node_info"]["queue"]
    node_job = next(c for c in document["all"]["vars"]["prometheus_scrape_configs"] if c["job_name"] == "node")
    (target,) = [t for t in node_job["static_configs"] if t["labels"]["role"] == "compute"]
    assert node_info_queue == target["labels"]["queue"] == "gpu-1"


# --- what the manifest holds -------------------------------------------------------------------------------

def test_the_manifest_names_the_secrets_and_where_nodes_keep_them_never_their_values(demo: Tenant) -> None:
    manifest = manifest_for(demo)
    assert manifest["secrets"] == {
        "munge-key": {"id": "fmcluster/demo/munge-key", "roles": ["controller", "login", "compute"]},
        "grafana-admin-password": {"id": "fmcluster/demo/grafana-admin-password", "roles": ["controller"]}}
    assert manifest["vars"]["munge_key_src"] == "/etc/fmcluster/secrets/munge-key"
    assert (manifest["ref"], manifest["org"], manifest["format"]) == (REF, "demo", 1)
    assert not [k for k in json.dumps(manifest).split('"') if "munge_key" in k and k != "munge_key_src"]


def test_without_fsx_outputs_the_shared_storage_has_no_source_and_is_expected_mounted(demo: Tenant) -> None:
    manifest = manifest_for(demo)
    assert manifest["vars"]["shared_storage_filesystems"] == [{
        "name": "lustre", "type": "lustre", "mount_point": "/fsx", "source": "", "unit": "fsx.mount",
        "options": "defaults,noatime,flock,_netdev,x-systemd.automount,x-systemd.requires=network.service"}]
    assert manifest["vars"]["node_exporter_expected_mounts"] == [{"mountpoint": "/fsx", "fstype": "lustre"}]


def test_the_storage_stack_s_outputs_become_lustre_and_nfs_mount_sources(stockmark: Tenant) -> None:
    outputs = {"LustreDnsName": "fs-0a1.fsx.ap-northeast-1.amazonaws.com", "LustreMountName": "abcd1234",
               "HomeDnsName": "fs-0b2.fsx.ap-northeast-1.amazonaws.com"}
    storage = {fs["name"]: fs for fs in manifest_for(stockmark, outputs)["vars"]["shared_storage_filesystems"]}
    assert storage["lustre"]["source"] == "fs-0a1.fsx.ap-northeast-1.amazonaws.com@tcp:/abcd1234"
    assert (storage["home"]["type"], storage["home"]["source"], storage["home"]["unit"]) == (
        "nfs", "fs-0b2.fsx.ap-northeast-1.amazonaws.com:/fsx", "home.mount")
    assert "_netdev" in storage["lustre"]["options"] and "_netdev" in storage["home"]["options"]
    assert manifest_for(stockmark, outputs)["stack_outputs"] == dict(sorted(outputs.items()))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\x00"), min_size=1,
                        max_size=8).filter(lambda p: p not in (".", "..")), min_size=1, max_size=3))
def test_mount_unit_names_are_systemd_s_own_for_any_mount_point(parts: list[str]) -> None:
    path = "/" + "/".join(parts)
    expected = subprocess.run(["systemd-escape", "--path", "--suffix=mount", path], capture_output=True, text=True,
                              check=True).stdout.strip()
    assert systemd_mount_unit(path) == expected


def test_a_mount_point_that_is_not_a_normalized_path_has_no_unit_name() -> None:
    with pytest.raises(ValueError, match="not a normalized path"):
        systemd_mount_unit("/fsx/../etc")


@pytest.mark.parametrize(("org", "backends", "gpus"), [("demo", ["cpu"], 0), ("stockmark", ["nccl"], 8)])
def test_the_submit_node_gets_the_acceptance_backend_of_each_kind_of_queue(org: str, backends: list[str],
                                                                           gpus: int) -> None:
    variables = manifest_for(load_tenant(org))["vars"]
    assert (variables["nccl_tests_backends"], variables["nccl_tests_gpus_per_node"]) == (backends, gpus)


def test_a_cluster_of_gpu_and_cpu_queues_gets_both_acceptance_backends(tmp_path: Path) -> None:
    queues = [{"name": "gpu", "instance_type": "p5.48xlarge", "count": 2},
              {"name": "cpu", "instance_type": "c5.2xlarge", "count": 1}]
    tenant = load_tenant("t-mixed", make_root(tmp_path, "t-mixed", "10.93.23.0/24", provider="aws", queues=queues))
    variables = manifest_for(tenant)["vars"]
    assert variables["nccl_tests_backends"] == ["nccl", "cpu"]
    assert variables["nccl_tests_gpus_per_node"] == 8


# --- the deploy machine's copy --------------------------------------------------------------------------------

def test_the_written_inventory_says_it_is_generated_and_is_not_rewritten_when_unchanged(tmp_path: Path) -> None:
    root = make_root(tmp_path, "t-inv", "10.93.24.0/24", login=1, queues={"cpu": 2, "big": 1})
    tenant = load_tenant("t-inv", root)
    path = write_inventory(tenant, manifest_for(tenant), nodes_for(tenant), root=root)
    assert path == root / "inventories" / "t-inv" / "generated" / "hosts.yml"
    text = path.read_text()
    assert text.startswith(HEADER.format(spec="inventories/t-inv/group_vars/all/tenant.yml"))
    assert "edits will be reverted" in text.splitlines()[0]
    mtime = path.stat().st_mtime_ns
    write_inventory(tenant, manifest_for(tenant), nodes_for(tenant), root=root)
    assert path.stat().st_mtime_ns == mtime
    assert read_nodes("t-inv", root) == sort_nodes(nodes_for(tenant))


def test_ansible_reads_the_written_inventory_as_assembled(tmp_path: Path) -> None:
    root = make_root(tmp_path, "t-inv", "10.93.24.0/24", login=1, queues={"cpu": 2, "big": 1})
    tenant = load_tenant("t-inv", root)
    path = write_inventory(tenant, manifest_for(tenant), nodes_for(tenant), root=root)
    listing = json.loads(subprocess.run([venv_tool("ansible-inventory"), "-i", str(path), "--list"],
                                        capture_output=True, text=True, check=True).stdout)
    assert listing["compute"]["children"] == ["queue_cpu", "queue_big"]
    assert listing["queue_cpu"]["hosts"] == ["ip-10-93-24-140", "ip-10-93-24-141"]
    assert listing["login"]["hosts"] == ["ip-10-93-24-139"]
    host = listing["_meta"]["hostvars"]["ip-10-93-24-140"]
    assert (host["ansible_host"], host["fmcluster_instance_type"], host["slurm_controller_address"]) == (
        "10.93.24.140", "c5.2xlarge", "10.93.24.138")


def test_hostile_values_stay_values_in_the_written_inventory(tmp_path: Path) -> None:
    """Validation refuses such a mount point; the writer must not depend on that."""
    root = make_root(tmp_path, "t-hostile", "10.93.25.0/24")
    tenant = load_tenant("t-hostile", root)
    manifest = manifest_for(tenant, {"LustreMountName": "x\n- ]: {{ lookup('pipe','id') }}"})
    manifest["vars"]["shared_storage_filesystems"][0]["mount_point"] = "/fsx: {x: 1}\n  - ]{{ lookup('pipe','id') }}"
    path = write_inventory(tenant, manifest, nodes_for(tenant), root=root)
    assert load_inventory_yaml(path.read_text()) == assemble_inventory(manifest, nodes_for(tenant))
    write_manifest("t-hostile", manifest, root)
    assert read_manifest("t-hostile", root) == manifest


def test_a_value_that_looks_like_a_template_reaches_the_roles_as_written(tmp_path: Path) -> None:
    """Ansible templates inventory strings: a value with Jinja markers is written `!unsafe` and stays literal."""
    root = make_root(tmp_path, "t-hostile", "10.93.25.0/24")
    tenant = load_tenant("t-hostile", root)
    manifest = manifest_for(tenant)
    manifest["vars"]["slurm_cluster_name"] = "/fsx{{ 6 * 7 }}"
    path = write_inventory(tenant, manifest, nodes_for(tenant), root=root)
    shown = subprocess.run([venv_tool("ansible"), "-i", str(path), "ip-10-93-25-138", "-c", "local", "-m",
                            "ansible.builtin.debug", "-a", "var=slurm_cluster_name"],
                           capture_output=True, text=True, check=True).stdout
    assert "/fsx{{ 6 * 7 }}" in shown
