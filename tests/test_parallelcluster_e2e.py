"""Scheduler parallelcluster for real on the local substrate: `invoke deploy` of a parallelcluster tenant renders
the cluster config from the deployed stacks, checks it with ParallelCluster's own schema, and the stand-in
cluster's nodes (tagged as ParallelCluster tags its instances) run the same OnNodeConfigured script and node
bootstrap as on AWS, converge themselves and pass the acceptance gate. What is stood in is said, in the deploy's
output and in `invoke status`; `invoke destroy --yes` leaves nothing behind.

One tenant (org `pce2e`, VPC 10.92.0.0/16: its own range, so it never meets the other e2e tenant's hosts).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest
import yaml

from conftest import ROOT
from localtenant import deploy_copy, invoke_org, running_instance_tags, substrate_leftovers

pytestmark = [pytest.mark.e2e, pytest.mark.standin]
ORG = "pce2e"
VPC = "10.92.0.0/16"


def invoke(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return invoke_org(ORG, *args, timeout=timeout)


def leftovers() -> list[str]:
    return substrate_leftovers(ORG)


@pytest.fixture(scope="module")
def deployed() -> Iterator[subprocess.CompletedProcess[str]]:
    yield from deploy_copy("pcdemo", "10.76.0.0/16", ORG, VPC)


def test_the_deploy_converges_the_stand_in_cluster_and_passes_acceptance(
        deployed: subprocess.CompletedProcess[str]) -> None:
    out = deployed.stdout
    assert deployed.returncode == 0, out[-8000:] + deployed.stderr[-3000:]
    assert f"=== deploy summary: {ORG} (local, parallelcluster) ===" in out
    assert "stood in locally" in out, "what the rehearsal stands in is said"
    assert re.search(r"4/4 nodes converged themselves", out)
    assert "acceptance passed" in out
    config = yaml.safe_load((ROOT / "inventories" / ORG / "generated" / "cluster-config.yaml").read_text())
    assert config["Scheduling"]["Scheduler"] == "slurm"
    from fmcluster.stacks.outputs import read_stack_outputs

    bucket = read_stack_outputs(ORG)["DataBucketName"]
    action = config["HeadNode"]["CustomActions"]["OnNodeConfigured"]
    assert action["Script"] == f"s3://{bucket}/fmcluster/bootstrap/pcluster-on-node-configured.sh", \
        "the config the schema checked names the deployed bucket, the one the stand-in's nodes fetched from"
    assert f"FMCLUSTER_ORG={ORG}" in action["Args"]


def test_nodes_are_found_by_parallelcluster_s_own_tags(deployed: subprocess.CompletedProcess[str]) -> None:
    ours = running_instance_tags(ORG)
    assert sorted(t.get("parallelcluster:node-type", "") for t in ours) == ["Compute", "Compute", "HeadNode",
                                                                           "LoginNode"]
    assert not [t for t in ours if "fmcluster:role" in t], "the stand-in tags its instances as ParallelCluster does"


def test_status_says_what_is_stood_in(deployed: subprocess.CompletedProcess[str]) -> None:
    status = invoke("status", timeout=300)
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-2000:]
    assert "local stand-in" in status.stdout


def test_destroy_leaves_nothing_behind(deployed: subprocess.CompletedProcess[str]) -> None:
    gone = invoke("destroy", "--yes")
    assert gone.returncode == 0, gone.stdout[-3000:] + gone.stderr[-2000:]
    assert leftovers() == []
