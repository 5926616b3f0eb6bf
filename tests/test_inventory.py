"""The generated inventory (inventories/<org>/generated/hosts.yml): what the roles see of a tenant."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import venv_tool
from fmcluster.catalog import load_catalog
from fmcluster.inventory import HEADER, inventory_document, placement_group_output_key, write_inventory
from fmcluster.localnodes import LocalNode, plan
from fmcluster.model import Tenant, load_tenant
from localtenant import make_root


@dataclass(frozen=True)
class AwsNode:
    name: str
    role: str
    queue: str | None
    address: str


def local_nodes(tenant: Tenant) -> list[LocalNode]:
    return [LocalNode(s.name, s.role, s.queue, f"10.79.20.{i + 2}", f"fmc-{tenant.org}-{s.name}", f"x{i}")
            for i, s in enumerate(plan(tenant))]


def aws_nodes(tenant: Tenant) -> list[AwsNode]:
    return [AwsNode(s.name, s.role, s.queue, f"10.0.1.{i + 10}") for i, s in enumerate(plan(tenant))]


@pytest.fixture
def demo() -> Tenant:
    return load_tenant("demo")


@pytest.fixture
def stockmark() -> Tenant:
    return load_tenant("stockmark")


def test_groups_are_controller_login_compute_and_one_queue_group_per_queue(demo: Tenant) -> None:
    doc = inventory_document(demo, local_nodes(demo))["all"]["children"]
    assert list(doc["controller"]["hosts"]) == ["controller-1"]
    assert list(doc["login"]["hosts"]) == ["login-1"]
    assert list(doc["compute"]["children"]) == ["queue_cpu"]
    assert list(doc["compute"]["children"]["queue_cpu"]["hosts"]) == ["cpu-1", "cpu-2", "cpu-3"]


def test_every_group_carries_its_instance_type_and_the_catalog_entry(demo: Tenant) -> None:
    doc = inventory_document(demo, local_nodes(demo))["all"]["children"]
    queue_vars = doc["compute"]["children"]["queue_cpu"]["vars"]
    assert queue_vars["fmcluster_instance_type"] == "c5.2xlarge"
    assert queue_vars["fmcluster_instance"] == load_catalog()["c5.2xlarge"].as_vars()
    assert doc["controller"]["vars"]["fmcluster_instance_type"] == "m5.xlarge"


def test_all_vars_name_the_org_and_provider(demo: Tenant) -> None:
    all_vars = inventory_document(demo, local_nodes(demo))["all"]["vars"]
    assert (all_vars["fmcluster_org"], all_vars["fmcluster_provider"]) == ("demo", "local")


def test_slurm_nodes_and_partitions_come_from_the_queues(demo: Tenant) -> None:
    all_vars = inventory_document(demo, local_nodes(demo))["all"]["vars"]
    assert [n["name"] for n in all_vars["slurm_nodes"]] == ["cpu-1", "cpu-2", "cpu-3"]
    assert {n["partition"] for n in all_vars["slurm_nodes"]} == {"cpu"}
    assert all_vars["slurm_partitions"] == [{"name": "cpu", "nodes": ["cpu-1", "cpu-2", "cpu-3"], "default": True}]
    assert all_vars["slurm_controller_address"] == "10.79.20.2"


def test_local_nodes_get_this_machines_cpus_and_no_gpus(demo: Tenant) -> None:
    import os

    node = inventory_document(demo, local_nodes(demo))["all"]["vars"]["slurm_nodes"][0]
    assert node["cpus"] == os.cpu_count()
    assert "gres" not in node


def test_local_tenant_has_one_munged_on_the_controller_and_per_node_slurm_conf(demo: Tenant) -> None:
    all_vars = inventory_document(demo, local_nodes(demo))["all"]["vars"]
    assert all_vars["munge_daemon"] == "{{ inventory_hostname in groups['controller'] }}"
    assert all_vars["slurm_conf_dir"] == "/var/lib/fmcluster/demo/nodes/{{ inventory_hostname }}/etc/slurm"
    assert all_vars["slurm_spool_dir"].endswith("/%n")
    assert (all_vars["common_manage_etc_hosts"], all_vars["common_time_sync"]) == (False, False)


def test_aws_gpu_nodes_get_gres_and_catalog_cpus_and_95_percent_memory(stockmark: Tenant) -> None:
    all_vars = inventory_document(stockmark, aws_nodes(stockmark))["all"]["vars"]
    node = all_vars["slurm_nodes"][0]
    p5 = load_catalog()["p5.48xlarge"]
    assert (node["cpus"], node["gres"], node["gres_files"]) == (p5.vcpus, "gpu:8", "/dev/nvidia[0-7]")
    assert node["real_memory_mb"] == int(p5.memory_gib * 1024 * 0.95)
    assert len(all_vars["common_hosts"]) == len(aws_nodes(stockmark))
    assert "munge_daemon" not in all_vars  # every AWS node runs its own munged (role default)


def test_a_placement_group_output_becomes_a_topology_switch(stockmark: Tenant) -> None:
    queue = stockmark.queues[0].name
    outputs = {placement_group_output_key(queue): "fmc-stockmark-pg"}
    all_vars = inventory_document(stockmark, aws_nodes(stockmark), outputs)["all"]["vars"]
    assert all_vars["slurm_topology"] == [{"name": "fmc-stockmark-pg",
                                           "nodes": [n["name"] for n in all_vars["slurm_nodes"]]}]
    assert inventory_document(stockmark, aws_nodes(stockmark))["all"]["vars"]["slurm_topology"] == []


def test_without_login_nodes_the_controller_is_the_login_node(tmp_path: Path) -> None:
    root = make_root(tmp_path, "t-inv", "10.79.20.0/24", login=0)
    tenant = load_tenant("t-inv", root)
    doc = inventory_document(tenant, local_nodes(tenant), root=root)["all"]["children"]
    assert list(doc["login"]["hosts"]) == ["controller-1"]


def test_written_file_starts_with_the_generated_header_and_is_not_rewritten_when_unchanged(tmp_path: Path) -> None:
    root = make_root(tmp_path, "t-inv", "10.79.20.0/24", login=1, queues={"cpu": 2, "big": 1})
    tenant = load_tenant("t-inv", root)
    path = write_inventory(tenant, local_nodes(tenant), root=root)
    assert path == root / "inventories" / "t-inv" / "generated" / "hosts.yml"
    text = path.read_text()
    assert text.startswith(HEADER.format(spec="inventories/t-inv/group_vars/all/tenant.yml"))
    assert "edits will be reverted" in text.splitlines()[0]
    assert list(yaml.safe_load(text)["all"]["children"]["compute"]["children"]) == ["queue_cpu", "queue_big"]
    mtime = path.stat().st_mtime_ns
    write_inventory(tenant, local_nodes(tenant), root=root)
    assert path.stat().st_mtime_ns == mtime


def test_ansible_reads_the_generated_directory_and_renders_per_node_paths(tmp_path: Path) -> None:
    root = make_root(tmp_path, "t-inv", "10.79.20.0/24", login=1)
    tenant = load_tenant("t-inv", root)
    path = write_inventory(tenant, local_nodes(tenant), root=root)
    listing = json.loads(subprocess.run([venv_tool("ansible-inventory"), "-i", f"{path.parent}/", "--list"],
                                        capture_output=True, text=True, check=True).stdout)
    assert listing["queue_cpu"]["hosts"] == ["cpu-1", "cpu-2"]
    assert listing["compute"]["children"] == ["queue_cpu"]
    out = subprocess.run([venv_tool("ansible"), "-i", f"{path.parent}/", "cpu-2", "-m", "ansible.builtin.debug",
                          "-a", "var=slurm_conf_dir"], capture_output=True, text=True, check=True).stdout
    assert "/var/lib/fmcluster/t-inv/nodes/cpu-2/etc/slurm" in out
