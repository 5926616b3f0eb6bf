"""Slurm's view as the health program reads it (recorded Slurm 22.05 outputs), and the controller's pass: which
nodes it drains for what, and which it leaves alone."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from fmcluster.health import cluster, slurm
from slurm_outputs import FIXTURES, RECORDED, node_block, show_node


def test_scontrol_show_node_is_parsed_with_full_reasons_and_flags() -> None:
    cpu1, cpu2 = slurm.parse_show_node(RECORDED)
    assert (cpu1.name, cpu1.state, cpu1.flags, cpu1.address) == ("cpu-1", "IDLE", ("DRAIN", "NOT_RESPONDING"), "10.79.60.3")
    assert (cpu1.reason, cpu1.reason_by, cpu1.reason_time) == ("fmcluster-health: test: prolog says bad", "root",
                                                               "2026-12-03T04:16:13")
    assert cpu1.drained and cpu1.ours and not cpu1.responding and cpu1.display_state == "drained"
    assert cpu1.fields["OS"] == "Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0"
    assert (cpu2.flags, cpu2.reason, cpu2.partitions, cpu2.cpus_total) == (("NOT_RESPONDING",), "", ("cpu",), 2)


def test_the_one_line_form_gives_the_same_nodes() -> None:
    lines = slurm.parse_show_node((FIXTURES / "scontrol-show-node-oneline.txt").read_text())
    assert [(n.name, n.state, n.flags, n.reason, n.fields["OS"], n.fields["RealMemory"]) for n in lines] == [
        ("cpu-1", "IDLE", ("DRAIN",), "fmcluster-health: test: prolog says bad",
         "Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0", "21694"),
        ("cpu-2", "IDLE", ("NOT_RESPONDING",), "", "Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0", "21694")]


def test_a_reason_with_equals_signs_and_colons_survives_parsing() -> None:
    reason = "fmcluster-health: efa: EFA link not up: rdmap32s27/1 state=1: DOWN"
    node, = slurm.parse_show_node(node_block("gpu-3", "MIXED+DRAIN", reason, cpus_alloc=96))
    assert node.reason == reason and node.display_state == "draining" and slurm.reason_check(reason) == (
        "efa", "EFA link not up: rdmap32s27/1 state=1: DOWN")


def test_sinfo_reasons_default_and_long_formats() -> None:
    short, = slurm.parse_sinfo_reasons((FIXTURES / "sinfo-R.txt").read_text())
    full, = slurm.parse_sinfo_reasons((FIXTURES / "sinfo-R-long.txt").read_text())
    assert (short.reason, short.user, short.nodes) == ("fmcluster-health: te", "root", ("cpu-1",))
    assert (full.reason, full.user, full.time, full.nodes) == ("fmcluster-health: test: prolog says bad", "root",
                                                               "2026-12-03T04:16:13", ("cpu-1",))


@pytest.mark.parametrize("expr, names", [
    ("cpu-[1-3,5]", ["cpu-1", "cpu-2", "cpu-3", "cpu-5"]),
    ("gpu-[01-02],cpu-1", ["gpu-01", "gpu-02", "cpu-1"]),
    ("controller-1", ["controller-1"]),
])
def test_hostlists_expand(expr: str, names: list[str]) -> None:
    assert slurm.expand_hostlist(expr) == names


def test_squeue_lines_become_jobs() -> None:
    assert slurm.parse_squeue("12|cpu|PENDING\n13|gpu,cpu|RUNNING\n\n") == [
        slurm.Job("12", "cpu", "pending"), slurm.Job("13", "gpu,cpu", "running")]


def test_a_drain_reason_is_one_argument_never_a_shell_line() -> None:
    hostile = 'x"; scontrol delete nodename=cpu-1; echo "$(reboot)'
    argv = slurm.drain_argv(["scontrol"], "cpu-1", f"fmcluster-health: disk: {hostile}")
    assert argv == ["scontrol", "update", "nodename=cpu-1", "state=drain", f"reason=fmcluster-health: disk: {hostile}"]


# --- the controller's pass -------------------------------------------------------------------------------------

def reachable(answers: dict[str, str | None]):  # type: ignore[no-untyped-def]
    return lambda address, port, tries, delay, timeout: answers.get(address)


def report(tmp: Path, node: str, healthy: bool, reason: str = "", age: float = 0) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / f"{node}.json").write_text(json.dumps({"node": node, "started": time.time() - age, "healthy": healthy,
                                                  "reason": reason}))


def config(tmp: Path) -> dict:
    return {"slurmd_port": 6818, "report_dir": str(tmp), "reports_shared": True, "stale_after": 180,
            "probe": {"tries": 1}}


def decide(tmp: Path, text: str, answers: dict[str, str | None]) -> list[tuple[str, str]]:
    decisions = cluster.decide(slurm.parse_show_node(text), config(tmp), time.time(), reachable(answers))
    return [(d.node, d.reason) for d in decisions]


def test_a_node_whose_slurmd_refuses_connections_is_drained_for_slurmd(tmp_path: Path) -> None:
    report(tmp_path, "cpu-1", True)
    text = show_node(node_block("cpu-1", address="10.79.61.3"))
    assert decide(tmp_path, text, {"10.79.61.3": "connection refused"}) == [
        ("cpu-1", "fmcluster-health: slurmd: nothing answers on 10.79.61.3:6818 (connection refused)")]


def test_a_failing_report_the_node_could_not_act_on_is_acted_on(tmp_path: Path) -> None:
    reason = "fmcluster-health: munge: slurmctld rejects this node's credentials (...)"
    report(tmp_path, "cpu-2", False, reason)
    text = show_node(node_block("cpu-2", "IDLE+NOT_RESPONDING", address="10.79.61.4"))
    assert decide(tmp_path, text, {}) == [("cpu-2", reason)]


def test_not_responding_with_slurmd_listening_and_no_report_names_munge_as_the_suspect(tmp_path: Path) -> None:
    text = show_node(node_block("cpu-2", "IDLE+NOT_RESPONDING", address="10.79.61.4"))
    (node, reason), = decide(tmp_path / "none", text, {})
    assert reason == ("fmcluster-health: slurmd: 10.79.61.4:6818 accepts connections but does not answer slurmctld "
                      "(munge key or Slurm version different from the controller's?)")


def test_a_guess_the_pass_drained_with_gives_way_to_the_node_s_own_report(tmp_path: Path) -> None:
    guess = ("fmcluster-health: slurmd: 10.79.61.4:6818 accepts connections but does not answer slurmctld "
             "(munge key or Slurm version different from the controller's?)")
    text = show_node(node_block("cpu-2", "IDLE+DRAIN+NOT_RESPONDING", guess, address="10.79.61.4"))
    assert decide(tmp_path / "none", text, {}) == []  # no report yet: the guess stands, not re-drained
    reason = "fmcluster-health: munge: slurmctld rejects this node's credentials: the munge key here differs"
    report(tmp_path, "cpu-2", False, reason)
    assert decide(tmp_path, text, {}) == [("cpu-2", reason)]


def test_a_node_whose_reports_stopped_is_drained_fail_closed(tmp_path: Path) -> None:
    report(tmp_path, "cpu-3", True, age=3600)
    long_ago = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 7200))
    text = show_node(node_block("cpu-3", slurmd_start=long_ago), node_block("cpu-4", slurmd_start=long_ago))
    got = dict(decide(tmp_path, text, {}))
    assert got["cpu-3"].startswith("fmcluster-health: health-report: none from cpu-3 since ")
    assert got["cpu-4"] == "fmcluster-health: health-report: none from cpu-4 since never (is HealthCheckProgram running?)"


def test_nodes_the_pass_leaves_alone(tmp_path: Path) -> None:
    for name in ("cpu-1", "cpu-2", "cpu-3", "cpu-4", "cpu-5"):
        report(tmp_path, name, True)
    report(tmp_path, "cpu-6", False, "fmcluster-health: disk: / has 10 MiB free")
    just_started = time.strftime("%Y-%m-%dT%H:%M:%S")
    text = show_node(
        node_block("cpu-1"),                                                        # healthy
        node_block("cpu-2", "DOWN+NOT_RESPONDING", "Not responding", by="slurm"),   # slurmctld took it out already
        node_block("cpu-3", "IDLE+DRAIN", "replacing the DIMM", by="ops"),          # a person's drain
        node_block("cpu-4", "UNKNOWN+NOT_RESPONDING"),                              # never registered yet
        node_block("cpu-5", slurmd_start=just_started),                             # fresh slurmd, report fine
        node_block("cpu-6", "IDLE+DRAIN", "fmcluster-health: disk: / has 10 MiB free"),  # drained by itself
    )
    assert decide(tmp_path, text, {"10.79.60.9": None}) == []


def test_tcp_answers_tells_a_listening_port_from_a_closed_one() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert cluster.tcp_answers("127.0.0.1", port, tries=1, delay=0, timeout=1) is None
    assert cluster.tcp_answers("127.0.0.1", port, tries=2, delay=0, timeout=1) == "connection refused"


def test_a_precise_reason_is_not_replaced_by_a_weaker_one_when_the_report_goes_stale(tmp_path: Path) -> None:
    reason = "fmcluster-health: munge: slurmctld rejects this node's credentials (...)"
    report(tmp_path, "cpu-2", False, reason, age=3600)  # the node cannot report again: its RPCs are refused
    long_ago = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 7200))
    text = show_node(node_block("cpu-2", "IDLE+DRAIN+NOT_RESPONDING", reason, slurmd_start=long_ago))
    assert decide(tmp_path, text, {}) == []
    # ... but a dead slurmd is news even on a drained node
    assert decide(tmp_path, text, {"10.79.60.9": "connection refused"}) == [
        ("cpu-2", "fmcluster-health: slurmd: nothing answers on 10.79.60.9:6818 (connection refused)")]
