"""The AWS answers ParallelCluster's validators get offline: data fmcluster already holds, in the API's shapes.

`pcluster_check.py` runs every validator a cluster config registers (as `pcluster create-cluster` does) inside
the tool environment, where a hook on boto3 serves the calls below from this data and answers every other call
with an error naming it (that validator then needs AWS, and is listed as such). Nothing here is a guess about
the account: each answer is what fmcluster itself creates or declares —

- instance types (DescribeInstanceTypes): the instance catalog (src/fmcluster/data/instances.yml);
- subnets, their route tables and the VPC's DNS attributes: the network stack fmcluster renders for the tenant
  (its zone, CIDRs, `MapPublicIpOnLaunch`, default routes to the internet or NAT gateway);
- capacity reservations: what the tenant says its queues launch into (type, zone, kind, count). Whether the
  account's reservation really is that is the capacity pre-flight's question (fmcluster.capacity), on AWS;
- the FSx file system and OpenZFS volume of the storage stack, in the tenant's private subnet;
- ParallelCluster's official image: a marked stand-in (`ami-0fmcluster0offline`, x86_64, the config's OS):
  which image `pcluster` picks, and its size, are AWS's answer.
"""

from __future__ import annotations

from typing import Any

from fmcluster.model import Tenant
from fmcluster.schedulers.parallelcluster.rendered import ClusterConfig
from fmcluster.schedulers.parallelcluster.rules import CAPACITY_BLOCK_TYPES
from fmcluster.stacks.cfn import Ref
from fmcluster.stacks.templates import network

#: Stand-in ids for what only AWS names; same forms as the real ones (ParallelCluster's schema checks forms).
IMAGE_ID = "ami-0f0000000000000ff"
VPC_ID = "vpc-0f0000000000000ff"
OPENZFS_FILE_SYSTEM_ID = "fs-0f0000000000000ff"
FSX_INTERFACE_ID = "eni-0f0000000000000ff"
#: Every catalog type is x86_64 with two threads per core (EC2's instance type tables); the catalog types
#: accelerators, vCPUs, memory and EFA, not these.
ARCHITECTURE, THREADS_PER_CORE = "x86_64", 2
#: ParallelCluster's own image names its OS in this tag (pcluster.constants.OS_TAG / the image's tags).
OS_TAG = "parallelcluster:os"


