"""Scheduler `parallelcluster`: an AWS ParallelCluster 3 cluster made from the cluster config fmcluster renders
(fmcluster.schedulers.parallelcluster), beside fmcluster's own network and storage stacks; its nodes run the same
first-boot script through OnNodeConfigured and are found by ParallelCluster's own instance tags. ParallelCluster's
Slurm, munge, shared-storage mounts, node replacement and accounting stay its own (docs/parallelcluster.md).

On provider local no ParallelCluster service exists: its part is stood in by a substrate
(fmcluster.schedulers.parallelcluster.stand_in) and the config is still rendered from the deployed stacks and checked by
ParallelCluster's own schema; only `pcluster create-cluster` itself does not run.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from fmcluster.capabilities import SCHEDULERS, SchedulerCapabilities
from fmcluster.model import Tenant
from fmcluster.nodes import Node
from fmcluster.schedulers.parallelcluster.config import BOOTSTRAP_TIMEOUT_S
from fmcluster.schedulers.parallelcluster.rules import DEFAULT_OS, official_image
from fmcluster.schedulers.parallelcluster.settings import settings_of
from fmcluster.schedulers.parallelcluster.stand_in import STAND_IN_TEMPLATE, STOOD_IN
from fmcluster.schedulers.parallelcluster.storage_parts import storage_parts
from fmcluster.schedulers.parallelcluster.tags import NODE_TAGS
from fmcluster.schedulers.protocol import SITE_PLAYBOOK, Out
from fmcluster.stacks.result import DeleteFirst
from fmcluster.stacks.templates import ClusterTemplate, StorageParts
from fmcluster.steps import StepOutcome

#: Why `invoke replace` leaves a node to ParallelCluster, and the command that triggers its own replacement.
PARALLELCLUSTER_REFUSAL = (
    "ParallelCluster replaces unhealthy static compute nodes itself: its clustermgtd (aws-parallelcluster-node's "
    "slurm_plugin) terminates a node Slurm marks DOWN, or DRAINED once idle, and launches a new one "
    "(terminate_down_nodes / terminate_drain_nodes, on by default). Trigger it with "
    "`invoke slurm --org={org} --cmd='sudo \"$(command -v scontrol)\" update nodename={node} state=down "
    "reason=replace'` (sudo's secure_path lacks ParallelCluster's /opt/slurm/bin).")


def parallelcluster_refusal(org: str, node: str) -> str:
    """The refusal, with the command that triggers ParallelCluster's own replacement (a name that is not a plain
    host name is not echoed into a command line)."""
    plain = node if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", node) else "<node>"
    return PARALLELCLUSTER_REFUSAL.format(org=org, node=plain)


class ParallelCluster:
    name = "parallelcluster"
    capabilities: SchedulerCapabilities = SCHEDULERS["parallelcluster"]
    playbook = SITE_PLAYBOOK
    #: ParallelCluster makes its cluster stack itself (pcluster create-cluster); where the provider has no
    #: ParallelCluster service, the stand-in's stack takes its place.
    cluster_template: ClusterTemplate | None = None
    stand_in_template: ClusterTemplate | None = STAND_IN_TEMPLATE
    # DevSettings/Timeouts: ComputeNodeBootstrapTimeout and HeadNodeBootstrapTimeout, which the rendered config sets.
    first_boot_window: tuple[str, float] | None = ("ParallelCluster's ComputeNodeBootstrapTimeout (the config's)",
                                                   float(BOOTSTRAP_TIMEOUT_S))
    instance_quotas = "ec2"

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant
        self.stand_in = tenant.capabilities.stand_in

    def discovery(self, outputs: Mapping[str, str]) -> dict[str, Any]:
        # ParallelCluster tags its instances with what they are; the config's Tags add fmcluster:org.
        return {"kind": "ec2", "tag": "fmcluster:org", "node_tags": NODE_TAGS.as_manifest()}

    def image(self, accelerator: str) -> str:
        # ParallelCluster's official AMI of the configured OS (Image/Os), on every node.
        settings = settings_of(self.tenant)
        return official_image(settings.os if settings else DEFAULT_OS)

    def storage_parts(self) -> StorageParts:
        # Its nodes' managed policies (no cluster stack of ours holds them) and, when asked for, the Slurm
        # accounting database (fmcluster.schedulers.parallelcluster.storage_parts).
        return storage_parts(self.tenant)

    def manifest_vars(self) -> dict[str, Any]:
        return {
            "prometheus_node_discovery": {"kind": "ec2", "region": self.tenant.region, "tag": "fmcluster:org",
                                          "value": self.tenant.org, "node_tags": NODE_TAGS.as_manifest()},
            # Who installs Slurm, munge and the shared-storage mounts is a capability (fmcluster_capabilities.
            # slurm_owner): ParallelCluster on AWS; fmcluster's roles for the local stand-in.
            # ParallelCluster's own daemons (clustermgtd, computemgtd ...) run as pcluster-admin and use the
            # instance role: the IMDS rule (roles/imds_guard) lets that account through.
            "imds_guard_scheduler_users": [] if self.stand_in else ["pcluster-admin"],
        }

    def before_cluster(self, s3: Any, bucket: str, out: Out) -> None:
        from fmcluster.schedulers.parallelcluster.operations import upload_custom_action

        upload_custom_action(s3, bucket, out)

    def validate(self, out: Out) -> int:
        from fmcluster.schedulers.parallelcluster import commands

        return commands.validate(self.tenant, out)

    def plan(self, out: Out) -> int:
        from fmcluster.schedulers.parallelcluster import commands

        return commands.plan(self.tenant, out)

    def make_cluster(self, outputs: Mapping[str, str], out: Out) -> StepOutcome:
        """Render the cluster config from the stacks' outputs and check it with ParallelCluster's schema; then
        `pcluster create-cluster`/`update-cluster` (a dry run first) and wait (AWS), or say what stands in."""
        from fmcluster.schedulers.parallelcluster import commands, operations
        from fmcluster.schedulers.parallelcluster.config import render_cluster_config, write_cluster_config

        chosen: dict[str, str] = {}
        if not self.stand_in:  # the stand-in boots the substrate's hosts, never an AMI
            from fmcluster.stacks import aws

            from fmcluster.schedulers.parallelcluster.custom_ami import baked_amis

            from fmcluster.capabilities import provider_capabilities

            apis = provider_capabilities(self.tenant.provider).apis
            chosen, refusals, said = baked_amis(self.tenant, aws.client("ec2", self.tenant.region, None, apis))
            for line in said:
                out(f"  image: {line}")
            if refusals:
                return StepOutcome("failed", "a recorded baked image may not be booted", refusals)
        cfg = render_cluster_config(self.tenant, dict(outputs), chosen)
        path = write_cluster_config(cfg)
        lines: list[str] = []
        checked = commands.check_rendered(cfg, lines.append)
        for line in lines:
            out(f"  {line}")
        details = [f"cluster config: {path}"] + [line.strip() for line in lines[:1]]
        if checked != 0:
            return StepOutcome("failed", "ParallelCluster's schema refused the rendered cluster config, or did not run",
                               details + lines[1:])
        if self.stand_in:
            if cfg.placeholders:
                details.append("rendered with marked placeholders for what the AWS emulator does not create: "
                               + ", ".join(cfg.placeholders))
            return StepOutcome("ok", f"{cfg.cluster_name}: local stand-in (the cluster stack above), "
                                     "the rendered config passed ParallelCluster's schema", details + [STOOD_IN])
        if cfg.placeholders:
            return StepOutcome("failed", "the stacks did not give " + ", ".join(cfg.placeholders), details)
        settings = settings_of(self.tenant)
        accounting = settings.accounting if settings else None
        # A database fmcluster creates (no ARN named) has its secret made by the storage stack, in this account.
        if accounting is not None and accounting.password_secret_arn is not None:
            from fmcluster.schedulers.parallelcluster.rules import secret_account_problem
            from fmcluster.stacks import aws

            sts = aws.client("sts", self.tenant.region, None, self.tenant.capabilities.provider.apis)
            account = str(sts.get_caller_identity()["Account"])
            if (problem := secret_account_problem(accounting.password_secret_arn, account)) is not None:
                return StepOutcome("failed", problem, details)
        try:
            done = operations.apply(cfg, path, out=out)
            state = done.state if done.action == "no-changes" else operations.wait(cfg.cluster_name, cfg.region, out=out)
        except operations.PclusterError as err:
            return StepOutcome("failed", str(err), details + err.lines)
        assert state is not None
        return StepOutcome("ok" if done.action == "no-changes" else "changed",
                           f"{cfg.cluster_name}: {done.action}, {state.status}", details + done.notes
                           + operations.status_lines(state))

    def delete_cluster(self, out: Out) -> DeleteFirst | None:
        if self.stand_in:
            return None  # the stand-in's stack is deleted with the others

        def delete() -> bool:
            from fmcluster.schedulers.parallelcluster import operations
            from fmcluster.schedulers.parallelcluster.config import cluster_name

            try:
                operations.delete(cluster_name(self.tenant), self.tenant.region, out=out)
            except operations.PclusterError as err:
                out(f"  {err}")
                for line in err.lines:
                    out(f"    {line}")
                return False
            return True

        return (f"ParallelCluster cluster {self.tenant.stack_prefix}-cluster", delete)

    def status_lines(self) -> list[str]:
        from fmcluster.schedulers.parallelcluster import operations
        from fmcluster.schedulers.parallelcluster.config import cluster_name

        if self.stand_in:
            return [f"{cluster_name(self.tenant)}: local stand-in (its stack is listed above). {STOOD_IN}"]
        try:
            return operations.status_lines(operations.describe(cluster_name(self.tenant), self.tenant.region))
        except operations.PclusterError as err:
            return [f"{cluster_name(self.tenant)}: describe-cluster failed: {err}", *err.lines]

    def session_target(self, node: Node, outputs: Mapping[str, str]) -> str:
        return node.instance_id  # an EC2 instance of the tenant's account, managed by SSM as any other

    def replacement_refusal(self, node: str) -> str | None:
        return parallelcluster_refusal(self.tenant.org, node)

    def request_replacement(self, node: Node, autoscaling: Callable[[], Any],
                            on_controller: Callable[[str], subprocess.CompletedProcess[str]]) -> tuple[str, list[str]]:
        raise RuntimeError(self.replacement_refusal(node.name) or "")
