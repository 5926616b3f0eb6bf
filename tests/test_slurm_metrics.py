"""fmcluster's Slurm metrics: the textfile the controller writes from scontrol and squeue output, checked by
promtool, and the dashboards' Slurm panels and the Slurm alerts reading exactly those series."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from fmcluster import dashboards
from fmcluster.health import metrics, slurm
from health_helpers import Recorded
from monitoring_helpers import PROMTOOL, RULES_FILE
from slurm_outputs import RECORDED, node_block, show_node

CLUSTER = show_node(
    node_block("cpu-1", "ALLOCATED", cpus_alloc=2),
    node_block("cpu-2", "MIXED", cpus_alloc=1),
    node_block("cpu-3", "IDLE+DRAIN", "fmcluster-health: mounts: /fsx is not mounted"),
    node_block("gpu-1", "IDLE", partitions="gpu"),
    node_block("gpu-2", "DOWN+NOT_RESPONDING", "Not responding", by="slurm", partitions="gpu"),
)
SQUEUE = "41|cpu|RUNNING\n42|cpu|RUNNING\n43|cpu|PENDING\n44|cpu|PENDING\n45|gpu,cpu|PENDING\n46|cpu|COMPLETING\n"


def rendered() -> str:
    return metrics.render(slurm.parse_show_node(CLUSTER), slurm.parse_squeue(SQUEUE), now=1796272694.5)


def samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_node_states_per_partition_count_every_node_once_per_partition() -> None:
    got = samples(rendered())
    assert {k: v for k, v in got.items() if k.startswith("slurm_nodes{")} == {
        'slurm_nodes{partition="cpu",state="allocated"}': 1, 'slurm_nodes{partition="cpu",state="drained"}': 1,
        'slurm_nodes{partition="cpu",state="mixed"}': 1, 'slurm_nodes{partition="gpu",state="down"}': 1,
        'slurm_nodes{partition="gpu",state="idle"}': 1}


def test_drained_and_down_nodes_carry_their_reasons() -> None:
    got = samples(rendered())
    assert {k for k in got if k.startswith("slurm_node_unavailable_info")} == {
        'slurm_node_unavailable_info{slurm_node="cpu-3",state="drained",reason="fmcluster-health: mounts: /fsx is not mounted",set_by="root"}',
        'slurm_node_unavailable_info{slurm_node="gpu-2",state="down",reason="Not responding",set_by="slurm"}'}
    assert got['slurm_node_not_responding{slurm_node="gpu-2"}'] == 1


def test_jobs_per_partition_and_state_with_zero_rows_for_empty_partitions() -> None:
    got = samples(rendered())
    assert {k: v for k, v in got.items() if k.startswith("slurm_jobs")} == {
        'slurm_jobs{partition="cpu",state="completing"}': 1, 'slurm_jobs{partition="cpu",state="pending"}': 3,
        'slurm_jobs{partition="cpu",state="running"}': 2, 'slurm_jobs{partition="gpu",state="pending"}': 1,
        'slurm_jobs{partition="gpu",state="running"}': 0}


def test_the_textfile_passes_promtool_check_metrics(tmp_path: Path) -> None:
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=rendered(), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_hostile_reason_stays_one_label_value() -> None:
    reason = 'x"} 1\nslurm_up 0 # \\'
    text = metrics.render(slurm.parse_show_node(node_block("cpu-9", "IDLE+DRAIN", reason)), [], now=0.0)
    line, = [l for l in text.splitlines() if l.startswith("slurm_node_unavailable_info")]
    assert line.endswith(" 1") and '\\"} 1' in line
    assert subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True).returncode == 0


def test_when_slurmctld_does_not_answer_only_slurm_up_0_is_written(tmp_path: Path) -> None:
    probe = Recorded({("scontrol", "show", "node"): ("", 1, "slurm_load_node error: Unable to contact slurm controller\n")})
    why = metrics.write_once(str(tmp_path / "slurm.prom"), probe)
    assert "Unable to contact slurm controller" in why
    got = samples((tmp_path / "slurm.prom").read_text())
    assert got["slurm_up"] == 0 and not [k for k in got if k.startswith(("slurm_nodes", "slurm_jobs"))]


def test_write_once_asks_scontrol_and_squeue(tmp_path: Path) -> None:
    probe = Recorded({("scontrol", "show", "node"): (RECORDED, 0), ("squeue",): ("7|cpu|PENDING\n", 0)})
    assert metrics.write_once(str(tmp_path / "slurm.prom"), probe) == ""
    assert probe.calls[1] == ["squeue", "--noheader", "--all", "--array", "--format=%i|%P|%T"]
    assert samples((tmp_path / "slurm.prom").read_text())['slurm_jobs{partition="cpu",state="pending"}'] == 1


def _series_names(expr: str) -> set[str]:
    labels = {"slurm_node"}
    return {m for m in re.findall(r"\b(slurm_[a-z_]+|fmcluster_health_[a-z_]+)\b", expr)} - labels


def test_the_dashboards_slurm_panels_and_the_alerts_read_series_the_textfiles_have() -> None:
    from fmcluster.health import node as health_node
    from fmcluster.health.model import Report, Result

    exposed = {line.split("{")[0].split(" ")[0] for line in rendered().splitlines() if line and line[0] != "#"}
    report = Report("n", "interval", 0.0, 0.1, [Result("disk", "pass", "ok")])
    exposed |= {line.split("{")[0] for line in health_node.metrics(report).splitlines() if line and line[0] != "#"}
    used = {name for _, title, expr in dashboards.expressions() for name in _series_names(expr)}
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    used |= {name for g in groups for r in g["rules"] for name in _series_names(r["expr"])}
    assert used and used <= exposed, used - exposed


@pytest.mark.parametrize("title", ["Slurm nodes by state", "Slurm jobs"])
def test_the_two_slurm_panels_no_longer_need_an_exporter_we_do_not_deploy(title: str) -> None:
    panel = next(p for p in dashboards.CLUSTER.panels if p.title == title)
    assert "9341" not in panel.description and "slurm_nodes_alloc" not in str(panel.exprs)
