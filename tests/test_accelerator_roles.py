"""playbooks/accelerators.yml with the real roles on this machine (no GPU, EFA or Trainium here).

Every catalog instance type is a local host of one inventory. The roles must choose their work from the catalog,
detect that the hardware is absent, skip with a message that names what would have been installed, render the
NCCL environment with the role's own templates, change nothing in --check, and change nothing on a second run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fmcluster.catalog import load_catalog
from fmcluster.nccl import queue_vars

from conftest import ROOT, venv_tool

pytestmark = pytest.mark.slow

GOLDEN = ROOT / "tests" / "golden"
UPDATE = os.environ.get("FMCLUSTER_UPDATE_GOLDEN") == "1"
TYPES = ["p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge", "trn1.32xlarge", "trn1n.32xlarge", "c5.2xlarge"]
PROFILE = "/etc/profile.d/fmcluster-nccl.sh"  # nccl role defaults: what a real node gets
PROLOG = "/etc/slurm/fmcluster-task-prolog.sh"


def slug(instance_type: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", instance_type)


def write_inventory(path: Path, provider: str, types: list[str], out: Path | None) -> Path:
    """A generated-inventory look-alike: one queue group per instance type, catalog facts as group vars."""
    catalog = load_catalog()
    queues: dict[str, Any] = {}
    for instance_type in types:
        host_vars: dict[str, Any] = {}
        if out is not None:  # a real run writes under `out`, never into /etc of this shared machine
            host_vars = {"nccl_profile_path": str(out / slug(instance_type) / "profile.sh"),
                         "nccl_task_prolog_path": str(out / slug(instance_type) / "task-prolog.sh")}
        queues[f"queue_{slug(instance_type)}"] = {
            "hosts": {slug(instance_type): host_vars},
            "vars": {"fmcluster_instance_type": instance_type, "fmcluster_instance": catalog[instance_type].as_vars(),
                     **queue_vars(instance_type)},
        }
    inventory = {"all": {
        "vars": {"fmcluster_provider": provider, "ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {"compute": {"children": queues}},
    }}
    path.write_text(yaml.safe_dump(inventory, sort_keys=False), encoding="utf-8")
    return path


def run_playbook(inventory: Path, *args: str) -> dict[str, Any]:
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_CACHE_PLUGIN": "memory",
           "PATH": f"{Path(venv_tool('ansible-playbook')).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([venv_tool("ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / "accelerators.yml"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    try:
        result: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"ansible-playbook did not return JSON (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result["rc"] = proc.returncode
    return result


def task_results(run: dict[str, Any], host: str) -> list[tuple[str, dict[str, Any]]]:
    return [(task["task"]["name"], task["hosts"][host]) for play in run["plays"] for task in play["tasks"] if host in task["hosts"]]


def messages(run: dict[str, Any], host: str) -> list[str]:
    return [str(r["msg"]) for _, r in task_results(run, host) if "msg" in r and not r.get("skipped")]


def facts(run: dict[str, Any], host: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for _, result in task_results(run, host):
        merged.update(result.get("ansible_facts", {}))
    return merged


def rendered(run: dict[str, Any], host: str, task_name: str) -> str:
    for name, result in task_results(run, host):
        if name.endswith(task_name):
            diff = result["diff"]
            return str((diff[0] if isinstance(diff, list) else diff)["after"])
    raise AssertionError(f"task {task_name!r} did not run on {host}")


def check_golden(path: Path, text: str) -> None:
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{path.relative_to(ROOT)} differs; FMCLUSTER_UPDATE_GOLDEN=1 rewrites it"


@pytest.fixture(scope="module")
def check_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """--check --diff with the roles' default paths: the diff carries what the templates render, nothing is written."""
    before = {p: Path(p).exists() for p in (PROFILE, PROLOG)}
    inventory = write_inventory(tmp_path_factory.mktemp("check") / "hosts.yml", "local", TYPES, out=None)
    run = run_playbook(inventory, "--check", "--diff")
    assert {p: Path(p).exists() for p in (PROFILE, PROLOG)} == before, "--check wrote files"
    return run


