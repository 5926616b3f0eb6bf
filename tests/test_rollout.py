"""Updates that never kill running jobs (fmcluster.stacks.rollout): a stack update that would replace a group's
instances is refused unless approved, and with approval runs only after Slurm drained the group's nodes.

Real: the rendered cluster stacks, the change sets and templates of a moto server (the tenant's emulator), Ansible-
free Python parsing of Slurm's own `scontrol show node` text (recorded from Slurm 22.05, tests/fixtures/slurm) and of
`squeue --format='%i|%T|%N'` lines, the commands the gate sends. Stood in: slurmctld. `FakeSlurm` answers the two
commands with that text for the states a scenario gives (a job running on a GPU node, finishing after a few polls),
and applies `scontrol update ... state=drain|resume` to them; it is the function the gate is given in place of the
deploy's ssh to the controller.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from fmcluster.model import load_tenant
from fmcluster.providers.registry import provider_for
from fmcluster.stacks import aws
from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator
from fmcluster.stacks.render import RenderedStack, load_cfn_yaml
import scheduler_stacks
from scheduler_stacks import render_stacks
from fmcluster.stacks.result import ResourceChange
from fmcluster.stacks.rollout import (
    DRAIN_REASON, SQUEUE_JOBS, ReplaceGate, Roll, SlurmUnreadable, deployed_template, no_controller, parse_jobs,
    read_nodes, rolls,
)
from signalling import NodesSignal
from slurm_outputs import node_block, show_node


def quiet(_: str) -> None:
    """Progress lines are the display's business."""


# --- a stand-in slurmctld speaking Slurm's text ------------------------------------------------------------------

@dataclass
class FakeSlurm:
    """slurmctld's answers for `nodes` (name → base state) and `jobs` (id → nodes), as text."""

    nodes: dict[str, str]
    partition: str
    jobs: dict[str, list[str]] = field(default_factory=dict)
    finish_after: int | None = None  # squeue answers after which every job has ended (None: never)
    drained: set[str] = field(default_factory=set)
    commands: list[str] = field(default_factory=list)
    polls: int = 0

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        self.commands.append(command)
        if command == "scontrol show node":
            blocks = []
            for name, state in self.nodes.items():
                busy = any(name in nodes for nodes in self.jobs.values())
                base = "ALLOCATED" if busy else state
                blocks.append(node_block(name, state=base + ("+DRAIN" if name in self.drained else ""),
                                         reason=DRAIN_REASON if name in self.drained else "",
                                         partitions=self.partition))
            return subprocess.CompletedProcess(command, 0, show_node(*blocks), "")
        if command == SQUEUE_JOBS:
            self.polls += 1
            if self.finish_after is not None and self.polls > self.finish_after:
                self.jobs.clear()
            lines = [f"{job}|RUNNING|{','.join(nodes)}" for job, nodes in self.jobs.items()]
            return subprocess.CompletedProcess(command, 0, "".join(line + "\n" for line in lines), "")
        argv = shlex.split(command)
        if argv[:2] == ["sudo", "-n"]:  # the operator logs in as the image's default user: drains go through sudo
            argv = argv[2:]
        if argv[:2] == ["scontrol", "update"]:
            names = set(argv[2].removeprefix("nodename=").split(","))
            if argv[3] == "state=drain":
                assert argv[4] == f"reason={DRAIN_REASON}"
                self.drained |= names
            else:
                assert argv[3] == "state=resume"
                self.drained -= names
            return subprocess.CompletedProcess(command, 0, "", "")
        return subprocess.CompletedProcess(command, 1, "", f"unexpected command: {command}")


def gpu_cluster() -> RenderedStack:
    return next(s for s in render_stacks(load_tenant("stockmark", ROOT)) if s.key == "cluster")


