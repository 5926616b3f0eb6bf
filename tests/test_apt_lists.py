"""Every node's package lists are fresh before anything installs a package (issue 36): HyperPod's and
ParallelCluster's images carry git and python3-venv, so the first boot's bootstrap never runs `apt-get update` there
and an AMI's lists are as old as the image, or absent. roles/common's package_manager.yml refreshes them, first of
everything the site playbook does, on every node whose package manager is apt."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from conftest import ROOT
from role_helpers import trusted

TASKS = ROOT / "roles/common/tasks/package_manager.yml"


def task(name: str) -> dict[str, Any]:
    tasks: list[dict[str, Any]] = yaml.safe_load(TASKS.read_text())
    return next(t for t in tasks if t["name"] == name)


def test_the_site_playbook_refreshes_the_lists_before_any_other_play() -> None:
    site = yaml.safe_load((ROOT / "playbooks/site.yml").read_text())
    assert site[0]["ansible.builtin.import_playbook"] == "baseline.yml"
    baseline = yaml.safe_load((ROOT / "playbooks/baseline.yml").read_text())
    assert baseline[0]["hosts"] == "controller:login:compute"
    first = baseline[0]["tasks"][0]["ansible.builtin.include_role"]
    assert first == {"name": "common", "tasks_from": "package_manager.yml"}


def test_the_lists_are_refreshed_wherever_dpkg_and_apt_are_whatever_the_image_or_common_quiet_apt() -> None:
    """Only dpkg and apt decide: no image, scheduler or quiet-apt switch may leave a node with stale lists (before,
    dpkg was looked for only with common_quiet_apt, so turning it off skipped the refresh too)."""
    refresh = task("Refresh package lists the image ships stale or empty")
    assert refresh["ansible.builtin.apt"] == {"update_cache": True,
                                             "cache_valid_time": "{{ common_apt_lists_max_age_s }}"}
    assert refresh["when"].startswith("common_dpkg.stat.exists | default(false) and "
                                      "ansible_facts.pkg_mgr | default('') == 'apt' and ")
    assert "common_quiet_apt" not in refresh["when"]
    assert "install" in refresh["tags"]
    look = task("Look for dpkg")
    assert look["ansible.builtin.stat"] == {"path": "/var/lib/dpkg"} and "when" not in look
    defaults = yaml.safe_load((ROOT / "roles/common/defaults/main.yml").read_text())
    assert 0 < defaults["common_apt_lists_max_age_s"] <= 3600


@pytest.mark.parametrize(("wait_output", "refreshes"), [
    (None, True),  # no lock wait ran (common_quiet_apt false, --check): apt's cache_valid_time decides
    (["waited 0s"], True),  # no lists at all
    (["waited 0s", "lists_age_s=4000"], True),  # older than the limit
    (["waited 0s", "lists_age_s=3590"], True),  # within a minute of it
    (["waited 0s", "lists_age_s=120"], False),  # fresh: no apt run, which would change nothing
])
def test_apt_runs_unless_the_lock_wait_found_the_lists_fresh(wait_output: list[str] | None, refreshes: bool) -> None:
    """The refresh's apt run costs ~2 CPU-s even when its cache_valid_time finds the lists fresh (BENCHMARKS.md);
    the lock wait already reads their age as apt would, so the task is skipped only where apt would do nothing."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    variables: dict[str, Any] = {"common_dpkg": {"stat": {"exists": True}}, "ansible_facts": {"pkg_mgr": "apt"},
                                 "common_apt_lists_max_age_s": 3600}
    if wait_output is not None:
        variables["common_dpkg_wait"] = {"stdout_lines": wait_output}
    refresh = task("Refresh package lists the image ships stale or empty")
    templar = Templar(loader=DataLoader(), variables=trusted(variables))
    assert templar.evaluate_conditional(trusted(refresh["when"])) is refreshes
