"""`invoke nodes` and `invoke replace`: which nodes are unhealthy and what each needs, and replacing one the
way its scheduler does.

`nodes` asks the controller, as an operator would (ssh): `scontrol show node` for every node's Slurm state and
`fmcluster-health triage --json` (fmcluster.health.triage with the XID table and the nodes' reports) for the
reason, the check that drained the node and the action it needs (none / drain / reboot / replace).

`replace` asks the scheduler's own API for a new node and waits, fail closed, for positive evidence:

    slurm-ec2        TerminateInstanceInAutoScalingGroup(ShouldDecrementDesiredCapacity=False): the group
                     launches a new instance from its launch template, which joins through the one boot path
                     (user data → node agent → ansible-pull → report); the controller and login nodes
                     re-converge the new membership (the old node leaves slurm.conf and Prometheus)
    hyperpod         HyperPod's Slurm path: `scontrol update nodename=N state=fail reason=Action:Replace` on the
                     controller (BatchReplaceClusterNodes is not in the pinned botocore)
    and refused where the scheduler's service replaces unhealthy nodes itself (its `replacement_refusal` says why)

(each scheduler's `request_replacement`, in its module under fmcluster.schedulers), then the provider's `boot` (local: the terminated instance's host goes, the new instance's host boots), every
node's report for the published commit and membership, Slurm showing the new node idle and the old one gone,
Prometheus scraping exactly the current nodes, the health program passing on the new node, and a job across it.
Node names are data: one is accepted only when it is a live node of the cluster, and reaches a remote shell
quoted.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fmcluster.exits import ExitCode
from fmcluster.health import slurm as slurm_text
from fmcluster.health.inventory import INSTALL_DIR
from fmcluster.health.triage import Finding
from fmcluster.model import Tenant
from fmcluster.nodes import Node, as_root
from fmcluster.providers import Provider, RouteUnusable
from fmcluster.schedulers.registry import scheduler_for

Out = Callable[[str], object]
HEALTH_PROGRAM = f"{INSTALL_DIR}/bin/fmcluster-health"
#: The node_health role's paths (node_health_cluster_config_path, node_health_config_path defaults).
CLUSTER_CONFIG = "/etc/fmcluster/health/cluster.json"
NODE_CONFIG = "/etc/fmcluster/health/config.json"
TRIAGE = as_root(f"{HEALTH_PROGRAM} triage --config {CLUSTER_CONFIG} --json")
#: node_repair's config (node_repair_config_path's default) and its ledger, as `fmcluster-health repair --show` prints it.
REPAIR_CONFIG = "/etc/fmcluster/health/repair.json"
REPAIR_LEDGER = as_root(f"{HEALTH_PROGRAM} repair --config {REPAIR_CONFIG} --show")
SHOW_NODE = "scontrol show node"


class LifecycleError(RuntimeError):
    """What `nodes` or `replace` could not do, in words an operator acts on."""

    def __init__(self, message: str, code: int = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.code = code


# --- reading the cluster --------------------------------------------------------------------------------------
def client_argv(provider: Provider, node: Node) -> list[str]:
    """How an operator reaches `node`; a route this machine cannot use is a not-ready lifecycle error."""
    try:
        return provider.client_argv(node)
    except RouteUnusable as err:
        raise LifecycleError(str(err), ExitCode.NOT_READY) from err


def remote(provider: Provider, node: Node, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`command` (a fixed text; any value in it quoted) on `node`, through ssh as an operator runs it."""
    argv = client_argv(provider, node)
    try:
        return subprocess.run([*argv, command], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([command], 124, "", f"{node.name} did not answer within {timeout:.0f}s")


def controller_of(nodes: Sequence[Node]) -> Node:
    found = next((n for n in nodes if n.role == "controller"), None)
    if found is None:
        raise LifecycleError("the cluster has no controller node (nothing deployed?)", ExitCode.NOT_READY)
    return found


@dataclass
class ClusterView:
    """Slurm's nodes (by name) and the triage's findings, as the controller sees them now."""

    slurm: dict[str, slurm_text.Node]
    findings: list[Finding]


def read_view(provider: Provider, controller: Node, tenant: Tenant) -> ClusterView:
    """Slurm's nodes and the triage's findings. Where fmcluster installs Slurm, the controller's health program
    triages (it reads the nodes' reports too); where the scheduler's service owns Slurm (slurm_owner
    `scheduler`: HyperPod, and on AWS a service that makes the cluster) no fmcluster-health runs there, so Slurm's own reasons are triaged here with the same table."""
    shown = remote(provider, controller, SHOW_NODE)
    if shown.returncode != 0:
        raise LifecycleError(f"`{SHOW_NODE}` on {controller.name} failed: {(shown.stderr or shown.stdout).strip()[-300:]}")
    cluster = {n.name: n for n in slurm_text.parse_show_node(shown.stdout)}
    if tenant.capabilities.slurm_owner != "fmcluster":
        from fmcluster.health import data, triage

        return ClusterView(cluster, triage.unhealthy_nodes(shown.stdout, triage.Rules(data.checks_doc(), data.xid_doc())))
    triaged = remote(provider, controller, TRIAGE)
    # triage exits 1 when it found unhealthy nodes; anything else but 0 is a failure to look.
    if triaged.returncode not in (0, 1):
        raise LifecycleError(f"`fmcluster-health triage` on {controller.name} failed ({triaged.returncode}): "
                             f"{(triaged.stderr or triaged.stdout).strip()[-300:]}")
    try:
        findings = [Finding(**raw) for raw in json.loads(triaged.stdout)]
    except (ValueError, TypeError) as err:
        raise LifecycleError(f"unreadable triage from {controller.name}: {err}: {triaged.stdout[:200]!r}") from None
    return ClusterView(cluster, findings)


@dataclass
class NodeLine:
    """One line of `invoke nodes`."""

    node: str
    role: str
    address: str
    instance_id: str
    state: str
    action: str = "none"
    check: str = ""
    reason: str = ""
    why: str = ""
    xids: list[int] = field(default_factory=list)

    @property
    def unhealthy(self) -> bool:
        return bool(self.reason or self.why)


def node_lines(nodes: Sequence[Node], view: ClusterView) -> list[NodeLine]:
    """Every live node with its Slurm state and, when unhealthy, the triage's reason, check and action; then
    Slurm nodes no live instance stands behind (a node gone without leaving slurm.conf)."""
    findings = {f.node: f for f in view.findings}
    # Slurm may name a node otherwise than its instance's hostname (a service's own naming, e.g. `<queue>-st-<resource>-<n>`);
    # its NodeAddr is the instance's address everywhere.
    by_address = {n.address: n for n in view.slurm.values() if n.address}
    matched: set[str] = set()
    lines: list[NodeLine] = []
    for node in nodes:
        known = view.slurm.get(node.name) or (by_address.get(node.address) if node.role == "compute" else None)
        if known is not None:
            matched.add(known.name)
        if node.role != "compute":
            state = "-"
        elif known is None:
            state = "not in Slurm"
        else:
            state = known.display_state + ("" if known.responding else "*")
        line = NodeLine(node.name, node.role, node.address, node.instance_id, state)
        finding = findings.get(known.name if known is not None else node.name)
        if finding is not None:
            line.action, line.check, line.reason, line.why = finding.action, finding.check, finding.reason, finding.why
            line.xids = list(finding.xids)
        elif node.role == "compute" and known is None:
            line.action, line.why = "none", "its instance is running but slurmctld does not list it (still joining?)"
        lines.append(line)
    for name, known in sorted(view.slurm.items()):
        if name not in matched:
            finding = findings.get(name)
            lines.append(NodeLine(name, "compute", known.address, "", known.display_state,
                                  finding.action if finding else "none", finding.check if finding else "",
                                  known.reason, "in Slurm, but no live instance stands behind it"))
    return lines


def render_lines(lines: Sequence[NodeLine]) -> str:
    rows = [("NODE", "ROLE", "STATE", "ACTION", "CHECK", "INSTANCE", "REASON")]
    rows += [(ln.node, ln.role, ln.state, ln.action if ln.unhealthy else "", ln.check, ln.instance_id,
              ln.reason or ln.why) for ln in lines]
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    return "".join("  ".join(r[i].ljust(widths[i]) for i in range(6)) + "  " + r[6] + "\n" for r in rows)


def auto_replacements(lines: Sequence[NodeLine], compute_count: int) -> tuple[list[str], str]:
    """The compute nodes an automatic pass may replace now, and why not when it may not.

    At most a quarter of the compute nodes (at least one) in one pass, as the groups' rolling updates: more
    nodes asking for replacement at once points to a shared cause (a file system, the network, a bad
    image), which new instances would not fix."""
    wanted = [ln.node for ln in lines if ln.role == "compute" and ln.instance_id and ln.action == "replace"]
    limit = max(1, compute_count // 4)
    if len(wanted) > limit:
        return [], (f"{len(wanted)} nodes ask for replacement, more than a quarter of the {compute_count} compute "
                    f"nodes ({limit}): a shared cause is likelier than {len(wanted)} bad nodes; replace them one by "
                    "one with `invoke replace` once you know")
    return wanted, ""


# --- replace --------------------------------------------------------------------------------------------------
@dataclass
class Replacement:
    """What `replace` found and did: the old and new node, the time each stage took, the evidence."""

    old: Node
    new: Node | None = None
    stages: list[tuple[str, float, str]] = field(default_factory=list)
    seconds: float = 0.0
    health: str = ""
    acceptance: str = ""
    failed: str = ""
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"\n=== replace summary: {self.old.name} ==="]
        lines.append(f"  old node   {self.old.name} {self.old.address} ({self.old.instance_id}, queue {self.old.queue})")
        if self.new is not None:
            lines.append(f"  new node   {self.new.name} {self.new.address} ({self.new.instance_id}, queue {self.new.queue})")
        for name, seconds, detail in self.stages:
            lines.append(f"  {name:<10} {seconds:6.1f}s  {detail}")
        if self.health:
            lines.append(f"  health     {self.health}")
        if self.acceptance:
            lines.append(f"  acceptance {self.acceptance}")
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"  FAILED: {self.failed}" if self.failed else
                     f"  done in {self.seconds:.1f}s: {self.old.name} replaced by {self.new.name if self.new else '?'}")
        return "\n".join(lines)


