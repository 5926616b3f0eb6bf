"""The controller's repair agent (fmcluster.health.repair, issue 38): from the triage of Slurm 22.05's recorded
`scontrol show node` (tests/slurm_outputs.py) and the real rules (health_checks.yml, xid.yml) to reboots and
replacements, within budgets that prevent loops, and a breaker that acts on nothing when many nodes fail at once.
The passes run the installed program's code against stand-in `scontrol` and replace programs (shell scripts that
print the recorded output and log their arguments); the agent on a live cluster is in tests/test_cluster_e2e.py."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from fmcluster.capabilities import SCHEDULERS
from fmcluster.health import data, repair, slurm, triage
from fmcluster.health.repair import Entry, Ledger, Policy
from fmcluster.health.inventory import repair_vars
from fmcluster.model import load_tenant
from slurm_outputs import node_block, show_node

RULES = triage.Rules(data.checks_doc(), data.xid_doc())
WHEN = "2026-12-03T04:16:13"  # node_block's reason time
T0 = time.mktime(time.strptime(WHEN, "%Y-%m-%dT%H:%M:%S"))
POLICY = Policy(restart_grace_s=120, reboots_per_node=1, replacements_per_queue=2, window_s=86400, backoff_s=60,
                breaker_share=0.5, settle_s=300)
DEAD = "fmcluster-health: slurmd: nothing answers on 10.79.60.9:6818 (connection refused)"


def cpu(n: int) -> str:
    return f"ip-10-77-128-{n}"


def decide(blocks: list[str], ledger: Ledger | None = None, now: float = T0 + 10, policy: Policy = POLICY) -> repair.Plan:
    text = show_node(*blocks)
    return repair.plan(slurm.parse_show_node(text), triage.unhealthy_nodes(text, RULES), ledger or Ledger(), policy,
                       now)


def healthy(*numbers: int) -> list[str]:
    return [node_block(cpu(n)) for n in numbers]


def kinds(plan: repair.Plan) -> dict[str, str]:
    return {s.node: s.kind for s in plan.steps}


def test_a_healthy_cluster_needs_nothing() -> None:
    assert decide(healthy(1, 2, 3, 4)).steps == []


def test_a_node_whose_job_could_not_be_killed_is_rebooted_once_then_replaced() -> None:
    stuck = node_block(cpu(1), "IDLE+DRAIN", "Kill task failed")
    first = decide([stuck, *healthy(2, 3, 4)])
    assert kinds(first) == {cpu(1): "reboot"}
    rebooted = Ledger([Entry(cpu(1), "cpu", "reboot", T0 - 600, "Kill task failed")])
    again = decide([stuck, *healthy(2, 3, 4)], rebooted)
    assert kinds(again) == {cpu(1): "replace"}
    assert "rebooted 1 time(s)" in again.steps[0].why


def test_a_reboot_needs_slurmd_so_a_node_not_responding_is_replaced_instead() -> None:
    plan = decide([node_block(cpu(1), "IDLE+DRAIN+NOT_RESPONDING", "Kill task failed"), *healthy(2, 3, 4)])
    assert kinds(plan) == {cpu(1): "replace"} and "does not answer" in plan.steps[0].why


def test_a_dead_slurmd_gets_systemd_s_restart_first_and_is_replaced_after_the_grace() -> None:
    dead = node_block(cpu(1), "IDLE+DRAIN+NOT_RESPONDING", DEAD)
    waiting = decide([dead, *healthy(2, 3, 4)], now=T0 + 60)
    assert kinds(waiting) == {cpu(1): "wait"} and "systemd restarts it" in waiting.steps[0].why
    gone = decide([dead, *healthy(2, 3, 4)], now=T0 + 121)
    assert kinds(gone) == {cpu(1): "replace"} and gone.actions[0].address == "10.79.60.9"


def test_nodes_a_person_or_the_agent_drained_are_left_alone() -> None:
    plan = decide([node_block(cpu(1), "IDLE+DRAIN", "disk swap by hand"),
                   node_block(cpu(2), "IDLE+DRAIN", "fmcluster-repair: replace: Kill task failed"),
                   node_block(cpu(3), "IDLE+DRAIN+REBOOT_REQUESTED", "Kill task failed"), *healthy(4)])
    assert plan.steps == []


def test_half_the_nodes_failing_at_once_opens_the_breaker_and_nothing_is_done() -> None:
    down = [node_block(cpu(n), "DOWN+NOT_RESPONDING", "Not responding", by="slurm") for n in (1, 2)]
    plan = decide([*down, *healthy(3, 4)])
    assert plan.actions == [] and set(kinds(plan).values()) == {"wait"}
    assert plan.breaker.startswith("2 of 4 compute nodes need a reboot or a replacement at once")
    assert "ip-10-77-128-1 (Not responding)" in plan.breaker
    one = decide([down[0], *healthy(2, 3, 4)])
    assert kinds(one) == {cpu(1): "replace"} and not one.breaker


def test_replacements_back_off_and_a_queue_over_its_budget_is_quarantined() -> None:
    down = node_block(cpu(1), "DOWN+NOT_RESPONDING", "Not responding", by="slurm")
    once = Ledger([Entry(cpu(9), "cpu", "replace", T0 - 30, "Not responding")])
    assert kinds(decide([down, *healthy(2, 3, 4)], once)) == {cpu(1): "wait"}  # 60 s backoff
    assert kinds(decide([down, *healthy(2, 3, 4)], once, now=T0 + 40)) == {cpu(1): "replace"}
    twice = Ledger([Entry(cpu(8), "cpu", "replace", T0 - 200, "x"), Entry(cpu(9), "cpu", "replace", T0 - 100, "x")])
    plan = decide([down, *healthy(2, 3, 4)], twice)
    assert kinds(plan) == {cpu(1): "quarantine"}
    assert "had 2 replacement(s) in the last 24h (budget 2)" in plan.steps[0].why
    expired = Ledger([Entry(cpu(8), "cpu", "replace", T0 - 90000, "x")])
    assert kinds(decide([down, *healthy(2, 3, 4)], expired)) == {cpu(1): "replace"}


def test_at_most_a_quarter_of_the_nodes_are_in_repair_at_once() -> None:
    down = [node_block(cpu(n), "DOWN+NOT_RESPONDING", "Not responding", by="slurm") for n in (1, 2, 3)]
    plan = decide([*down, *healthy(*range(4, 13))], policy=Policy(replacements_per_queue=10, backoff_s=0))
    assert sorted(kinds(plan).values()) == ["replace", "replace", "replace"]  # 12 nodes: three at once
    busy = Ledger([Entry(cpu(12), "cpu", "replace", T0 - 5, "x")])
    plan = decide([*down, *healthy(*range(4, 13))], busy, policy=Policy(replacements_per_queue=10, backoff_s=0))
    assert sorted(kinds(plan).values()) == ["replace", "replace", "wait"]


# --- the pass, with stand-in programs -----------------------------------------------------------------------
def program(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def controller(tmp_path: Path) -> dict[str, object]:
    calls = tmp_path / "calls.log"
    shown = tmp_path / "show-node.txt"
    scontrol = program(tmp_path / "scontrol",
                       f'if [ "$1 $2" = "show node" ]; then cat {shown}; else echo "scontrol $*" >> {calls}; fi\n')
    replace = program(tmp_path / "replace", f'echo "replace $*" >> {calls}\n')
    cluster = {"commands": {"scontrol": [scontrol]}, "checks": data.checks_doc()["checks"],
               "external_reasons": data.checks_doc()["external_reasons"], "xids": data.xid_doc()}
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    own = {"cluster_config": str(tmp_path / "cluster.json"), "ledger": str(tmp_path / "ledger.json"),
           "textfile": str(tmp_path / "fmcluster_repair.prom"), "policy": {"backoff_s": 0, "breaker_share": 0.5},
           "mechanism": {"reboot": ["scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason={reason}", "{node}"],
                         "replace": [replace, "--address={address}"]}}
    (tmp_path / "repair.json").write_text(json.dumps(own))
    return {"config": str(tmp_path / "repair.json"), "shown": shown, "calls": calls, "dir": tmp_path}


def run_pass(controller: dict[str, object], blocks: list[str]) -> tuple[repair.Plan, list[str]]:
    Path(str(controller["shown"])).write_text(show_node(*blocks))
    calls = Path(str(controller["calls"]))
    before = calls.read_text().splitlines() if calls.exists() else []
    import io

    plan = repair.repair_pass(repair.load_config(str(controller["config"])), out=io.StringIO(), now=T0 + 10)
    after = calls.read_text().splitlines() if calls.exists() else []
    return plan, after[len(before):]


def test_a_pass_asks_the_scheduler_then_drains_with_its_reason_and_counts_it(controller: dict[str, object]) -> None:
    down = node_block(cpu(1), "DOWN+NOT_RESPONDING", "Not responding", by="slurm", address="10.77.128.1")
    plan, calls = run_pass(controller, [down, *healthy(2, 3, 4)])
    assert [s.kind for s in plan.actions] == ["replace"]
    assert calls == ["replace --address=10.77.128.1",
                     f"scontrol update nodename={cpu(1)} state=drain reason=fmcluster-repair: replace: Not responding"]
    ledger = json.loads(Path(str(controller["dir"]), "ledger.json").read_text())
    assert ledger["totals"] == {"replace/cpu": 1} and ledger["entries"][0]["ok"] is True
    prom = Path(str(controller["dir"]), "fmcluster_repair.prom").read_text()
    assert 'fmcluster_repair_actions_total{kind="replace",queue="cpu"} 1' in prom
    assert "fmcluster_repair_breaker_open 0" in prom
    # The next pass sees the agent's own reason and leaves the node to the replacement under way.
    drained = node_block(cpu(1), "DOWN+DRAIN+NOT_RESPONDING", "fmcluster-repair: replace: Not responding")
    plan, calls = run_pass(controller, [drained, *healthy(2, 3, 4)])
    assert plan.steps == [] and calls == []


def test_a_pass_reboots_through_slurm_with_the_trigger_as_the_reason(controller: dict[str, object]) -> None:
    plan, calls = run_pass(controller, [node_block(cpu(2), "IDLE+DRAIN", "Kill task failed"), *healthy(1, 3, 4)])
    assert calls == [f"scontrol reboot ASAP nextstate=RESUME reason=fmcluster-repair: reboot: Kill task failed {cpu(2)}"]


def test_an_open_breaker_is_a_metric_the_alert_fires_on(controller: dict[str, object]) -> None:
    down = [node_block(cpu(n), "DOWN+NOT_RESPONDING", "Not responding", by="slurm") for n in (1, 2)]
    plan, calls = run_pass(controller, [*down, *healthy(3, 4)])
    assert plan.breaker and calls == []
    prom = Path(str(controller["dir"]), "fmcluster_repair.prom").read_text()
    assert "fmcluster_repair_breaker_open 1" in prom
    assert json.loads(Path(str(controller["dir"]), "ledger.json").read_text())["breaker"] == plan.breaker
    # RepairBreakerOpen fires on it: tests/promtool/fmcluster-alerts.test.yml.


def test_a_failed_request_is_not_retried_every_pass(controller: dict[str, object]) -> None:
    config = json.loads(Path(str(controller["config"])).read_text())
    config["mechanism"]["replace"] = ["/bin/false"]
    Path(str(controller["config"])).write_text(json.dumps(config))
    down = node_block(cpu(1), "DOWN+NOT_RESPONDING", "Not responding", by="slurm")
    plan, calls = run_pass(controller, [down, *healthy(2, 3, 4)])
    entries = json.loads(Path(str(controller["dir"]), "ledger.json").read_text())["entries"]
    assert [e["ok"] for e in entries] == [False] and calls == []  # not drained for a request never made
    plan, calls = run_pass(controller, [down, *healthy(2, 3, 4)])
    assert plan.steps == []  # settles first (settle_s), then tries again


# --- what the inventory gives the role ------------------------------------------------------------------------
def test_the_agent_runs_where_fmcluster_repairs_and_not_where_the_scheduler_does() -> None:
    demo = repair_vars(load_tenant("demo"))
    assert demo["node_repair_enabled"] is True
    assert demo["node_repair_mechanism"] == {k: SCHEDULERS["slurm-ec2"].repair[k] for k in ("reboot", "replace")}  # type: ignore[index]
    assert demo["node_repair_policy"]["restart_grace_s"] == 2 * 30 + 60  # the local provider's 30 s interval
    assert repair_vars(load_tenant("hpdemo"))["node_repair_enabled"] is False  # HyperPod repairs its own
    assert repair_vars(load_tenant("pcdemo"))["node_repair_enabled"] is False  # clustermgtd does


def test_the_policy_reads_the_role_s_config_and_ignores_what_it_does_not_know() -> None:
    policy = Policy.from_config({"reboots_per_node": "2", "breaker_share": 0.25, "unknown": 1})
    assert (policy.reboots_per_node, policy.breaker_share) == (2, 0.25)
    assert os.path.basename(repair.__file__) == "repair.py"


def test_invoke_nodes_shows_the_agent_s_breaker_quarantines_and_last_actions() -> None:
    from fmcluster.lifecycle import render_repair

    ledger = Ledger([Entry(cpu(1), "cpu", "replace", T0 - 600, "Not responding"),
                     Entry(cpu(2), "cpu", "reboot", T0 - 60, "Kill task failed", ok=False, detail="exit 1")],
                    {"gpu": "3 replacements in 24h"}, "2 of 4 compute nodes need a reboot or a replacement at once")
    text = render_repair(json.loads(ledger.to_json()), T0)
    assert text.splitlines() == [
        "repair agent: breaker OPEN: 2 of 4 compute nodes need a reboot or a replacement at once",
        "  queue gpu quarantined: 3 replacements in 24h",
        f"     10 min ago  replace {cpu(1)} (cpu): done — Not responding",
        f"      1 min ago  reboot {cpu(2)} (cpu): FAILED exit 1 — Kill task failed"]
    assert render_repair({}, T0).splitlines() == ["repair agent: breaker closed", "  no action in its window"]


def test_a_paused_agent_repairs_nothing_and_says_so(controller: dict[str, object]) -> None:
    config = json.loads(Path(str(controller["config"])).read_text())
    pause = Path(str(controller["dir"]), "repair.paused")
    config["pause_file"] = str(pause)
    Path(str(controller["config"])).write_text(json.dumps(config))
    pause.write_text("disk swap on the cpu queue, alice\n")
    down = node_block(cpu(1), "DOWN+NOT_RESPONDING", "Not responding", by="slurm")
    plan, calls = run_pass(controller, [down, *healthy(2, 3, 4)])
    assert plan.steps == [] and calls == []
    assert "fmcluster_repair_paused 1" in Path(str(controller["dir"]), "fmcluster_repair.prom").read_text()
    pause.unlink()
    plan, calls = run_pass(controller, [down, *healthy(2, 3, 4)])
    assert [s.kind for s in plan.actions] == ["replace"] and len(calls) == 2
