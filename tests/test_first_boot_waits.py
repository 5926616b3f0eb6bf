"""Start-up races at first boot: every node converges at once, and a node that gives up on the controller sends
CloudFormation a FAILURE signal that rolls the whole cluster stack back. The waits on the controller are bounded
by the first-boot window (the cluster stack's signal timeout), not by a few seconds of polling."""

from __future__ import annotations

import yaml

from conftest import ROOT
from fmcluster.schedulers.slurm_ec2.scheduler import SlurmEc2


def defaults(role: str) -> dict[str, object]:
    loaded: dict[str, object] = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    return loaded


def test_the_login_node_waits_for_slurmctld_before_asking_it_anything() -> None:
    tasks = yaml.safe_load((ROOT / "roles/slurm_login/tasks/main.yml").read_text())
    names = [t["name"] for t in tasks]
    wait = next(t for t in tasks if "ansible.builtin.wait_for" in t)
    assert wait["ansible.builtin.wait_for"]["port"] == 6817
    assert names.index(wait["name"]) < names.index("Check that the clients reach slurmctld")


def test_the_waits_on_the_controller_fit_the_first_boot_window_and_outlast_its_converge() -> None:
    _, window = SlurmEc2.first_boot_window or ("", 0.0)
    login, compute = defaults("slurm_login"), defaults("slurm_compute")
    waits = {"login: slurmctld": int(str(login["slurm_login_controller_timeout"])),
             "compute: slurmctld": int(str(compute["slurm_compute_controller_timeout"])),
             "compute: registration": int(str(compute["slurm_compute_register_timeout"]))}
    # The controller's first converge installs MariaDB and slurmdbd before slurmctld answers (minutes on AWS).
    assert all(600 <= seconds < window for seconds in waits.values()), waits
    assert waits["compute: slurmctld"] + waits["compute: registration"] < window, waits
