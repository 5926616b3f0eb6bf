"""Replace a compute node from the cluster itself (the controller's repair agent): its instance is terminated in its
Auto Scaling group with the desired capacity kept, so the group launches a new one from its launch template, and
EC2 boots it (locally: the substrate's hypervisor stand-in); the new node converges and joins by itself.

It runs on the controller's own toolchain (/opt/fmcluster/venv, boto3) with the controller's instance role (its
credentials from the instance metadata service) and the node's settings: the region from the environment or
fmcluster-bootstrap's /etc/fmcluster/node.env, the AWS endpoint as the node agent finds it (AWS_ENDPOINT_URL where the
substrate names one; on AWS the region's endpoints). The controller's role may do this on its own cluster's compute
groups only (the slurm-ec2 cluster template, statement RepairComputeNodes).

    /opt/fmcluster/venv/bin/python -m fmcluster.node.replace i-0123456789abcdef0 [--unhealthy]
    /opt/fmcluster/venv/bin/python -m fmcluster.node.replace --address=10.0.128.4   (Slurm's NodeAddr)

prints one JSON object ({"instance_id", "group", "action"}) and exits 0, or says why not and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ENV_FILE = Path("/etc/fmcluster/node.env")


def node_region(env: dict[str, str] | None = None, env_file: Path = ENV_FILE) -> str:
    """The node's region: FMCLUSTER_REGION (or AWS_REGION / AWS_DEFAULT_REGION) from the environment, else
    fmcluster-bootstrap's node.env."""
    env = dict(os.environ if env is None else env)
    for key in ("FMCLUSTER_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"):
        if env.get(key):
            return env[key]
    if env_file.is_file():
        from fmcluster.node.agent import read_env_file

        region = read_env_file(env_file).get("FMCLUSTER_REGION", "")
        if region:
            return region
    raise RuntimeError(f"no region: FMCLUSTER_REGION is not set and {env_file} names none")


def boto3_client(service: str, region: str | None = None) -> Any:
    """The node's own client: its instance role's credentials, its endpoint (AWS_ENDPOINT_URL)."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "max_attempts": 4}, connect_timeout=5, read_timeout=60)
    return boto3.session.Session(region_name=region or node_region()).client(service, config=config)


def autoscaling_client(region: str | None = None) -> Any:
    return boto3_client("autoscaling", region)


def replace_instance(instance_id: str, *, unhealthy: bool = False, autoscaling: Any = None) -> str:
    """Have `instance_id`'s Auto Scaling group replace it; returns the group's name.

    Default: TerminateInstanceInAutoScalingGroup with ShouldDecrementDesiredCapacity=False — the group launches the
    replacement at once. `unhealthy=True`: SetInstanceHealth(Unhealthy) instead, leaving the termination to the
    group's own health process (on AWS; the local emulator records the status but replaces nothing).
    RuntimeError when the instance is in no group (nothing would launch a replacement)."""
    client = autoscaling if autoscaling is not None else autoscaling_client()
    found = client.describe_auto_scaling_instances(InstanceIds=[instance_id]).get("AutoScalingInstances", [])
    if not found:
        raise RuntimeError(f"instance {instance_id} is in no Auto Scaling group: nothing would launch its "
                           "replacement (was it started by hand, or is it the controller?)")
    group = str(found[0]["AutoScalingGroupName"])
    if unhealthy:
        client.set_instance_health(InstanceId=instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False)
    else:
        client.terminate_instance_in_auto_scaling_group(InstanceId=instance_id, ShouldDecrementDesiredCapacity=False)
    return group


def instance_at(address: str, ec2: Any = None) -> str:
    """The live instance whose private address is `address` (what Slurm knows a node by: its NodeAddr)."""
    client = ec2 if ec2 is not None else boto3_client("ec2")
    found = [i["InstanceId"] for r in client.describe_instances(Filters=[
                 {"Name": "private-ip-address", "Values": [address]},
                 {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
             ]).get("Reservations", []) for i in r.get("Instances", [])]
    if len(found) != 1:
        raise RuntimeError(f"{len(found)} live instances have the private address {address}: "
                           + (", ".join(found) if found else "its instance is gone already"))
    return str(found[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fmcluster.node.replace",
                                     description="replace a compute node through its Auto Scaling group")
    parser.add_argument("instance_id", nargs="?", default="", help="the instance (or --address)")
    parser.add_argument("--address", default="", help="the node's private address (Slurm's NodeAddr) instead")
    parser.add_argument("--unhealthy", action="store_true",
                        help="mark it Unhealthy (the group replaces it) instead of terminating it in its group")
    args = parser.parse_args(argv)
    if bool(args.instance_id) == bool(args.address):
        parser.error("name the instance or its --address, one of the two")
    try:
        if args.address:
            args.instance_id = instance_at(args.address)
        group = replace_instance(args.instance_id, unhealthy=args.unhealthy)
    except Exception as err:  # noqa: BLE001 - one line for the caller (the repair agent logs it)
        print(f"fmcluster-node replace: {args.instance_id or args.address}: {type(err).__name__}: {err}",
              file=sys.stderr)
        return 1
    print(json.dumps({"instance_id": args.instance_id, "group": group,
                      "action": "set-unhealthy" if args.unhealthy else "terminate-keep-capacity"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