def gpu_group(stack: RenderedStack) -> tuple[str, str, dict[str, Any]]:
    """(group logical id, its launch template's logical id, the group) of the GPU queue."""
    template = load_cfn_yaml(stack.body)
    lid, group = next((lid, r) for lid, r in template["Resources"].items()
                      if r["Type"] == "AWS::AutoScaling::AutoScalingGroup"
                      and any(t.get("Key") == "fmcluster:role" and t.get("Value") == "compute"
                              for t in r["Properties"]["Tags"]))
    return lid, group["Properties"]["LaunchTemplate"]["LaunchTemplateId"]["Ref"], group


# --- what replaces instances ---------------------------------------------------------------------------------------

def test_a_launch_template_change_rolls_the_gpu_group_and_says_how() -> None:
    stack = gpu_cluster()
    group, template, _ = gpu_group(stack)
    (roll,) = rolls(stack, [ResourceChange("Modify", template, "AWS::EC2::LaunchTemplate", "False")])
    assert (roll.group, roll.role, roll.queue, roll.nodes, roll.batch) == (group, "compute", "gpu", 16, 4)
    assert roll.describe() == f"{group} (queue gpu): 16 instance(s) replaced, 4 at a time, because its launch " \
                              f"template {template} changes"


def test_a_size_change_alone_replaces_nothing_a_subnet_change_does() -> None:
    stack = gpu_cluster()
    group, _, _ = gpu_group(stack)
    deployed = load_cfn_yaml(stack.body)
    deployed["Resources"][group]["Properties"]["DesiredCapacity"] = 8
    modify = [ResourceChange("Modify", group, "AWS::AutoScaling::AutoScalingGroup", "False")]
    assert rolls(stack, modify, deployed) == []
    deployed["Resources"][group]["Properties"]["VPCZoneIdentifier"] = ["subnet-elsewhere"]
    assert [r.why for r in rolls(stack, modify, deployed)] == ["its VPCZoneIdentifier changes"]


def test_a_removed_or_replaced_group_is_named_too() -> None:
    stack = gpu_cluster()
    group, _, _ = gpu_group(stack)
    found = rolls(stack, [ResourceChange("Modify", group, "AWS::AutoScaling::AutoScalingGroup", "True"),
                          ResourceChange("Remove", "QueueOldGroup", "AWS::AutoScaling::AutoScalingGroup")])
    assert [(r.group, r.why) for r in found] == [(group, "the group itself is replaced"),
                                                 ("QueueOldGroup", "the group is removed (its instances are terminated)")]


# --- Slurm's text ----------------------------------------------------------------------------------------------------

def test_squeue_lines_give_each_running_job_its_expanded_nodes() -> None:
    jobs = parse_jobs("1042|RUNNING|ip-10-1-0-[12-13,15]\n1043|COMPLETING|ip-10-1-0-20\n\n")
    assert [(j.job_id, j.state, j.nodes) for j in jobs] == [
        ("1042", "running", ("ip-10-1-0-12", "ip-10-1-0-13", "ip-10-1-0-15")), ("1043", "completing", ("ip-10-1-0-20",))]


def test_a_node_reading_tells_drained_from_draining_and_names_the_jobs() -> None:
    slurm = FakeSlurm({"gpu-1": "IDLE", "gpu-2": "IDLE", "gpu-3": "DOWN"}, "gpu", jobs={"77": ["gpu-1"]})
    slurm.drained = {"gpu-1", "gpu-2"}
    reading = read_nodes(slurm.run, ["gpu-1", "gpu-2", "gpu-3", "gpu-9"])
    assert reading.states == {"gpu-1": "draining", "gpu-2": "drained", "gpu-3": "down"}
    assert reading.jobs == {"gpu-1": ["77"]} and reading.unknown == ["gpu-9"]
    assert reading.busy() == ["gpu-1"]


def test_an_unanswered_slurm_is_no_evidence() -> None:
    def broken(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 255, "", "ssh: connect to host 10.1.0.5 port 22: timed out")
    with pytest.raises(SlurmUnreadable, match="timed out"):
        read_nodes(broken, ["gpu-1"])


