"""playbooks/monitoring.yml maps the inventory a node assembles onto the exporters' expectations.

A GPU node of an AWS tenant (stockmark: p5.48xlarge in queue `gpu`, FSx for Lustre and an OpenZFS home), with the
inventory fmcluster.manifest.assemble_inventory makes from its manifest, is run through the real playbook in
check mode with --diff: nothing is written, and the diff shows what the node_exporter role would write (the
expectations textfile, the daemon's systemd unit with its command line).
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from conftest import HOST_PYTHON
from fmcluster.catalog import load_catalog
from fmcluster.manifest import assemble_inventory
from fmcluster.model import load_tenant
from localtenant import manifest_for, nodes_for
from monitoring_helpers import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gpu_node() -> tuple[str, str]:
    node = next(n for n in nodes_for(load_tenant("stockmark")) if n.queue == "gpu")
    return node.name, node.address


@pytest.fixture(scope="module")
def check_diff(tmp_path_factory: pytest.TempPathFactory, gpu_node: tuple[str, str]) -> str:
    workdir = tmp_path_factory.mktemp("mapping")
    tenant = load_tenant("stockmark")
    outputs = {"LustreDnsName": "fs-1.fsx.example", "LustreMountName": "abc", "HomeDnsName": "fs-2.fsx.example"}
    inventory = assemble_inventory(manifest_for(tenant, outputs), nodes_for(tenant))
    inventory["all"]["vars"].update({
        "ansible_connection": "local", "ansible_python_interpreter": HOST_PYTHON,
        "prometheus_config_dir": str(workdir / "prometheus"), "node_exporter_run_dir": str(workdir / "{{ inventory_hostname }}")})
    path = workdir / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(workdir / "facts"), "ANSIBLE_FORCE_COLOR": "0"}
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(path), str(ROOT / "playbooks" / "monitoring.yml"),
         "--check", "--diff", "--limit", gpu_node[0]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert not list(workdir.glob("ip-*")), "check mode wrote files"
    return result.stdout


def test_a_p5_node_expects_the_catalog_s_gpus_and_efa_interfaces(check_diff: str) -> None:
    p5 = load_catalog()["p5.48xlarge"].as_vars()
    assert f'+fmcluster_node_expected_accelerators{{accelerator="cuda"}} {p5["accelerators_per_node"]}' in check_diff
    assert f"+fmcluster_node_expected_efa_interfaces {p5['efa_interfaces']}" in check_diff


def test_an_aws_node_expects_every_shared_file_system_of_the_manifest(check_diff: str) -> None:
    assert '+fmcluster_node_expected_mount{mountpoint="/fsx",fstype="lustre"} 1' in check_diff
    assert '+fmcluster_node_expected_mount{mountpoint="/home",fstype="nfs"} 1' in check_diff


def test_the_node_s_info_carries_its_role_queue_and_instance_type(check_diff: str) -> None:
    assert ('+fmcluster_node_info{cluster="stockmark",instance_type="p5.48xlarge",queue="gpu",role="compute"} 1'
            in check_diff)


def test_node_exporter_listens_on_the_node_s_cluster_address(check_diff: str, gpu_node: tuple[str, str]) -> None:
    assert f"+ExecStart=/usr/bin/prometheus-node-exporter --web.listen-address={gpu_node[1]}:9100 " in check_diff


def test_gpu_and_efa_exporters_are_skipped_by_facts_on_a_host_without_the_hardware(
        check_diff: str, gpu_node: tuple[str, str]) -> None:
    assert f"No NVIDIA GPU on {gpu_node[0]}" in check_diff
    assert f"No EFA device under /sys/class/infiniband on {gpu_node[0]}" in check_diff
