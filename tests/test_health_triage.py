"""Triage: unhealthy nodes with their reasons, and what each needs, decided by the data files."""

from __future__ import annotations

from pathlib import Path

from fmcluster.health import data, engine, triage
from fmcluster.health.xid import XidTable
from health_helpers import Recorded, healthy_answers, p5_config
from slurm_outputs import FIXTURES, node_block, show_node

RULES = triage.Rules(data.checks_doc(), data.xid_doc())


def test_xid_79_fell_off_the_bus_means_drain_and_replace_xid_13_means_nothing() -> None:
    table = XidTable(data.xid_doc())
    assert triage.decide_xids([79], table) == "replace"
    assert triage.decide_xids([13], table) == "none"
    assert triage.decide_xids([13, 43, 45], table) == "none"
    assert triage.decide_xids([13, 79], table) == "replace"
    assert triage.decide_xids([9999], table) == "drain"  # not in the table: fail closed


def test_unhealthy_nodes_come_with_reason_and_action() -> None:
    text = show_node(
        node_block("gpu-1", "IDLE+DRAIN", "fmcluster-health: xid: XID 79 on GPU 0000:75:00 (GPU has fallen off the bus): replace"),
        node_block("gpu-2", "IDLE+DRAIN", "fmcluster-health: row-remap: row remapping pending on GPU 00000000:86:00.0"),
        node_block("gpu-3", "MIXED+DRAIN", "fmcluster acceptance 2026-12-03T04:10Z: below_floor 180 < 250 GB/s at 1 GiB",
                   cpus_alloc=96),
        node_block("gpu-4", "DOWN+NOT_RESPONDING", "Not responding", by="slurm"),
        node_block("gpu-5", "IDLE+DRAIN", "waiting for the vendor", by="ops"),
        node_block("gpu-6"),
    )
    found = {f.node: (f.state, f.origin, f.check, f.action) for f in triage.unhealthy_nodes(text, RULES)}
    assert found == {
        "gpu-1": ("drained", "fmcluster-health", "xid", "replace"),
        "gpu-2": ("drained", "fmcluster-health", "row-remap", "reboot"),
        "gpu-3": ("draining", "acceptance", "", "replace"),
        "gpu-4": ("down*", "slurm", "", "replace"),
        "gpu-5": ("drained", "person", "", "none"),
    }
    findings = triage.unhealthy_nodes(text, RULES)
    assert [f.node for f in findings][:3] == ["gpu-1", "gpu-3", "gpu-4"]  # the costliest first
    assert triage.replacements(findings) == ["gpu-1", "gpu-3", "gpu-4"]
    assert next(f for f in findings if f.node == "gpu-1").xids == [79]


def test_the_nodes_report_decides_when_it_agrees_with_the_reason(tmp_path: Path) -> None:
    report = engine.run_checks(p5_config(tmp_path, kmsg="kmsg-xid79.txt", efa_count=2), "interval", "gpu-1",
                               Recorded(healthy_answers())).as_dict()
    text = show_node(node_block("gpu-1", "IDLE+DRAIN", report["reason"]))
    finding, = triage.unhealthy_nodes(text, RULES, {"gpu-1": report})
    assert (finding.action, finding.xids, finding.why) == ("replace", [79], "the node's health report asks for replace")


def test_a_node_that_could_not_drain_itself_is_listed_from_its_report(tmp_path: Path) -> None:
    reason = "fmcluster-health: munge: slurmctld rejects this node's credentials: the munge key here differs"
    text = show_node(node_block("cpu-2", "IDLE+NOT_RESPONDING"))
    finding, = triage.unhealthy_nodes(text, RULES, {"cpu-2": {"healthy": False, "reason": reason, "results": []}})
    assert (finding.origin, finding.check, finding.action, finding.state) == ("report", "munge", "drain", "idle*")


def test_an_xid_13_report_is_not_an_unhealthy_node(tmp_path: Path) -> None:
    report = engine.run_checks(p5_config(tmp_path, kmsg="kmsg-xid13.txt", efa_count=2), "interval", "gpu-1",
                               Recorded(healthy_answers())).as_dict()
    assert triage.unhealthy_nodes(show_node(node_block("gpu-1")), RULES, {"gpu-1": report}) == []


def test_sinfo_reasons_fill_in_nodes_scontrol_output_lacks() -> None:
    finding, = triage.unhealthy_nodes("", RULES, sinfo_reasons=(FIXTURES / "sinfo-R-long.txt").read_text())
    assert (finding.node, finding.check, finding.action) == ("cpu-1", "test", "drain")


def test_the_table_is_readable() -> None:
    text = show_node(node_block("gpu-1", "IDLE+DRAIN", "fmcluster-health: gpu-count: 7 of 8 GPUs visible"))
    assert triage.table(triage.unhealthy_nodes(text, RULES)).splitlines() == [
        "NODE   STATE    ACTION   CHECK      REASON",
        "gpu-1  drained  replace  gpu-count  fmcluster-health: gpu-count: 7 of 8 GPUs visible"]
    assert triage.table([]) == "no unhealthy node\n"