# --- the gate ----------------------------------------------------------------------------------------------------------

GPU_NODES = [f"ip-10-1-0-{n}" for n in range(12, 16)]


def gate_for(slurm: FakeSlurm, approve: bool, lines: list[str], timeout_s: float = 3600.0) -> ReplaceGate:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    return ReplaceGate(approve, lambda roll: GPU_NODES if roll.queue == "gpu" else [], lambda: slurm.run,
                       lines.append, poll_s=30.0, timeout_s=timeout_s, clock=lambda: now[0], sleep=sleep)


def launch_template_change(stack: RenderedStack) -> list[ResourceChange]:
    _, template, _ = gpu_group(stack)
    return [ResourceChange("Modify", template, "AWS::EC2::LaunchTemplate", "False")]


def test_without_approval_the_update_is_refused_naming_the_group_and_the_running_job() -> None:
    stack = gpu_cluster()
    slurm = FakeSlurm(dict.fromkeys(GPU_NODES, "IDLE"), "gpu", jobs={"1042": GPU_NODES[:2]})
    failure = gate_for(slurm, False, [])(stack, launch_template_change(stack))
    assert failure is not None and failure.status == "REFUSED"
    assert "QueueGpuGroup (queue gpu): 16 instance(s) replaced, 4 at a time" in failure.reason
    assert "ip-10-1-0-12: allocated, jobs 1042" in failure.reason and "--approve-replace" in failure.reason
    assert not any(c.startswith("sudo -n scontrol update") for c in slurm.commands), "nothing drained without approval"


def test_with_approval_the_gpu_nodes_are_drained_and_the_update_waits_for_the_job() -> None:
    stack = gpu_cluster()
    slurm = FakeSlurm(dict.fromkeys(GPU_NODES, "IDLE"), "gpu", jobs={"1042": GPU_NODES[:2]}, finish_after=3)
    lines: list[str] = []
    gate = gate_for(slurm, True, lines)
    assert gate(stack, launch_template_change(stack)) is None
    drains = [c for c in slurm.commands if c.startswith("sudo -n scontrol update")]
    assert drains == [f"sudo -n scontrol update nodename={','.join(GPU_NODES)} state=drain 'reason={DRAIN_REASON}'"]
    assert slurm.jobs == {} and slurm.polls > 3, "asked until Slurm showed no job on the nodes"
    assert any("waiting for ip-10-1-0-12, ip-10-1-0-13 to drain" in line for line in lines)
    assert gate.drained == GPU_NODES and gate.notes and gate.notes[0].startswith("drained ip-10-1-0-12")


def test_a_job_that_outlasts_the_wait_leaves_the_group_unreplaced_and_the_nodes_resumed() -> None:
    stack = gpu_cluster()
    slurm = FakeSlurm(dict.fromkeys(GPU_NODES, "IDLE"), "gpu", jobs={"1042": GPU_NODES[:1]})
    failure = gate_for(slurm, True, [], timeout_s=90.0)(stack, launch_template_change(stack))
    assert failure is not None and "jobs still run on ip-10-1-0-12 after 90s" in failure.reason
    assert slurm.drained == set(), "the nodes it drained serve again"


def test_approval_without_a_reachable_controller_is_refused() -> None:
    stack = gpu_cluster()
    gate = ReplaceGate(True, lambda roll: GPU_NODES, no_controller, quiet)
    failure = gate(stack, launch_template_change(stack))
    assert failure is not None and "cannot drain" in failure.reason


# --- against the emulator (a real moto server process) --------------------------------------------------------------

@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    shutil.copytree(ROOT / "inventories", tmp_path / "inventories", ignore=shutil.ignore_patterns("generated", "hosts.yml"))
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    yield tmp_path
    stop_emulator(ORG, tmp_path)


ORG = "stockmark"  # 16 × p5.48xlarge in one GPU queue, rehearsed on the emulator as tests/test_stacks.py does


