"""Scheduler `pcs`: AWS Parallel Computing Service, managed Slurm (fmcluster.schedulers.pcs.template). PCS runs
slurmctld (and slurmdbd) in AWS's account and launches the node groups' instances in the tenant's; the PCS agent on
the image registers each instance and starts its Slurm daemon (slurmd on compute nodes, sackd on nodes in no queue),
after the launch template's user data has run fmcluster's first boot. So, as on HyperPod, the
service owns Slurm (capability `service_installs_slurm`) and fmcluster's roles configure around it: the manifest
gives them the image's Slurm paths. The instances are EC2 instances of the tenant's account, tagged by the launch
templates: they are found, and scraped by Prometheus, as slurm-ec2's are.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from fmcluster.capabilities import SCHEDULERS, SchedulerCapabilities
from fmcluster.nodes import Node
from fmcluster.schedulers.pcs.image import IMAGE, SLURM_VERSION
from fmcluster.schedulers.pcs.template import CLUSTER_TEMPLATE
from fmcluster.schedulers.protocol import Out, TenantEc2Cluster
from fmcluster.stacks.templates import ClusterTemplate
from fmcluster.steps import StepOutcome

#: Where PCS's Slurm installer puts Slurm (/opt/aws/pcs/scheduler/slurm-<version>), and where configless Slurm caches
#: the configuration it fetched from the controller (/run/slurm/conf); README.md, "Sources".
SLURM_PREFIX = f"/opt/aws/pcs/scheduler/slurm-{SLURM_VERSION}"
SLURM_BIN_DIR = f"{SLURM_PREFIX}/bin"
SLURM_CONF_DIR = "/run/slurm/conf"
#: The Slurm commands fmcluster's programs run (health checks, Slurm metrics, acceptance), by path: a supervised
#: service's PATH does not have PCS's prefix.
SLURM_COMMANDS = ("scontrol", "squeue", "sinfo", "sbatch", "srun", "sacctmgr")
REPLACEMENT_REFUSAL = ("fmcluster does not replace PCS nodes yet: PCS launches and terminates its node groups' "
                       "instances itself (src/fmcluster/schedulers/pcs/README.md, \"What is not done yet\")")


class Pcs(TenantEc2Cluster):
    name = "pcs"
    capabilities: SchedulerCapabilities = SCHEDULERS["pcs"]
    cluster_template: ClusterTemplate | None = CLUSTER_TEMPLATE
    # PCS documents no time limit for a node's user data.
    first_boot_window: tuple[str, float] | None = None

    def image(self, accelerator: str) -> str:
        return IMAGE

    def manifest_vars(self) -> dict[str, Any]:
        return {
            **super().manifest_vars(),
            # PCS's Slurm, for the roles that configure around it (capability service_installs_slurm).
            "slurm_conf_dir": SLURM_CONF_DIR,
            "fmcluster_slurm_bin_dir": SLURM_BIN_DIR,
            "node_health_commands": {name: [f"{SLURM_BIN_DIR}/{name}"] for name in SLURM_COMMANDS},
        }

    def plan(self, out: Out) -> int:
        out(f"  PCS: Slurm {SLURM_VERSION}; every node group boots {IMAGE} (parameter PcsImageId, resolved by name when "
            "the cluster stack is created); its first boot cannot run there yet: src/fmcluster/schedulers/pcs/README.md")
        return 0

    def make_cluster(self, outputs: Mapping[str, str], out: Out) -> StepOutcome:
        return StepOutcome("ok", "made by the cluster stack (AWS::PCS::Cluster, compute node groups, queues)")

    def replacement_refusal(self, node: str) -> str | None:
        return REPLACEMENT_REFUSAL

    def request_replacement(self, node: Node, autoscaling: Callable[[], Any],
                            on_controller: Callable[[str], subprocess.CompletedProcess[str]]) -> tuple[str, list[str]]:
        raise RuntimeError(REPLACEMENT_REFUSAL)
