"""The accelerator roles adapt to what the image carries: at or above the pin it is accepted, below or absent
the pinned version is installed, never a downgrade (roles/nvidia_driver, roles/efa, roles/neuron).

One ansible-playbook run evaluates the roles' own decision variables (their vars/main.yml, with the role
defaults) for images with older, equal and newer components, and runs the neuron role's decision tasks against
this machine's real package database (no Neuron package here; `bash` stands in for one the image has)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
import yaml

from conftest import HOST_PYTHON, ROOT, venv_tool
from fmcluster import versions

pytestmark = pytest.mark.slow  # one ansible-playbook run (several seconds on a loaded machine)

PIN = "570.133.20"
#: (image driver, image Fabric Manager, image CUDA dirs) → (driver installed?, Fabric Manager package or None, CUDA?)
NVIDIA = [
    ("", "", [], True, f"nvidia-fabricmanager-570={PIN}-1", True),
    ("560.35.03", "560.35.03", ["12.4"], True, f"nvidia-fabricmanager-570={PIN}-1", True),
    (PIN, PIN, ["12.8"], False, None, False),
    ("580.95.05", "", ["12.9", "12.10"], False, "nvidia-fabricmanager-580=580.95.05-1", False),
    ("580.95.05", "580.95.05", ["11.8"], False, None, True),
]
EFA = [("", True), ("# EFA installer version: 1.38.0\n# Debug packages installed: no\n", True),
       ("# EFA installer version: 1.49.0\n", False), ("# EFA installer version: 1.50.1\n", False)]


def playbook() -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    for role in ("nvidia_driver", "efa"):
        # Outside the role there is no role_path for its defaults' versions.yml lookup (`<role>_pins`): the play
        # hands the pins in, as the manifest does on a node.
        tasks += [{"ansible.builtin.include_vars": str(ROOT / "roles" / role / "defaults" / "main.yml")},
                  {"ansible.builtin.set_fact": {f"{role}_pins": versions.load()}},
                  {"ansible.builtin.include_vars": str(ROOT / "roles" / role / "vars" / "main.yml")}]
    for i, (driver, fm, cuda, *_) in enumerate(NVIDIA):
        tasks += [
            {"ansible.builtin.set_fact": {
                "nvidia_driver_fabric_manager": True, "nvidia_driver_container_toolkit": False,
                "nvidia_driver_image_module": {"rc": 0 if driver else 1, "stdout": driver},
                "nvidia_driver_image_fm": {"rc": 0, "stdout": f"Fabric Manager version is : {fm}" if fm else ""},
                "nvidia_driver_image_cuda": {"files": [{"path": f"/usr/local/cuda-{v}"} for v in cuda]}}},
            {"name": f"nvidia {i}", "ansible.builtin.debug": {
                "msg": "{{ {'install': _nvidia_driver_to_install, 'running': _nvidia_driver_running_version} }}"}}]
    for i, (marker, _) in enumerate(EFA):
        tasks += [
            {"ansible.builtin.set_fact": {"efa_marker": {"content": "{{ %r | b64encode }}" % marker} if marker else {}}},
            {"name": f"efa {i}", "ansible.builtin.debug": {"msg": "{{ _efa_needs_install | bool }}"}}]
    tasks += [
        {"ansible.builtin.include_vars": str(ROOT / "roles" / "neuron" / "defaults" / "main.yml")},
        {"ansible.builtin.set_fact": {"neuron_package_versions": {"bash": "1.0", "aws-neuronx-dkms": "2.31.7.0",
                                                                  "coreutils": "999.0"}}},
        {"ansible.builtin.include_role": {"name": "neuron", "tasks_from": "image.yml"}},
        {"name": "neuron", "ansible.builtin.debug": {"msg": "{{ neuron_to_install }}"}}]
    return [{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("adapt") / "play.yml"
    path.write_text(yaml.safe_dump(playbook(), sort_keys=False))
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_LOCALHOST_WARNING": "false",
           "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"}
    proc = subprocess.run([venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={HOST_PYTHON}", str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads(proc.stdout)
    return {t["task"]["name"]: t["hosts"]["localhost"].get("msg") for play in run["plays"] for t in play["tasks"]}


@pytest.mark.parametrize("case", range(len(NVIDIA)))
def test_the_nvidia_driver_of_the_image_is_kept_at_or_above_the_pin_and_fabric_manager_matches_it(
        results: dict[str, Any], case: int) -> None:
    driver, fm, cuda, wants_driver, fm_package, wants_cuda = NVIDIA[case]
    got = results[f"nvidia {case}"]
    install = got["install"]
    assert any(p.startswith("cuda-drivers-") for p in install) == wants_driver, install
    assert [p for p in install if p.startswith("nvidia-fabricmanager")] == ([fm_package] if fm_package else []), install
    assert any(p.startswith("cuda-toolkit-") for p in install) == wants_cuda, install
    assert got["running"] == (driver if driver and not wants_driver else PIN)


@pytest.mark.parametrize("case", range(len(EFA)))
def test_the_efa_installer_runs_only_where_the_image_has_none_or_an_older_one(results: dict[str, Any],
                                                                             case: int) -> None:
    assert results[f"efa {case}"] is EFA[case][1]


def test_neuron_installs_only_the_packages_the_image_lacks_or_has_older(results: dict[str, Any]) -> None:
    # bash (here, newer than 1.0) is kept; a package absent here, or older than its pin, is installed.
    assert results["neuron"] == ["aws-neuronx-dkms=2.31.7.0", "coreutils=999.0"]
