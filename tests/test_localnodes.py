"""The local node provider on real network namespaces (needs root; creates and removes real kernel objects)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fmcluster.localnodes import (LocalNode, LocalNodesError, load_nodes, names_for, nodes_down, nodes_up,
                                  run_on_node, runtime_root, ssh_key_path)
from fmcluster.model import Tenant, load_tenant
from localtenant import make_root

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]


def quiet(_: str) -> None:
    pass


def leftovers(tenant: Tenant, nodes: list[LocalNode]) -> list[str]:
    """Every trace a tenant's local nodes could leave on this machine."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {n.netns}" for n in nodes if n.netns in netns.split()]
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    for name in [names_for(tenant.org).bridge] + [n.host_veth for n in nodes]:
        if any(line.split()[0].split("@")[0] == name for line in links.splitlines()):
            found.append(f"link {name}")
    procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    found += [f"process {line}" for line in procs.splitlines() if str(runtime_root(tenant.org)) in line]
    if runtime_root(tenant.org).exists():
        found.append(f"dir {runtime_root(tenant.org)}")
    return found


@pytest.fixture
def tenant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tenant]:
    monkeypatch.setenv("FMCLUSTER_ROOT", str(make_root(tmp_path, "t-nodes", "10.79.11.0/24", login=1)))
    t = load_tenant("t-nodes")
    yield t
    nodes_down(t, quiet)


def test_nodes_up_gives_every_node_its_own_namespace_address_and_sshd(tenant: Tenant) -> None:
    nodes = nodes_up(tenant, quiet)
    assert [n.name for n in nodes] == ["controller-1", "login-1", "cpu-1", "cpu-2"]
    for node in nodes:
        inside = run_on_node(tenant, node.name, ["ip", "-4", "-br", "addr", "show", "eth0"]).stdout
        assert f"{node.address}/24" in inside
        ssh = subprocess.run(["ssh", "-i", str(ssh_key_path(tenant.org)), "-o", "StrictHostKeyChecking=no",
                              "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=error", "-o", "BatchMode=yes",
                              f"root@{node.address}", "ip -4 -br addr show eth0"],
                             capture_output=True, text=True, timeout=30)
        assert f"{node.address}/24" in ssh.stdout, ssh.stderr


def test_a_second_nodes_up_changes_nothing(tenant: Tenant) -> None:
    first = nodes_up(tenant, quiet)
    said: list[str] = []
    assert nodes_up(tenant, said.append) == first
    assert said == [f"nodes-up: the 4 local nodes of {tenant.org} are already up; nothing changed"]


def test_nodes_down_leaves_no_namespace_link_process_or_file(tenant: Tenant) -> None:
    nodes = nodes_up(tenant, quiet)
    assert leftovers(tenant, nodes)  # the check sees them while they exist
    nodes_down(tenant, quiet)
    assert leftovers(tenant, nodes) == []
    assert load_nodes(tenant.org) == []


def test_shrinking_a_queue_removes_the_extra_node(tenant: Tenant, tmp_path: Path) -> None:
    nodes = nodes_up(tenant, quiet)
    smaller = load_tenant("t-nodes", make_root(tmp_path, "t-nodes", "10.79.11.0/24", login=1, queues={"cpu": 1}))
    after = nodes_up(smaller, quiet)
    assert [n.name for n in after] == ["controller-1", "login-1", "cpu-1"]
    gone = next(n for n in nodes if n.name == "cpu-2")
    assert not Path(gone.netns_path).exists()


def test_two_tenants_coexist_and_a_third_on_an_overlapping_subnet_is_refused(
        tenant: Tenant, tmp_path: Path) -> None:
    other = load_tenant("t-nodes2", make_root(tmp_path / "b", "t-nodes2", "10.79.12.0/24", queues={"cpu": 1}))
    clash = load_tenant("t-nodes3", make_root(tmp_path / "c", "t-nodes3", "10.79.11.0/25", queues={"cpu": 1}))
    try:
        nodes_up(tenant, quiet)
        other_nodes = nodes_up(other, quiet)
        ping = run_on_node(other, "cpu-1", ["ping", "-c1", "-W2", other_nodes[0].address])
        assert ping.returncode == 0, ping.stdout
        with pytest.raises(LocalNodesError, match="overlaps"):
            nodes_up(clash, quiet)
    finally:
        nodes_down(other, quiet)
        nodes_down(clash, quiet)
    assert leftovers(clash, []) == []


def test_nodes_up_from_another_checkout_is_refused(tenant: Tenant, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    nodes_up(tenant, quiet)
    other_checkout = make_root(tmp_path / "other", "t-nodes", "10.79.11.0/24", login=1)
    monkeypatch.setenv("FMCLUSTER_ROOT", str(other_checkout))
    with pytest.raises(LocalNodesError, match="another checkout"):
        nodes_up(load_tenant("t-nodes"), quiet)
