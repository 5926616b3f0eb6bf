"""Updates that never kill running jobs: before a change set that would replace a group's instances is executed,
the deploy names what it would replace and either refuses (the default) or, with the operator's approval
(`invoke deploy --approve-replace`), drains the group's Slurm nodes and waits until no job runs on them.

Which changes replace instances (CloudFormation's rules for AWS::AutoScaling::AutoScalingGroup): a group with an
`AutoScalingRollingUpdate` policy replaces its instances, a batch at a time, when its launch template changes
(a new version: the change set lists the launch template as modified), when the group's own launch template,
subnets or placement group change, or when the group itself is replaced or removed. A change of its size alone
does not. The change set lists the resources; the deployed template (GetTemplate) tells which properties changed,
since a change set's per-property details are not always there (the emulator gives none).

How Slurm is asked: through the same path the deploy uses for every command on the controller (an operator's ssh,
fmcluster.lifecycle.remote), passed in as a function, so the gate is tested with real Slurm text and no cluster:
`scontrol show node` (fmcluster.health.slurm.parse_show_node) for each node's state and `squeue` for the jobs on
the nodes. Fail closed: the gate lets the change set run only on positive evidence (every node of every group to
be replaced drained, with no job on it, in Slurm's own answers).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fmcluster.health import slurm as slurm_text
from fmcluster.nodes import as_root
from fmcluster.stacks.render import RenderedStack, load_cfn_yaml
from fmcluster.stacks.result import Failure, ResourceChange

Out = Callable[[str], object]
RunOnController = Callable[[str], "subprocess.CompletedProcess[str]"]

#: Properties of an Auto Scaling group whose change makes an AutoScalingRollingUpdate replace its instances
#: (AWS CloudFormation User Guide, "UpdatePolicy attribute": LaunchConfigurationName, LaunchTemplate,
#: MixedInstancesPolicy, PlacementGroup, VPCZoneIdentifier).
ROLLING_PROPERTIES = ("LaunchConfigurationName", "LaunchTemplate", "MixedInstancesPolicy", "PlacementGroup",
                      "VPCZoneIdentifier")
DRAIN_REASON = "fmcluster: instances replaced by a stack update"
SQUEUE_JOBS = "squeue --noheader --all --states=RUNNING,COMPLETING,CONFIGURING,SUSPENDED --format='%i|%T|%N'"
APPROVAL = "--approve-replace"


@dataclass(frozen=True)
class Roll:
    """A group whose instances the change set would replace."""

    group: str  # logical id of the Auto Scaling group
    role: str  # controller | login | compute (its fmcluster:role tag), "" when unknown (a removed group)
    queue: str  # its fmcluster:queue tag ("" off queues)
    nodes: int | None  # how many instances it holds (DesiredCapacity), None when unknown
    batch: int | None  # MaxBatchSize of its rolling update
    why: str

    def describe(self) -> str:
        what = f"{self.group}" + (f" (queue {self.queue})" if self.queue else f" ({self.role})" if self.role else "")
        size = f"{self.nodes} instance(s)" if self.nodes is not None else "its instances"
        pace = f", {self.batch} at a time" if self.batch else ""
        return f"{what}: {size} replaced{pace}, because {self.why}"


def _groups(template: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {lid: res for lid, res in (template.get("Resources") or {}).items()
            if res.get("Type") == "AWS::AutoScaling::AutoScalingGroup"}


def _ref(value: Any) -> str | None:
    """The logical id a Ref or GetAtt points at."""
    if isinstance(value, Mapping):
        if "Ref" in value:
            return str(value["Ref"])
        if "Fn::GetAtt" in value:
            target = value["Fn::GetAtt"]
            return str(target[0] if isinstance(target, list) else str(target).split(".")[0])
    return None


def _tag(res: Mapping[str, Any], key: str) -> str:
    for tag in res.get("Properties", {}).get("Tags") or []:
        if isinstance(tag, Mapping) and tag.get("Key") == key and isinstance(tag.get("Value"), str):
            return str(tag["Value"])
    return ""


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def rolls(stack: RenderedStack, changes: Sequence[ResourceChange],
          deployed: Mapping[str, Any] | None = None) -> list[Roll]:
    """The groups whose instances executing this change set would replace. `deployed`: the stack's current
    template (None: judged from the change set alone)."""
    new = load_cfn_yaml(stack.body)
    by_id = {c.logical_id: c for c in changes}
    old_groups = _groups(deployed or {})
    found = []
    for lid, res in _groups(new).items():
        props = res.get("Properties", {})
        policy = res.get("UpdatePolicy", {}).get("AutoScalingRollingUpdate")
        change = by_id.get(lid)
        why = ""
        if change is not None and change.replacement == "True":
            why = "the group itself is replaced"
        elif policy is not None:
            template = _ref((props.get("LaunchTemplate") or {}).get("LaunchTemplateId"))
            template_change = by_id.get(template or "")
            if template_change is not None and template_change.action in ("Modify", "Remove"):
                why = f"its launch template {template} changes"
            elif change is not None and change.action == "Modify" and lid in old_groups:
                before = old_groups[lid].get("Properties", {})
                moved = [p for p in ROLLING_PROPERTIES if before.get(p) != props.get(p)]
                if moved:
                    why = f"its {', '.join(moved)} change{'s' if len(moved) == 1 else ''}"
        if why:
            found.append(Roll(lid, _tag(res, "fmcluster:role"), _tag(res, "fmcluster:queue"),
                              _int(props.get("DesiredCapacity")), _int((policy or {}).get("MaxBatchSize")), why))
    for change in changes:
        if change.action == "Remove" and change.resource_type == "AWS::AutoScaling::AutoScalingGroup":
            before = old_groups.get(change.logical_id, {})
            found.append(Roll(change.logical_id, _tag(before, "fmcluster:role"), _tag(before, "fmcluster:queue"),
                              _int(before.get("Properties", {}).get("DesiredCapacity")), None,
                              "the group is removed (its instances are terminated)"))
    return found


# --- Slurm's answers --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunningJob:
    job_id: str
    state: str
    nodes: tuple[str, ...]


def parse_jobs(text: str) -> list[RunningJob]:
    """`squeue --noheader --format='%i|%T|%N'` lines: job id, state, the job's nodes as a Slurm host list."""
    jobs = []
    for raw in text.splitlines():
        parts = raw.strip().split("|")
        if len(parts) >= 3 and parts[0]:
            jobs.append(RunningJob(parts[0], parts[1].lower(), tuple(slurm_text.expand_hostlist(parts[2]))))
    return jobs


