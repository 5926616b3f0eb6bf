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
from typing import Any

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


# --- the agent in `invoke fleet` (one cell per tenant) and `invoke nodes` -------------------------------------
def test_the_ledger_shown_says_when_a_pass_last_completed_and_why_the_agent_is_paused(
        controller: dict[str, object]) -> None:
    import io

    shown = io.StringIO()
    repair.show(str(controller["config"]), shown)
    assert json.loads(shown.getvalue()) == {}  # no pass yet: nothing claimed
    run_pass(controller, [node_block(cpu(1), "DOWN+NOT_RESPONDING", "Not responding", by="slurm"), *healthy(2, 3, 4)])
    config = json.loads(Path(str(controller["config"])).read_text())
    pause = Path(str(controller["dir"]), "repair.paused")
    config["pause_file"] = str(pause)
    Path(str(controller["config"])).write_text(json.dumps(config))
    pause.write_text("disk swap on the cpu queue, alice\n")
    shown = io.StringIO()
    repair.show(str(controller["config"]), shown)
    doc = json.loads(shown.getvalue())
    assert doc["last_pass"] == os.path.getmtime(Path(str(controller["dir"]), "ledger.json"))
    assert doc["paused"] == "disk swap on the cpu queue, alice" and [e["kind"] for e in doc["entries"]] == ["replace"]


def test_the_fleet_cell_sums_the_agent_up_from_the_recorded_ledger() -> None:
    from fmcluster.lifecycle import render_repair, repair_summary

    ledger = json.loads(Ledger([Entry(cpu(1), "cpu", "replace", T0 - 600, "Not responding"),
                                Entry(cpu(2), "cpu", "reboot", T0 - 60, "Kill task failed", ok=False, detail="exit 1"),
                                Entry(cpu(3), "cpu", "reboot", T0 - 90000, "Kill task failed")],
                               {"gpu": "3 replacements in 24h"},
                               "2 of 4 compute nodes need a reboot or a replacement at once").to_json())
    assert repair_summary({**ledger, "last_pass": T0 - 20}, T0, 30) == (
        "running; breaker OPEN: 2 of 4 compute nodes need a reboot or a replacement at once; quarantined: gpu; "
        "2 action(s) in 24 h (1 failed)")
    paused = {**ledger, "breaker": "", "quarantined": {}, "last_pass": T0 - 3600, "paused": "disk swap, alice"}
    assert repair_summary(paused, T0, 30) == (
        "paused (disk swap, alice); breaker closed; quarantined: none; 2 action(s) in 24 h (1 failed)")
    # Fail closed: an agent whose passes stopped, or that never completed one, is not called running.
    assert repair_summary({"last_pass": T0 - 600}, T0, 30) == (
        "no pass for 10 min (one is due every 30 s); breaker closed; quarantined: none; 0 action(s) in 24 h")
    assert repair_summary({}, T0, 30).startswith("no completed pass on record; breaker closed")
    assert render_repair({"paused": "disk swap, alice"}, T0, every_s=30).splitlines()[:2] == [
        "repair agent: breaker closed", "  agent: paused (disk swap, alice)"]


@pytest.fixture
def fleet_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_aws: None) -> dict[str, Any]:
    """Three tenants: demo deployed locally (its emulator 'runs'; its controller's remote shell a local sh where
    `sudo` runs this checkout's `fmcluster-health repair --show` on the controller fixture's config), hpdemo not
    deployed (HyperPod repairs its own nodes), stockmark on AWS without credentials."""
    import shutil
    import sys

    from conftest import ROOT
    from fmcluster import inventory
    from fmcluster.doctor.report import Diagnosis
    from fmcluster.nodes import Node
    from fmcluster.providers import registry
    from fmcluster.providers.local import emulator

    root = tmp_path / "root"
    for org in ("demo", "hpdemo", "stockmark"):
        shutil.copytree(ROOT / "inventories" / org / "group_vars", root / "inventories" / org / "group_vars")
    bin_dir = tmp_path / "remote-bin"
    bin_dir.mkdir()
    asked = tmp_path / "asked"
    program(bin_dir / "sudo", f'echo "$*" >> {asked}\n'
                              f'exec {sys.executable} -m fmcluster.health repair --config "$CONFIG" --show\n')
    shell: dict[str, list[str]] = {"argv": ["env", f"PATH={bin_dir}:/usr/bin:/bin",
                                            f"CONFIG={tmp_path / 'repair.json'}", "sh", "-c"]}

    class Shell:
        def client_argv(self, node: Node) -> list[str]:
            if shell["argv"][0] == "raise":
                from fmcluster.providers.local.hosts import SubstrateError

                raise SubstrateError(shell["argv"][1])
            return shell["argv"]

    monkeypatch.setattr(registry, "provider_for", lambda tenant: Shell())
    monkeypatch.setattr(emulator, "running_emulator", lambda org, root=None: object() if org == "demo" else None)
    monkeypatch.setattr(inventory, "read_nodes", lambda org, root=None: [
        Node("controller-1", "10.77.0.9", "controller", None, "i-0c00000000000002", "m5.xlarge")])

    def run(as_json: bool = False) -> tuple[int, str]:
        from fmcluster.commands.diagnose import fleet

        lines: list[str] = []
        code = fleet(out=lines.append, root=root, as_json=as_json, usage_of=lambda tenant: "-",
                     diagnose=lambda org: Diagnosis(org, [], checked=["sinfo"]))
        return code, "\n".join(lines)

    return {"run": run, "shell": shell, "asked": asked, "root": root}


