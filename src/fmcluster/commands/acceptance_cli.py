"""`fmcluster acceptance ...` subcommands; src/fmcluster/cli.py only registers them."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from fmcluster.acceptance.expectation import COLLECTIVES, canonical_collective, resolve_expectation
from fmcluster.acceptance.model import ParsedLog, json_safe
from fmcluster.acceptance.parser import parse_file
from fmcluster.acceptance.verdict import Verdict, judge, render
from fmcluster.catalog import InstanceType, load_catalog
from fmcluster.escape import neutral, neutral_lines
from fmcluster.exits import VERDICT_EXITS, ExitCode

PARSE_EPILOG = """\
exit status:
  0  pass: judged, and the log shows the reference size ran, finite, correct, at or above the floor,
     over the expected transport
  1  fail: judged and failed, or failed on what fails any run (truncated, killed, wrong data, NaN,
     nccl-tests' own FAILED) even without an instance type
  2  unreadable: the file cannot be read (missing, a directory, a device or FIFO, no permission, a
     compression other than gzip/bzip2/xz), or a bad option (an instance type or queue the
     catalog/tenant does not have, an unknown --collective, a --min-busbw that is not a positive number)
  5  not judged: read, nothing failed, but there is nothing to judge against; give --instance-type
     (or --org) and, if the log names no hosts, --nodes. AWS Neuron nccom-test output is judged
     against its Trainium instance type (e.g. --instance-type trn1.32xlarge), not judged without one.

The instance type is, in order: --instance-type; the tenant's queue (--org [--queue]); the type
aws-ofi-nccl names in the log (`NET/OFI Running on p5.48xlarge platform`).
"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("acceptance", help="collective-bandwidth acceptance: parse logs, run the gate")
    acc = p.add_subparsers(dest="acceptance_command", required=True)
    parse = acc.add_parser("parse", help="read an nccl-tests, CPU bench or nccom-test log and judge it",
                           epilog=PARSE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parse.add_argument("log", type=Path)
    parse.add_argument("--json", action="store_true",
                       help="print status, parsed log and verdict as strict JSON (NaN/inf become null)")
    parse.add_argument("--instance-type", help="judge against this catalog instance type, e.g. p5.48xlarge")
    parse.add_argument("--org", help="judge against this tenant's queue (and its min_busbw_gbps override)")
    parse.add_argument("--queue", help="with --org: the queue the log ran on (default: the only one, or the "
                       "one the log's hosts are named after)")
    parse.add_argument("--nodes", type=int, help="node count of the run (default: hosts seen in the log)")
    parse.add_argument("--min-busbw", type=float, help="floor override in GB/s (as tenant.acceptance.min_busbw_gbps)")
    parse.add_argument("--collective", help="the collective the log must be, e.g. all_reduce or alltoall (default: the one it names)")
    parse.add_argument("--require-data-check", action="store_true",
                       help="fail, not just warn, when nccl-tests ran without data checks (-c 0)")
    run = acc.add_parser("run", help="run the acceptance gate on a tenant's Slurm cluster (as `invoke acceptance`)")
    run.add_argument("org")


def main(args: argparse.Namespace) -> int:
    if args.acceptance_command == "run":
        from fmcluster.commands import cluster

        return cluster.acceptance(args.org)
    return parse_command(args)


def _queues(org: str) -> tuple[dict[str, InstanceType], float | None]:
    from fmcluster.commands.cluster import require_tenant

    tenant = require_tenant(org)
    return {q.name: q.instance for q in tenant.queues}, tenant.acceptance.min_busbw_gbps


def parse_command(args: argparse.Namespace) -> int:
    try:
        log = parse_file(args.log)
    except OSError as err:
        return _unreadable(args, f"cannot read {args.log}: {err.strerror or err}")
    catalog = load_catalog()
    if args.instance_type and args.instance_type not in catalog:
        return _unreadable(args, f"unknown instance type {args.instance_type!r}; known: {', '.join(sorted(catalog))}")
    if args.nodes is not None and args.nodes < 1:
        return _unreadable(args, f"--nodes must be at least 1, not {args.nodes}")
    if args.min_busbw is not None and not (math.isfinite(args.min_busbw) and args.min_busbw > 0):
        return _unreadable(args, f"--min-busbw must be a finite number of GB/s above 0, not {args.min_busbw}")
    collective = None
    if args.collective is not None:
        collective = canonical_collective(args.collective)
        if collective is None:
            return _unreadable(args, f"--collective: unknown collective {args.collective!r}; known: {', '.join(COLLECTIVES)}")
    queues, override = (_queues(args.org) if args.org and not args.instance_type else (None, None))
    if queues is not None and args.queue is not None and args.queue not in queues:
        return _unreadable(args, f"tenant {args.org} has no queue {args.queue!r}; it has {', '.join(sorted(queues))}")
    resolution = resolve_expectation(
        log, catalog, instance_type=args.instance_type, queues=queues, queue=args.queue, nodes=args.nodes,
        override_gbps=args.min_busbw if args.min_busbw is not None else override, collective=collective,
        require_data_check=args.require_data_check)
    verdict = judge(log, resolution.expectation, not_judged_reason=resolution.reason)
    code = VERDICT_EXITS[verdict.status]
    if args.json:
        print(_json(log, verdict, code, resolution.reason))
    else:
        # Every echo of the log (its file name, hosts, versions, error lines) through the one escape.
        print(neutral_lines(describe(log)))
        print(neutral_lines(render(verdict)))
    return code


def _unreadable(args: argparse.Namespace, message: str) -> int:
    if args.json:
        print(json.dumps({"status": "unreadable", "exit_code": ExitCode.INVALID, "error": message}, allow_nan=False))
    else:
        print(f"acceptance parse: {neutral(message)}")
    return ExitCode.INVALID


def _json(log: ParsedLog, verdict: Verdict, code: int, basis: str) -> str:
    data, non_finite = json_safe({"log": log.to_dict(), "verdict": verdict.to_dict()})
    payload = {"status": verdict.status, "exit_code": code, "cause": verdict.cause, "codes": list(verdict.codes),
               "expectation_basis": basis, "non_finite": non_finite, **data}
    return json.dumps(payload, indent=2, allow_nan=False)


def describe(log: ParsedLog) -> str:
    net = log.network
    bench = log.benchmark or "benchmark ?"
    if log.benchmark_printed and log.benchmark_printed != log.benchmark:
        bench += f" (printed as {log.benchmark_printed})"
    lines = [
        f"{log.source}: {bench}, {log.library or 'library ?'}"
        f"{f', {log.tests_version}' if log.tests_version else ''}",
        f"  {log.ranks or '?'} ranks on {len(log.hosts) or '?'} host(s) ({', '.join(log.hosts[:4])}"
        f"{', ...' if len(log.hosts) > 4 else ''}); {len(log.rows)} sizes; "
        f"{'complete' if log.completed else 'INCOMPLETE'}{'; KILLED' if log.killed else ''}",
        f"  network {net.network or '?'}; provider {net.ofi_provider or '-'}"
        f"{f' ({net.ofi_nics} nics)' if net.ofi_nics else ''}; plugin "
        f"{'MISSING' if net.plugin_missing else (net.ofi_plugin_version or '-')}; GDR "
        f"{'on' if net.gdr else 'off' if net.gdr is False else '-'}; channels {net.channels or '?'}; rings {len(net.rings)}"
        f"{f'; platform {net.platform}' if net.platform else ''}",
    ]
    if log.rows:
        lines.append("        size     count   type  redop   time(us)  algbw  busbw  #wrong | in-place time  algbw  busbw  #wrong")
        for r in log.rows:
            o, i = r.out_of_place, r.in_place
            lines.append(f"  {r.size_bytes:10d} {r.count:9d} {r.dtype:>6} {r.redop or '-':>6} {o.time_us:10.2f} "
                         f"{o.algbw_gbps:6.2f} {o.busbw_gbps:6.2f} {_w(o.wrong, o.check):>7} | {i.time_us:13.2f} "
                         f"{i.algbw_gbps:6.2f} {i.busbw_gbps:6.2f} {_w(i.wrong, i.check):>7}")
    avg = log.avg_busbw_text if log.avg_busbw_text is not None else "-"
    lines.append(f"  avg bus bandwidth: {avg} GB/s{f' {log.avg_verdict}' if log.avg_verdict else ''}; out of bounds: "
                 f"{log.out_of_bounds if log.out_of_bounds is not None else '-'}; wrong elements: {log.wrong}")
    for e in log.errors[:5]:
        lines.append(f"  error: {e}")
    if log.garbled_lines or log.duplicate_rows or log.tables > 1 or log.long_lines:
        lines.append(f"  odd: {log.garbled_lines} unreadable line(s), {log.duplicate_rows} duplicate row(s), "
                     f"{log.tables} table(s), {log.long_lines} over-long line(s)")
    return "\n".join(lines)


def _w(wrong: int | None, check: str) -> str:
    if check == "unchecked":
        return "N/A"
    if check == "max_error":
        return "maxerr"
    return "?" if wrong is None else str(wrong)