@pytest.fixture(scope="module")
def converged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    out = tmp_path_factory.mktemp("converge")
    inventory = write_inventory(out / "hosts.yml", "local", TYPES, out=out)
    return out, run_playbook(inventory), run_playbook(inventory)


def test_check_mode_succeeds_everywhere_and_changes_nothing_on_disk(check_run: dict[str, Any]) -> None:
    assert check_run["rc"] == 0
    assert all(stats["failures"] == 0 and stats["unreachable"] == 0 for stats in check_run["stats"].values())


@pytest.mark.parametrize("instance_type", ["p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge", "trn1.32xlarge", "trn1n.32xlarge"])
def test_rendered_nccl_profile_and_task_prolog_match_the_golden_files(check_run: dict[str, Any], instance_type: str) -> None:
    host = slug(instance_type)
    profile = rendered(check_run, host, "Write the NCCL environment for login shells")
    prolog = rendered(check_run, host, "Write the Slurm TaskProlog that gives every task the same environment")
    check_golden(GOLDEN / "nccl" / f"{instance_type}.profile.sh", profile)
    check_golden(GOLDEN / "nccl" / f"{instance_type}.task-prolog.sh", prolog)
    exports = {k: v for k, v in queue_vars(instance_type)["nccl_environment"].items()}
    for name, value in exports.items():
        assert f"export {name}='{value}'" in profile or f"export {name}={value}" in profile
        assert f"export {name}={value}" in prolog
    if not exports:
        assert "Nothing to set" in profile and "Nothing to set" in prolog


