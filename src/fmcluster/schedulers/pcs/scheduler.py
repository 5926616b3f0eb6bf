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
from fmcluster.model import Tenant
from fmcluster.nodes import Node
from fmcluster.schedulers.pcs.image import IMAGE, SLURM_VERSION
from fmcluster.schedulers.pcs.template import CLUSTER_TEMPLATE
from fmcluster.schedulers.protocol import SITE_PLAYBOOK, Out
from fmcluster.stacks.result import DeleteFirst
from fmcluster.stacks.templates import ClusterTemplate, StorageParts
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


class Pcs:
    name = "pcs"
    capabilities: SchedulerCapabilities = SCHEDULERS["pcs"]
    playbook = SITE_PLAYBOOK
    cluster_template: ClusterTemplate | None = CLUSTER_TEMPLATE
    stand_in_template: ClusterTemplate | None = None
    # PCS documents no time limit for a node's user data.
    first_boot_window: tuple[str, float] | None = None
    instance_quotas = "ec2"

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant

    def discovery(self, outputs: Mapping[str, str]) -> dict[str, Any]:
        # The launch templates tag every instance with the tenant's org, its role and its queue.
        return {"kind": "ec2", "tag": "fmcluster:org"}

    def image(self, accelerator: str) -> str:
        return IMAGE

    def storage_parts(self) -> StorageParts:
        return StorageParts()

    def manifest_vars(self) -> dict[str, Any]:
        return {
            "prometheus_node_discovery": {"kind": "ec2", "region": self.tenant.region, "tag": "fmcluster:org",
                                          "value": self.tenant.org},
            # PCS's Slurm, for the roles that configure around it (capability service_installs_slurm).
            "slurm_conf_dir": SLURM_CONF_DIR,
            "fmcluster_slurm_bin_dir": SLURM_BIN_DIR,
            "node_health_commands": {name: [f"{SLURM_BIN_DIR}/{name}"] for name in SLURM_COMMANDS},
        }

    def before_cluster(self, s3: Any, bucket: str, out: Out) -> None:
        return None

    def validate(self, out: Out) -> int:
        return 0

    def plan(self, out: Out) -> int:
        out(f"  PCS: Slurm {SLURM_VERSION}; every node group boots {IMAGE} (parameter PcsImageId, resolved by name when "
            "the cluster stack is created); its first boot cannot run there yet: src/fmcluster/schedulers/pcs/README.md")
        return 0

    def make_cluster(self, outputs: Mapping[str, str], out: Out) -> StepOutcome:
        return StepOutcome("ok", "made by the cluster stack (AWS::PCS::Cluster, compute node groups, queues)")

    def delete_cluster(self, out: Out) -> DeleteFirst | None:
        return None  # the cluster stack is deleted with the others

    def status_lines(self) -> list[str]:
        return []

    def session_target(self, node: Node, outputs: Mapping[str, str]) -> str:
        return node.instance_id  # an EC2 instance of the tenant's account, managed by SSM as any other

    def replacement_refusal(self, node: str) -> str | None:
        return REPLACEMENT_REFUSAL

    def request_replacement(self, node: Node, autoscaling: Callable[[], Any],
                            on_controller: Callable[[str], subprocess.CompletedProcess[str]]) -> tuple[str, list[str]]:
        raise RuntimeError(REPLACEMENT_REFUSAL)
