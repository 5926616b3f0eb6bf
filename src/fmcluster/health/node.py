"""The node program: run the checks, write the report and the metrics, drain or resume the node.

Run by slurmd as HealthCheckProgram (context `interval`, also once when slurmd starts) and as the Prolog of
jobs given GPUs (context `prolog`), or by hand. Draining goes through `scontrol update` from the node itself;
when slurmctld rejects the node (its munge key differs) the node cannot, and the report it leaves in the shared
report directory lets the controller's pass (fmcluster.health.cluster) drain it instead.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, TextIO

from fmcluster.health import REASON_PREFIX, engine, slurm, textfile
from fmcluster.health.model import ACTIONS, Report
from fmcluster.health.probe import Probe

#: Contexts whose runs drain and resume the node when the config allows it (manual runs need --drain).
ACTING_CONTEXTS = ("interval", "prolog")
#: Contexts whose runs leave a JSON report (the controller reads `<node>.json`, the interval run's).
REPORTING_CONTEXTS = ("interval", "prolog", "diag")


def load_config(path: str, node: str = "") -> Dict[str, Any]:
    """A node config (JSON written by the node_health role). `%n` in the path is the node name, as in
    slurm.conf: every namespace node of a local tenant has its own config, and slurmd names the node."""
    name = node or os.environ.get("SLURMD_NODENAME", "")
    real = path.replace("%n", name) if name else path
    with open(real, encoding="utf-8") as handle:
        config: Dict[str, Any] = json.load(handle)
    config["node"] = name or str(config.get("node", ""))
    if not config["node"]:
        raise ValueError(f"{real} names no node and SLURMD_NODENAME is not set; pass --node")
    return config


def probe_for(config: Mapping[str, Any]) -> Probe:
    env = {}
    conf = str(config.get("slurm", {}).get("conf", "")).replace("%n", str(config.get("node", "")))
    if conf:
        env["SLURM_CONF"] = conf
    return Probe(env)


def job_has_gpus(env: Mapping[str, str]) -> bool:
    """Prolog: whether Slurm gave the job GPUs (SLURM_JOB_GPUS, set in the Prolog's environment)."""
    return bool(env.get("SLURM_JOB_GPUS", "").strip())


def act(report: Report, config: Mapping[str, Any], probe: Probe) -> Dict[str, Any]:
    """Drain the node with the report's reason, or resume it when healthy and drained by this program only."""
    node = report.node
    scontrol = list(config.get("commands", {}).get("scontrol") or ["scontrol"])
    shown = probe.run([*scontrol, "show", "node", node], timeout=15)
    if not shown.ok:
        return {"attempted": False, "ok": False, "action": "none",
                "detail": f"cannot read this node's Slurm state: {shown.why()}"}
    found = [n for n in slurm.parse_show_node(shown.stdout) if n.name == node]
    if not found:
        return {"attempted": False, "ok": False, "action": "none", "detail": f"slurmctld does not know node {node}"}
    current = found[0]
    if report.healthy:
        if current.drained and current.ours:
            done = probe.run(slurm.resume_argv(scontrol, node), timeout=15)
            return {"attempted": True, "ok": done.ok, "action": "resume",
                    "detail": f"resumed (was: {current.reason})" if done.ok else done.why()}
        return {"attempted": False, "ok": True, "action": "none", "detail": "healthy; nothing to do"}
    reason = report.reason()
    if current.drained and not current.ours and current.reason:
        return {"attempted": False, "ok": True, "action": "none",
                "detail": f"already drained by {current.reason_by or 'someone'} ({current.reason}); left as it is"}
    if current.drained and slurm.same_check(current.reason, reason):
        # Keep Slurm's reason and its timestamp (when the trouble started) while the same check keeps failing,
        # even if its detail (a free-space figure) moved.
        return {"attempted": False, "ok": True, "action": "drain", "detail": f"already drained: {current.reason}"}
    done = probe.run(slurm.drain_argv(scontrol, node, reason), timeout=15)
    return {"attempted": True, "ok": done.ok, "action": "drain", "detail": reason if done.ok else done.why()}



def report_path(config: Mapping[str, Any], node: str, context: str) -> str:
    directory = str(config.get("report_dir", "")).replace("%n", node)
    if not directory:
        return ""
    return os.path.join(directory, f"{node}.json" if context == "interval" else f"{node}.{context}.json")


def _report_dir_usable(config: Mapping[str, Any]) -> Optional[str]:
    """None when the report directory may be written; else why not (it lives on a mount that is missing:
    writing would fill the empty mount point, hidden once the file system comes back)."""
    mount = str(config.get("report_requires_mount", ""))
    if not mount:
        return None
    from fmcluster.health import system

    try:
        with open(config.get("paths", {}).get("mountinfo", "/proc/self/mountinfo"), encoding="utf-8") as handle:
            mounts = system.parse_mountinfo(handle.read())
    except OSError as err:
        return f"cannot read the mount table ({err})"
    return None if system.find_mount(mounts, mount) else f"{mount} is not mounted"


def write_outputs(report: Report, config: Mapping[str, Any]) -> List[str]:
    """The JSON report (shared directory) and, for interval runs, the metrics textfile. Returns problems."""
    problems = []
    path = report_path(config, report.node, report.context) if report.context in REPORTING_CONTEXTS else ""
    if path:
        blocked = _report_dir_usable(config)
        if blocked:
            problems.append(f"report not written to {path}: {blocked}")
        else:
            try:
                textfile.write_atomic(path, json.dumps(report.as_dict(), indent=1, sort_keys=True) + "\n")
            except OSError as err:
                problems.append(f"report not written to {path}: {err}")
    directory = str(config.get("textfile_dir", "")).replace("%n", report.node)
    if directory and report.context == "interval":
        try:
            textfile.write_atomic(os.path.join(directory, "fmcluster_health.prom"), metrics(report))
        except OSError as err:
            problems.append(f"metrics not written to {directory}: {err}")
    return problems


def metrics(report: Report) -> str:
    out = textfile.Exposition()
    out.declare("fmcluster_health_check_failed",
                "1 when the named health check failed in the last run, 0 when it passed (skipped checks are absent).")
    for result in report.results:
        if result.status != "skip":
            out.add("fmcluster_health_check_failed", "", 1 if result.status == "fail" else 0,
                    {"check": result.check, "context": report.context})
    out.add("fmcluster_health_action", "What the last health run asks for: 0 none, 1 drain, 2 reboot, 3 replace.",
            ACTIONS.index(report.action), {"context": report.context})
    out.add("fmcluster_health_last_run_timestamp_seconds", "When the last health run started (Unix time).",
            round(report.started, 3), {"context": report.context})
    out.add("fmcluster_health_run_duration_seconds", "How long the last health run took.",
            round(report.seconds, 3), {"context": report.context})
    return out.render()


def summary(report: Report, out: TextIO) -> None:
    width = max([len(r.check) for r in report.results] + [5])
    for r in report.results:
        out.write(f"{r.status.upper():4}  {r.check:<{width}}  {r.detail}" + (f"  [{r.action}]" if r.status == "fail" else "")
                  + "\n")
    verdict = "healthy" if report.healthy else f"UNHEALTHY ({report.action}): {report.reason()}"
    out.write(f"{report.node}: {verdict} ({report.context}, {report.seconds:.1f} s)\n")
    if report.drain:
        out.write(f"slurm: {report.drain.get('action')}: {report.drain.get('detail')}\n")


def run(config_path: str, context: str, node: str = "", drain: Optional[bool] = None, only: Sequence[str] = (),
        as_json: bool = False, diag_level: Optional[int] = None, out: TextIO = sys.stdout) -> int:
    """One health run. Exit 0 healthy, 1 unhealthy (a Prolog exiting 1 makes Slurm requeue the job)."""
    if context == "prolog" and not job_has_gpus(os.environ):
        return 0  # a CPU job: nothing of the GPU checks concerns it, and every job pays for the Prolog
    config = load_config(config_path, node)
    probe = probe_for(config)
    # The boot run's level is the tenant's (health.return_diag_level, in the node config); diag's is asked for.
    level = diag_level if diag_level is not None else int(config.get("return_diag_level", 2))
    report = engine.run_checks(config, context, config["node"], probe, only, level)
    should_act = drain if drain is not None else (context in ACTING_CONTEXTS and bool(config.get("slurm", {}).get("drain", True)))
    if should_act:
        report.drain = act(report, config, probe)
    problems = write_outputs(report, config)
    if as_json:
        out.write(json.dumps(report.as_dict(), indent=1, sort_keys=True) + "\n")
    else:
        summary(report, out)
        for problem in problems:
            out.write(f"warning: {problem}\n")
    return 0 if report.healthy else 1


__all__ = ["run", "act", "load_config", "metrics", "REASON_PREFIX"]