def test_task_prolog_prints_exactly_the_lines_slurm_reads(converged: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    out, _, _ = converged
    for instance_type in ["p5.48xlarge", "trn1.32xlarge"]:
        printed = subprocess.run(["sh", str(out / slug(instance_type) / "task-prolog.sh")], capture_output=True, text=True, check=True)
        expected = [f"export {k}={v}" for k, v in sorted(queue_vars(instance_type)["nccl_environment"].items())]
        assert printed.stdout.splitlines() == expected
        shell = subprocess.run(["sh", "-c", f". {out / slug(instance_type) / 'profile.sh'}; env"], capture_output=True, text=True, check=True)
        for line in expected:
            assert line.removeprefix("export ") in shell.stdout.splitlines()


@pytest.mark.parametrize("instance_type", TYPES)
def test_package_sets_follow_the_catalog_and_match_the_golden_files(check_run: dict[str, Any], instance_type: str) -> None:
    instance = load_catalog()[instance_type]
    found = facts(check_run, slug(instance_type))
    plan = {"instance_type": instance_type}
    if "efa_plan" in found:
        plan["efa"] = found["efa_plan"]
    if "nvidia_driver_plan" in found:
        plan["nvidia_driver"] = found["nvidia_driver_plan"]
    if "neuron_plan" in found:
        plan["neuron"] = found["neuron_plan"]
    check_golden(GOLDEN / "packages" / f"{instance_type}.yml", yaml.safe_dump(plan, sort_keys=True))
    # The roles chosen and what they would install are the catalog's facts, not flags.
    assert ("efa" in plan) == instance.has_efa
    assert ("nvidia_driver" in plan) == (instance.accelerator == "cuda")
    assert ("neuron" in plan) == (instance.accelerator == "neuron")
    if instance.has_efa:
        assert plan["efa"]["expected_interfaces"] == instance.efa_interfaces
    if instance.accelerator == "cuda":
        packages = plan["nvidia_driver"]["packages"]
        assert plan["nvidia_driver"]["expected_gpus"] == instance.accelerators_per_node
        assert any(p.startswith("nvidia-fabricmanager-") for p in packages) == instance.nvswitch
        assert ("nvidia-fabricmanager" in plan["nvidia_driver"]["services"]) == instance.nvswitch
        driver = next(p for p in packages if p.startswith("cuda-drivers-")).split("=")[1]
        assert all(p.split("=")[1] == driver for p in packages if "fabricmanager" in p or "nscq" in p), "driver and Fabric Manager must match"
    if instance.accelerator == "neuron":
        assert plan["neuron"]["expected_devices"] == instance.accelerators_per_node
        assert {p.split("=")[0] for p in plan["neuron"]["packages"]} == {
            "aws-neuronx-dkms", "aws-neuronx-collectives", "aws-neuronx-runtime-lib", "aws-neuronx-tools"}


@pytest.mark.parametrize("instance_type", TYPES)
def test_absent_hardware_is_skipped_with_a_message_and_nothing_is_installed(check_run: dict[str, Any], instance_type: str) -> None:
    instance = load_catalog()[instance_type]
    said = "\n".join(messages(check_run, slug(instance_type)))
    expected = (["EFA: skipped - no EFA device found"] if instance.has_efa else []) + \
        (["nvidia_driver: skipped - no NVIDIA GPU found"] if instance.accelerator == "cuda" else []) + \
        (["neuron: skipped - no Trainium device found"] if instance.accelerator == "neuron" else [])
    for line in expected:
        assert line in said and "Nothing was installed." in said
    assert "skipped - " not in said if not expected else True
    installing = {"ansible.builtin.apt", "ansible.builtin.get_url", "ansible.builtin.unarchive", "ansible.builtin.command",
                  "ansible.builtin.deb822_repository", "ansible.builtin.dpkg_selections", "ansible.builtin.service",
                  "community.general.modprobe", "ansible.posix.sysctl"}
    ran = [name for name, result in task_results(check_run, slug(instance_type))
           if not result.get("skipped") and result.get("action") in installing]
    assert ran == []


def test_second_converge_changes_nothing(converged: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    _, first, second = converged
    assert first["rc"] == 0 and second["rc"] == 0
    assert sum(stats["changed"] for stats in first["stats"].values()) > 0
    assert {host: stats["changed"] for host, stats in second["stats"].items()} == {slug(t): 0 for t in TYPES}


def test_efa_fails_clearly_on_an_aws_host_without_the_efa_the_catalog_promises(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "hosts.yml", "aws", ["p5.48xlarge", "c5.2xlarge"], out=tmp_path)
    run = run_playbook(inventory, "--check")
    assert run["rc"] != 0
    assert run["stats"]["p5_48xlarge"]["failures"] == 1 and run["stats"]["c5_2xlarge"]["failures"] == 0
    failed = [r["msg"] for _, r in task_results(run, "p5_48xlarge") if r.get("failed")]
    assert failed and "attaches 32 EFA interface(s), but no EFA device was found on this AWS host" in failed[0]
    assert "Nothing was installed" in failed[0]


def test_a_cluster_of_plain_cpu_queues_gets_no_accelerator_role_at_all(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "hosts.yml", "local", ["c5.2xlarge", "m5.xlarge"], out=tmp_path)
    run = run_playbook(inventory)
    assert run["rc"] == 0
    assert {host: stats["changed"] for host, stats in run["stats"].items()} == {"c5_2xlarge": 0, "m5_xlarge": 0}
    assert [p.name for p in tmp_path.iterdir()] == ["hosts.yml"]
    said = " ".join(messages(run, "c5_2xlarge"))
    assert "Roles: ['none']" in said


def test_cpu_nodes_of_an_accelerated_cluster_get_the_cluster_wide_task_prolog_empty(
        converged: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    out, _, _ = converged
    printed = subprocess.run(["sh", str(out / "c5_2xlarge" / "task-prolog.sh")], capture_output=True, text=True, check=True)
    assert printed.stdout == ""
