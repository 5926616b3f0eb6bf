"""Naming and addressing of local nodes (no root needed: nothing is created)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fmcluster.localnodes import IFNAMSIZ, LocalNodesError, _allocate, names_for, plan
from fmcluster.model import load_tenant
from localtenant import make_root


def test_interface_names_fit_the_kernel_limit_for_the_longest_org() -> None:
    names = names_for("a-very-long-org-name-x24")
    assert len("a-very-long-org-name-x24") == 24
    for name in (names.bridge, names.host_veth(65534), names.peer_veth(65534)):
        assert len(name) <= IFNAMSIZ, name


def test_orgs_sharing_a_prefix_get_different_interface_names() -> None:
    assert names_for("research-a").bridge != names_for("research-b").bridge
    assert names_for("demo").bridge == "fmcbr-demo"


def test_plan_names_controller_login_then_queue_nodes_in_order() -> None:
    demo = load_tenant("demo")
    assert [(s.name, s.role, s.queue) for s in plan(demo)] == [
        ("controller-1", "controller", None), ("login-1", "login", None),
        ("cpu-1", "compute", "cpu"), ("cpu-2", "compute", "cpu"), ("cpu-3", "compute", "cpu")]


def test_a_queue_named_like_the_login_nodes_is_refused(tmp_path: Path) -> None:
    tenant = load_tenant("t-plan", make_root(tmp_path, "t-plan", "10.79.21.0/24", login=1, queues={"cpu": 1}))
    # Validation refuses the name `login` first; plan() still guards a Tenant built some other way.
    tenant = replace(tenant, queues=(replace(tenant.queues[0], name="login"),))
    with pytest.raises(LocalNodesError, match="login-1"):
        plan(tenant)


def test_addresses_start_after_the_bridge_and_stay_with_their_node(tmp_path: Path) -> None:
    root = make_root(tmp_path, "t-plan", "10.79.21.0/24", queues={"cpu": 2})
    tenant = load_tenant("t-plan", root)
    first = _allocate(tenant, plan(tenant), [])
    assert [(n.name, n.address) for n in first] == [
        ("controller-1", "10.79.21.2"), ("cpu-1", "10.79.21.3"), ("cpu-2", "10.79.21.4")]
    grown = load_tenant("t-plan", make_root(tmp_path, "t-plan", "10.79.21.0/24", queues={"cpu": 3}))
    again = _allocate(grown, plan(grown), [n for n in first if n.name != "cpu-1"])
    assert {n.name: n.address for n in again} == {
        "controller-1": "10.79.21.2", "cpu-1": "10.79.21.3", "cpu-2": "10.79.21.4", "cpu-3": "10.79.21.5"}


def test_a_subnet_too_small_for_the_nodes_is_refused(tmp_path: Path) -> None:
    # The spec validator already refuses this; the allocator does not rely on it.
    valid = load_tenant("t-plan", make_root(tmp_path, "t-plan", "10.79.21.0/24", queues={"cpu": 2}))
    tenant = replace(valid, network=replace(valid.network, local_subnet="10.79.21.0/30"))
    with pytest.raises(LocalNodesError, match="larger subnet"):
        _allocate(tenant, plan(tenant), [])
