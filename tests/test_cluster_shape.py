"""The deploy's `shape` step (fmcluster.shape): every compute node the tenant declares serves in Slurm, or the
deploy fails naming each one that does not, with its state, reason and the triage's action (issue 38). The inputs
are Slurm 22.05's recorded `scontrol show node` (tests/slurm_outputs.py) and the real triage over it; the whole
step on a live cluster is in tests/test_cluster_e2e.py."""

from __future__ import annotations

import subprocess
from pathlib import Path, PurePosixPath

import pytest

from fmcluster import shape
from fmcluster.acceptance.slurm import Job
from fmcluster.health import data, slurm, triage
from fmcluster.model import load_tenant
from fmcluster.nodes import Node
from slurm_outputs import node_block, show_node

RULES = triage.Rules(data.checks_doc(), data.xid_doc())
DEMO = load_tenant("demo")  # queue cpu, 3 nodes
CONTROLLER = Node("ip-10-77-128-4", "10.77.128.4", "controller", None, "i-0c0000000000000aa", "m5.xlarge")


def cpu(n: int) -> Node:
    return Node(f"ip-10-77-128-{n}", f"10.77.128.{n}", "compute", "cpu", f"i-0c00000000000010{n}", "m5.xlarge")


def measured(blocks: list[str], nodes: list[Node]) -> shape.Shape:
    text = show_node(*blocks)
    return shape.measure(DEMO, [CONTROLLER, *nodes], {n.name: n for n in slurm.parse_show_node(text)},
                         triage.unhealthy_nodes(text, RULES, None))


def test_the_demo_declares_three_cpu_nodes() -> None:
    assert [(q.name, q.count) for q in DEMO.queues] == [("cpu", 3)]


def test_a_cluster_at_its_declared_shape_passes_with_the_counts() -> None:
    got = measured([node_block(cpu(n).name, state) for n, state in ((6, "IDLE"), (7, "ALLOCATED"), (8, "MIXED"))],
                   [cpu(6), cpu(7), cpu(8)])
    assert not got.degraded
    result = shape.outcome(got, allow_degraded=False, org="demo")
    assert (result.status, result.summary) == ("ok", "every declared compute node serves (cpu 3/3)")


def test_a_node_drained_by_its_health_check_fails_the_deploy_naming_it_and_why() -> None:
    reason = "fmcluster-health: slurmd: nothing answers on 10.77.128.7:6818 (connection refused)"
    got = measured([node_block(cpu(6).name), node_block(cpu(7).name, "IDLE+DRAIN+NOT_RESPONDING", reason),
                    node_block(cpu(8).name)], [cpu(6), cpu(7), cpu(8)])
    assert got.degraded and got.settling  # the health program resumes it once slurmd answers: worth a wait
    result = shape.outcome(got, allow_degraded=False, org="demo")
    assert result.status == "failed" and "cpu 2/3" in result.summary
    assert result.details[0].startswith(f"{cpu(7).name} (queue cpu): drained (not responding) — {reason}")
    assert "invoke replace --org=demo" in result.details[-1] and "--allow-degraded" in result.details[-1]


def test_a_node_acceptance_drained_does_not_settle_by_itself() -> None:
    reason = "fmcluster acceptance 20261205T1200Z: busbw 0.01 < 0.2 GB/s"
    got = measured([node_block(cpu(6).name), node_block(cpu(7).name, "IDLE+DRAIN", reason), node_block(cpu(8).name)],
                   [cpu(6), cpu(7), cpu(8)])
    assert got.degraded and not got.settling
    assert got.missing[0].action == "replace"


def test_a_person_s_drain_counts_as_degraded_too() -> None:
    got = measured([node_block(cpu(6).name), node_block(cpu(7).name, "IDLE+DRAIN", "bad fan, ticket 42"),
                    node_block(cpu(8).name)], [cpu(6), cpu(7), cpu(8)])
    assert got.degraded and not got.settling and "bad fan, ticket 42" in got.missing[0].line()


def test_an_instance_missing_from_its_group_and_one_slurm_does_not_list_are_named() -> None:
    got = measured([node_block(cpu(6).name)], [cpu(6), cpu(7)])
    lines = [m.line() for m in got.missing]
    assert lines == [f"{cpu(7).name} (queue cpu): not in Slurm — its instance runs but slurmctld does not list it "
                     "(still joining?)",
                     "1 instance(s) (queue cpu): absent — the queue declares 3; its group runs fewer"]
    assert not got.settling  # an absent instance does not appear by waiting here


def test_down_and_powered_down_nodes_do_not_serve() -> None:
    for state in ("DOWN+NOT_RESPONDING", "IDLE+POWERED_DOWN", "IDLE+NOT_RESPONDING", "FUTURE", "UNKNOWN"):
        got = measured([node_block(cpu(6).name, state), node_block(cpu(7).name), node_block(cpu(8).name)],
                       [cpu(6), cpu(7), cpu(8)])
        assert got.degraded and [m.node for m in got.missing] == [cpu(6).name], state


def test_allowed_degraded_is_said_not_hidden() -> None:
    got = measured([node_block(cpu(6).name), node_block(cpu(7).name, "IDLE+DRAIN", "bad fan"),
                    node_block(cpu(8).name)], [cpu(6), cpu(7), cpu(8)])
    result = shape.outcome(got, allow_degraded=True, org="demo")
    assert result.status == "ok" and result.summary.startswith("DEGRADED, allowed by --allow-degraded: cpu 2/3")
    assert result.details == [f"{cpu(7).name} (queue cpu): drained — bad fan"]


