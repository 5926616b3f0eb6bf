"""`fmcluster acceptance ...` subcommands; src/fmcluster/cli.py only registers them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fmcluster.acceptance.model import ParsedLog
from fmcluster.acceptance.parser import parse_file
from fmcluster.acceptance.verdict import judge, render, thresholds_for
from fmcluster.catalog import load_catalog


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("acceptance", help="collective-bandwidth acceptance: parse logs, run the gate")
    acc = p.add_subparsers(dest="acceptance_command", required=True)
    parse = acc.add_parser("parse", help="read an nccl-tests (or CPU bench) log; judge it with --instance-type")
    parse.add_argument("log", type=Path)
    parse.add_argument("--json", action="store_true", help="print the parsed log (and verdict) as JSON")
    parse.add_argument("--instance-type", help="judge against this catalog instance type, e.g. p5.48xlarge")
    parse.add_argument("--nodes", type=int, help="node count of the run (default: hosts seen in the log)")
    parse.add_argument("--min-busbw", type=float, help="floor override in GB/s (as tenant.acceptance.min_busbw_gbps)")
    run = acc.add_parser("run", help="run the acceptance gate on a tenant's Slurm cluster (as `invoke acceptance`)")
    run.add_argument("org")


def main(args: argparse.Namespace) -> int:
    if args.acceptance_command == "run":
        from fmcluster import commands

        return commands.acceptance(args.org)
    if not args.log.is_file():
        print(f"acceptance parse: no such log file: {args.log}")
        return 2
    log = parse_file(args.log)
    verdict = None
    if args.instance_type:
        catalog = load_catalog()
        if args.instance_type not in catalog:
            print(f"acceptance parse: unknown instance type {args.instance_type!r}; known: {', '.join(sorted(catalog))}")
            return 2
        nodes = args.nodes or max(len(log.hosts), 1)
        verdict = judge(log, thresholds_for(catalog[args.instance_type], nodes, args.min_busbw))
    if args.json:
        print(json.dumps({"log": log.to_dict(), "verdict": verdict.to_dict() if verdict else None}, indent=2))
    else:
        print(describe(log))
        if verdict:
            print(render(verdict))
    if verdict is not None:
        return 0 if verdict.passed else 1
    return 0 if log.completed and not log.wrong and not log.out_of_bounds else 1


def describe(log: ParsedLog) -> str:
    net = log.network
    lines = [
        f"{log.source}: {log.benchmark or 'benchmark ?'}, {log.library or 'library ?'}"
        f"{f', {log.tests_version}' if log.tests_version else ''}",
        f"  {log.ranks or '?'} ranks on {len(log.hosts) or '?'} host(s) ({', '.join(log.hosts[:4])}"
        f"{', ...' if len(log.hosts) > 4 else ''}); {len(log.rows)} sizes; "
        f"{'complete' if log.completed else 'INCOMPLETE'}{'; KILLED' if log.killed else ''}",
        f"  network {net.network or '?'}; provider {net.ofi_provider or '-'}"
        f"{f' ({net.ofi_nics} nics)' if net.ofi_nics else ''}; plugin "
        f"{'MISSING' if net.plugin_missing else (net.ofi_plugin_version or '-')}; GDR "
        f"{'on' if net.gdr else 'off' if net.gdr is False else '-'}; channels {net.channels or '?'}; rings {len(net.rings)}",
    ]
    if log.rows:
        lines.append("        size     count   type  redop   time(us)  algbw  busbw  #wrong | in-place time  algbw  busbw  #wrong")
        for r in log.rows:
            o, i = r.out_of_place, r.in_place
            lines.append(f"  {r.size_bytes:10d} {r.count:9d} {r.dtype:>6} {r.redop:>6} {o.time_us:10.2f} {o.algbw_gbps:6.2f} "
                         f"{o.busbw_gbps:6.2f} {_w(o.wrong):>7} | {i.time_us:13.2f} {i.algbw_gbps:6.2f} {i.busbw_gbps:6.2f} {_w(i.wrong):>7}")
    lines.append(f"  avg bus bandwidth: {log.avg_busbw_gbps if log.avg_busbw_gbps is not None else '-'} GB/s; "
                 f"out of bounds: {log.out_of_bounds if log.out_of_bounds is not None else '-'}; wrong elements: {log.wrong}")
    for e in log.errors[:5]:
        lines.append(f"  error: {e}")
    if log.garbled_lines or log.duplicate_rows or log.tables > 1:
        lines.append(f"  odd: {log.garbled_lines} unreadable line(s), {log.duplicate_rows} duplicate row(s), {log.tables} table(s)")
    return "\n".join(lines)


def _w(wrong: int | None) -> str:
    return "N/A" if wrong is None else str(wrong)