class Replacer:
    """One `invoke replace`: the tenant, its provider, the live nodes, and the waits, each bounded."""

    def __init__(self, tenant: Tenant, provider: Provider, endpoint: str | None, manifest: dict[str, Any],
                 out: Out = print, timeout_s: float | None = None, poll_s: float = 2.0) -> None:
        self.tenant, self.provider, self.endpoint, self.manifest, self.out = tenant, provider, endpoint, manifest, out
        #: One budget for the whole replacement (every wait takes what is left of it), not one per stage.
        self.timeout_s = timeout_s or provider.boot_timeout_s
        self.poll_s = poll_s
        self.deadline = float("inf")  # set when a replacement starts

    def _left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def client(self, service: str) -> Any:
        from fmcluster.stacks import aws

        return aws.client(service, self.tenant.region, self.endpoint, self.provider.capabilities.apis)

    def live_nodes(self) -> list[Node]:
        from fmcluster.nodes import discover

        return discover(self.manifest.get("discovery", {}), self.client, self.tenant.org)

    def pick(self, wanted: str, nodes: Sequence[Node]) -> Node:
        """The live node named `wanted` (name, address or instance id); compute nodes only."""
        target = next((n for n in nodes if wanted in (n.name, n.address, n.instance_id)), None)
        compute = ", ".join(n.name for n in nodes if n.role == "compute")
        if target is None:
            raise LifecycleError(f"no live node {wanted!r} in {self.tenant.org}; compute nodes: {compute or 'none'}",
                                 ExitCode.INVALID)
        if target.role != "compute":
            raise LifecycleError(
                f"{target.name} is the cluster's {target.role} node: `invoke replace` replaces compute nodes only. "
                + ("The controller holds slurmctld's state and the accounting database; rebuild it with a deploy "
                   "after restoring them." if target.role == "controller" else
                   "A login node holds users' sessions; terminate it in its Auto Scaling group when nobody is on it, "
                   "and `invoke deploy` waits for the new one."), ExitCode.INVALID)
        return target

    def _stage(self, result: Replacement, name: str, began: float, detail: str) -> None:
        result.stages.append((name, time.monotonic() - began, detail))
        self.out(f"    {name}: {detail} ({time.monotonic() - began:.1f}s)")

    def replace(self, wanted: str) -> Replacement:
        refusal = scheduler_for(self.tenant).replacement_refusal(wanted)
        if refusal:
            raise LifecycleError(refusal, ExitCode.INVALID)
        nodes = self.live_nodes()
        old = self.pick(wanted, nodes)
        controller = controller_of(nodes)
        result = Replacement(old)
        started = time.monotonic()
        self.deadline = started + self.timeout_s
        try:
            self._run(result, nodes, controller)
        except LifecycleError as err:
            result.failed = str(err)
        result.seconds = time.monotonic() - started
        return result

    def _run(self, result: Replacement, nodes: list[Node], controller: Node) -> None:
        old = result.old
        view = read_view(self.provider, controller, self.tenant)
        known = view.slurm.get(old.name)
        finding = next((f for f in view.findings if f.node == old.name), None)
        state = known.display_state if known else "not in Slurm"
        self.out(f"==> {old.name}: Slurm {state}" + (f", {finding.check or finding.origin}: {finding.reason} "
                                                     f"(triage: {finding.action})" if finding else ", healthy in triage"))
        if known is not None and (known.state in slurm_text.BUSY_STATES or "COMPLETING" in known.flags):
            raise LifecycleError(f"{old.name} is running jobs ({state}): drain it and let them finish first "
                                 f"(`invoke slurm --org={self.tenant.org} --cmd='sudo scontrol update nodename={old.name} "
                                 "state=drain reason=replace'`)")

        began = time.monotonic()
        self.out("==> asking the scheduler for a new node")
        try:
            asked, notes = scheduler_for(self.tenant).request_replacement(
                old, lambda: self.client("autoscaling"), lambda command: remote(self.provider, controller, command))
        except RuntimeError as err:
            raise LifecycleError(str(err)) from err
        result.notes += notes
        self._stage(result, "request", began, asked)

        began = time.monotonic()
        booted = self.provider.boot(self.endpoint, lambda line: self.out(f"  {line}"))
        result.notes += booted.notes
        new = self._wait_new(old, {n.instance_id for n in nodes})
        result.new = new
        self._stage(result, "launch", began, f"new instance {new.instance_id} at {new.address} ({new.name})")

        began = time.monotonic()
        self._wait_reports()
        self._stage(result, "converge", began, f"{new.name} reported its first boot; controller and login "
                                               "converged the new membership")

        began = time.monotonic()
        self._wait_slurm(controller, old, new)
        self._stage(result, "slurm", began, f"{new.name} idle, {old.name} gone from slurmctld")

        began = time.monotonic()
        current = self.live_nodes()
        from fmcluster.monitoring import scrape_targets

        scraped = scrape_targets(client_argv(self.provider, controller), current, lambda line: self.out(line),
                                 wait_s=self._left())
        if scraped.status == "failed":
            raise LifecycleError(f"Prometheus: {scraped.summary}: {'; '.join(scraped.details[:4])}")
        self._stage(result, "monitoring", began, scraped.summary)

        result.health = self._health(new)
        result.acceptance = self._job_across(controller, current, new)

    def _wait_new(self, old: Node, before: set[str]) -> Node:
        deadline = self.deadline
        while True:
            nodes = self.live_nodes()
            fresh = [n for n in nodes if n.instance_id not in before and n.role == "compute" and n.queue == old.queue]
            if fresh and old.instance_id not in {n.instance_id for n in nodes}:
                return fresh[0]
            if time.monotonic() > deadline:
                raise LifecycleError(f"no new instance in queue {old.queue} within the {self.timeout_s:.0f}s budget "
                                     f"(old instance {'gone' if old.instance_id not in {n.instance_id for n in nodes} else 'still live'})")
            time.sleep(self.poll_s)
            # Local: what the group launched needs a host; on AWS this reports EC2 booting its instances.
            self.provider.boot(self.endpoint, lambda line: self.out(f"  {line}"))

    def _wait_reports(self) -> None:
        from fmcluster.manifest import digest
        from fmcluster.reports import failure_details, wait_for_reports

        bucket, s3 = self._bucket(), self.client("s3")
        wait = wait_for_reports(s3, bucket, self.live_nodes, str(self.manifest.get("ref", "")),
                                digest(self.manifest), self._left(), self.out, self.poll_s)
        if not wait.ok:
            details = failure_details(wait, s3, bucket, lambda node: self.provider.console_output(self.endpoint, node))
            raise LifecycleError(("timed out" if wait.timed_out else "a node failed") + ": "
                                 + "; ".join(s.line() for s in wait.failed[:4]) + "".join(f"\n{d}" for d in details))

    def _bucket(self) -> str:
        from fmcluster.stacks.outputs import read_stack_outputs

        return str(read_stack_outputs(self.tenant.org)["DataBucketName"])

    def _wait_slurm(self, controller: Node, old: Node, new: Node) -> None:
        deadline = self.deadline
        last = ""
        while True:
            shown = remote(self.provider, controller, SHOW_NODE)
            nodes = {n.name: n for n in slurm_text.parse_show_node(shown.stdout)} if shown.returncode == 0 else {}
            mine = nodes.get(new.name)
            line = (f"{new.name} {mine.display_state + ('' if mine.responding else '*') if mine else 'not listed'}, "
                    f"{old.name} {'still listed' if old.name in nodes else 'gone'}")
            if line != last:
                self.out(f"    slurm: {line}")
                last = line
            if mine is not None and mine.state == "IDLE" and not mine.drained and mine.responding \
                    and old.name not in nodes:
                return
            if time.monotonic() > deadline:
                raise LifecycleError(f"Slurm within the {self.timeout_s:.0f}s budget: {line}"
                                     + (f" (reason: {mine.reason})" if mine and mine.reason else ""))
            time.sleep(self.poll_s)

    def _health(self, new: Node) -> str:
        """The health program on the new node, by hand (context manual: it drains nothing, files no report)."""
        command = as_root(f"{HEALTH_PROGRAM} check --config {NODE_CONFIG} --node {shlex.quote(new.name)} "
                          "--context manual --no-drain --json")
        done = remote(self.provider, new, command, timeout=120)
        try:
            report = json.loads(done.stdout)
        except ValueError:
            raise LifecycleError(f"the health program on {new.name} gave no report ({done.returncode}): "
                                 f"{(done.stderr or done.stdout).strip()[-300:]}") from None
        results = report.get("results", [])
        ran = [r for r in results if r.get("status") in ("pass", "fail")]
        failed = [r for r in results if r.get("status") == "fail"]
        if done.returncode != 0 or failed or not report.get("healthy") or not ran:
            raise LifecycleError(f"{new.name} fails its health checks: "
                                 + ("; ".join(f"{r.get('check')}: {r.get('detail')}" for r in failed) or
                                    f"exit {done.returncode}, {len(ran)} check(s) ran"))
        skipped = [str(r.get("check")) for r in results if r.get("status") == "skip"]
        return (f"{len(ran)} checks pass on {new.name} ({', '.join(str(r.get('check')) for r in ran)})"
                + (f"; skipped by facts: {', '.join(skipped)}" if skipped else ""))

    def _job_across(self, controller: Node, nodes: Sequence[Node], new: Node) -> str:
        """A job across the new node and every other idle node of its queue (srun hostname; the collective
        acceptance gate stays `invoke acceptance`)."""
        from fmcluster.acceptance.gate import client_node

        partition = new.queue or ""
        view = read_view(self.provider, controller, self.tenant)
        live = {n.name for n in nodes}
        idle = sorted(name for name, n in view.slurm.items() if name in live and partition in n.partitions
                      and n.state == "IDLE" and not n.drained and n.responding)
        if new.name not in idle:
            raise LifecycleError(f"{new.name} is not idle in partition {partition} any more")
        command = (f"srun --partition={shlex.quote(partition)} --nodes={len(idle)} --ntasks-per-node=1 --time=2 "
                   f"--nodelist={shlex.quote(','.join(idle))} hostname")
        done = remote(self.provider, client_node(nodes), command, timeout=180)
        ran_on = sorted(set(done.stdout.split()))
        if done.returncode != 0 or ran_on != idle:
            raise LifecycleError(f"a job across {', '.join(idle)} failed ({done.returncode}): "
                                 f"{(done.stderr or done.stdout).strip()[-300:]}")
        return (f"srun hostname ran on all {len(idle)} idle node(s) of {partition}, the new one included: "
                f"{', '.join(ran_on)}")


