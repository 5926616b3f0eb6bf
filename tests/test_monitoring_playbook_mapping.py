"""playbooks/monitoring.yml maps the generated inventory's catalog facts onto the exporters' expectations.

A GPU node of an AWS tenant (p5.48xlarge from the instance catalog, in queue `gpu`) is run through the
real playbook in check mode with --diff: nothing is written, and the diff shows what the node_exporter
role would write (the expectations textfile and the file_sd target).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from fmcluster.catalog import load_catalog
from monitoring_helpers import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def check_diff(tmp_path_factory: pytest.TempPathFactory) -> str:
    workdir = tmp_path_factory.mktemp("mapping")
    p5 = load_catalog()["p5.48xlarge"]
    inventory = {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3",
                 "fmcluster_org": "gpuorg", "fmcluster_provider": "aws", "fmcluster_lustre_mount_point": "/fsx",
                 "prometheus_config_dir": str(workdir / "prometheus"),
                 "node_exporter_run_dir": str(workdir / "{{ inventory_hostname }}")},
        "children": {
            "controller": {"hosts": {"fmo-map-ctl": {"fmcluster_address": "10.1.0.10"}}},
            "compute": {"children": {"queue_gpu": {
                "hosts": {"fmo-map-gpu1": {"fmcluster_address": "10.1.16.21"}},
                "vars": {"fmcluster_instance_type": "p5.48xlarge", "fmcluster_instance": p5.as_vars()}}}}},
    }}
    path = workdir / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(workdir / "facts"), "ANSIBLE_FORCE_COLOR": "0"}
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(path), str(ROOT / "playbooks" / "monitoring.yml"),
         "--check", "--diff", "--limit", "fmo-map-gpu1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert not list(workdir.glob("fmo-map-gpu1*")), "check mode wrote files"
    return result.stdout


def test_a_p5_node_expects_the_catalog_s_gpus_and_efa_interfaces(check_diff: str) -> None:
    p5 = load_catalog()["p5.48xlarge"].as_vars()
    assert f'+fmcluster_node_expected_accelerators{{accelerator="cuda"}} {p5["accelerators_per_node"]}' in check_diff
    assert f"+fmcluster_node_expected_efa_interfaces {p5['efa_interfaces']}" in check_diff


def test_an_aws_node_expects_the_lustre_mount(check_diff: str) -> None:
    assert '+fmcluster_node_expected_mount{mountpoint="/fsx",fstype="lustre"} 1' in check_diff


def test_the_node_s_target_carries_its_queue_and_instance_type(check_diff: str) -> None:
    assert "+    queue: gpu" in check_diff
    assert "+    instance_type: p5.48xlarge" in check_diff
    assert "+  - 10.1.16.21:9100" in check_diff


def test_gpu_and_efa_exporters_are_skipped_by_facts_on_a_host_without_the_hardware(check_diff: str) -> None:
    assert "No NVIDIA GPU on fmo-map-gpu1" in check_diff
    assert "No EFA device under /sys/class/infiniband on fmo-map-gpu1" in check_diff
