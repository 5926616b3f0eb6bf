"""Which HyperPod instances are nodes of the cluster (fmcluster.nodes.hyperpod_nodes), by SageMaker's instance status.

Every status ListClusterNodes may answer (ClusterInstanceStatusDetails, as the pinned botocore knows it) is either a
node of the cluster or gone, and a node running its on-start deep health checks or being patched is one: its own
converge must find itself, by whichever of its addresses SageMaker lists (issue 36, fourth review).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from fmcluster.node import agent as node_agent
from fmcluster.nodes import HYPERPOD_GONE_STATUSES, HYPERPOD_LIVE_STATUSES, hyperpod_nodes

GROUPS = {"controller": "controller", "trn": "compute"}


class FakeSageMaker:
    """ListClusterNodes/DescribeClusterNode as SageMaker answers them, one trn1 node per status."""

    def __init__(self, statuses: list[str]) -> None:
        self.summaries = [{"InstanceGroupName": "trn", "InstanceId": f"i-{n:017x}",
                           "InstanceStatus": {"Status": status}, "InstanceType": "ml.trn1.32xlarge"}
                          for n, status in enumerate(statuses, start=1)]

    def get_paginator(self, operation: str) -> Any:
        assert operation == "list_cluster_nodes"
        summaries = self.summaries

        class Paginator:
            def paginate(self, **_: Any) -> list[dict[str, Any]]:
                return [{"ClusterNodeSummaries": summaries}]

        return Paginator()

    def describe_cluster_node(self, ClusterName: str, NodeId: str) -> dict[str, Any]:  # noqa: N803 (boto3's names)
        n = int(NodeId.removeprefix("i-"), 16)
        return {"NodeDetails": {"PrivatePrimaryIp": f"10.0.1.{n}", "PrivateDnsHostname": f"ip-10-0-1-{n}.ec2.internal"}}


def test_every_status_sagemaker_answers_is_either_a_node_or_gone() -> None:
    model = botocore.session.get_session().get_service_model("sagemaker")
    answered = set(model.shape_for("ClusterInstanceStatus").enum)
    assert not HYPERPOD_LIVE_STATUSES & HYPERPOD_GONE_STATUSES
    assert answered == HYPERPOD_LIVE_STATUSES | HYPERPOD_GONE_STATUSES, (
        "SageMaker's ClusterInstanceStatus changed: decide in fmcluster.nodes whether each new status is a node "
        f"of the cluster; unclassified: {sorted(answered - HYPERPOD_LIVE_STATUSES - HYPERPOD_GONE_STATUSES)}")


@pytest.mark.parametrize("status", ["DeepHealthCheckInProgress", "SystemUpdating", "Running", "Pending"])
def test_a_node_in_its_deep_health_checks_or_being_patched_is_a_node_of_the_cluster(status: str) -> None:
    nodes = hyperpod_nodes(FakeSageMaker([status]), "fmc-neuronlab", dict(GROUPS))
    assert [(n.name, n.address, n.role, n.queue, n.instance_type) for n in nodes] == [
        ("ip-10-0-1-1", "10.0.1.1", "compute", "trn", "trn1.32xlarge")]


@pytest.mark.parametrize("status", sorted(HYPERPOD_GONE_STATUSES | {"SomethingNew"}))
def test_a_failed_leaving_or_unknown_instance_is_not(status: str) -> None:
    assert hyperpod_nodes(FakeSageMaker([status]), "fmc-neuronlab", dict(GROUPS)) == []


# --- a node finds itself by any of its addresses ----------------------------------------------------------------

CUSTOMER, AGENT_NETWORK = "10.0.1.1", "100.64.3.9"  # resource_config.json's CustomerIpAddress and AgentIpAddress


class FakeSession:
    def __init__(self, sagemaker: FakeSageMaker) -> None:
        self.sagemaker = sagemaker

    def client(self, service: str, config: Any = None) -> Any:
        assert service == "sagemaker"
        return self.sagemaker


def agent_on_a_hyperpod_node(tmp_path: Path) -> node_agent.Agent:
    settings = node_agent.Settings("bucket", "us-east-2", "neuronlab", "0" * 40, "playbooks/site.yml", fetch_tries=1)
    agent = node_agent.Agent(settings, state_dir=tmp_path / "state", etc_dir=tmp_path / "etc")
    agent.session = FakeSession(FakeSageMaker(["Running"]))
    return agent


def test_a_hyperpod_node_finds_itself_by_its_customer_address_whichever_interface_reaches_the_metadata_service(
        tmp_path: Path) -> None:
    """A HyperPod instance holds an address on HyperPod's agent network besides its customer-VPC address (the one
    SageMaker lists); which one the route to the metadata service leaves from is not documented, so the agent looks
    for every address of the host, as wait_for_hyperpod_slurm.sh does, and reports the one the cluster knows."""
    manifest = {"discovery": {"kind": "hyperpod", "cluster_name": "fmc-neuronlab", "groups": dict(GROUPS)}}
    me, nodes = agent_on_a_hyperpod_node(tmp_path).whoami(manifest, [AGENT_NETWORK, CUSTOMER])
    assert (me.address, me.queue, [n.address for n in nodes]) == (CUSTOMER, "trn", [CUSTOMER])


def test_a_node_whose_addresses_the_cluster_does_not_list_fails_its_identity_naming_them(tmp_path: Path) -> None:
    manifest = {"discovery": {"kind": "hyperpod", "cluster_name": "fmc-neuronlab", "groups": dict(GROUPS)}}
    with pytest.raises(node_agent.StageFailed, match=f"find this node \\({AGENT_NETWORK}, 10.9.9.9\\)"):
        agent_on_a_hyperpod_node(tmp_path).whoami(manifest, [AGENT_NETWORK, "10.9.9.9"])


def test_the_agent_looks_for_this_node_by_every_address_of_its_interfaces_the_route_s_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_agent, "my_address", lambda: "192.0.2.77")
    addresses = node_agent.my_addresses()
    assert addresses[0] == "192.0.2.77" and len(addresses) == len(set(addresses))
    assert not [a for a in addresses if a.startswith("127.")]
    assert all(ipaddress.IPv4Address(a) for a in addresses)
