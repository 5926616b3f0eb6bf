"""Which Slurm role this HyperPod instance plays and where its controller is, from the resource config HyperPod
writes on every instance (/opt/ml/config/resource_config.json: instance groups, each with its instances'
CustomerIpAddress). on_create.sh waits for HyperPod's own Slurm daemon with it (wait_for_hyperpod_slurm.sh).

fmcluster names HyperPod's instance groups itself (fmcluster.schedulers.hyperpod.scheduler.HyperPod.groups): "controller",
"login", and one group per queue. Standard library only: it runs before anything is installed.

Usage: hyperpod_slurm_role.py RESOURCE_CONFIG ADDRESS... → prints "ROLE CONTROLLER_ADDRESS[,...]"; exit 2 when
none of ADDRESS is an instance of the config (HyperPod's own file disagrees with this host: nothing is guessed).
"""

from __future__ import annotations

import json
import sys
from typing import Any

ROLE_OF_GROUP = {"controller": "controller", "login": "login"}  # every other group is a queue: compute


def role_and_controllers(config: dict[str, Any], addresses: set[str]) -> tuple[str, list[str]] | None:
    groups = config.get("InstanceGroups") or []
    controllers = [str(i.get("CustomerIpAddress")) for g in groups if g.get("Name") == "controller"
                   for i in g.get("Instances") or [] if i.get("CustomerIpAddress")]
    for group in groups:
        for instance in group.get("Instances") or []:
            if instance.get("CustomerIpAddress") in addresses:
                return ROLE_OF_GROUP.get(str(group.get("Name")), "compute"), controllers
    return None


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 64
    with open(argv[0], encoding="utf-8") as handle:
        found = role_and_controllers(json.load(handle), set(argv[1:]))
    if found is None:
        print(f"none of {' '.join(argv[1:])} is an instance of {argv[0]}", file=sys.stderr)
        return 2
    role, controllers = found
    if not controllers:
        print(f"{argv[0]} has no instance in the 'controller' group", file=sys.stderr)
        return 2
    print(role, ",".join(controllers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