@dataclass
class NodeReading:
    """What Slurm says about the nodes of the groups to be replaced, at one moment."""

    states: dict[str, str]  # node → sinfo-style state (drained, draining, allocated, idle ...)
    jobs: dict[str, list[str]]  # node → ids of the jobs on it
    unknown: list[str] = field(default_factory=list)  # nodes slurmctld does not list

    def busy(self) -> list[str]:
        """Nodes that may still run a job: not drained, or a job on them."""
        return sorted(n for n, state in self.states.items() if state not in ("drained", "down") or self.jobs.get(n))

    def render(self) -> list[str]:
        lines = [f"{node}: {state}" + (f", jobs {', '.join(self.jobs[node])}" if self.jobs.get(node) else "")
                 for node, state in sorted(self.states.items())]
        return lines + [f"{node}: not a Slurm node (slurmctld does not list it; no job on it)" for node in self.unknown]


class SlurmUnreadable(RuntimeError):
    """Slurm could not be asked (no controller, ssh failed, a command failed): no evidence either way."""


def read_nodes(run: RunOnController, nodes: Sequence[str]) -> NodeReading:
    shown = run("scontrol show node")
    if shown.returncode != 0:
        raise SlurmUnreadable(f"`scontrol show node` failed: {(shown.stderr or shown.stdout).strip()[-300:]}")
    queued = run(SQUEUE_JOBS)
    if queued.returncode != 0:
        raise SlurmUnreadable(f"`squeue` failed: {(queued.stderr or queued.stdout).strip()[-300:]}")
    known = {n.name: n for n in slurm_text.parse_show_node(shown.stdout)}
    jobs: dict[str, list[str]] = {}
    for job in parse_jobs(queued.stdout):
        for node in job.nodes:
            jobs.setdefault(node, []).append(job.job_id)
    wanted = set(nodes)
    reading = NodeReading({n: known[n].display_state for n in sorted(wanted & set(known))},
                          {n: ids for n, ids in jobs.items() if n in wanted})
    # A node slurmctld does not know runs no Slurm job (squeue, which answered, lists none on it): nothing to drain.
    reading.unknown = sorted(n for n in wanted - set(known) if not jobs.get(n))
    reading.states.update({n: "unknown (jobs listed on it)" for n in wanted - set(known) if jobs.get(n)})
    return reading


def drain_command(nodes: Sequence[str]) -> str:
    return as_root(shlex.join(["scontrol", "update", f"nodename={','.join(nodes)}", "state=drain",
                               f"reason={DRAIN_REASON}"]))


def resume_command(nodes: Sequence[str]) -> str:
    return as_root(shlex.join(["scontrol", "update", f"nodename={','.join(nodes)}", "state=resume"]))


