"""Scheduler pcs rehearsed on the local substrate: `invoke deploy` of a copy of the bundled `pcsdemo` tenant creates,
in place of PCS's cluster stack, its stand-in's (fmcluster.schedulers.pcs.stand_in: slurm-ec2's stack, instances
tagged as PCS's launch templates tag them, user data the shell part of PCS's), whose nodes run the same first boot
as PCS's would, converge themselves with fmcluster's Slurm standing in for PCS's, and pass the acceptance gate.
Checked here: every node converges and what is stood in is said (deploy summary, `invoke status`); the nodes are
found by the tags PCS's launch templates give; compute nodes run configless slurmd as PCS's do, and a job runs
across both; `invoke destroy --yes` leaves nothing behind.

In the standins-extra tier, which `invoke test` (and so .ci/run) leaves out: its one deploy (the module: 594 s
beside a loaded CI run, 218 s alone) would take CI past its 30 minutes on 2 cores; `invoke test --tier=standins-extra`
runs it, alone (as the ParallelCluster and HyperPod stand-ins' are). One tenant (org
`pcse2e`, VPC 10.72.0.0/16, a range no other test uses).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator

import pytest

from localtenant import deploy_copy, invoke_org, on_node_as_root, running_instance_tags, substrate_leftovers

pytestmark = [pytest.mark.e2e, pytest.mark.standin, pytest.mark.extra_standin]
ORG = "pcse2e"
VPC = "10.72.0.0/16"


def invoke(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return invoke_org(ORG, *args, timeout=timeout)


def on_node(name: str, command: str) -> subprocess.CompletedProcess[str]:
    return on_node_as_root(ORG, name, command)


def nodes() -> list[dict[str, str]]:
    from fmcluster.inventory import read_nodes

    return [n.as_dict() for n in read_nodes(ORG)]


@pytest.fixture(scope="module")
def deployed() -> Iterator[subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    for done in deploy_copy("pcsdemo", "10.75.0.0/16", ORG, VPC):
        print(f"\n{ORG}: deploy took {time.monotonic() - started:.0f} s")
        yield done


def test_the_deploy_converges_the_stand_in_cluster_and_passes_acceptance(
        deployed: subprocess.CompletedProcess[str]) -> None:
    out = deployed.stdout
    assert deployed.returncode == 0, out[-8000:] + deployed.stderr[-3000:]
    assert f"=== deploy summary: {ORG} (local, pcs) ===" in out
    assert "local stand-in for AWS PCS" in out and "stood in locally" in out, "what the rehearsal stands in is said"
    assert re.search(r"4/4 nodes converged themselves", out)
    assert "acceptance passed" in out
    gaps = [line for line in out.splitlines() if "not created by the AWS emulator" in line or "NOT created" in line]
    assert not [line for line in gaps if "AWS::PCS::" in line], "no PCS resource is asked of the emulator"


def test_nodes_are_found_by_the_tags_pcs_s_launch_templates_give(deployed: subprocess.CompletedProcess[str]) -> None:
    ours = running_instance_tags(ORG)
    assert sorted((t["fmcluster:role"], t.get("fmcluster:queue", "")) for t in ours) == [
        ("compute", "cpu"), ("compute", "cpu"), ("controller", ""), ("login", "")]
    assert sorted(n["role"] for n in nodes()) == ["compute", "compute", "controller", "login"]


def test_compute_nodes_run_configless_slurmd_and_a_job_runs_across_both(
        deployed: subprocess.CompletedProcess[str]) -> None:
    by_role = {n["role"]: n for n in nodes()}
    workers = sorted(n["name"] for n in nodes() if n["role"] == "compute")
    for worker in workers:
        slurmd = on_node(worker, "test ! -e /etc/slurm/slurm.conf && pgrep -a slurmd")
        assert slurmd.returncode == 0 and "--conf-server" in slurmd.stdout, slurmd.stdout + slurmd.stderr
    job = invoke("slurm", "--cmd=srun -p cpu -N 2 --ntasks-per-node=1 hostname -s", f"--node={by_role['login']['name']}",
                 timeout=300)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    assert sorted(job.stdout.split()[-2:]) == workers


def test_status_says_what_is_stood_in(deployed: subprocess.CompletedProcess[str]) -> None:
    status = invoke("status", timeout=300)
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-2000:]
    assert "PCS: local stand-in" in status.stdout


def test_destroy_leaves_nothing_behind(deployed: subprocess.CompletedProcess[str]) -> None:
    gone = invoke("destroy", "--yes")
    assert gone.returncode == 0, gone.stdout[-3000:] + gone.stderr[-2000:]
    assert substrate_leftovers(ORG) == []
