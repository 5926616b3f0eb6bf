"""Scheduler `parallelcluster`: an AWS ParallelCluster 3 cluster made from the cluster config fmcluster renders
(fmcluster.parallelcluster), beside fmcluster's own network and storage stacks; its nodes run the same
first-boot script through OnNodeConfigured. ParallelCluster's own Slurm, node replacement and accounting stay
its own (docs/parallelcluster.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fmcluster.model import Tenant
from fmcluster.schedulers import SITE_PLAYBOOK, Out


class ParallelCluster:
    name = "parallelcluster"
    playbook = SITE_PLAYBOOK

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant

    def cluster_template(self) -> str:
        return ""  # ParallelCluster makes the cluster's stack itself

    def discovery(self, outputs: Mapping[str, str]) -> dict[str, Any]:
        # ParallelCluster's instances carry its tags and the ones the config adds (fmcluster:org).
        return {"kind": "ec2", "tag": "fmcluster:org"}

    def manifest_vars(self) -> dict[str, Any]:
        return {"prometheus_node_discovery": {"kind": "ec2", "region": self.tenant.region,
                                              "tag": "fmcluster:org", "value": self.tenant.org}}

    def before_cluster(self, s3: Any, bucket: str, out: Out) -> None:
        return None

    def validate(self, out: Out) -> int:
        from fmcluster.parallelcluster import commands

        return commands.validate(self.tenant, out)

    def plan(self, out: Out) -> int:
        from fmcluster.parallelcluster import commands

        return commands.plan(self.tenant, out)
