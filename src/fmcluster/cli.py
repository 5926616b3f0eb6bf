"""The `fmcluster` command line. tasks.py (invoke) is the front door and calls the same functions."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from fmcluster.model import Tenant, TenantInvalid, load_tenant
from fmcluster.paths import repo_root

EXIT_INVALID_SPEC = 2


def describe(tenant: Tenant) -> str:
    queues = ", ".join(f"{q.name}: {q.count}× {q.instance.name} ({q.accelerator})" for q in tenant.queues)
    return (f"tenant '{tenant.org}' is valid: provider {tenant.provider}, {tenant.scheduler} in "
            f"{tenant.availability_zone}; queues {queues}")


def validate(org: str, out: Callable[[str], object] = print) -> int:
    """Validate one tenant; print every problem with its fix. Returns the process exit code."""
    try:
        tenant = load_tenant(org)
    except TenantInvalid as err:
        out(err.render(repo_root()))
        return EXIT_INVALID_SPEC
    out(describe(tenant))
    if tenant.scheduler == "parallelcluster":  # its cluster config through ParallelCluster's own schema
        from fmcluster.parallelcluster import commands as parallelcluster

        return parallelcluster.validate(tenant, out)
    return 0


def require_tenant(org: str) -> Tenant:
    """Load a tenant for a task that changes something; exit with the full problem list if invalid."""
    try:
        return load_tenant(org)
    except TenantInvalid as err:
        print(err.render(repo_root()), file=sys.stderr)
        raise SystemExit(EXIT_INVALID_SPEC) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fmcluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_validate = sub.add_parser("validate", help="validate a tenant spec")
    p_validate.add_argument("org")
    p_schema = sub.add_parser("schema-doc", help="print the tenant spec reference (Markdown) from the JSON Schema")
    p_schema.add_argument("--output", type=Path)
    from fmcluster.acceptance import cli as acceptance_cli

    acceptance_cli.register(sub)
    args = parser.parse_args(argv)
    if args.command == "acceptance":
        return acceptance_cli.main(args)
    if args.command == "validate":
        return validate(args.org)
    if args.command == "schema-doc":
        from fmcluster.schemadoc import render_reference

        text = render_reference()
        if args.output:
            args.output.write_text(text, encoding="utf-8")
        else:
            print(text, end="")
        return 0
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