def deployed_template(cf: Any) -> Callable[[RenderedStack], Mapping[str, Any] | None]:
    """The stack's current template, from CloudFormation (None when there is none to compare)."""
    def read(stack: RenderedStack) -> Mapping[str, Any] | None:
        try:
            body = cf.get_template(StackName=stack.name)["TemplateBody"]
        except Exception:  # no deployed template (or no answer): judged from the change set alone
            return None
        return dict(body) if isinstance(body, Mapping) else load_cfn_yaml(str(body))
    return read


def no_controller() -> RunOnController:
    raise SlurmUnreadable("this command does not reach the cluster's nodes")


# --- the gate ---------------------------------------------------------------------------------------------------

@dataclass
class ReplaceGate:
    """Called by apply_stack with a stack's change set before it is executed; a Failure stops it unexecuted.

    `members(roll)`: the Slurm node names of a group's instances; `controller()`: how to run a command on the
    controller (raises SlurmUnreadable when there is none to reach). Both are only called when a group would be
    replaced."""

    approve: bool
    members: Callable[[Roll], list[str]]
    controller: Callable[[], RunOnController]
    out: Out = print
    poll_s: float = 30.0
    timeout_s: float = 6 * 3600.0
    deployed: Callable[[RenderedStack], Mapping[str, Any] | None] = lambda stack: None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    drained: list[str] = field(default_factory=list)  # the nodes this gate drained (resumed if the update fails)
    notes: list[str] = field(default_factory=list)

    def __call__(self, stack: RenderedStack, changes: Sequence[ResourceChange]) -> Failure | None:
        found = rolls(stack, changes, self.deployed(stack))
        if not found:
            return None
        plan = [roll.describe() for roll in found]
        for line in plan:
            self.out(f"  would replace {line}")
        nodes = sorted({node for roll in found if roll.role in ("compute", "") for node in self.members(roll)})
        try:
            reading: NodeReading | None = read_nodes(self.controller(), nodes) if nodes else None
        except SlurmUnreadable as err:
            reading, unreadable = None, str(err)
        else:
            unreadable = ""
        seen = reading.render() if reading else ([f"Slurm not asked: {unreadable}"] if unreadable else [])
        if not self.approve:
            return self._refuse(stack, "would replace instances: " + "; ".join(plan) + ". Nothing was changed. "
                                + (f"Slurm now: {'; '.join(seen)}. " if seen else "")
                                + f"Re-run `invoke deploy` with {APPROVAL} to drain their Slurm nodes first and "
                                  "replace them once no job runs on them")
        if not nodes:
            self.notes.append("replacing " + "; ".join(plan) + " (no Slurm compute node among them)")
            return None
        if reading is None:
            return self._refuse(stack, f"cannot drain the nodes before replacing them ({unreadable}); nothing was "
                                       "changed")
        return self._drain_and_wait(stack, nodes, plan, reading)

    def _refuse(self, stack: RenderedStack, reason: str) -> Failure:
        return Failure(stack.name, "fmcluster::ReplaceGate", "REFUSED", reason)

    def _drain_and_wait(self, stack: RenderedStack, nodes: list[str], plan: list[str],
                        first: NodeReading) -> Failure | None:
        run = self.controller()
        known = [n for n in nodes if n not in first.unknown]
        if known:
            done = run(drain_command(known))
            if done.returncode != 0:
                return self._refuse(stack, f"draining {', '.join(known)} failed: "
                                           f"{(done.stderr or done.stdout).strip()[-300:]}; nothing was changed")
            self.drained = known
            self.out(f"  drained {', '.join(known)}; waiting until no job runs on them")
        deadline = self.clock() + self.timeout_s
        while True:
            try:
                reading = read_nodes(run, nodes)
            except SlurmUnreadable as err:
                busy, detail = nodes, [str(err)]
            else:
                busy, detail = reading.busy(), reading.render()
            if not busy:
                self.notes.append(f"drained {', '.join(known) or 'no Slurm node'} before replacing "
                                  + "; ".join(plan))
                return None
            if self.clock() >= deadline:
                self.resume()
                return self._refuse(stack, f"jobs still run on {', '.join(busy)} after {self.timeout_s:.0f}s "
                                           f"({'; '.join(detail)}); the nodes were resumed and nothing was replaced")
            self.out(f"  waiting for {', '.join(busy)} to drain")
            self.sleep(self.poll_s)

    def resume(self) -> None:
        """Give back the nodes this gate drained (the update did not happen, or failed and rolled back)."""
        if self.drained:
            done = self.controller()(resume_command(self.drained))
            self.out(f"  resumed {', '.join(self.drained)}" if done.returncode == 0 else
                     f"  resuming {', '.join(self.drained)} failed: {(done.stderr or done.stdout).strip()[-200:]}")
            self.drained = []