def test_invoke_fleet_shows_each_tenant_s_repair_agent_from_its_controller_s_ledger(
        controller: dict[str, object], fleet_of: dict[str, Any]) -> None:
    import io

    down = node_block(cpu(1), "DOWN+NOT_RESPONDING", "Not responding", by="slurm", address="10.77.128.1")
    Path(str(controller["shown"])).write_text(show_node(down, *healthy(2, 3, 4)))
    repair.repair_pass(repair.load_config(str(controller["config"])), out=io.StringIO(), now=time.time())
    code, text = fleet_of["run"]()
    header = text.splitlines()[0].split("  ")
    assert code == 0 and "repair" in header
    # Each row's cells (two spaces apart); the repair cell precedes usage and state.
    rows = {line.split()[0]: [c.strip() for c in line.split("  ") if c.strip()] for line in text.splitlines()[2:5]}
    assert rows["demo"][-3:] == ["running; breaker closed; quarantined: none; 1 action(s) in 24 h", "-", "healthy"]
    assert Path(fleet_of["asked"]).read_text().splitlines() == [
        "-n /opt/fmcluster/health/bin/fmcluster-health repair --config /etc/fmcluster/health/repair.json --show"]
    assert rows["hpdemo"][-3:] == ["off (hyperpod repairs its own nodes)", "-", "not deployed"]
    assert rows["stockmark"][-3:] == ["unknown (no AWS credentials)", "-", "planned"]
    page = (Path(fleet_of["root"]) / "inventories" / "fleet.html").read_text()
    assert "<td>running; breaker closed; quarantined: none; 1 action(s) in 24 h</td>" in page
    code, text = fleet_of["run"](as_json=True)
    assert {r["org"]: r["repair"] for r in json.loads(text)}["stockmark"] == "unknown (no AWS credentials)"


def test_invoke_fleet_says_unknown_and_why_where_the_controller_does_not_answer(
        fleet_of: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster import inventory

    fleet_of["shell"]["argv"] = ["sh", "-c", "echo 'ssh: connect to host 10.77.0.9 port 22: Connection refused' >&2; "
                                             "exit 255"]
    code, text = fleet_of["run"]()
    demo = next(line for line in text.splitlines() if line.startswith("demo "))
    assert ("unknown (the repair agent's ledger on controller-1: ssh: connect to host 10.77.0.9 port 22: "
            "Connection refused)") in demo and "running" not in demo
    fleet_of["shell"]["argv"] = ["sh", "-c", "echo 'not json'"]
    assert "unknown (unreadable repair ledger from controller-1: 'not json\\n')" in fleet_of["run"]()[1]
    fleet_of["shell"]["argv"] = ["sh", "-c", "echo '{\"entries\": [1]}'"]
    assert "unknown (unreadable repair ledger: " in fleet_of["run"]()[1]
    fleet_of["shell"]["argv"] = ["raise", "no local host for instance 'i-0c00000000000002': nothing to open a session to"]
    assert ("unknown (the controller was not asked: no local host for instance 'i-0c00000000000002': nothing to open "
            "a session to)") in fleet_of["run"]()[1]
    monkeypatch.setattr(inventory, "read_nodes", lambda org, root=None: [])
    assert "unknown (the cluster has no controller node (nothing deployed?))" in fleet_of["run"]()[1]