def test_settling_waits_for_a_node_that_comes_back_and_not_for_one_that_cannot() -> None:
    back = iter([measured([node_block(cpu(6).name, "DOWN+NOT_RESPONDING", "Not responding", by="slurm"),
                           node_block(cpu(7).name), node_block(cpu(8).name)], [cpu(6), cpu(7), cpu(8)])] * 2
                + [measured([node_block(cpu(n).name) for n in (6, 7, 8)], [cpu(6), cpu(7), cpu(8)])])
    said: list[str] = []
    assert not shape.settle(lambda: next(back), 60, said.append, poll_s=0).degraded
    assert said and "waiting up to" in said[0] and cpu(6).name in said[0]
    looks = 0

    def sticky() -> shape.Shape:
        nonlocal looks
        looks += 1
        return measured([node_block(cpu(6).name, "IDLE+DRAIN", "bad fan"), node_block(cpu(7).name),
                         node_block(cpu(8).name)], [cpu(6), cpu(7), cpu(8)])

    assert shape.settle(sticky, 60, said.append, poll_s=0).degraded and looks == 1


# --- acceptance that could not test a declared node is not a PASS ------------------------------------------------
class OneDrained:
    """What run_acceptance sends: `sinfo` lists one of the queue's nodes drained; the job logs are unreadable
    (this test judges the run's completeness, not a fabric: any verdict will do)."""

    def run(self, argv: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        assert argv[0] == "sinfo", argv
        return subprocess.CompletedProcess(argv, 0, f"{cpu(6).name} idle\n{cpu(7).name} drain\n{cpu(8).name} idle\n", "")

    def make_dir(self, path: PurePosixPath) -> None:
        pass

    def submit(self, script: PurePosixPath, *, nodes: list[str], output: PurePosixPath, **_: object) -> Job:
        return Job(1, tuple(nodes), output)

    def wait(self, jobs: list[Job], timeout: float, poll: float = 0.5) -> dict[int, str]:
        return {j.job_id: "COMPLETED" for j in jobs}

    def read_file(self, path: PurePosixPath) -> str | None:
        return None


@pytest.mark.parametrize("every_node", [True, False])
def test_acceptance_names_the_nodes_it_could_not_test_and_is_no_pass_of_the_cluster(
        every_node: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.acceptance import runner

    monkeypatch.setattr(runner.results, "new_run_dir", lambda org, now=None: tmp_path)
    monkeypatch.setattr(runner.results, "previous_result", lambda org, current: None)
    result = runner.run_acceptance(DEMO, OneDrained(), "/fsx", out=lambda line: None,  # type: ignore[arg-type]
                                   every_node=every_node)
    assert result.unavailable == [cpu(7).name] and not result.passed
    said = [n for n in result.notes if n.startswith("not a PASS of the cluster")]
    assert said == ([f"not a PASS of the cluster: 1 declared node(s) could not be tested (drained or down before "
                     f"this run): {cpu(7).name}"] if every_node else [])


def test_a_node_slurm_names_as_parallelcluster_does_is_found_by_its_address() -> None:
    blocks = [node_block(f"cpu-st-c5-{n}", state, reason, address=cpu(n + 5).address)
              for n, state, reason in ((1, "IDLE", ""), (2, "IDLE+DRAIN", "bad fan"), (3, "IDLE", ""))]
    got = measured(blocks, [cpu(6), cpu(7), cpu(8)])
    assert got.serving == {"cpu": [cpu(6).name, cpu(8).name]}
    assert [m.line() for m in got.missing] == [f"{cpu(7).name} (queue cpu): drained — bad fan"]


def test_a_deploy_over_an_allowed_degraded_cluster_does_not_say_done() -> None:
    from fmcluster.deploy import render_summary
    from fmcluster.steps import StepOutcome, StepReport

    got = measured([node_block(cpu(6).name), node_block(cpu(7).name, "IDLE+DRAIN", "bad fan"),
                    node_block(cpu(8).name)], [cpu(6), cpu(7), cpu(8)])
    reports = [StepReport("converge", StepOutcome("ok", "5/5 nodes converged"), 0.1),
               StepReport("shape", shape.outcome(got, allow_degraded=True, org="demo"), 0.5)]
    text = render_summary(DEMO, reports, total_steps=2)
    assert "DEGRADED (allowed by --allow-degraded, see shape) in 0.6s" in text and "done in" not in text
    assert f"{cpu(7).name} (queue cpu): drained — bad fan" in text


def test_a_node_the_repair_agent_replaces_is_worth_a_wait_but_a_quarantined_one_is_not() -> None:
    under_way = measured([node_block(cpu(6).name), node_block(cpu(7).name, "DOWN+DRAIN+NOT_RESPONDING",
                                                             "fmcluster-repair: replace: Not responding"),
                          node_block(cpu(8).name)], [cpu(6), cpu(7), cpu(8)])
    assert under_way.degraded and under_way.settling
    held = measured([node_block(cpu(6).name), node_block(cpu(7).name, "IDLE+DRAIN",
                                                         "fmcluster-repair: quarantined (queue cpu): Not responding"),
                     node_block(cpu(8).name)], [cpu(6), cpu(7), cpu(8)])
    assert held.degraded and not held.settling
    result = shape.outcome(held, allow_degraded=False, org="demo")
    assert "fmcluster-repair: quarantined (queue cpu)" in result.details[0]
