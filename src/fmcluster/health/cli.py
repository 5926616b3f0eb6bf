"""`fmcluster-health`: the node health program's command line (python3 -m fmcluster.health).

    check         run the checks of a context on this node (interval: as Slurm's HealthCheckProgram;
                  prolog: as the Prolog, only for jobs given GPUs; manual: by hand, drains only with --drain)
    diag          DCGM's level 2 or 3 diagnostic on demand (takes minutes: drain the node first)
    boot          once per boot, before slurmd starts: DCGM's diagnostic at the tenant's level, recorded for
                  the check return-diag (a GPU node serves again only once it passed)
    boot-serving  the boot unit arrived while slurmd already served on this boot (an upgrade of a running node):
                  record it, so return-diag passes on this boot and the diagnostic runs at the next boot
    show          which checks apply to this node and why the others are skipped
    cluster       the controller's pass (once, or --every N seconds)
    repair        the controller's repair agent: reboot or replace nodes as triage says, within budgets
    slurm-metrics Slurm's state into a node_exporter textfile (once, or --every N seconds)
    triage        unhealthy nodes and what each needs, from slurmctld and the nodes' reports
    usage-metrics this month's GPU/CPU hours per team and user (sacct) into a node_exporter textfile
    slurm-associations  the tenant's QoS, team accounts and users' associations into slurmdbd (sacctmgr)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from fmcluster.health import checks, efa, engine, facts, node


def _checks_arg(value: str) -> List[str]:
    return [v for v in value.split(",") if v]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="fmcluster-health", description=__doc__.splitlines()[0] if __doc__ else "")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="run the health checks on this node")
    check.add_argument("--config", required=True, help="node config (JSON); %%n is the node name")
    check.add_argument("--context", default="manual", choices=["interval", "prolog", "manual"])
    check.add_argument("--node", default="", help="node name (default: $SLURMD_NODENAME, else the config's)")
    check.add_argument("--only", type=_checks_arg, default=[], help="comma-separated check names")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    drain = check.add_mutually_exclusive_group()
    drain.add_argument("--drain", dest="drain", action="store_true", default=None,
                       help="drain or resume the node by the result (default: only in interval/prolog)")
    drain.add_argument("--no-drain", dest="drain", action="store_false")

    diag = sub.add_parser("diag", help="DCGM level 2 or 3 diagnostic (minutes; run on an idle, drained node)")
    diag.add_argument("--config", required=True)
    diag.add_argument("--node", default="")
    diag.add_argument("--level", type=int, choices=[2, 3], default=2)
    diag.add_argument("--drain", action="store_true", help="drain the node when the diagnostic fails")
    diag.add_argument("--json", action="store_true")

    boot = sub.add_parser("boot", help="this boot's return diagnostic (before slurmd starts; recorded)")
    boot.add_argument("--config", required=True)
    boot.add_argument("--node", default="")
    boot.add_argument("--json", action="store_true")

    serving = sub.add_parser("boot-serving", help="the boot unit arrived while slurmd served: the diagnostic waits for "
                             "the next boot (role node_health decides, from systemd)")
    serving.add_argument("--state-dir", required=True, help="the node's state directory (the config's state_dir)")
    serving.add_argument("--boot-id-file", default="/proc/sys/kernel/random/boot_id")

    show = sub.add_parser("show", help="which checks apply here, and why the others are skipped")
    show.add_argument("--config", required=True)
    show.add_argument("--node", default="")

    cluster = sub.add_parser("cluster", help="the controller's pass over every node")
    cluster.add_argument("--config", required=True, help="cluster config (JSON)")
    cluster.add_argument("--every", type=float, default=0.0, help="repeat every N seconds (0: once)")

    repair = sub.add_parser("repair", help="the controller's repair agent: reboot or replace nodes within budgets")
    repair.add_argument("--config", required=True, help="repair config (JSON; names the controller's pass config)")
    repair.add_argument("--every", type=float, default=0.0, help="repeat every N seconds (0: once)")
    repair.add_argument("--show", action="store_true", help="print the ledger (actions, quarantines, breaker)")

    metrics = sub.add_parser("slurm-metrics", help="Slurm state into a node_exporter textfile")
    metrics.add_argument("--textfile", required=True, help="e.g. <textfile dir>/fmcluster_slurm.prom")
    metrics.add_argument("--slurm-conf", default="", help="SLURM_CONF for scontrol and squeue")
    metrics.add_argument("--every", type=float, default=0.0, help="repeat every N seconds (0: once)")

    triage = sub.add_parser("triage", help="unhealthy nodes and what each needs")
    triage.add_argument("--config", required=True, help="cluster config (JSON: checks, XID table, reports)")
    triage.add_argument("--json", action="store_true")

    usage = sub.add_parser("usage-metrics", help="this month's usage per team and user into a node_exporter textfile")
    usage.add_argument("--org", required=True, help="the organization (the series' org label)")
    usage.add_argument("--textfile", required=True, help="e.g. <textfile dir>/fmcluster_usage.prom")
    usage.add_argument("--slurm-conf", default="", help="SLURM_CONF for sacct")
    usage.add_argument("--every", type=float, default=0.0, help="repeat every N seconds (0: once)")

    assoc = sub.add_parser("slurm-associations", help="teams, users and QoS into slurmdbd (sacctmgr)")
    assoc.add_argument("--config", required=True, help="desired state (JSON, fmcluster.health.accounts); - for standard input")
    assoc.add_argument("--slurm-conf", default="", help="SLURM_CONF for sacctmgr")
    assoc.add_argument("--check", action="store_true", help="list the commands, run none")

    exporter = sub.add_parser("efa-exporter", help="serve the efa driver's hardware counters as Prometheus metrics")
    exporter.add_argument("--listen-address", default="0.0.0.0")
    exporter.add_argument("--port", type=int, default=9109)
    exporter.add_argument("--sysfs-root", default=efa.SYSFS_ROOT)
    exporter.add_argument("--once", action="store_true", help="print the metrics once and exit")
    devices = sub.add_parser("efa-devices", help="the RDMA devices bound to the efa driver, one name a line")
    devices.add_argument("--sysfs-root", default=efa.SYSFS_ROOT)

    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except (OSError, ValueError) as err:
        print(f"fmcluster-health {args.command}: {err}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "check":
        return node.run(args.config, args.context, args.node, args.drain, args.only, args.json)
    if args.command == "diag":
        return node.run(args.config, "diag", args.node, True if args.drain else False, ["dcgm-deep"], args.json,
                        diag_level=args.level)
    if args.command == "boot":
        return node.run(args.config, "boot", args.node, False, [], args.json)
    if args.command == "boot-serving":
        with open(args.boot_id_file, encoding="utf-8") as handle:
            this_boot = handle.read().strip()
        path, written = checks.write_serving_marker(args.state_dir, this_boot)
        print(f"{'recorded' if written else 'unchanged'} {path} (boot {this_boot})")
        return 0
    if args.command == "show":
        config = node.load_config(args.config, args.node)
        node_facts = facts.derive(config)
        for spec in engine.specs(config):
            if spec.scope != "node":
                continue
            missing = facts.unmet(node_facts, list(spec.when))
            where = ",".join(spec.contexts)
            print(f"{'skip' if missing else 'runs':4}  {spec.name:<13} [{where}]  "
                  + ("; ".join(missing) if missing else spec.title))
        return 0
    if args.command == "cluster":
        from fmcluster.health import cluster

        if args.every > 0:
            return cluster.run_forever(args.config, args.every)
        with open(args.config, encoding="utf-8") as handle:
            cluster.cluster_pass(json.load(handle))
        return 0
    if args.command == "repair":
        from fmcluster.health import repair

        if args.show:
            return repair.show(args.config)
        if args.every > 0:
            return repair.run_forever(args.config, args.every)
        repair.repair_pass(repair.load_config(args.config))
        return 0
    if args.command == "slurm-metrics":
        from fmcluster.health import metrics

        return metrics.run_forever(args.textfile, args.every, args.slurm_conf, rounds=None if args.every > 0 else 1)
    if args.command == "triage":
        return _triage(args.config, args.json)
    if args.command == "usage-metrics":
        from fmcluster.health import usage

        return usage.collect_forever(args.org, args.textfile, args.every, args.slurm_conf,
                                     rounds=None if args.every > 0 else 1)
    if args.command == "efa-exporter":
        from fmcluster.health import efa_exporter

        return efa_exporter.run(args.listen_address, args.port, Path(args.sysfs_root), args.once)
    if args.command == "efa-devices":
        for device in efa.efa_devices(Path(args.sysfs_root)):
            print(device.name)
        return 0
    if args.command == "slurm-associations":
        from fmcluster.health import accounts

        return accounts.converge(args.config, args.check, args.slurm_conf)
    return 2


def _triage(config_path: str, as_json: bool) -> int:
    from dataclasses import asdict

    from fmcluster.health import cluster, triage
    from fmcluster.health.probe import Probe

    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    probe = Probe({"SLURM_CONF": str(config["slurm_conf"])} if config.get("slurm_conf") else None)
    shown = probe.run([*(config.get("commands", {}).get("scontrol") or ["scontrol"]), "show", "node"], timeout=30)
    if not shown.ok:
        print(f"fmcluster-health triage: {shown.why()}", file=sys.stderr)
        return 2
    report_dir = str(config.get("report_dir", ""))
    reports = {}
    if report_dir and os.path.isdir(report_dir):
        for name in os.listdir(report_dir):
            if name.endswith(".json") and name.count(".") == 1:
                loaded = cluster.load_report(report_dir, name[:-5])
                if loaded:
                    reports[name[:-5]] = loaded
    rules = triage.Rules({"checks": config.get("checks", []), "external_reasons": config.get("external_reasons", [])},
                         config.get("xids", {}))
    findings = triage.unhealthy_nodes(shown.stdout, rules, reports)
    if as_json:
        print(json.dumps([asdict(f) for f in findings], indent=1))
    else:
        sys.stdout.write(triage.table(findings))
    return 0 if not findings else 1


if __name__ == "__main__":
    sys.exit(main())
