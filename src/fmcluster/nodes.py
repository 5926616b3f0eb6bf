"""Which nodes a cluster has right now, read from the AWS APIs — the same code on the deploy machine and on
every node (no value is typed twice, and a node that joins later is found the same way).

A node is known by the instance behind it: its short private DNS name (`ip-10-0-128-4`, the hostname EC2
gives it) is its inventory name and its Slurm NodeName, its private address is where everything reaches it,
and its role and queue come from the tags its cluster put on it (`fmcluster:role`, `fmcluster:queue` from our
cluster stack; a scheduler whose service tags its instances otherwise names its tags in the manifest's discovery
entry, `node_tags`, from its folder) or, on HyperPod, from its instance group. Only boto3 is needed, so a node's own toolchain runs this too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast

Role = Literal["controller", "login", "compute"]
ROLES: tuple[Role, ...] = ("controller", "login", "compute")
#: Instance states of a node that is (or is about to be) part of the cluster.
LIVE_STATES = ("pending", "running")
#: SageMaker HyperPod's instance statuses (ClusterInstanceStatus, API_ClusterInstanceStatusDetails:
#: https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ClusterInstanceStatusDetails.html), each either a
#: node of the cluster or not. A node running its on-start deep health checks is one: HyperPod holds it in a Slurm
#: maintenance reservation meanwhile, so it is already a Slurm node (https://docs.aws.amazon.com/sagemaker/latest/dg/
#: sagemaker-hyperpod-resiliency-slurm-deep-health-checks.html); so is one HyperPod is patching (SystemUpdating).
#: Left out, such a node's own converge could not find itself (the agent's identity step fails, and on first boot
#: on_create.sh with it) and the controller's inventory dropped it. Whether HyperPod starts the checks before a
#: node's lifecycle script ends is not documented; fmcluster's script starts slurmd before it converges.
HYPERPOD_LIVE_STATUSES = frozenset({"Pending", "Running", "DeepHealthCheckInProgress", "SystemUpdating"})
HYPERPOD_GONE_STATUSES = frozenset({"Failure", "ShuttingDown", "NotFound"})


def as_root(command: str) -> str:
    """`command` (a shell text) as root on a node an operator reached: the operator logs in as the image's default
    user, never root (as on AWS), and sudo without a password prompt fails at once instead of waiting."""
    return f"sudo -n {command}"


@dataclass(frozen=True)
class NodeTags:
    """How a cluster's instances say what they are: the tag holding the role (its values → roles) and the one
    holding the queue of a compute node."""

    role: str
    roles: Mapping[str, Role]
    queue: str

    def role_of(self, tags: Mapping[str, str]) -> Role | None:
        return self.roles.get(tags.get(self.role, ""))

    def as_manifest(self) -> dict[str, Any]:
        """The discovery entry's `node_tags` (a scheduler's discovery() writes it; from_manifest reads it back)."""
        return {"role": self.role, "roles": dict(self.roles), "queue": self.queue}

    @staticmethod
    def from_manifest(entry: Any) -> NodeTags:
        """The tags a discovery entry names (`node_tags`); fmcluster's own where it names none."""
        if entry is None:
            return FMCLUSTER_TAGS
        roles = entry["roles"] if isinstance(entry, Mapping) else None
        if not isinstance(roles, Mapping) or not set(roles.values()) <= set(ROLES):
            raise ValueError(f"the discovery entry's node_tags {entry!r} is not a role tag, its values → "
                             f"{', '.join(ROLES)}, and a queue tag (the scheduler's discovery())")
        return NodeTags(str(entry["role"]), {str(k): cast(Role, v) for k, v in roles.items()}, str(entry["queue"]))


#: fmcluster's own tags: its cluster stacks' (slurm-ec2's, and the local stand-ins' launch templates).
FMCLUSTER_TAGS = NodeTags("fmcluster:role", {r: r for r in ROLES}, "fmcluster:queue")


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    role: Role
    queue: str | None
    instance_id: str
    instance_type: str
    public_address: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> Node:
        return Node(str(raw["name"]), str(raw["address"]), cast(Role, raw["role"]), raw.get("queue") or None,
                    str(raw["instance_id"]), str(raw["instance_type"]), str(raw.get("public_address") or ""))


