"""The controller's pass: drain the nodes that cannot drain themselves.

A node's own health run drains it through `scontrol update`. Two failures take that away: its slurmd is dead
(slurmd is what runs the health program), or slurmctld rejects its credentials (its munge key differs, so its
`scontrol update` is refused like every other RPC). This pass runs on the controller every HealthCheckInterval
and, for each node slurmctld has not already taken out itself (DOWN, UNKNOWN, FUTURE, powered down):

  slurmd         no TCP connection to NodeAddr:SlurmdPort on any of `tries` attempts → drain; a node that
                 accepts connections but is NOT_RESPONDING to slurmctld, with no report saying why → drain
  health-report  the node's latest report (shared report directory) fails and the node is not drained with its
                 reason → drain with that reason (the node could not); no fresh report from a responding node
                 whose slurmd has run longer than `stale_after` → drain (its health program is not running)

A node already drained by a health run keeps its (more precise) reason; only a dead slurmd is reported over it.
The one guess this pass drains with (slurmd listens but does not answer) gives way to the node's own failing
report when that arrives: after a munge key changes, the two race, and the report names the check.
It never resumes a node: the node's own next healthy run does, for reasons this program wrote, and only those.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, TextIO

from fmcluster.health import REASON_PREFIX, slurm
from fmcluster.health.probe import Probe

SKIP_STATES = ("DOWN", "UNKNOWN", "FUTURE")
#: The one drain reason this pass writes on a guess (slurmd listens but does not answer): the node's own report,
#: when it arrives, names the check that failed and replaces it (the two race after a munge key changes).
GUESS = "accepts connections but does not answer slurmctld"
SKIP_FLAGS = ("POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED")


@dataclass
class Decision:
    node: str
    check: str
    reason: str
    done: bool = False
    detail: str = ""


def tcp_answers(address: str, port: int, tries: int, delay: float, timeout: float) -> Optional[str]:
    """None when a TCP connection succeeds on one of `tries`; else the last error ("connection refused")."""
    error = "no attempt"
    for attempt in range(max(tries, 1)):
        if attempt:
            time.sleep(delay)
        try:
            with socket.create_connection((address, port), timeout=timeout):
                return None
        except OSError as err:
            error = (err.strerror or str(err)).lower()
    return error


def load_report(report_dir: str, node: str) -> Optional[Dict[str, Any]]:
    try:
        with open(os.path.join(report_dir, f"{node}.json"), encoding="utf-8") as handle:
            doc = json.load(handle)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def _epoch(slurm_time: str) -> Optional[float]:
    """Slurm's local-time stamps (2026-12-03T04:15:43) as Unix time; None for Unknown/None."""
    try:
        return time.mktime(time.strptime(slurm_time, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def decide(nodes: List[slurm.Node], config: Mapping[str, Any], now: float,
           reachable: Any = tcp_answers) -> List[Decision]:
    """The drains this pass would make, from slurmctld's node list, the reports and TCP probes."""
    port = int(config.get("slurmd_port", 6818))
    probe_cfg = config.get("probe", {})
    report_dir = str(config.get("report_dir", ""))
    shared = bool(config.get("reports_shared", False)) and bool(report_dir)
    stale_after = float(config.get("stale_after", 300))
    decisions = []
    for node in nodes:
        if node.state in SKIP_STATES or any(f in node.flags for f in SKIP_FLAGS):
            continue
        if node.drained and node.reason and not node.ours:
            continue  # somebody else's drain (a person, acceptance): theirs to lift
        error = reachable(node.address, port, int(probe_cfg.get("tries", 3)), float(probe_cfg.get("delay", 1.0)),
                          float(probe_cfg.get("timeout", 2.0))) if node.address else "no NodeAddr"
        if error:
            decisions.append(Decision(node.name, "slurmd", f"{REASON_PREFIX} slurmd: nothing answers on "
                                      f"{node.address}:{port} ({error})"))
            continue
        if node.drained and not (node.ours and GUESS in node.reason):
            continue  # drained by a health run already: its reason is the precise one, the rules below are weaker
        report = load_report(report_dir, node.name) if shared else None
        fresh = report is not None and now - float(report.get("started", 0)) <= stale_after
        if report is not None and fresh and not report.get("healthy", True) and report.get("reason"):
            decisions.append(Decision(node.name, "health-report", str(report["reason"])))
            continue
        if not node.responding:
            decisions.append(Decision(node.name, "slurmd", f"{REASON_PREFIX} slurmd: {node.address}:{port} {GUESS} "
                                      "(munge key or Slurm version different from the controller's?)"))
            continue
        started = _epoch(node.slurmd_start)
        if shared and not fresh and started is not None and now - started > stale_after:
            seen = (time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(float(report["started"])))
                    if report else "never")
            decisions.append(Decision(node.name, "health-report", f"{REASON_PREFIX} health-report: none from "
                                      f"{node.name} since {seen} (is HealthCheckProgram running?)"))
    # Only what changes something: a node already drained by the same check keeps its reason and timestamp.
    by_name = {n.name: n for n in nodes}
    return [d for d in decisions
            if not (by_name[d.node].drained and slurm.same_check(by_name[d.node].reason, d.reason))]



def cluster_pass(config: Mapping[str, Any], probe: Optional[Probe] = None, out: TextIO = sys.stdout) -> List[Decision]:
    probe = probe or Probe({"SLURM_CONF": str(config["slurm_conf"])} if config.get("slurm_conf") else None)
    scontrol = list(config.get("commands", {}).get("scontrol") or ["scontrol"])
    shown = probe.run([*scontrol, "show", "node"], timeout=30)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    if not shown.ok:
        out.write(f"{stamp} cannot read the node list: {shown.why()}\n")
        return []
    decisions = decide(slurm.parse_show_node(shown.stdout), config, time.time())
    for d in decisions:
        done = probe.run(slurm.drain_argv(scontrol, d.node, d.reason), timeout=15)
        d.done, d.detail = done.ok, "" if done.ok else done.why()
        out.write(f"{stamp} {'drained' if done.ok else 'could not drain'} {d.node}: {d.reason}"
                  + (f" ({d.detail})" if d.detail else "") + "\n")
    out.flush()
    return decisions


def repeat(what: str, one_pass: Callable[[], object], every: float, out: TextIO) -> int:
    """Run `one_pass` every `every` seconds for good (a controller daemon's loop); one failing pass is logged and
    the next runs on time."""
    while True:
        started = time.monotonic()
        try:
            one_pass()
        except Exception as err:  # noqa: BLE001 - one bad pass must not stop the next
            out.write(f"{what} failed: {err!r}\n")
            out.flush()
        time.sleep(max(every - (time.monotonic() - started), 1.0))


def run_forever(config_path: str, every: float, out: TextIO = sys.stdout) -> int:
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    out.write(f"fmcluster-health cluster pass every {every:g} s (reports: {config.get('report_dir') or 'none'})\n")
    out.flush()
    return repeat("cluster pass", lambda: cluster_pass(config, out=out), every, out)


__all__ = ["decide", "cluster_pass", "run_forever"]
