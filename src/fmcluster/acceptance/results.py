"""Per-run acceptance records under inventories/<org>/generated/acceptance/<timestamp>/.

Each run directory holds the job logs, `result.json` (everything the gate decided, machine-readable)
and `summary.md` (the same for people), so runs can be compared over time: `compare()` puts the
busbw of each test beside the previous run's.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fmcluster.acceptance.model import json_safe
from fmcluster.paths import generated_dir, real_dir, tenant_dir, write_fresh

STAMP = "%Y%m%dT%H%M%SZ"


def acceptance_dir(org: str, root: Path | None = None) -> Path:
    return generated_dir(org, root) / "acceptance"


def new_run_dir(org: str, now: datetime | None = None, root: Path | None = None) -> Path:
    stamp = (now or datetime.now(timezone.utc)).strftime(STAMP)
    path = acceptance_dir(org, root) / stamp
    suffix = 1
    while path.exists():
        suffix += 1
        path = acceptance_dir(org, root) / f"{stamp}-{suffix}"
    real_dir(path.parent, tenant_dir(org, root))
    path.mkdir()
    return path


def previous_result(org: str, current: Path, root: Path | None = None) -> dict[str, Any] | None:
    """The newest result.json older than the run directory `current`."""
    base = acceptance_dir(org, root)
    older = sorted(p for p in base.iterdir() if p.is_dir() and p.name < current.name and (p / "result.json").is_file()) \
        if base.is_dir() else []
    if not older:
        return None
    data: dict[str, Any] = json.loads((older[-1] / "result.json").read_text(encoding="utf-8"))
    data["_run_dir"] = older[-1].name
    return data


def compare(current: dict[str, Any], previous: dict[str, Any] | None) -> list[str]:
    """One line per test: busbw now vs the previous run (same test name)."""
    if previous is None:
        return ["first recorded run: nothing to compare with"]
    before = {t["name"]: t for t in previous.get("tests", [])}
    lines = [f"compared with run {previous.get('_run_dir', '?')} ({'PASS' if previous.get('passed') else 'FAIL'})"]
    for test in current.get("tests", []):
        old = before.get(test["name"])
        now_bw, old_bw = test.get("busbw_gbps"), (old or {}).get("busbw_gbps")
        if old is None:
            lines.append(f"{test['name']}: new test")
        elif now_bw is None or old_bw is None:
            lines.append(f"{test['name']}: busbw {now_bw} (before {old_bw})")
        else:
            delta = 100 * (now_bw - old_bw) / old_bw if old_bw else 0.0
            lines.append(f"{test['name']}: busbw {now_bw:.3f} GB/s (before {old_bw:.3f}, {delta:+.0f}%)")
    return lines


def write(run_dir: Path, data: dict[str, Any], summary: str) -> None:
    """Write result.json as strict JSON (non-finite figures become null, listed under `non_finite`)."""
    safe, non_finite = json_safe(data)
    if non_finite:
        safe["non_finite"] = non_finite
    text = json.dumps(safe, indent=2, default=str, allow_nan=False)
    write_fresh(run_dir / "result.json", text + "\n", run_dir)
    write_fresh(run_dir / "summary.md", summary, run_dir)