def _value_at(data: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def output_values(cfg: ClusterConfig) -> dict[str, str]:
    """Stack output → the value the config holds for it (real or placeholder)."""
    found: dict[str, str] = {}
    for path, name in cfg.sources.items():
        try:
            value = _value_at(cfg.data, path)
        except (KeyError, IndexError, TypeError):
            continue
        if isinstance(value, dict) and len(value) == 1:  # recorded at its section (FsxLustreSettings: {FileSystemId})
            (value,) = value.values()
        if isinstance(value, str):
            found.setdefault(name, value)
    return found


def instance_type(name: str) -> dict[str, Any]:
    """DescribeInstanceTypes' entry for a catalog type."""
    from fmcluster.catalog import load_catalog

    it = load_catalog()[name]
    cards = max(1, it.efa_interfaces)
    answer: dict[str, Any] = {
        "InstanceType": it.name,
        "VCpuInfo": {"DefaultVCpus": it.vcpus, "DefaultCores": it.vcpus // THREADS_PER_CORE,
                     "DefaultThreadsPerCore": THREADS_PER_CORE, "ValidThreadsPerCore": [1, THREADS_PER_CORE]},
        "MemoryInfo": {"SizeInMiB": it.memory_gib * 1024},
        "ProcessorInfo": {"SupportedArchitectures": [ARCHITECTURE]},
        "NetworkInfo": {"EfaSupported": it.has_efa, "MaximumNetworkCards": cards,
                        "NetworkCards": [{"NetworkCardIndex": i, "MaximumNetworkInterfaces": 2} for i in range(cards)],
                        "EfaInfo": {"MaximumEfaInterfaces": it.efa_interfaces}},
        "PlacementGroupInfo": {"SupportedStrategies": ["cluster", "partition", "spread"]},
        # EC2 sells Capacity Blocks for ML of these types only (the same list fmcluster's own rules check).
        "SupportedUsageClasses": ["on-demand", "spot", *(["capacity-block"] if it.name in CAPACITY_BLOCK_TYPES else [])],
        "EbsInfo": {"EbsOptimizedSupport": "default"},
        "InstanceStorageSupported": False,
    }
    if it.accelerator == "cuda":
        answer["GpuInfo"] = {"Gpus": [{"Name": it.accelerator_model, "Manufacturer": "NVIDIA",
                                       "Count": it.accelerators_per_node}]}
    return answer


def _network(tenant: Tenant, subnet_ids: dict[str, str]) -> dict[str, Any]:
    """Subnets, route tables and VPC attributes as the rendered network stack declares them."""
    resources: dict[str, Any] = network.build(tenant)["Resources"]
    logical_of = {"PublicSubnet": subnet_ids.get("PublicSubnetId"), "PrivateSubnet": subnet_ids.get("PrivateSubnetId")}
    subnets = []
    for logical, sid in logical_of.items():
        if sid is None:
            continue
        props = resources[logical]["Properties"]
        subnets.append({"SubnetId": sid, "VpcId": VPC_ID, "AvailabilityZone": props["AvailabilityZone"],
                        "CidrBlock": props["CidrBlock"], "MapPublicIpOnLaunch": bool(props.get("MapPublicIpOnLaunch")),
                        "State": "available"})
    tables = []
    for res in resources.values():
        if res["Type"] != "AWS::EC2::SubnetRouteTableAssociation":
            continue
        subnet, table = _ref(res["Properties"]["SubnetId"]), _ref(res["Properties"]["RouteTableId"])
        sid = logical_of.get(subnet or "")
        if sid is None or table is None:
            continue
        routes = [{"DestinationCidrBlock": tenant.network.vpc_cidr, "GatewayId": "local"}]
        for route in resources.values():
            props = route.get("Properties", {})
            if route["Type"] == "AWS::EC2::Route" and _ref(props.get("RouteTableId")) == table:
                if "GatewayId" in props:
                    routes.append({"DestinationCidrBlock": props["DestinationCidrBlock"], "GatewayId": "igw-0f0000000000000ff"})
                elif "NatGatewayId" in props:
                    routes.append({"DestinationCidrBlock": props["DestinationCidrBlock"], "NatGatewayId": "nat-0f0000000000000ff"})
        tables.append({"RouteTableId": f"rtb-{table.lower()}", "VpcId": VPC_ID, "Routes": routes,
                       "Associations": [{"SubnetId": sid, "Main": False}]})
    vpc = resources["Vpc"]["Properties"]
    return {"subnets": subnets, "route_tables": tables,
            "vpcs": {VPC_ID: {"enableDnsSupport": bool(vpc.get("EnableDnsSupport")),
                              "enableDnsHostnames": bool(vpc.get("EnableDnsHostnames"))}}}


def _ref(value: Any) -> str | None:
    """The logical id a Ref names (None for anything else)."""
    return value.name if isinstance(value, Ref) else None


def answers(tenant: Tenant, cfg: ClusterConfig) -> dict[str, Any]:
    """Everything the tool environment's stub may answer for this tenant's config."""
    outputs = output_values(cfg)
    types = sorted({tenant.controller.name, *(q.instance.name for q in tenant.queues),
                    *([tenant.login.name] if tenant.login is not None else [])})
    reservations = [{
        "CapacityReservationId": q.capacity_reservation_id, "InstanceType": q.instance.name,
        "AvailabilityZone": tenant.availability_zone, "InstancePlatform": "Linux/UNIX",
        "ReservationType": "capacity-block" if q.capacity_reservation_type == "capacity-block" else "default",
        "TotalInstanceCount": q.count, "AvailableInstanceCount": q.count, "State": "active",
        "InstanceMatchCriteria": "targeted", "Tenancy": "default",
    } for q in tenant.queues if q.capacity_reservation_id]
    private = outputs.get("PrivateSubnetId")
    file_systems, volumes = [], []
    if "LustreFileSystemId" in outputs:
        file_systems.append({"FileSystemId": outputs["LustreFileSystemId"], "FileSystemType": "LUSTRE",
                             "Lifecycle": "AVAILABLE", "VpcId": VPC_ID, "SubnetIds": [private] if private else [],
                             "NetworkInterfaceIds": [FSX_INTERFACE_ID],
                             "StorageCapacity": tenant.storage.lustre.storage_capacity_gib,
                             "LustreConfiguration": {"DeploymentType": tenant.storage.lustre.deployment_type}})
    if "HomeVolumeId" in outputs and tenant.storage.openzfs is not None:
        volumes.append({"VolumeId": outputs["HomeVolumeId"], "FileSystemId": OPENZFS_FILE_SYSTEM_ID,
                        "VolumeType": "OPENZFS", "Lifecycle": "AVAILABLE"})
        file_systems.append({"FileSystemId": OPENZFS_FILE_SYSTEM_ID, "FileSystemType": "OPENZFS",
                             "Lifecycle": "AVAILABLE", "VpcId": VPC_ID, "SubnetIds": [private] if private else [],
                             "NetworkInterfaceIds": [FSX_INTERFACE_ID],
                             "StorageCapacity": tenant.storage.openzfs.storage_capacity_gib})
    os_name = str(cfg.data.get("Image", {}).get("Os", ""))
    image = {"ImageId": IMAGE_ID, "Name": f"fmcluster offline stand-in for ParallelCluster's {os_name} image",
             "State": "available", "Architecture": ARCHITECTURE, "RootDeviceName": "/dev/sda1",
             "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 40}}],
             "Tags": [{"Key": OS_TAG, "Value": os_name}]}
    # A baked image's CustomAmi (fmcluster.baked): described as the official image is, its own id and name; what the
    # AMI really is (architecture, volumes) only AWS says, at `pcluster create-cluster --dryrun true`.
    custom = sorted({str(group["Image"]["CustomAmi"]) for group in _node_groups(cfg.data)
                     if isinstance(group.get("Image"), dict) and "CustomAmi" in group["Image"]})
    custom_images = [{**image, "ImageId": ami, "Name": f"fmcluster offline stand-in for the baked image {ami}"}
                     for ami in custom]
    return {"instance_types": [instance_type(t) for t in types], "capacity_reservations": reservations,
            **_network(tenant, outputs), "file_systems": file_systems, "volumes": volumes, "image": image,
            "custom_images": custom_images}


def _node_groups(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The config's head node, login pools and queues: where a CustomAmi may be."""
    return [data.get("HeadNode") or {}, *((data.get("LoginNodes") or {}).get("Pools") or []),
            *((data.get("Scheduling") or {}).get("SlurmQueues") or [])]
