"""EC2's hypervisor stood in (fmcluster.providers.local.hypervisor): the reconcile decision, the lock the deploy's
boots share with it, what `halt` leaves down, what the daemon did as the tasks running meanwhile report it. The
deployed path (a compute node terminated in its group from the controller, its replacement booted with no deploy
machine) is tests/test_cluster_e2e.py's."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from fmcluster.providers.local import hypervisor
from fmcluster.providers.local.hypervisor import Plan, reconcile_plan


def instance(key: str, state: str = "running") -> dict[str, Any]:
    return {"InstanceId": key, "State": {"Name": state}}


# --- the reconcile decision -----------------------------------------------------------------------------------

def test_a_running_instance_without_a_host_is_booted_and_nothing_else_changes() -> None:
    plan = reconcile_plan([instance("i-a"), instance("i-b"), instance("i-new", "pending")], {"i-a", "i-b"})
    assert plan == Plan(boot=["i-new"], remove=[])


def test_the_host_of_a_terminated_or_stopped_instance_is_removed() -> None:
    instances = [instance("i-a"), instance("i-gone", "terminated"), instance("i-going", "shutting-down"),
                 instance("i-off", "stopped")]
    plan = reconcile_plan(instances, {"i-a", "i-gone", "i-going", "i-off", "i-unknown"})
    assert plan == Plan(boot=[], remove=["i-going", "i-gone", "i-off", "i-unknown"])


def test_a_replacement_is_one_removal_and_one_boot() -> None:
    plan = reconcile_plan([instance("i-old", "terminated"), instance("i-new")], {"i-old"})
    assert (plan.boot, plan.remove) == (["i-new"], ["i-old"]) and plan


def test_a_halted_instance_stays_down_but_its_termination_still_removes_nothing_twice() -> None:
    # halt removed its host: the daemon does not boot it again, as EC2 does not restart a crashed instance.
    assert not reconcile_plan([instance("i-a"), instance("i-halted")], {"i-a"}, halted={"i-halted"})
    assert reconcile_plan([instance("i-halted", "terminated"), instance("i-new")], set(), {"i-halted"}).boot == ["i-new"]


def test_nothing_to_do_is_a_false_plan() -> None:
    assert not reconcile_plan([instance("i-a"), instance("i-t", "terminated")], {"i-a"})
    assert not reconcile_plan([], set())


# --- the substrate's records (a temporary substrate root) -------------------------------------------------------

@pytest.fixture
def substrate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FMCLUSTER_SUBSTRATE_ROOT", str(tmp_path))
    return tmp_path / "t1"


def test_halted_marks_are_kept_and_cleared(substrate: Path) -> None:
    assert hypervisor.halted("t1") == set()
    hypervisor.mark_halted("t1", "i-a")
    hypervisor.mark_halted("t1", "i-b")
    assert hypervisor.halted("t1") == {"i-a", "i-b"}
    hypervisor.clear_halted("t1", ["i-a"])
    assert hypervisor.halted("t1") == {"i-b"}
    hypervisor.clear_halted("t1")
    assert hypervisor.halted("t1") == set() and not (substrate / hypervisor.HALTED_FILE).exists()


def test_what_the_daemon_did_is_reported_to_tasks_that_began_before(substrate: Path) -> None:
    substrate.mkdir(parents=True)
    hypervisor.record("t1", ["ip-10-0-0-5"], [])
    hypervisor.record("t1", ["ip-10-0-0-6"], ["ip-10-0-0-5"])
    hypervisor.record("t1", [], [])  # nothing done: nothing recorded
    assert hypervisor.events_since("t1", 0.0) == (["ip-10-0-0-5", "ip-10-0-0-6"], ["ip-10-0-0-5"])
    assert hypervisor.events_since("t1", 9e12) == ([], [])
    assert len((substrate / hypervisor.EVENTS_FILE).read_text().splitlines()) == 2


def test_the_boot_lock_excludes_another_process(substrate: Path) -> None:
    lock = substrate / hypervisor.LOCK_FILE
    with hypervisor.boot_lock("t1"):
        assert subprocess.run(["flock", "-n", str(lock), "true"]).returncode == 1
    assert subprocess.run(["flock", "-n", str(lock), "true"]).returncode == 0


def test_no_daemon_runs_for_a_tenant_without_one(substrate: Path) -> None:
    assert hypervisor.running("t1") is None and hypervisor.stop_hypervisor("t1") is False
