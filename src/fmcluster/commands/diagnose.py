"""`invoke doctor` and `invoke fleet`: the troubleshooting commands over fmcluster.doctor (the knowledge base's
detections on one cluster or one job log; every tenant in one table and a static page)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from fmcluster.doctor.fleet import Diagnose, RepairOf, UsageOf, html_page, row, table, tenants
from fmcluster.doctor.report import Diagnosis, Out, diagnose_cluster, diagnose_log, render
from fmcluster.escape import neutral, neutral_lines
from fmcluster.exits import ExitCode


def doctor(org: str = "", node: str = "", log: str = "", as_json: bool = False, out: Out = print,
           instance_type: str = "") -> int:
    """The command: exit 0 healthy, 1 unhealthy (or nothing could be read), 2 bad input."""
    if log:
        from fmcluster.catalog import load_catalog

        if instance_type and instance_type not in load_catalog():
            out(f"doctor: unknown instance type {instance_type!r}; known: {', '.join(sorted(load_catalog()))}")
            return ExitCode.INVALID
        try:
            diagnosis = diagnose_log(Path(log), org or None, instance_type or None)
        except OSError as err:
            message = f"cannot read {log}: {err.strerror or err}"
            out(json.dumps({"healthy": False, "error": message}) if as_json else f"doctor: {neutral(message)}")
            return ExitCode.INVALID
    elif instance_type:
        out("doctor: --instance-type judges a --log; a cluster is judged by its tenant (--org)")
        return ExitCode.INVALID
    elif not org:
        out("doctor: give --org=NAME (a tenant), or --log=FILE (a job log)")
        return ExitCode.INVALID
    else:
        diagnosis = diagnose_cluster(org, node, out=(lambda _l: None) if as_json else out)
    # Every echo of the log or the nodes (file name, evidence lines, notes) through the one escape; JSON escapes
    # every non-ASCII character itself.
    out(json.dumps(diagnosis.to_dict(), indent=1) if as_json else neutral_lines(render(diagnosis).rstrip("\n")))
    return ExitCode.OK if diagnosis.healthy else ExitCode.FAILED


def fleet(out: Out = print, html_path: Path | None = None, root: Path | None = None,
          diagnose: Diagnose | None = None, as_json: bool = False, usage_of: UsageOf | None = None,
          repair_of: RepairOf | None = None) -> int:
    """Print the table and write the HTML page; exit 0 when no deployed tenant is degraded or invalid."""
    from datetime import datetime, timezone

    from fmcluster.paths import inventories_dir, write_fresh

    if diagnose is None:
        def diagnose(org: str) -> Diagnosis:
            return diagnose_cluster(org, out=lambda _l: None)

    rows = [row(org, diagnose, root, usage_of, repair_of) for org in tenants(root)]
    path = html_path or inventories_dir(root) / "fleet.html"
    # Written afresh (temporary file + rename): a `fleet.html -> victim` link is replaced, not written through.
    write_fresh(path, html_page(rows, datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")), path.parent)
    if as_json:
        out(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        out(table(rows).rstrip("\n"))
        out(f"report: {path}")
    return ExitCode.FAILED if any(r.state in ("degraded", "invalid") for r in rows) else ExitCode.OK
