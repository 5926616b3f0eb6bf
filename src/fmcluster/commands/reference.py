"""Commands that print or write what fmcluster knows, with no tenant and nothing deployed: the NCCL environment an
instance type gets, the Grafana dashboards the grafana role ships, the tenant spec reference."""

from __future__ import annotations

import sys
from pathlib import Path

from fmcluster.exits import ExitCode


def nccl_env(instance_type: str, plugin_version: str = "") -> int:
    """The NCCL/libfabric environment of `instance_type`, each value with its public source."""
    from fmcluster.nccl import describe

    try:
        print(describe(instance_type, plugin_version or None))
    except (KeyError, ValueError) as err:
        print(f"nccl-env: {err.args[0] if err.args else err}", file=sys.stderr)
        return ExitCode.INVALID
    return ExitCode.OK


def dashboards(root: Path | None = None) -> int:
    """Regenerate the grafana role's dashboard JSON from fmcluster.dashboards; print each path written."""
    from fmcluster.dashboards import write_all

    for path in write_all():
        print(path.relative_to(root) if root and path.is_relative_to(root) else path)
    return ExitCode.OK


def schema_doc(output: Path | None = None) -> int:
    """The tenant spec reference (Markdown) from the JSON Schema: to `output`, or printed."""
    from fmcluster.schemadoc import render_reference

    text = render_reference()
    if output:
        output.write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return ExitCode.OK


__all__ = ["dashboards", "nccl_env", "schema_doc"]
