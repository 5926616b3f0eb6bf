"""Task-level entry points for a tenant's Slurm cluster: nodes up/down, inventory, converge, client access.

tasks.py calls the `*_task` functions (they validate the tenant and return an exit code); the deploy flow
calls the typed functions they wrap: fmcluster.localnodes.nodes_up/nodes_down,
fmcluster.inventory.write_inventory, fmcluster.converge.converge.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fmcluster.cli import require_tenant
from fmcluster.converge import ConvergeError, converge
from fmcluster.inventory import write_inventory
from fmcluster.localnodes import LocalNodesError, load_nodes, nodes_down, nodes_up, run_on_node, runtime_root
from fmcluster.model import Tenant


def nodes_up_task(org: str) -> int:
    """`invoke nodes-up`: create the local nodes, then write the generated inventory for them."""
    tenant = require_tenant(org)
    started = time.monotonic()
    try:
        nodes = nodes_up(tenant)
    except LocalNodesError as err:
        print(f"nodes-up: {err}")
        return 1
    path = write_inventory(tenant, nodes)
    print(f"nodes-up: {len(nodes)} nodes of {org} up in {time.monotonic() - started:.1f} s; inventory {path}")
    print(f"next: invoke converge --org={org}")
    return 0


def nodes_down_task(org: str) -> int:
    """`invoke nodes-down`: remove the local nodes and everything they left on this machine."""
    tenant = require_tenant(org)
    try:
        nodes_down(tenant)
    except LocalNodesError as err:
        print(f"nodes-down: {err}")
        return 1
    print(f"nodes-down: no local node of {org} is left")
    return 0


def converge_task(org: str, limit: str = "", check: bool = False) -> int:
    """`invoke converge`: run playbooks/slurm-cluster.yml against the generated inventory."""
    tenant = require_tenant(org)
    up = load_nodes(org)
    if tenant.provider == "local" and (not up or not all(Path(n.netns_path).exists() for n in up)):
        print(f"converge: the local nodes of {org} are not up; run `invoke nodes-up --org={org}` first")
        return 1
    started = time.monotonic()
    try:
        code = converge(tenant, limit=limit, check=check)
    except ConvergeError as err:
        print(f"converge: {err}")
        return 1
    print(f"converge: {'ok' if code == 0 else f'failed ({code})'} in {time.monotonic() - started:.1f} s")
    return code


def slurm_task(org: str, cmd: str, node: str = "") -> int:
    """`invoke slurm`: run one Slurm client command on a local node; its output goes to ours."""
    import shlex

    tenant = require_tenant(org)
    try:
        done = slurm(tenant, shlex.split(cmd), node or None)
    except LocalNodesError as err:
        print(f"slurm: {err}")
        return 1
    print(done.stdout, end="")
    print(done.stderr, end="", file=sys.stderr)
    return done.returncode


def client_node(tenant: Tenant) -> str:
    """The node users (and the acceptance job) submit from: the first login node, else the controller."""
    nodes = load_nodes(tenant.org)
    for role in ("login", "controller"):
        names = [n.name for n in nodes if n.role == role]
        if names:
            return names[0]
    raise LocalNodesError(f"the local nodes of {tenant.org} are not up; run `invoke nodes-up --org={tenant.org}`")


def slurm_conf_path(tenant: Tenant, node: str | None = None) -> str:
    """SLURM_CONF of a local node (each node keeps its own copy, written by converge)."""
    return f"{runtime_root(tenant.org)}/nodes/{node or client_node(tenant)}/etc/slurm/slurm.conf"


def slurm(tenant: Tenant, argv: Sequence[str], node: str | None = None,
          timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command (sbatch, srun, squeue, scontrol, sinfo) on a local node of the tenant.

    It runs in that node's network namespace with SLURM_CONF pointing at the node's slurm.conf, exactly as a
    user logged into the node would; the default node is the login node (controller when there is none).
    """
    name = node or client_node(tenant)
    return run_on_node(tenant, name, argv, env={"SLURM_CONF": slurm_conf_path(tenant, name)}, timeout=timeout)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fmcluster.cluster nodes-up|nodes-down|converge ORG`: the same as the invoke tasks, for
    Molecule's prepare/cleanup playbooks (which set $FMCLUSTER_ROOT to the scenario's directory)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fmcluster.cluster")
    parser.add_argument("action", choices=["nodes-up", "nodes-down", "converge"])
    parser.add_argument("org")
    parser.add_argument("--limit", default="")
    args = parser.parse_args(argv)
    if args.action == "nodes-up":
        return nodes_up_task(args.org)
    if args.action == "nodes-down":
        return nodes_down_task(args.org)
    return converge_task(args.org, limit=args.limit)


if __name__ == "__main__":
    raise SystemExit(main())