def set_in_spec(root: Path, old: str, new: str) -> None:
    spec = root / "inventories" / ORG / "group_vars" / "all" / "tenant.yml"
    text = spec.read_text(encoding="utf-8")
    assert old in text
    spec.write_text(text.replace(old, new, 1), encoding="utf-8")


@pytest.mark.slow
def test_the_emulator_does_not_roll_the_gpu_group_while_a_job_runs_on_it_and_rolls_it_once_drained(root: Path) -> None:
    set_in_spec(root, "provider: aws", "provider: local")
    endpoint = ensure_emulator(ORG, root).endpoint
    tenant = load_tenant(ORG)
    image = provider_for(tenant).image_parameter
    assert scheduler_stacks.deploy_stacks(tenant, endpoint, image_parameter=image, out=quiet,
                             while_waiting=NodesSignal(tenant.region, endpoint)).ok  # no node boots: they signal
    ec2 = aws.client("ec2", tenant.region, endpoint)
    cf = aws.client("cloudformation", tenant.region, endpoint)
    stack_name = f"fmc-{ORG}-cluster"

    def versions() -> tuple[int, str]:
        lt_id = cf.describe_stack_resource(StackName=stack_name, LogicalResourceId="QueueGpuLaunchTemplate")[
            "StackResourceDetail"]["PhysicalResourceId"]
        (lt,) = ec2.describe_launch_templates(LaunchTemplateIds=[lt_id])["LaunchTemplates"]
        return int(lt["LatestVersionNumber"]), cf.describe_stacks(StackName=stack_name)["Stacks"][0]["StackStatus"]

    from fmcluster.nodes import discover

    nodes = discover({"kind": "ec2", "tag": "fmcluster:org"}, lambda s: aws.client(s, tenant.region, endpoint), ORG)
    gpu = sorted(n.name for n in nodes if n.queue == "gpu")
    assert len(gpu) == 16
    before = versions()

    set_in_spec(root, "instance_type: p5.48xlarge", "instance_type: p5en.48xlarge")  # a new launch template version
    changed = load_tenant(ORG)
    slurm = FakeSlurm(dict.fromkeys(gpu, "IDLE"), "gpu", jobs={"4242": gpu[:2]})

    def members(roll: Roll) -> list[str]:
        return [n.name for n in nodes if n.role == roll.role and (n.queue or "") == roll.queue]

    refused = scheduler_stacks.deploy_stacks(changed, endpoint, image_parameter=image, out=quiet, before_execute=ReplaceGate(
        False, members, lambda: slurm.run, quiet, deployed=deployed_template(cf)))
    failure = refused.stacks[2].failure
    assert not refused.ok and failure is not None and failure.status == "REFUSED"
    assert "QueueGpuGroup (queue gpu): 16 instance(s) replaced, 4 at a time, because its launch template " \
           "QueueGpuLaunchTemplate changes" in failure.reason
    assert f"{gpu[0]}: allocated, jobs 4242" in failure.reason
    assert versions() == before, "the change set was not executed: no new launch template version, stack untouched"
    pending = [c for c in cf.list_change_sets(StackName=stack_name)["Summaries"]
               if c.get("StackName") == stack_name and c.get("ExecutionStatus") == "AVAILABLE"]
    assert pending == [], "the refused change set is deleted, not left to be executed by hand"

    slurm.finish_after = 2
    gate = ReplaceGate(True, members, lambda: slurm.run, quiet, poll_s=0.0, deployed=deployed_template(cf))
    done = scheduler_stacks.deploy_stacks(changed, endpoint, image_parameter=image, out=quiet, before_execute=gate)
    assert done.ok and done.changed == [stack_name], done.failure
    assert slurm.drained == set(gpu) and slurm.jobs == {}, "rolled only after every GPU node was drained and idle"
    assert versions() == (before[0] + 1, "UPDATE_COMPLETE")
