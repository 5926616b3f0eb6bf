"""Scheduler `pcs`: AWS Parallel Computing Service, managed Slurm (fmcluster.schedulers.pcs.template). PCS runs
slurmctld (and slurmdbd) in AWS's account and launches the node groups' instances in the tenant's; the PCS agent on
the image registers each instance and starts its Slurm daemon (slurmd on compute nodes, sackd on nodes in no queue),
after the launch template's user data has run fmcluster's first boot. So, as on HyperPod, the
service owns Slurm (capability `service_installs_slurm`) and fmcluster's roles configure around it: the manifest
gives them the image's Slurm paths. The instances are EC2 instances of the tenant's account, tagged by the launch
templates: they are found, and scraped by Prometheus, as slurm-ec2's are.

On provider local no PCS exists: its part is stood in by a substrate (fmcluster.schedulers.pcs.stand_in, whose stack
takes the cluster stack's place) and fmcluster's roles install Slurm there, at their own paths.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from fmcluster.capabilities import SCHEDULERS, SchedulerCapabilities
from fmcluster.nodes import Node
from fmcluster.model import Tenant
from fmcluster.schedulers.pcs.image import SLURM_VERSION, load_installers
from fmcluster.schedulers.pcs.stand_in import STAND_IN_TEMPLATE, STOOD_IN
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
    #: Where the provider has no PCS (capability service_resources_stood_in), the stand-in's stack takes its place.
    stand_in_template: ClusterTemplate | None = STAND_IN_TEMPLATE
    # PCS documents no time limit for a node's user data.
    first_boot_window: tuple[str, float] | None = None

    def __init__(self, tenant: Tenant) -> None:
        super().__init__(tenant)
        self.stand_in = tenant.capabilities.stand_in

    def image(self, accelerator: str) -> str:
        # The base its baked image is built on (installers.yml bases); the node boots the baked image (template.py).
        return load_installers().base(accelerator)

    def manifest_vars(self) -> dict[str, Any]:
        if self.stand_in:
            return super().manifest_vars()  # fmcluster's Slurm (slurm_owner fmcluster), at its own paths
        return {
            **super().manifest_vars(),
            # PCS's Slurm, for the roles that configure around it (capability service_installs_slurm).
            "slurm_conf_dir": SLURM_CONF_DIR,
            "node_health_commands": {name: [f"{SLURM_BIN_DIR}/{name}"] for name in SLURM_COMMANDS},
        }

    def plan(self, out: Out) -> int:
        if self.stand_in:
            out(f"  PCS: local stand-in (the cluster stack is src/fmcluster/schedulers/pcs/stand_in.py's). {STOOD_IN}")
            return 0
        out(f"  PCS: Slurm {SLURM_VERSION}; every node group boots the tenant's baked image of its kind (`invoke image "
            f"--org={self.tenant.org}`: its base with AWS's PCS agent and Slurm installers, then fmcluster's install "
            "steps); without a current one the deploy is refused (src/fmcluster/schedulers/pcs/README.md)")
        return 0

    def make_cluster(self, outputs: Mapping[str, str], out: Out) -> StepOutcome:
        if self.stand_in:
            return StepOutcome("ok", "local stand-in for AWS PCS (the cluster stack above)", [STOOD_IN])
        return StepOutcome("ok", "made by the cluster stack (AWS::PCS::Cluster, compute node groups, queues)")

    def status_lines(self) -> list[str]:
        return [f"PCS: local stand-in (its stack is listed above). {STOOD_IN}"] if self.stand_in else []

    def replacement_refusal(self, node: str) -> str | None:
        return REPLACEMENT_REFUSAL

    def request_replacement(self, node: Node, autoscaling: Callable[[], Any],
                            on_controller: Callable[[str], subprocess.CompletedProcess[str]]) -> tuple[str, list[str]]:
        raise RuntimeError(REPLACEMENT_REFUSAL)
