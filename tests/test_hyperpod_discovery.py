"""Which HyperPod instances are nodes of the cluster (fmcluster.nodes.hyperpod_nodes), by SageMaker's instance status.

Every status ListClusterNodes may answer (ClusterInstanceStatusDetails, as the pinned botocore knows it) is either a
node of the cluster or gone, and a node running its on-start deep health checks or being patched is one: its own
converge must find itself (issue 36, fourth review).
"""

from __future__ import annotations

from typing import Any

import botocore.session
import pytest

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
