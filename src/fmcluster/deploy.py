"""The whole `invoke deploy` flow, one path for every provider and scheduler:

    validate → endpoint → capacity (reservations and quotas, fmcluster.capacity) → access (secrets, key pair) → stacks (network, storage; publish the bootstrap
    bundle and manifest; cluster) → cluster (what the stacks do not make: a scheduler service's) → boot → converge (wait for every node's own report) → monitoring →
    shape (every declared compute node serving in Slurm, fmcluster.shape) → acceptance → summary

A cluster stack whose groups carry a CreationPolicy completes only once their nodes' first boots signalled, so the
instances boot while the stacks step waits: it calls the provider's (idempotent) `boot` now and then meanwhile (on
AWS EC2 boots them and the call only notes it; locally it makes each instance's host). When such a stack fails, the
step names the failed nodes first (their reports: stage, failed task, log tail), then CloudFormation's reason.

The deploy machine pushes nothing to the nodes: each converges itself from its user data (its first boot)
or its node agent (later commits, nodes joining or leaving) and files a report in the tenant bucket, which
this flow reads. The provider supplies the substrate only (fmcluster.providers): the AWS endpoint, what
boots the instances, how an operator reaches a node. Each step prints its progress; the run ends with a
summary a person would read.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fmcluster.exits import ExitCode
from fmcluster.model import Tenant
from fmcluster.nodes import Node
from fmcluster.providers import BootResult, Provider
from fmcluster.providers.registry import provider_for
from fmcluster.schedulers.protocol import Scheduler
from fmcluster.schedulers.registry import scheduler_for
from fmcluster.steps import Status, StepOutcome, StepReport

if TYPE_CHECKING:
    from fmcluster.stacks.result import StackOutcome
    from fmcluster.stacks.rollout import ReplaceGate

Out = Callable[[str], object]


class Deploy:
    """One run of the flow: the tenant, its provider and scheduler, and what the steps learn on the way."""

    def __init__(self, tenant: Tenant, out: Out = print, converge_timeout_s: float | None = None,
                 approve_replace: bool = False, allow_degraded: bool = False) -> None:
        self.tenant, self.out = tenant, out
        #: The operator accepts ending below the declared shape (`--allow-degraded`): the shape step says so instead
        #: of failing, and acceptance tests the nodes that serve without calling that a PASS of the cluster.
        self.allow_degraded = allow_degraded
        #: The operator approved replacing instances (`--approve-replace`): drain their Slurm nodes first.
        self.approve_replace = approve_replace
        self.provider: Provider = provider_for(tenant)
        self.scheduler: Scheduler = scheduler_for(tenant)
        self.endpoint: str | None = None
        self._clients: dict[tuple[str, str | None], Any] = {}
        self.outputs: dict[str, str] = {}
        self.manifest: dict[str, Any] = {}
        self.ref = ""
        self.nodes: list[Node] = []
        self.published: list[str] = []
        self.published_changed = False
        self.scale_in: dict[str, str] = {}  # the capacity pre-flight's scale-in times of Capacity Block queues
        self.started_at = ""
        #: What the provider booted while the stacks step waited for the nodes' signals (the boot step adds it).
        self.booted_while_waiting = BootResult()
        self.converge_timeout_s = converge_timeout_s or self.provider.boot_timeout_s
        self.reports: list[StepReport] = []

    def client(self, service: str) -> Any:
        """One boto3 client per service for the whole run: the report polls ask every few seconds, and a new
        client each time re-reads botocore's service model (tens of milliseconds and megabytes each)."""
        from fmcluster.stacks import aws

        key = (service, self.endpoint)  # the endpoint is known only once the emulator (or AWS) is chosen
        if key not in self._clients:
            self._clients[key] = aws.client(service, self.tenant.region, self.endpoint,
                                            self.provider.capabilities.apis)
        return self._clients[key]

    # --- steps --------------------------------------------------------------------------------------------
    def validate(self) -> StepOutcome:
        """The tenant (validated when it was loaded) and the images its nodes boot: a node kind whose image fmcluster's
        first boot cannot run on is refused here, before any secret, key pair or stack exists."""
        from fmcluster.images import booted_image, first_boot_refusals
        from fmcluster.stacks.api import required_baked_refusals

        refusals = first_boot_refusals(self.tenant, booted_image(self.scheduler.image, self.provider.node_image))
        if refusals:
            return StepOutcome("failed", f"{len(refusals)} node image(s) fmcluster's first boot cannot run on; nothing "
                               "was created or changed", refusals)
        refusals = required_baked_refusals(self.tenant, self.scheduler)
        if refusals:
            return StepOutcome("failed", f"{len(refusals)} node kind(s) with no current baked image, which their "
                               "scheduler requires; nothing was created or changed", refusals)
        return StepOutcome("ok", self.tenant.describe())

    def aws_endpoint(self) -> StepOutcome:
        self.endpoint = self.provider.endpoint(True, lambda line: self.out(f"  {line}"))
        where = self.endpoint or f"AWS ({self.tenant.region})"
        return StepOutcome("ok", f"AWS APIs at {where}", self.provider.substrate_notes())

    def capacity(self) -> StepOutcome:
        """The capacity pre-flight: refused here, nothing has been changed yet (no secret, key pair or stack)."""
        from fmcluster.capacity import preflight
        from fmcluster.paths import repo_root

        result = preflight(self.tenant, self.client, stand_in=self.provider.capabilities.apis.capacity_stand_in)
        self.scale_in = result.scale_in
        if not result.ok:
            return StepOutcome("failed", f"{len(result.refusals)} capacity problem(s); nothing was created or changed",
                               [line for p in result.refusals for line in p.render(repo_root()).splitlines()]
                               + result.lines)
        reserved = sum(1 for q in self.tenant.queues if q.capacity_reservation_id)
        return StepOutcome("ok", f"{reserved} reservation(s) and the On-Demand quotas hold what the tenant asks",
                           result.lines)

    def access(self) -> StepOutcome:
        from fmcluster.access import ensure_key_pair
        from fmcluster.publish import ensure_secrets, missing_tenant_secrets

        # The secrets the tenant makes itself, before anything is made or changed: a missing one would fail a node's
        # converge after its stack waited for it.
        self.provider.stand_in_secrets(self.endpoint, lambda line: self.out(f"  {line}"))
        missing = missing_tenant_secrets(self.tenant, self.client("secretsmanager"))
        if missing:
            return StepOutcome("failed", f"{len(missing)} secret(s) the tenant names are missing; nothing was created "
                                         "or changed", missing)
        created = ensure_secrets(self.tenant, self.client("secretsmanager"), lambda line: self.out(f"  {line}"))
        key = ensure_key_pair(self.tenant, self.client("ec2"), lambda line: self.out(f"  {line}"))
        status: Status = "changed" if created or key.created else "ok"
        return StepOutcome(status, f"{len(created)} secret(s) created, key pair {key.name} "
                                   f"{'imported' if key.created else 'present'}",
                           [f"secrets: fmcluster/{self.tenant.org}/* in Secrets Manager (nodes read them at boot)"])

    def stacks(self) -> StepOutcome:
        from fmcluster.stacks.api import deploy_stacks

        gate = self.replace_gate()
        result = deploy_stacks(self.tenant, self.endpoint, scheduler=self.scheduler,
                               apis=self.provider.capabilities.apis, before_cluster=self.publish,
                               image_parameter=self.provider.image_parameter, out=self.out, capacity=self.scale_in,
                               before_execute=gate, while_waiting=self.boot_while_waiting)
        if not result.ok:
            gate.resume()  # the update did not happen or rolled back: the nodes the gate drained serve again
            failure = next((s.failure for s in result.stacks if s.failure), None)
            reason = failure.render() if failure else "; ".join(result.notes) or "a stack did not deploy"
            nodes = self.failed_nodes(result.stacks)
            if nodes:
                # A node's failure is the cause; CloudFormation's rollback reason only names its group.
                return StepOutcome("failed", f"{nodes[0]} (the cluster stack then failed: {reason})",
                                   nodes[1:] + [f"{s.name}: {s.action} {s.status}" for s in result.stacks])
            return StepOutcome("failed", reason, [f"{s.name}: {s.action} {s.status}" for s in result.stacks])
        self.outputs = dict(result.outputs)
        details = [f"{s.name}: {s.action}" for s in result.stacks] + gate.notes
        missing = [f"{lid} ({kind})" for s in result.stacks for lid, kind in s.not_created]
        if missing:
            details.append(f"not created by the AWS emulator (exist only on AWS): {', '.join(missing)}")
        details += self.published
        changed = bool(result.changed) or self.published_changed
        return StepOutcome("changed" if changed else "ok",
                           f"{len(result.changed)} stack(s) created/updated, {len(result.skipped)} unchanged", details)

    def boot_while_waiting(self) -> None:
        """While a stack waits for its nodes' signals: the instances that exist boot (the provider's boot is
        idempotent; AWS boots its own). Also after it finished: instances a rollback terminated go."""
        result = self.provider.boot(self.endpoint, self.out)
        done = self.booted_while_waiting
        done.started += [h for h in result.started if h not in done.started]
        done.removed += [h for h in result.removed if h not in done.removed]
        done.notes += [n for n in result.notes if n not in done.notes]

    def failed_nodes(self, stacks: Sequence[StackOutcome]) -> list[str]:
        """When the cluster stack failed: what the nodes reported during this run (every failed node, its task and
        log tail). The reports are in the data bucket, which is the storage stack's (retained): a cluster stack's
        rollback leaves them readable."""
        from fmcluster.reports import failed_node_reports

        cluster_failed = any(s.key == "cluster" and s.failure for s in stacks)
        bucket = next((s.outputs["DataBucketName"] for s in stacks if s.outputs.get("DataBucketName")), "")
        if not cluster_failed or not bucket:
            return []
        return failed_node_reports(self.client("s3"), bucket, since=self.started_at)

    def publish(self, outputs: dict[str, str]) -> None:
        """Before the cluster stack: the nodes' bundle (pinned commit) and manifest, the scheduler's uploads."""
        from fmcluster.access import operator_public_key
        from fmcluster.images import booted_image
        from fmcluster.publish import (bootstrap_files, build_manifest, pinned_commit, publish, trust_index,
                                       uncommitted_changes)

        self.ref = pinned_commit()
        bucket = outputs["DataBucketName"]
        self.manifest = build_manifest(self.tenant, self.ref, outputs, self.provider.queue_resources,
                                       self.scheduler.manifest_vars(), self.provider.manifest_vars(),
                                       self.scheduler.discovery(outputs),
                                       booted_image(self.scheduler.image, self.provider.node_image),
                                       [operator_public_key(self.tenant.org)],
                                       self.provider.container_registry(outputs))
        from fmcluster.inventory import write_manifest

        write_manifest(self.tenant.org, self.manifest)
        s3 = self.client("s3")
        lines: list[str] = []
        done = publish(s3, bucket, bootstrap_files(self.ref, self.scheduler.playbook,
                                                   out=lambda line: lines.append(line.strip())), self.manifest,
                       lambda line: lines.append(line.strip()), identities={"repo.bundle": f"git:{self.ref}"})
        self.scheduler.before_cluster(s3, bucket, lambda line: lines.append(line.strip()))
        # Last: the nodes trust what was published only once its index's digest is in the deploy's SSM parameter.
        trusted = trust_index(self.client("ssm"), self.tenant.org, done.index_sha256,
                              lambda line: lines.append(line.strip()))
        for line in lines:
            self.out(f"  {line}")
        if uncommitted_changes():
            lines.append(f"note: the work tree has uncommitted changes; nodes converge to the committed {self.ref[:12]}")
        self.published_changed = bool(done.written) or trusted
        self.published = ([f"published commit {self.ref[:12]} and the manifest to s3://{bucket}/fmcluster/"]
                          if done.written else [f"commit {self.ref[:12]} and the manifest already published"]) + lines

    def replace_gate(self) -> ReplaceGate:
        """What keeps a stack update from replacing instances under running jobs (fmcluster.stacks.rollout): the
        group's Slurm nodes are the nodes the cluster's discovery lists for its role and queue; Slurm is asked on
        the controller the way every deploy step reaches a node (fmcluster.lifecycle.remote)."""
        from fmcluster.lifecycle import remote
        from fmcluster.stacks.rollout import ReplaceGate, Roll, RunOnController, SlurmUnreadable, deployed_template

        def members(roll: Roll) -> list[str]:
            return [n.name for n in self.list_nodes()
                    if (n.role == roll.role or not roll.role) and (n.queue or "") == roll.queue]

        def controller() -> RunOnController:
            found = next((n for n in self.list_nodes() if n.role == "controller"), None)
            if found is None:
                raise SlurmUnreadable("the cluster's discovery lists no controller node")
            return lambda command: remote(self.provider, found, command)

        return ReplaceGate(self.approve_replace, members, controller, lambda line: self.out(line),
                           deployed=deployed_template(self.client("cloudformation")))

    def cluster(self) -> StepOutcome:
        return self.scheduler.make_cluster(self.outputs, self.out)

    def boot(self) -> StepOutcome:
        result = self.provider.boot(self.endpoint, self.out)
        early = self.booted_while_waiting  # booted while the stacks step waited for the nodes' signals
        result.started = early.started + [h for h in result.started if h not in early.started]
        result.removed = early.removed + [h for h in result.removed if h not in early.removed]
        result.kept = [h for h in result.kept if h not in result.started]
        result.notes = early.notes + [n for n in result.notes if n not in early.notes]
        self.nodes = self.list_nodes()
        status: Status = "changed" if result.started or result.removed else "ok"
        details = [f"{n.name} {n.address} {n.role}{' ' + n.queue if n.queue else ''} ({n.instance_id})" for n in self.nodes]
        details += result.notes
        summary = (f"{len(self.nodes)} instance(s); {len(result.started)} booted, {len(result.removed)} removed, "
                   f"{len(result.kept)} already running" if result.started or result.removed or result.kept
                   else f"{len(self.nodes)} instance(s) booting on {self.provider.name}")
        return StepOutcome(status, summary, details)

    def list_nodes(self) -> list[Node]:
        from fmcluster.nodes import discover

        return discover(self.manifest.get("discovery", {}), self.client, self.tenant.org)

    def converge(self) -> StepOutcome:
        from fmcluster.manifest import digest
        from fmcluster.reports import failure_details, first_boot_warnings, wait_for_reports

        bucket = self.outputs["DataBucketName"]
        s3 = self.client("s3")
        wait = wait_for_reports(s3, bucket, self.list_nodes, self.ref, digest(self.manifest), self.converge_timeout_s,
                                self.out)
        self.nodes = [s.node for s in wait.statuses]
        self.write_inventory()
        details = [s.line() for s in wait.statuses]
        details += first_boot_warnings(wait.statuses, self.scheduler.first_boot_window, self.provider.shared_cores())
        if wait.ok:
            # Converges that happened during this run (ISO timestamps compare as text) and changed something.
            fresh = [s.report or {} for s in wait.statuses if str((s.report or {}).get("finished", "")) >= self.started_at]
            changed = [r for r in fresh if r.get("trigger") == "first-boot" or int(r.get("changed") or 0) > 0]
            slowest = max(wait.statuses, key=lambda s: float((s.report or {}).get("seconds") or 0))
            return StepOutcome("changed" if changed else "ok",
                               f"{len(wait.statuses)}/{len(wait.statuses)} nodes converged themselves, "
                               f"{len(fresh)} during this run "
                               f"(slowest {slowest.node.name}, {(slowest.report or {}).get('seconds')}s)", details)
        details += failure_details(wait, s3, bucket, lambda node: self.provider.console_output(self.endpoint, node))
        why = "timed out" if wait.timed_out else "a node failed"
        return StepOutcome("failed", f"{why} after {wait.seconds:.0f}s: "
                           f"{sum(1 for s in wait.statuses if s.state == 'converged')}/{len(wait.statuses)} converged",
                           details)

    def write_inventory(self) -> Path:
        from fmcluster.inventory import write_inventory

        return write_inventory(self.tenant, self.manifest, self.nodes)

    def monitoring(self) -> StepOutcome:
        from fmcluster.monitoring import scrape_targets

        controller = next((n for n in self.nodes if n.role == "controller"), None)
        if controller is None:
            return StepOutcome("failed", "no controller node: nowhere to ask Prometheus")
        route = self.provider.route(controller)
        self.out(f"  reaching the nodes through {route.via}")
        if why := route.unusable():
            return StepOutcome("failed", why)
        outcome = scrape_targets(self.provider.client_argv(controller), self.nodes, self.out)
        outcome.details.append(f"operator access: the controller through {route.via}")
        return outcome

    def shape(self) -> StepOutcome:
        from fmcluster import shape as cluster_shape
        from fmcluster.lifecycle import LifecycleError, controller_of, read_view

        def look() -> cluster_shape.Shape:
            view = read_view(self.provider, controller_of(self.nodes), self.tenant)
            return cluster_shape.measure(self.tenant, self.nodes, view.slurm, view.findings)

        try:
            # Two health intervals: a node the health program drained is resumed by its next passing run.
            budget = 2 * self.tenant.capabilities.provider.health_interval_s + 30
            measured = cluster_shape.settle(look, budget, self.out)
        except LifecycleError as err:
            return StepOutcome("failed", f"cannot read the cluster's shape: {err}")
        return cluster_shape.outcome(measured, self.allow_degraded, self.tenant.org)

    def acceptance(self) -> StepOutcome:
        from fmcluster.acceptance.gate import deploy_acceptance

        # Over a degraded cluster (allowed) the serving nodes are tested now: a PASS of the whole cluster is no evidence.
        degraded = any(r.outcome.degraded for r in self.reports)
        return deploy_acceptance(self.tenant, self.provider, self.nodes, self.manifest, self.out,
                                 every_node=not self.allow_degraded, reuse=not degraded)

    def steps(self) -> list[tuple[str, Callable[[], StepOutcome]]]:
        return [("validate", self.validate), ("endpoint", self.aws_endpoint), ("capacity", self.capacity),
                ("access", self.access),
                ("stacks", self.stacks), ("cluster", self.cluster), ("boot", self.boot), ("converge", self.converge),
                ("monitoring", self.monitoring), ("shape", self.shape), ("acceptance", self.acceptance)]

    def run(self) -> list[StepReport]:
        from datetime import datetime, timezone

        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        steps = self.steps()
        reports = self.reports
        for index, (name, step) in enumerate(steps, start=1):
            self.out(f"\n==> [{index}/{len(steps)}] {name}")
            began = time.monotonic()
            try:
                outcome = step()
            except Exception as err:  # a step failing must still produce the summary
                outcome = StepOutcome("failed", f"{type(err).__name__}: {err}",
                                      traceback.format_exc().strip().splitlines()[-6:])
            reports.append(StepReport(name, outcome, time.monotonic() - began))
            self.out(f"    {outcome.status}: {outcome.summary} ({reports[-1].seconds:.1f}s)")
            if outcome.status == "failed":
                for line in outcome.details:
                    self.out(f"      {line}")
                break
        self.out(render_summary(self.tenant, reports, len(steps)))
        record_run(self.tenant, reports)
        return reports


