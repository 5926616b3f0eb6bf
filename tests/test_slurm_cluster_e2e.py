"""End to end: a local tenant becomes a real Slurm cluster (munged, slurmctld, one slurmd per namespace node),
grows and shrinks with --limit, and nodes-down leaves nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from fmcluster import cluster
from fmcluster.converge import ansible_env, converge, converge_command
from fmcluster.inventory import write_inventory
from fmcluster.localnodes import load_nodes, nodes_down, nodes_up
from fmcluster.model import Tenant, load_tenant
from localtenant import make_root
from test_localnodes import leftovers, quiet

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]

ORG, SUBNET = "t-e2e", "10.79.13.0/24"


def up(tmp: Path, compute: int) -> Tenant:
    tenant = load_tenant(ORG, make_root(tmp, ORG, SUBNET, login=1, queues={"cpu": compute}))
    write_inventory(tenant, nodes_up(tenant, quiet))
    return tenant


def step_nodes(tenant: Tenant, nodes: int) -> set[str]:
    out = cluster.slurm(tenant, ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "printenv", "SLURMD_NODENAME"],
                        timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_local_tenant_converges_into_a_slurm_cluster_that_grows_and_shrinks_with_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    tenant = up(tmp_path, compute=2)
    nodes = []
    try:
        assert converge(tenant) == 0
        assert step_nodes(tenant, 2) == {"cpu-1", "cpu-2"}

        dry = subprocess.run(converge_command(tenant, check=True), env=ansible_env(tenant),
                             capture_output=True, text=True, cwd=tmp_path)
        recap = re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=(\d+)", dry.stdout, re.M)
        assert dry.returncode == 0, dry.stdout[-3000:]
        assert {"controller-1", "login-1", "cpu-1", "cpu-2"} <= {name for name, _, _ in recap}
        assert all(changed == "0" and failed == "0" for _, changed, failed in recap), recap

        grown = up(tmp_path, compute=3)
        nodes = load_nodes(ORG)
        assert converge(grown, limit="controller-1,login-1,cpu-3") == 0
        assert step_nodes(grown, 3) == {"cpu-1", "cpu-2", "cpu-3"}

        shrunk = up(tmp_path, compute=2)
        assert converge(shrunk, limit="controller-1,login-1") == 0
        sinfo = cluster.slurm(shrunk, ["sinfo", "--noheader", "--Node", "--format=%N %T"])
        assert dict(line.split() for line in sinfo.stdout.splitlines()) == {"cpu-1": "idle", "cpu-2": "idle"}
    finally:
        nodes_down(tenant, quiet)
    assert leftovers(tenant, nodes) == []