def hostname_for(address: str, private_dns_name: str = "") -> str:
    """EC2's hostname of an instance: the first label of its private DNS name (`ip-10-0-128-4`)."""
    label = private_dns_name.split(".", 1)[0]
    return label or "ip-" + address.replace(".", "-")


def sort_nodes(nodes: Iterable[Node]) -> list[Node]:
    """Controller, login nodes, then compute nodes by queue, each by address: a stable order for every list."""
    return sorted(nodes, key=lambda n: (ROLES.index(n.role), n.queue or "", int(ipaddress.IPv4Address(n.address))))


def ec2_nodes(ec2: Any, org: str, node_tags: NodeTags = FMCLUSTER_TAGS) -> list[Node]:
    """The tenant's live instances, from EC2's DescribeInstances (a scheduler whose nodes carry `node_tags`)."""
    nodes = []
    paginator = ec2.get_paginator("describe_instances")
    filters = [{"Name": "tag:fmcluster:org", "Values": [org]}, {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
    for page in paginator.paginate(Filters=filters):
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                role = node_tags.role_of(tags)
                address = instance.get("PrivateIpAddress")
                if role is None or not address:
                    continue  # not a cluster node (or not yet addressed): nothing to configure for it
                queue = tags.get(node_tags.queue) if role == "compute" else None
                nodes.append(Node(hostname_for(address, instance.get("PrivateDnsName", "")), address,
                                  role, queue or None, instance["InstanceId"],
                                  instance["InstanceType"], instance.get("PublicIpAddress", "")))
    return sort_nodes(nodes)


def hyperpod_nodes(sagemaker: Any, cluster_name: str, groups: dict[str, Role]) -> list[Node]:
    """The nodes of a HyperPod cluster, from SageMaker's ListClusterNodes/DescribeClusterNode.

    `groups` maps instance group names to roles (queues are the compute groups' names)."""
    nodes = []
    paginator = sagemaker.get_paginator("list_cluster_nodes")
    for page in paginator.paginate(ClusterName=cluster_name):
        for summary in page["ClusterNodeSummaries"]:
            group = summary["InstanceGroupName"]
            status = summary.get("InstanceStatus", {}).get("Status", "")
            if group not in groups or status not in HYPERPOD_LIVE_STATUSES:
                continue  # not ours, or gone (a status SageMaker adds later is not taken for a node: fail closed)
            detail = sagemaker.describe_cluster_node(ClusterName=cluster_name, NodeId=summary["InstanceId"])["NodeDetails"]
            address = detail.get("PrivatePrimaryIp")
            if not address:
                continue
            role = groups[group]
            nodes.append(Node(hostname_for(address, detail.get("PrivateDnsHostname", "")), address, role,
                              group if role == "compute" else None, summary["InstanceId"],
                              str(summary.get("InstanceType", "")).removeprefix("ml.")))
    return sort_nodes(nodes)


def node_at(nodes: Sequence[Node], address: str) -> Node | None:
    return next((n for n in nodes if n.address == address), None)


def discover(discovery: Mapping[str, Any], client: Callable[[str], Any], org: str) -> list[Node]:
    """The cluster's live nodes, as a manifest's `discovery` entry says to find them (deploy machine and nodes)."""
    finder = DISCOVERY.get(str(discovery.get("kind")))
    if finder is None:
        raise ValueError(f"the manifest's discovery kind {discovery.get('kind')!r} is not one of "
                         f"{', '.join(sorted(DISCOVERY))} (the scheduler's discovery())")
    return finder(discovery, client, org)


def _by_ec2_tags(discovery: Mapping[str, Any], client: Callable[[str], Any], org: str) -> list[Node]:
    return ec2_nodes(client("ec2"), org, NodeTags.from_manifest(discovery.get("node_tags")))


def _by_cluster_node_list(discovery: Mapping[str, Any], client: Callable[[str], Any], org: str) -> list[Node]:
    groups: dict[str, Role] = dict(discovery["groups"])
    return hyperpod_nodes(client("sagemaker"), str(discovery["cluster_name"]), groups)


#: How a manifest's `discovery` entry finds the nodes, by its kind (what the scheduler's discovery() writes):
#: EC2 instance tags, or SageMaker's node list of a HyperPod cluster.
DISCOVERY: dict[str, Callable[[Mapping[str, Any], Callable[[str], Any], str], list[Node]]] = {
    "ec2": _by_ec2_tags,
    "hyperpod": _by_cluster_node_list,
}
