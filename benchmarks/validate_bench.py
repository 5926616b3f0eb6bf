"""How long `invoke validate` takes and how much memory a hostile file can make it use.

    .venv/bin/python benchmarks/validate_bench.py [--repeat N]

Prints, as Markdown tables:
- validate time (median and max of N runs) for each bundled tenant;
- validate time over the hostile spec suite (tests/hostile/test_hostile_specs.py, every case once per run);
- wall time and peak resident memory of a fresh `python -m fmcluster.cli validate` process on a 50 MB
  file, an alias bomb (a billion laughs: 9 levels of 9 aliases), 5,000 nested brackets and, for reference,
  a valid spec.

Time is measured in-process (the import cost of a fresh process is not validation); memory in a child
process, as its peak RSS (getrusage), so one case cannot inherit another's high-water mark.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "tests" / "hostile")]
os.environ.setdefault("FMCLUSTER_ROOT", str(ROOT))

from fmcluster.model import TenantInvalid, load_tenant  # noqa: E402


def _timed(org: str, root: Path) -> tuple[float, bool]:
    started = time.perf_counter()
    try:
        load_tenant(org, root)
        ok = True
    except TenantInvalid:
        ok = False
    return time.perf_counter() - started, ok


def bundled(repeat: int) -> list[str]:
    rows = ["| tenant | median | max |", "|---|---|---|"]
    for org in ("demo", "stockmark", "neuronlab"):
        _timed(org, ROOT)  # warm: catalog and schema are read once per process
        times = [_timed(org, ROOT)[0] for _ in range(repeat)]
        rows.append(f"| {org} | {statistics.median(times) * 1000:.1f} ms | {max(times) * 1000:.1f} ms |")
    return rows


def hostile(repeat: int) -> list[str]:
    from hostile_helpers import spec_text, write_tenant
    from test_hostile_specs import REFUSED

    per_case: dict[str, list[float]] = {c.id: [] for c in REFUSED}
    refused = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for _ in range(repeat):
            for case in REFUSED:
                content = case.spec if isinstance(case.spec, (str, bytes)) else spec_text(case.spec, base=case.base)
                write_tenant(root, content)
                elapsed, ok = _timed("acme", root)
                per_case[case.id].append(elapsed)
                refused += not ok
    medians = {k: statistics.median(v) for k, v in per_case.items()}
    every = [t for v in per_case.values() for t in v]
    slowest = sorted(medians, key=medians.__getitem__, reverse=True)[:3]
    return [
        "| hostile specs | refused | median | max | slowest cases (median) |", "|---|---|---|---|---|",
        f"| {len(REFUSED)} × {repeat} | {refused}/{len(REFUSED) * repeat} | {statistics.median(every) * 1000:.1f} ms "
        f"| {max(every) * 1000:.1f} ms | " + ", ".join(f"{k} {medians[k] * 1000:.0f} ms" for k in slowest) + " |",
    ]


def _child(spec: Path) -> tuple[float, int, int, str]:
    """(wall seconds, peak RSS KiB, exit code, first output line) of a fresh validate process on `spec`."""
    root = spec.parents[4]
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "p = subprocess.run([sys.executable, '-m', 'fmcluster.cli', 'validate', 'acme'], capture_output=True, text=True); "
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.returncode); "
            "print(p.stdout.splitlines()[0] if p.stdout else p.stderr[-200:])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "FMCLUSTER_ROOT": str(root), "PYTHONPATH": str(ROOT / "src")}).stdout
    first, second = (out.splitlines() + ["", ""])[:2]
    wall, rss, rc = first.split()
    return float(wall), int(rss), int(rc), second


def memory() -> list[str]:
    from hostile_helpers import write_tenant
    from test_hostile_specs import BOMB, DEMO

    cases: dict[str, str | bytes] = {
        "valid spec (reference)": DEMO,
        "50 MB file": DEMO.encode() + b"#" * (50 * 1024 * 1024),
        "alias bomb (9 levels × 9 aliases = 387M values)": BOMB + DEMO.removeprefix("---\n"),
        "5,000 nested brackets": DEMO + "deep: " + "[" * 5000 + "]" * 5000 + "\n",
    }
    rows = ["| file | size | wall (fresh process) | peak RSS | answer |", "|---|---|---|---|---|"]
    for label, content in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            spec = write_tenant(Path(tmp), content)
            size = spec.stat().st_size
            wall, rss, rc, line = _child(spec)
        shown = line.split("tenant.yml", 1)[-1].strip(": ")[:70]
        rows.append(f"| {label} | {size / 1024 / 1024:.2f} MiB | {wall:.2f} s | {rss / 1024:.0f} MiB | exit {rc}: {shown} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20, help="runs per tenant (and per hostile case: repeat // 5)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print(f"validate benchmark, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"load {os.getloadavg()[0]:.1f}\n")
    for title, rows in (("Bundled tenants", bundled(args.repeat)),
                        ("Hostile spec suite (in-process)", hostile(max(1, args.repeat // 5))),
                        ("Hostile files (fresh process each)", memory())):
        print(f"### {title}\n")
        print("\n".join(rows) + "\n")
    print(f"done in {time.perf_counter() - started:.1f} s; peak RSS of this process "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
