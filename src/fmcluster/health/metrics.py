"""Slurm's state as Prometheus metrics, written for node_exporter's textfile collector on the controller.

prometheus-slurm-exporter is not packaged in Debian 12, and a textfile needs no port, no extra scrape job and
no file_sd target: the controller's node_exporter serves it, with the labels every node target carries. The
series (all gauges):

    slurm_up                                   1 when scontrol and squeue answered this round, else 0 (and nothing else)
    slurm_nodes{partition,state}               nodes per partition and state (idle, allocated, mixed, drained, draining, down, ...)
    slurm_node_state{slurm_node,partition,state}   1 per node (slurm_node: the node_exporter target already has `node`)
    slurm_node_not_responding{slurm_node}      1 when slurmctld has the node NOT_RESPONDING
    slurm_node_unavailable_info{slurm_node,state,reason,set_by}   1 per drained, draining or down node, with its reason
    slurm_node_cpus{slurm_node,kind}           CPUs allocated / total per node
    slurm_jobs{partition,state}                jobs per partition and state (pending = queue depth, running, ...)
    slurm_metrics_last_update_timestamp_seconds

A node in several partitions counts in each.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Dict, List, Optional, Sequence, TextIO, Tuple

from fmcluster.health import slurm, textfile
from fmcluster.health.probe import Probe

#: Job states listed with a zero when a partition has none, so panels show 0 rather than no data.
JOB_STATES = ("pending", "running")
UNAVAILABLE = ("drained", "draining", "down", "fail", "failing")


def render(nodes: Sequence[slurm.Node], jobs: Sequence[slurm.Job], now: float, up: bool = True) -> str:
    out = textfile.Exposition()
    out.add("slurm_up", "1 when slurmctld answered this collection round, else 0 (then no other slurm_ series).",
            1 if up else 0)
    if up:
        _nodes(out, nodes)
        _jobs(out, nodes, jobs)
    out.add("slurm_metrics_last_update_timestamp_seconds", "When fmcluster's Slurm metrics were last collected.",
            round(now, 3))
    return out.render()


def _nodes(out: textfile.Exposition, nodes: Sequence[slurm.Node]) -> None:
    counts: Counter[Tuple[str, str]] = Counter()
    out.declare("slurm_nodes", "Nodes per partition and state.")
    out.declare("slurm_node_state", "1 for each node, labelled with its partition and one-word state.")
    for node in nodes:
        state = node.display_state
        for partition in node.partitions or ("",):
            counts[(partition, state)] += 1
            out.add("slurm_node_state", "", 1, {"slurm_node": node.name, "partition": partition, "state": state})
        out.add("slurm_node_not_responding", "1 when slurmctld marks the node NOT_RESPONDING.",
                0 if node.responding else 1, {"slurm_node": node.name})
        out.add("slurm_node_cpus", "CPUs of the node: allocated and total.", node.cpus_alloc,
                {"slurm_node": node.name, "kind": "allocated"})
        out.add("slurm_node_cpus", "", node.cpus_total, {"slurm_node": node.name, "kind": "total"})
        if state in UNAVAILABLE:
            out.add("slurm_node_unavailable_info", "1 per drained, draining or down node, with the reason Slurm holds.",
                    1, {"slurm_node": node.name, "state": state, "reason": node.reason or "none",
                        "set_by": node.reason_by or ""})
    for (partition, state), count in sorted(counts.items()):
        out.add("slurm_nodes", "", count, {"partition": partition, "state": state})


def _jobs(out: textfile.Exposition, nodes: Sequence[slurm.Node], jobs: Sequence[slurm.Job]) -> None:
    counts: Counter[Tuple[str, str]] = Counter()
    partitions = sorted({p for n in nodes for p in n.partitions} | {p for j in jobs for p in j.partition.split(",")})
    for partition in partitions:
        for state in JOB_STATES:
            counts[(partition, state)] += 0
    for job in jobs:
        for partition in job.partition.split(","):  # a pending job may list several candidate partitions
            counts[(partition, job.state)] += 1
    out.declare("slurm_jobs", "Jobs per partition and state (pending is the queue depth).")
    for (partition, state), count in sorted(counts.items()):
        out.add("slurm_jobs", "", count, {"partition": partition, "state": state})


def collect(probe: Probe, scontrol: Sequence[str], squeue: Sequence[str]) -> Tuple[bool, List[slurm.Node],
                                                                                     List[slurm.Job], str]:
    shown = probe.run([*scontrol, "show", "node"], timeout=30)
    if not shown.ok:
        return False, [], [], shown.why()
    queued = probe.run([*squeue, "--noheader", "--all", "--array", f"--format={slurm.SQUEUE_FORMAT}"], timeout=30)
    if not queued.ok:
        return False, [], [], queued.why()
    return True, slurm.parse_show_node(shown.stdout), slurm.parse_squeue(queued.stdout), ""


def write_once(textfile_path: str, probe: Probe, scontrol: Sequence[str] = ("scontrol",),
               squeue: Sequence[str] = ("squeue",)) -> str:
    """Collect and write the textfile; returns "" or why slurmctld could not be read (slurm_up 0 written)."""
    up, nodes, jobs, why = collect(probe, scontrol, squeue)
    textfile.write_atomic(textfile_path, render(nodes, jobs, time.time(), up))
    return why


def run_forever(textfile_path: str, every: float, slurm_conf: str = "", out: TextIO = sys.stdout,
                rounds: Optional[int] = None) -> int:
    probe = Probe({"SLURM_CONF": slurm_conf} if slurm_conf else None)
    out.write(f"fmcluster Slurm metrics every {every:g} s into {textfile_path}\n")
    out.flush()
    done = 0
    last_error: Dict[str, Optional[str]] = {"why": None}
    while rounds is None or done < rounds:
        started = time.monotonic()
        why = write_once(textfile_path, probe)
        if why != last_error["why"]:  # log changes only: one line per scrape would fill the log
            out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} " + (f"slurmctld not answering: {why}" if why else "collecting") + "\n")
            out.flush()
            last_error["why"] = why
        done += 1
        if rounds is None or done < rounds:
            time.sleep(max(every - (time.monotonic() - started), 1.0))
    return 0
