"""Scheduler `hyperpod`: SageMaker HyperPod with Slurm (fmcluster.schedulers.hyperpod.template). HyperPod makes the
instances, starts its own Slurm and then runs the lifecycle script on each as OnInitComplete
(node_files/on_create.sh), which waits for that Slurm and runs the same first-boot script as every
other node; the nodes are found through SageMaker's ListClusterNodes.

One Slurm per cluster, HyperPod's: HyperPod's AMI ships Slurm and munge
under /opt/slurm, its cluster agent writes slurm.conf there (nodes and partitions from the instance groups'
SlurmConfig), its deep health checks and NodeRecovery replace failing nodes. The manifest says so
(capability `service_installs_slurm`, so `fmcluster_capabilities.slurm_owner: scheduler` and no node is in
the inventory group fmcluster_slurm), so the playbooks install no Slurm or munge, and it gives the roles that work
around Slurm (health program, Slurm metrics, acceptance) HyperPod's paths (docs/stacks.md)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from fmcluster.capabilities import SCHEDULERS, SchedulerCapabilities
from fmcluster.model import Tenant
from fmcluster.nodes import Node, as_root
from fmcluster.schedulers.hyperpod.lifecycle import LIFECYCLE_DIR, lifecycle_environment
from fmcluster.schedulers.hyperpod.template import CLUSTER_TEMPLATE, cluster_name
from fmcluster.schedulers.protocol import SITE_PLAYBOOK, Out
from fmcluster.stacks.first_boot import USER_DATA_SCRIPT, first_boot_script
from fmcluster.stacks.result import DeleteFirst
from fmcluster.stacks.templates import ClusterTemplate, StorageParts
from fmcluster.stacks.templates.common import LIFECYCLE_PREFIX
from fmcluster.steps import StepOutcome

LIFECYCLE_ENV = "fmcluster-lifecycle.env"
#: Where HyperPod's Slurm lives on its AMI (AWS's HyperPod lifecycle samples: slurm.conf, accounting.conf and
#: slurmdbd.conf under /opt/slurm/etc; the binaries under /opt/slurm/bin; configless slurmd's cache in its spool).
SLURM_PREFIX = "/opt/slurm"
SLURM_CONF_DIR = f"{SLURM_PREFIX}/etc"
SLURM_BIN_DIR = f"{SLURM_PREFIX}/bin"
SLURMD_SPOOL_DIR = "/var/spool/slurmd"
#: The Slurm commands fmcluster's programs run (health checks, Slurm metrics, acceptance): HyperPod's, by path,
#: since a supervised service's PATH does not have /opt/slurm/bin.
SLURM_COMMANDS = ("scontrol", "squeue", "sinfo", "sbatch", "srun", "sacctmgr")
#: HyperPod's Slurm integration replaces a node set to FAIL with this reason (its documented manual path).
HYPERPOD_REPLACE_REASON = "Action:Replace"


def hyperpod_replace_command(node: str) -> str:
    """HyperPod (Slurm): the documented manual replacement, as a command for the controller."""
    return as_root(f"{SLURM_BIN_DIR}/scontrol update nodename={shlex.quote(node)} state=fail "
                   f"reason={shlex.quote(HYPERPOD_REPLACE_REASON)}")


class HyperPod:
    name = "hyperpod"
    capabilities: SchedulerCapabilities = SCHEDULERS["hyperpod"]
    playbook = SITE_PLAYBOOK
    cluster_template: ClusterTemplate | None = CLUSTER_TEMPLATE
    stand_in_template: ClusterTemplate | None = None
    # HyperPod documents no time limit of its own for a lifecycle script (on_create.sh).
    first_boot_window: tuple[str, float] | None = None
    instance_quotas = "sagemaker"

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant

    def groups(self) -> dict[str, str]:
        """Instance group name → role (the compute groups are named after their queues)."""
        groups = {"controller": "controller", **({"login": "login"} if self.tenant.login else {})}
        groups.update({q.name: "compute" for q in self.tenant.queues})
        return groups

    def discovery(self, outputs: Mapping[str, str]) -> dict[str, Any]:
        # The template's own name, not the stack output: the manifest is published before the cluster stack exists.
        return {"kind": "hyperpod", "cluster_name": cluster_name(self.tenant),
                "groups": self.groups()}

    def image(self, accelerator: str) -> str:
        # HyperPod boots its own AMI on every instance group (no image in its cluster API of ours).
        return "hyperpod-default"

    def storage_parts(self) -> StorageParts:
        return StorageParts()

    def manifest_vars(self) -> dict[str, Any]:
        return {
            # HyperPod's instances live in a service account, not in the tenant's EC2: Prometheus scrapes the
            # nodes the controller's inventory lists (it re-converges when nodes join or leave).
            "prometheus_node_discovery": {"kind": "inventory"},
            # Who installs and configures Slurm and munge (playbooks/slurm-cluster.yml) is the capability
            # service_installs_slurm (fmcluster.capabilities): HyperPod.
            # HyperPod's Slurm, for the roles that configure around it.
            "slurm_conf_dir": SLURM_CONF_DIR,
            "slurm_spool_dir": SLURMD_SPOOL_DIR,
            "node_health_commands": {name: [f"{SLURM_BIN_DIR}/{name}"] for name in SLURM_COMMANDS},
        }

    def lifecycle_files(self, bucket: str) -> dict[str, bytes]:
        files = {script.name: script.read_bytes() for script in sorted(LIFECYCLE_DIR.iterdir())
                 if script.suffix in (".sh", ".py")}
        files[USER_DATA_SCRIPT.name] = first_boot_script().encode()
        # The same FMCLUSTER_* variables as the EC2 user data (shell-quoted: on_create.sh sources the file).
        files[LIFECYCLE_ENV] = lifecycle_environment(self.tenant, bucket, f"{self.tenant.stack_prefix}-cluster").encode()
        return files

    def before_cluster(self, s3: Any, bucket: str, out: Out) -> None:
        for name, body in self.lifecycle_files(bucket).items():
            s3.put_object(Bucket=bucket, Key=f"{LIFECYCLE_PREFIX}{name}", Body=body)
        out(f"  uploaded the lifecycle scripts (on_create.sh → {USER_DATA_SCRIPT.name}) to s3://{bucket}/{LIFECYCLE_PREFIX}")

    def validate(self, out: Out) -> int:
        return 0

    def plan(self, out: Out) -> int:
        return 0

    def make_cluster(self, outputs: Mapping[str, str], out: Out) -> StepOutcome:
        return StepOutcome("ok", "made by the cluster stack (AWS::SageMaker::Cluster)")

    def delete_cluster(self, out: Out) -> DeleteFirst | None:
        return None  # the cluster stack is deleted with the others

    def status_lines(self) -> list[str]:
        return []

    def session_target(self, node: Node, outputs: Mapping[str, str]) -> str:
        # HyperPod's instances are SageMaker's: SSM names them sagemaker-cluster:<cluster id>_<group>-<instance id>.
        cluster_id = outputs.get("ClusterArn", "").rpartition("/")[2]
        if not cluster_id:
            raise RuntimeError("no ClusterArn among the cluster stack's outputs (generated/stack_outputs.yml): "
                               "cannot name the HyperPod node's Session Manager target; run `invoke deploy` again")
        group = node.queue if node.role == "compute" else node.role
        return f"sagemaker-cluster:{cluster_id}_{group}-{node.instance_id}"

    def replacement_refusal(self, node: str) -> str | None:
        return None

    def request_replacement(self, node: Node, autoscaling: Callable[[], Any],
                            on_controller: Callable[[str], subprocess.CompletedProcess[str]]) -> tuple[str, list[str]]:
        done = on_controller(hyperpod_replace_command(node.name))
        if done.returncode != 0:
            raise RuntimeError(f"HyperPod replacement request failed: {(done.stderr or done.stdout).strip()}")
        return (f"{node.name} set FAIL with reason {HYPERPOD_REPLACE_REASON}",
                ["HyperPod: asked through Slurm (state=fail reason=Action:Replace, HyperPod's documented path); "
                 "BatchReplaceClusterNodes is not in the pinned botocore"])
