"""Every task that installs software is reachable by one tag, and none of them reads the tenant (issue 40).

`site.yml --tags install` is what a baked image is made of (fmcluster.baked, `invoke image`): every apt/package/
pip/get_url/unarchive task of every role carries the tag, and no task carrying it reads a variable of
fmcluster.baked.TENANT_VARIABLES (secrets, membership, host names, users), so an image holds nothing of them.
"""

from __future__ import annotations

import json
import re

import yaml

from conftest import ROOT
from fmcluster.baked import INSTALL_TAG, TENANT_VARIABLES, applied_roles, role_tasks


def test_every_installing_task_carries_the_install_tag() -> None:
    untagged = [f"{t.path}: {t.name}" for t in role_tasks(ROOT) if t.installs and not t.tagged]
    assert not untagged, f"tasks that install software without tags: [{INSTALL_TAG}] (fix: tag them, or tag the " \
                         f"block around them): {untagged}"


def test_every_task_fixing_a_daemon_account_s_id_carries_the_install_tag() -> None:
    """A baked image's packages would make slurm and munge with ids of their own (Debian 12: 64030, 103) before the
    first boot's fixed-id accounts, and the first boot keeps an account the image has: found by the e2e tier's
    first deploy on a baked image (slurm 64030 where every pristine node has 401)."""
    def reads_tenant(task: dict[str, object]) -> bool:
        text = json.dumps(task, default=str)
        return any(re.search(rf"\b{re.escape(name)}\b", text) for name in TENANT_VARIABLES)

    fixing = [t for t in role_tasks(ROOT) if t.fixes_account_id and not reads_tenant(t.task)]
    assert {t.path for t in fixing} >= {"roles/common/tasks/main.yml"}  # the walk sees them
    untagged = [f"{t.path}: {t.name}" for t in fixing if not t.tagged]
    assert not untagged, f"tasks fixing an account's id without tags: [{INSTALL_TAG}] (fix: tag them): {untagged}"


def test_the_walk_sees_the_installing_tasks() -> None:
    installing = [t for t in role_tasks(ROOT) if t.installs]
    assert len(installing) >= 20  # the walk reads every role (a walk that read none would pass the test above)
    assert {"roles/munge/tasks/main.yml", "roles/slurm_compute/tasks/main.yml"} <= {t.path for t in installing}


def test_no_install_task_reads_a_tenant_variable() -> None:
    found = []
    for task in role_tasks(ROOT):
        if not task.tagged:
            continue
        text = json.dumps(task.task, default=str)
        found += [f"{task.path}: {task.name}: {name}" for name in TENANT_VARIABLES
                  if re.search(rf"\b{re.escape(name)}\b", text)]
    assert not found, f"install tasks read tenant-specific variables (an image must hold nothing of them): {found}"


def test_accelerator_roles_are_installed_whole() -> None:
    """The accelerator roles hold the instance type's drivers and nothing of the tenant's: included with apply."""
    assert {"efa", "nvidia_driver", "neuron"} <= applied_roles(ROOT)


def test_the_includes_on_the_way_carry_the_tag() -> None:
    """A dynamic include runs under --tags only when it carries the tag itself (its own tags never reach inside)."""
    missing = []
    for playbook in ("baseline.yml", "accelerators.yml", "acceptance-jobs.yml"):
        for play in yaml.safe_load((ROOT / "playbooks" / playbook).read_text()):
            for task in play.get("tasks", []):
                include = task.get("ansible.builtin.include_role") or {}
                role = include.get("name")
                if role in {"common", "security_updates", "imds_guard", "efa", "nvidia_driver", "neuron"} or (
                        role == "nccl_tests" and task.get("vars", {}).get("nccl_tests_build")):
                    if INSTALL_TAG not in (task.get("tags") or []):
                        missing.append(f"{playbook}: {task['name']}")
    assert not missing, missing