def repair_state(provider: Provider, controller: Node) -> dict[str, Any]:
    """The controller's repair agent's ledger (breaker, quarantines, actions); {} where it never ran."""
    shown = remote(provider, controller, REPAIR_LEDGER)
    if shown.returncode != 0:
        raise LifecycleError(f"the repair agent's ledger on {controller.name}: "
                             f"{(shown.stderr or shown.stdout).strip()[-300:]}")
    try:
        doc = json.loads(shown.stdout or "{}")
    except ValueError:
        raise LifecycleError(f"unreadable repair ledger from {controller.name}: {shown.stdout[:200]!r}") from None
    return doc if isinstance(doc, dict) else {}


def repair_off(tenant: Tenant) -> str:
    """Why the controller's repair agent does not run for `tenant` (node_repair_enabled false); '' where it runs."""
    from fmcluster.health.inventory import repair_vars

    if repair_vars(tenant)["node_repair_enabled"]:
        return ""
    if not tenant.health.repair.enabled:
        return "health.repair.enabled: false"
    return f"{tenant.scheduler} repairs its own nodes"


def repair_agent(ledger: Mapping[str, Any], now: float, every_s: float) -> str:
    """Whether the agent runs, from its ledger (`repair --show`): paused by a person (why), or its last completed
    pass (each saves the ledger) within three passes of `every_s`; anything else is not claimed to run."""
    if "paused" in ledger:
        return f"paused ({ledger['paused']})"
    last = ledger.get("last_pass")
    if not isinstance(last, (int, float)) or isinstance(last, bool):
        return "no completed pass on record"
    ago = now - float(last)
    if ago > 3 * every_s + 60:
        return f"no pass for {ago / 60:.0f} min (one is due every {every_s:g} s)"
    return "running"


