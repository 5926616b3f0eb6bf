# mypy: disable-error-code="import-not-found"
"""Run INSIDE the aws-parallelcluster tool environment (.tools/pcluster-venv), never imported by fmcluster.

stdin: a JSON list of {"cluster_name", "region", "config", "answers"}; stdout: a JSON list of reports, one per config:

    {"pcluster_version", "loaded_as", "errors": [{"path", "message"}], "findings": [{"validator", "level",
     "message", "path"}], "needs_aws": [{"validator", "call"}]}

`errors` are ParallelCluster's schema (ClusterSchema(cluster_name=...).load) refusing the config, with the
field path marshmallow reports. `findings` come from ParallelCluster's own validators: first the ones that need
no AWS answer, run with the arguments its config classes pass them (so each finding has its config path), then
every validator the config registers (`config.validate()`, as `pcluster create-cluster` runs them), with the
AWS answers they ask for served from `answers` (fmcluster.schedulers.parallelcluster.offline_aws: the instance catalog,
the tenant, the rendered network stack) by a `before-call` hook on boto3's default session: no request ever
leaves this process. A call `answers` cannot serve is answered with the error code FmclusterNeedsAws, so the
validator that made it is listed under `needs_aws` (it runs on AWS, in `pcluster ... --dryrun true`), never
counted as passed or failed. Uses the standard library and the pcluster package only.
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


NEEDS_AWS = "FmclusterNeedsAws"


class _Stub:
    """EC2/FSx answers from data for the calls ParallelCluster's config and validators make; every other call
    gets the FmclusterNeedsAws error (what a missing permission looks like to ParallelCluster)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.unanswered: list[str] = []

    def answer(self, call: str, params: dict[str, Any]) -> dict[str, Any] | None:
        a = self.answers

        def pick(kind: str, key: str, wanted: list[str]) -> list[Any]:
            return [item for item in a.get(kind, []) if item.get(key) in wanted]

        if call == "ec2.DescribeInstanceTypes":
            found = pick("instance_types", "InstanceType", params.get("InstanceTypes", []))
            return {"InstanceTypes": found} if len(found) == len(params.get("InstanceTypes", [])) else None
        if call == "ec2.DescribeSubnets" and "SubnetIds" in params:
            found = pick("subnets", "SubnetId", params["SubnetIds"])
            return {"Subnets": found} if len(found) == len(params["SubnetIds"]) else None
        if call == "ec2.DescribeCapacityReservations" and "CapacityReservationIds" in params:
            found = pick("capacity_reservations", "CapacityReservationId", params["CapacityReservationIds"])
            return {"CapacityReservations": found} if len(found) == len(params["CapacityReservationIds"]) else None
        if call == "ec2.DescribeRouteTables":
            wanted = [v for f in params.get("Filters", []) if f.get("Name") == "association.subnet-id"
                      for v in f.get("Values", [])]
            return {"RouteTables": [t for t in a.get("route_tables", [])
                                    if any(x.get("SubnetId") in wanted for x in t.get("Associations", []))]}
        if call == "ec2.DescribeVpcAttribute":
            vpc = a.get("vpcs", {}).get(params.get("VpcId", ""))
            attribute = str(params.get("Attribute", ""))
            if vpc is None or attribute not in vpc:
                return None
            return {"VpcId": params["VpcId"], attribute[0].upper() + attribute[1:]: {"Value": vpc[attribute]}}
        if call == "ec2.DescribeImages" and params.get("ImageIds") == [a.get("image", {}).get("ImageId")]:
            return {"Images": [a["image"]]}
        if call == "ec2.DescribeImages" and "ImageIds" in params:
            found = pick("custom_images", "ImageId", params["ImageIds"])
            return {"Images": found} if found and len(found) == len(params["ImageIds"]) else None
        if call == "fsx.DescribeVolumes":
            found = pick("volumes", "VolumeId", params.get("VolumeIds", []))
            return {"Volumes": found} if found and len(found) == len(params.get("VolumeIds", [])) else None
        if call == "fsx.DescribeFileSystems":
            found = pick("file_systems", "FileSystemId", params.get("FileSystemIds", []))
            return {"FileSystems": found} if found and len(found) == len(params.get("FileSystemIds", [])) else None
        return None

    def install(self, region: str) -> None:
        import boto3
        from botocore.awsrequest import AWSResponse

        def keep_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
            context["fmcluster_params"] = dict(params)

        def before_call(model: Any, context: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
            call = f"{model.service_model.service_name}.{model.name}"
            found = self.answer(call, context.get("fmcluster_params") or {})
            if found is not None:
                return AWSResponse("https://fmcluster.offline", 200, {}, None), found
            self.unanswered.append(call)
            error = {"Code": NEEDS_AWS, "Message": f"[{NEEDS_AWS} {call}] answered only by AWS"}
            return AWSResponse("https://fmcluster.offline", 400, {}, None), {
                "Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}

        from pcluster.aws.aws_api import AWSApi
        from pcluster.aws.common import Cache

        AWSApi.reset()  # its clients (and their caches) were made from the previous config's session
        Cache.clear_all()
        boto3.setup_default_session(region_name=region)
        session = boto3.DEFAULT_SESSION._session  # noqa: SLF001 - the botocore session every client copies its hooks from
        session.register("provide-client-params", keep_params)
        session.register("before-call", before_call)


def _all_validators(cfg: Any, stub: _Stub, seen: set[tuple[str, str]]) -> tuple[list[Any], list[Any]]:
    """config.validate() as pcluster create-cluster runs it; (findings, validators that need AWS)."""
    import logging

    from pcluster.config.common import Resource
    from pcluster.validators.common import ValidatorContext

    answers = stub.answers
    logging.getLogger("pcluster").setLevel(logging.CRITICAL)  # its AWS-error log lines: we report them ourselves
    # pcluster create-cluster looks its official image up before validating (Cluster.__official_ami); offline a
    # stand-in id whose description `answers` serves (the image's own checks need AWS).
    cfg.official_ami = answers.get("image", {}).get("ImageId")
    # Some validators turn an unanswered call into a message of their own ("Cannot validate secret ..."): a
    # warning from a validator that asked something only AWS answers is not a finding about the config.
    asked: dict[int, list[str]] = {}
    run_one = Resource._validator_execute_sync  # noqa: SLF001

    def traced(validator_args: Any, validator: Any) -> Any:
        before = len(stub.unanswered)
        results = run_one(validator_args, validator)
        for result in results or []:
            if len(stub.unanswered) > before:
                asked[id(result)] = stub.unanswered[before:]
        return results

    Resource._validator_execute_sync = staticmethod(traced)  # noqa: SLF001
    findings, needs = [], []
    for result in cfg.validate(context=ValidatorContext()):
        message = str(result.message)
        if NEEDS_AWS in message:
            call = message[message.index(NEEDS_AWS) + len(NEEDS_AWS):].split("]")[0].strip()
            needs.append({"validator": result.validator_type, "call": call})
        elif id(result) in asked and str(result.level) != "ERROR":
            needs += [{"validator": result.validator_type, "call": call} for call in asked[id(result)]]
        elif (result.validator_type, message) not in seen:
            findings.append({"validator": result.validator_type, "level": str(result.level), "message": message,
                             "path": []})
    unique = {(n["validator"], n["call"]): n for n in needs}
    return findings, sorted(unique.values(), key=lambda n: (n["validator"], n["call"]))


def check(item: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import version

    from marshmallow import ValidationError
    from pcluster.schemas.cluster_schema import ClusterSchema

    # ParallelCluster's config classes read the region from the environment while loading (no AWS call).
    os.environ["AWS_DEFAULT_REGION"] = str(item["region"])
    report: dict[str, Any] = {"pcluster_version": version("aws-parallelcluster"), "loaded_as": None,
                              "errors": [], "findings": [], "needs_aws": []}
    stub = _Stub(item.get("answers") or {})
    stub.install(str(item["region"]))
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
        seen = {(f["validator"], f["message"]) for f in report["findings"]}
        more, report["needs_aws"] = _all_validators(cfg, stub, seen)
        report["findings"] += more
    except Exception as err:  # noqa: BLE001
        report["errors"] = [{"path": [], "message": f"offline validators failed: {type(err).__name__}: {err}"}]
    return report


def main() -> int:
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # never ask an instance metadata service
    # Validators look at credentials only through calls, which the stub answers; botocore still wants some.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "fmcluster-offline")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "fmcluster-offline")
    items = json.load(sys.stdin)
    json.dump([check(item) for item in items], sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
