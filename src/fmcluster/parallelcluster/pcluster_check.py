# mypy: disable-error-code="import-not-found"
"""Run INSIDE the aws-parallelcluster tool environment (.tools/pcluster-venv), never imported by fmcluster.

stdin: a JSON list of {"cluster_name", "region", "config"}; stdout: a JSON list of reports, one per config:

    {"pcluster_version", "loaded_as", "errors": [{"path", "message"}], "findings": [{"validator", "level",
     "message", "path"}]}

`errors` are ParallelCluster's schema (ClusterSchema(cluster_name=...).load) refusing the config, with the
field path marshmallow reports. `findings` come from the ParallelCluster validators that need no AWS call
(names, counts, sizes, mount directories, capacity type), run on the loaded config with the arguments
ParallelCluster's own config classes pass them; the validators that ask EC2, FSx or IAM run only in
`pcluster create-cluster --dryrun true`. Several configs go through one process: the import costs more
than a load. Uses the standard library and the pcluster package only.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

Path = list[Any]


def _flatten(messages: Any, path: Path) -> list[dict[str, Any]]:
    """marshmallow's nested error dict → [{path, message}] (list indices stay ints; `_schema` is the node)."""
    if isinstance(messages, dict):
        out: list[dict[str, Any]] = []
        for key, value in messages.items():
            here = path if key == "_schema" else [*path, key]
            out += _flatten(value, here)
        return out
    if isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        return [{"path": path, "message": m} for m in messages]
    if isinstance(messages, list):
        return [item for m in messages for item in _flatten(m, path)]
    return [{"path": path, "message": str(messages)}]


def _findings(cfg: Any, cluster_name: str) -> list[dict[str, Any]]:
    from pcluster.config.common import CapacityType
    from pcluster.constants import (
        MAX_COMPUTE_RESOURCES_PER_QUEUE, MAX_NUMBER_OF_COMPUTE_RESOURCES_PER_CLUSTER, MAX_NUMBER_OF_LOGIN_NODE_POOLS,
        MAX_NUMBER_OF_QUEUES,
    )
    from pcluster.validators import cluster_validators as cv
    from pcluster.validators import ec2_validators as ev

    out: list[dict[str, Any]] = []

    def run(validator: Any, path: Path, **kwargs: Any) -> None:
        for result in validator().execute(**kwargs):
            out.append({"validator": result.validator_type, "level": str(result.level), "message": result.message,
                        "path": path})

    queues = cfg.scheduling.queues
    qp: Path = ["Scheduling", "SlurmQueues"]
    run(cv.ClusterNameValidator, ["ClusterName"], name=cluster_name, scheduling=cfg.scheduling)
    run(cv.DuplicateNameValidator, qp, name_list=[q.name for q in queues], resource_name="Queue")
    run(cv.MaxCountValidator, qp, resources_length=len(queues), max_length=MAX_NUMBER_OF_QUEUES,
        resource_name="SlurmQueues")
    run(cv.MaxCountValidator, qp, resources_length=sum(len(q.compute_resources) for q in queues),
        max_length=MAX_NUMBER_OF_COMPUTE_RESOURCES_PER_CLUSTER, resource_name="ComputeResources per Cluster")
    for i, queue in enumerate(queues):
        run(cv.NameValidator, [*qp, i, "Name"], name=queue.name)
        run(cv.MaxCountValidator, [*qp, i, "ComputeResources"], resources_length=len(queue.compute_resources),
            max_length=MAX_COMPUTE_RESOURCES_PER_QUEUE, resource_name="ComputeResources per Queue")
        placement = queue.networking.placement_group
        run(ev.PlacementGroupCapacityTypeValidator, [*qp, i, "Networking", "PlacementGroup"],
            capacity_type=queue.capacity_type,
            placement_group_enabled=bool(placement is not None and placement.enabled))
        for j, resource in enumerate(queue.compute_resources):
            run(cv.NameValidator, [*qp, i, "ComputeResources", j, "Name"], name=resource.name)
            run(cv.ComputeResourceSizeValidator, [*qp, i, "ComputeResources", j, "MinCount"],
                min_count=resource.min_count, max_count=resource.max_count,
                capacity_type=queue.capacity_type or CapacityType.ONDEMAND)
    storage = cfg.shared_storage or []
    run(cv.DuplicateNameValidator, ["SharedStorage"], name_list=[s.name for s in storage], resource_name="Shared Storage")
    for k, item in enumerate(storage):
        run(cv.SharedStorageNameValidator, ["SharedStorage", k, "Name"], name=item.name)
        run(cv.SharedStorageMountDirValidator, ["SharedStorage", k, "MountDir"], mount_dir=item.mount_dir)
    run(cv.DuplicateMountDirValidator, ["SharedStorage"],
        shared_storage_name_mount_dir_tuple_list=[(s.name, s.mount_dir) for s in storage],
        local_mount_dir_instance_types_dict={})
    run(cv.OverlappingMountDirValidator, ["SharedStorage"], shared_mount_dir_list=[s.mount_dir for s in storage],
        local_mount_dir_list=[])
    if cfg.login_nodes is not None:
        pools = cfg.login_nodes.pools
        run(cv.MaxCountValidator, ["LoginNodes", "Pools"], resources_length=len(pools),
            max_length=MAX_NUMBER_OF_LOGIN_NODE_POOLS, resource_name="LoginNodePools")
        for k, pool in enumerate(pools):
            run(cv.NameValidator, ["LoginNodes", "Pools", k, "Name"], name=pool.name)
    return out


def check(item: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import version

    from marshmallow import ValidationError
    from pcluster.schemas.cluster_schema import ClusterSchema

    # ParallelCluster's config classes read the region from the environment while loading (no AWS call).
    os.environ["AWS_DEFAULT_REGION"] = str(item["region"])
    report: dict[str, Any] = {"pcluster_version": version("aws-parallelcluster"), "loaded_as": None,
                              "errors": [], "findings": []}
    try:
        cfg = ClusterSchema(cluster_name=item["cluster_name"]).load(item["config"])
    except ValidationError as err:
        report["errors"] = _flatten(err.messages, [])
        return report
    except Exception as err:  # noqa: BLE001 - anything else is reported, never a pass
        report["errors"] = [{"path": [], "message": f"{type(err).__name__}: {err}"}]
        return report
    report["loaded_as"] = type(cfg).__name__
    try:
        report["findings"] = _findings(cfg, item["cluster_name"])
    except Exception as err:  # noqa: BLE001
        report["errors"] = [{"path": [], "message": f"offline validators failed: {type(err).__name__}: {err}"}]
    return report


def main() -> int:
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # never ask an instance metadata service
    items = json.load(sys.stdin)
    json.dump([check(item) for item in items], sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
