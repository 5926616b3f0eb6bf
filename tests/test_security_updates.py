"""Security updates keep flowing while the pinned stack never moves (roles/security_updates): unattended-upgrades on
fmcluster's own timer, with versions.yml's held_packages as its Package-Blacklist, given to every node kind."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import HOST_PYTHON, ROOT, venv_tool
from fmcluster import versions
from fmcluster.model import load_tenant
from localtenant import manifest_for

ORGS = sorted(p.name for p in (ROOT / "inventories").iterdir() if (p / "group_vars" / "all" / "tenant.yml").is_file())


def held(package: str) -> bool:
    """unattended-upgrade's own test (is_pkgname_in_blacklist): re.match of each pattern on the package name."""
    return any(re.match(pattern, package) for pattern in versions.role_vars()["security_updates_package_blacklist"])


def test_the_kernel_accelerator_stack_lustre_and_slurm_are_held_and_security_updates_are_not() -> None:
    pins = versions.load()
    branch = pins["nvidia"]["driver"].split(".")[0]
    cuda = pins["nvidia"]["cuda"].replace(".", "-")
    # What the nvidia_driver and neuron roles install (and hold), and what the GPU images ship as packages.
    neuron = yaml.safe_load((ROOT / "roles/neuron/defaults/main.yml").read_text())["neuron_package_versions"]
    stack = [f"cuda-drivers-{branch}", f"cuda-toolkit-{cuda}", f"nvidia-fabricmanager-{branch}", f"libnvidia-nscq-{branch}",
             "nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
             "libnvidia-container1", "libnccl2", "libnccl-dev", *neuron,
             f"nvidia-driver-{branch}-server", f"libnvidia-compute-{branch}-server", "datacenter-gpu-manager",
             "linux-image-6.8.0-1021-aws", "linux-aws", "linux-modules-extra-6.8.0-1021-aws", "linux-headers-aws",
             "efa", "efa-config", "libfabric1-aws", "ibverbs-providers", "libibverbs1", "rdma-core", "openmpi40-aws",
             "lustre-client-modules-aws", "lustre-client-utils",
             "slurmd", "slurmctld", "slurmdbd", "slurm-client", "slurm-wlm-basic-plugins", "libslurm39",
             "munge", "libmunge2", "libpmix2"]
    assert [p for p in stack if not held(p)] == []
    security = ["openssl", "libssl3", "libc6", "openssh-server", "sudo", "curl", "python3.12", "systemd", "tzdata",
                "bash"]
    assert [p for p in security if held(p)] == []


@pytest.mark.parametrize("org", ORGS)
def test_every_node_kind_gets_the_blacklist_from_the_manifest(org: str) -> None:
    manifest = manifest_for(load_tenant(org, ROOT))
    assert manifest["vars"]["security_updates_package_blacklist"] == [h["pattern"] for h in versions.load()["held_packages"]]
    baseline = yaml.safe_load((ROOT / "playbooks/baseline.yml").read_text())
    roles = [t["ansible.builtin.include_role"]["name"] for t in baseline[0]["tasks"]]
    assert roles.index("common") < roles.index("security_updates")  # after dpkg's lock is free and the lists fresh


def test_the_role_refuses_an_empty_blacklist_and_leaves_the_distribution_s_apt_timers_stopped() -> None:
    defaults = yaml.safe_load((ROOT / "roles/security_updates/defaults/main.yml").read_text())
    assert defaults["security_updates_package_blacklist"] == []
    tasks = yaml.safe_load((ROOT / "roles/security_updates/tasks/main.yml").read_text())
    assert "security_updates_package_blacklist | length > 0" in tasks[0]["ansible.builtin.assert"]["that"]
    stopped = yaml.safe_load((ROOT / "roles/common/defaults/main.yml").read_text())["common_apt_background_units"]
    assert {"apt-daily-upgrade.timer", "apt-daily.timer"} <= set(stopped)


def run_role(tmp_path: Path, variables: dict[str, Any], *args: str) -> tuple[int, dict[str, Any]]:
    play = tmp_path / "play.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  roles: [security_updates]\n", encoding="utf-8")
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({"ansible_python_interpreter": HOST_PYTHON, **variables}), encoding="utf-8")
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles")}
    proc = subprocess.run([venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", f"@{extra}",
                           str(play), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow
def test_the_role_converges_twice_without_change_and_its_units_pass_systemd_analyze(tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()
    variables = {"security_updates_package_blacklist": versions.role_vars()["security_updates_package_blacklist"],
                 "security_updates_install_package": False, "security_updates_start_timer": False,
                 "security_updates_unit_dir": str(units), "security_updates_apt_conf_path": str(tmp_path / "52fmc")}
    rc, first = run_role(tmp_path, variables)
    assert rc == 0 and first["stats"]["localhost"]["changed"] == 2
    rc, second = run_role(tmp_path, variables)
    assert rc == 0 and second["stats"]["localhost"]["changed"] == 0
    conf = (tmp_path / "52fmc").read_text()
    assert '    "linux-";\n' in conf and '    "nvidia-";\n' in conf and 'Automatic-Reboot "false"' in conf
    timer = (units / "fmcluster-security-updates.timer").read_text()
    assert "OnCalendar=*-*-* 03:00:00" in timer and "RandomizedDelaySec=2h" in timer
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze here")
    # The unit runs binaries this build machine need not have (unattended-upgrade): verify the units' syntax with
    # them stood in by /bin/true, everything else as written.
    service = (units / "fmcluster-security-updates.service").read_text()
    (units / "fmcluster-security-updates.service").write_text(service.replace("/usr/bin/unattended-upgrade", "/bin/true"))
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(units / "fmcluster-security-updates.service"),
                           str(units / "fmcluster-security-updates.timer")], capture_output=True, text=True, timeout=60)
    problems = [line for line in proc.stderr.splitlines() if "fmcluster-security-updates" in line]
    assert proc.returncode == 0 and not problems, proc.stderr


@pytest.mark.slow
def test_empty_blacklist_fails_the_role(tmp_path: Path) -> None:
    rc, run = run_role(tmp_path, {"security_updates_install_package": False, "security_updates_start_timer": False,
                                  "security_updates_unit_dir": str(tmp_path), "security_updates_apt_conf_path": str(tmp_path / "c")})
    assert rc != 0 and not (tmp_path / "c").exists()