def repair_summary(ledger: Mapping[str, Any], now: float, every_s: float, window_s: float = 86400) -> str:
    """render_repair in one line (`invoke fleet`'s cell): the agent, its breaker, quarantined queues, and the
    actions it took within `window_s` (failed ones counted apart)."""
    breaker = str(ledger.get("breaker", ""))
    quarantined = sorted(str(q) for q in ledger.get("quarantined", {}))
    recent = [e for e in ledger.get("entries", []) if now - float(e.get("at", 0)) <= window_s]
    failed = sum(1 for e in recent if not e.get("ok"))
    return "; ".join([
        repair_agent(ledger, now, every_s),
        f"breaker {'OPEN: ' + breaker if breaker else 'closed'}",
        f"quarantined: {', '.join(quarantined) if quarantined else 'none'}",
        f"{len(recent)} action(s) in {window_s / 3600:g} h" + (f" ({failed} failed)" if failed else "")])


def render_repair(ledger: Mapping[str, Any], now: float, last: int = 5, every_s: float | None = None) -> str:
    """The repair agent's state for a person: breaker, quarantined queues, its last actions; with `every_s` (its
    pass interval) whether it runs (repair_agent)."""
    breaker = str(ledger.get("breaker", ""))
    lines = [f"repair agent: breaker {'OPEN: ' + breaker if breaker else 'closed'}"]
    if every_s is not None:
        lines.append(f"  agent: {repair_agent(ledger, now, every_s)}")
    lines += [f"  queue {queue} quarantined: {why}" for queue, why in sorted(ledger.get("quarantined", {}).items())]
    entries = sorted(ledger.get("entries", []), key=lambda e: float(e.get("at", 0)))[-last:]
    for e in entries:
        ago = now - float(e.get("at", now))
        lines.append(f"  {ago / 60:5.0f} min ago  {e.get('kind')} {e.get('node')} ({e.get('queue')}): "
                     f"{'done' if e.get('ok') else 'FAILED ' + str(e.get('detail', ''))} — {e.get('reason', '')}")
    if not entries:
        lines.append("  no action in its window")
    return "\n".join(lines) + "\n"


def line_dicts(lines: Sequence[NodeLine]) -> list[dict[str, Any]]:
    return [{**asdict(ln), "unhealthy": ln.unhealthy} for ln in lines]
