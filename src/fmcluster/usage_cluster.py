"""The usage report (fmcluster.health.usage) read on a tenant's cluster: sacct on its login node (else the controller),
through the provider's ssh, as `invoke slurm` runs a command there. Used by `invoke usage` and `invoke fleet`."""

from __future__ import annotations

from pathlib import Path

from fmcluster.model import Tenant
from fmcluster.health.usage import Usage, UsageError, read

#: sacct over a month of a busy cluster's allocations takes seconds; a minute is a cluster that does not answer.
TIMEOUT_S = 60.0


class NoCluster(UsageError):
    """Nothing deployed to ask (no nodes recorded for the tenant)."""


def read_cluster_usage(tenant: Tenant, since: str, root: Path | None = None) -> tuple[str, list[Usage]]:
    """(the node asked, the usage rows); NoCluster before a deploy, UsageError when sacct fails or answers garbage."""
    from fmcluster.acceptance.gate import client_node
    from fmcluster.acceptance.slurm import SlurmError
    from fmcluster.inventory import read_nodes
    from fmcluster.lifecycle import remote
    from fmcluster.providers.registry import provider_for

    nodes = read_nodes(tenant.org, root)
    try:
        target = client_node(nodes)
    except SlurmError:
        raise NoCluster(f"no login or controller node known for '{tenant.org}'; run `invoke deploy "
                        f"--org={tenant.org}` first") from None
    provider = provider_for(tenant)

    def run(command: str) -> tuple[int, str, str]:
        done = remote(provider, target, command, timeout=TIMEOUT_S)
        return done.returncode, done.stdout, done.stderr

    try:
        return target.name, read(run, since)
    except UsageError as err:
        raise UsageError(f"on {target.name}: {err}") from None
