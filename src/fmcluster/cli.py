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
    from fmcluster.commands import acceptance_cli

    acceptance_cli.register(sub)
    args = parser.parse_args(argv)
    if args.command == "acceptance":
        return acceptance_cli.main(args)
    if args.command == "validate":
        from fmcluster import commands

        return commands.validate(args.org)
    if args.command == "usage":
        from fmcluster import commands

        return commands.usage(args.org, since=args.since, as_json=args.json)
    if args.command == "schema-doc":
        from fmcluster.commands import schema_doc

        return schema_doc(args.output)
    return ExitCode.FAILED  # a command registered but not handled here


if __name__ == "__main__":
    raise SystemExit(main())
