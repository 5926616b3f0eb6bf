"""The `fmcluster` command line: a second front door (beside tasks.py) onto fmcluster.commands."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fmcluster.exits import ExitCode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fmcluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_validate = sub.add_parser("validate", help="validate a tenant spec")
    p_validate.add_argument("org")
    p_schema = sub.add_parser("schema-doc", help="print the tenant spec reference (Markdown) from the JSON Schema")
    p_schema.add_argument("--output", type=Path)
    p_usage = sub.add_parser("usage", help="GPU-, CPU- and node-hours per team and user, from sacct on the cluster")
    p_usage.add_argument("org")
    p_usage.add_argument("--since", default="", help="first day counted, YYYY-MM-DD (default: the first of this month)")
    p_usage.add_argument("--json", action="store_true", help="print the report as JSON")
    p_doctor = sub.add_parser("doctor", help="name the root cause in a cluster (--org) or in any job or system log (--log)")
    p_doctor.add_argument("--org", default="")
    p_doctor.add_argument("--node", default="")
    p_doctor.add_argument("--log", default="", help="a job log, slurmd/slurmctld log, dmesg, nvidia-smi or dcgmi output")
    p_doctor.add_argument("--instance-type", default="", help="the instance type the log ran on (EFA facts)")
    p_doctor.add_argument("--json", action="store_true")
    from fmcluster.commands import acceptance_cli

    acceptance_cli.register(sub)
    args = parser.parse_args(argv)
    if args.command == "acceptance":
        return acceptance_cli.main(args)
    if args.command == "validate":
        from fmcluster import commands

        return commands.validate(args.org)
    if args.command == "doctor":
        from fmcluster import commands

        return commands.doctor(args.org, args.node, args.log, args.json, instance_type=args.instance_type)
    if args.command == "usage":
        from fmcluster import commands

        return commands.usage(args.org, since=args.since, as_json=args.json)
    if args.command == "schema-doc":
        from fmcluster.commands import schema_doc

        return schema_doc(args.output)
    return ExitCode.FAILED  # a command registered but not handled here


if __name__ == "__main__":
    raise SystemExit(main())