def render_summary(tenant: Tenant, reports: list[StepReport], total_steps: int) -> str:
    width = max(len(r.name) for r in reports)
    lines = [f"\n=== deploy summary: {tenant.org} ({tenant.provider}, {tenant.scheduler}) ==="]
    for report in reports:
        lines.append(f"  {report.name:<{width}}  {report.outcome.status:<8} {report.seconds:6.1f}s  {report.outcome.summary}")
        lines.extend(f"  {'':<{width}}  {'':<8} {'':>7}  {d}" for d in report.outcome.details
                     if report.outcome.status != "failed")
    not_run = total_steps - len(reports)
    failed = [r for r in reports if r.outcome.status == "failed"]
    total = sum(r.seconds for r in reports)
    if failed:
        lines.append(f"  FAILED at '{failed[0].name}'; {not_run} later step(s) not run. Fix the cause and re-run: "
                     "completed steps are skipped or no-ops.")
    else:
        changed = sum(1 for r in reports if r.outcome.status == "changed")
        degraded = [r.name for r in reports if r.outcome.degraded]
        lines.append(f"  {'DEGRADED (allowed by --allow-degraded, see ' + degraded[0] + ')' if degraded else 'done'} "
                     f"in {total:.1f}s: {changed} step(s) changed something, {len(reports) - changed} had nothing to do.")
    from fmcluster.images import image_lines

    lines += [f"  {line}" for line in image_lines(tenant, scheduler_for(tenant).image, provider_for(tenant).node_image)]
    return "\n".join(lines)


def record_run(tenant: Tenant, reports: list[StepReport]) -> None:
    """generated/deploy-last.json: each step's status and time (benchmarks and `invoke status` read it)."""
    from fmcluster.paths import generated_dir, tenant_dir, write_fresh

    path = generated_dir(tenant.org) / "deploy-last.json"
    write_fresh(path, json.dumps([{"step": r.name, "status": r.outcome.status, "seconds": round(r.seconds, 2),
                                   "summary": r.outcome.summary} for r in reports], indent=1) + "\n",
                tenant_dir(tenant.org))


def run_deploy(tenant: Tenant, out: Out = print, approve_replace: bool = False, allow_degraded: bool = False) -> int:
    reports = Deploy(tenant, out, approve_replace=approve_replace, allow_degraded=allow_degraded).run()
    return ExitCode.FAILED if any(r.outcome.status == "failed" for r in reports) else ExitCode.OK
