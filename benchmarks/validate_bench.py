"""How long `invoke validate` takes and how much memory a hostile file can make it use.

    .venv/bin/python benchmarks/validate_bench.py [--repeat N] [--src DIR]

Prints, as Markdown tables:
- validate time (median and max of N runs) for each bundled tenant;
- validate time over the hostile spec suite (tests/hostile/test_hostile_specs.py, every case once per run);
- wall time and peak resident memory of a fresh `python -m fmcluster.cli validate` process on a 50 MB
  file, an alias bomb (a billion laughs: 9 levels of 9 aliases), 5,000 nested brackets and, for reference,
  a valid spec.

Time is measured in-process (the import cost of a fresh process is not validation); memory in a child
process, as its peak RSS (getrusage), so one case cannot inherit another's high-water mark. The child runs
under a 2 GiB address-space limit and a 120 s timeout, so an older loader (`--src` pointing at another
checkout's src/, e.g. `git archive main src | tar -x -C /tmp/old`) can be measured without taking the
machine down.
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


def _timed(org: str, root: Path) -> tuple[float, float, bool]:
    """(wall seconds, CPU seconds, valid) of one validation. CPU time is what it costs whatever else runs."""
    started, cpu = time.perf_counter(), time.process_time()
    try:
        load_tenant(org, root)
        ok = True
    except TenantInvalid:
        ok = False
    return time.perf_counter() - started, time.process_time() - cpu, ok


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms | {max(values) * 1000:.1f} ms"


def bundled(repeat: int) -> list[str]:
    rows = ["| tenant | wall median | wall max | CPU median | CPU max |", "|---|---|---|---|---|"]
    for org in ("demo", "stockmark", "neuronlab"):
        _timed(org, ROOT)  # warm: catalog and schema are read once per process
        runs = [_timed(org, ROOT) for _ in range(repeat)]
        rows.append(f"| {org} | {_ms([r[0] for r in runs])} | {_ms([r[1] for r in runs])} |")
    return rows


def hostile(repeat: int) -> list[str]:
    from hostile_helpers import spec_text, write_tenant
    from test_hostile_specs import REFUSED

    per_case: dict[str, list[float]] = {c.id: [] for c in REFUSED}
    cpu: list[float] = []
    refused = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for _ in range(repeat):
            for case in REFUSED:
                content = case.spec if isinstance(case.spec, (str, bytes)) else spec_text(case.spec, base=case.base)
                write_tenant(root, content)
                elapsed, used, ok = _timed("acme", root)
                per_case[case.id].append(elapsed)
                cpu.append(used)
                refused += not ok
    medians = {k: statistics.median(v) for k, v in per_case.items()}
    every = [t for v in per_case.values() for t in v]
    slowest = sorted(medians, key=medians.__getitem__, reverse=True)[:3]
    return [
        "| hostile specs | refused | wall median | wall max | CPU median | CPU max | slowest cases (wall median) |",
        "|---|---|---|---|---|---|---|",
        f"| {len(REFUSED)} × {repeat} | {refused}/{len(REFUSED) * repeat} | {_ms(every)} | {_ms(cpu)} | "
        + ", ".join(f"{k} {medians[k] * 1000:.0f} ms" for k in slowest) + " |",
    ]


LIMIT_BYTES = 2 * 1024**3
LIMIT_SECONDS = 120


def _child(spec: Path, src: Path) -> tuple[float, int, int, str]:
    """(wall seconds, peak RSS KiB, exit code, last output line) of a fresh validate process on `spec`."""
    root = spec.parents[4]
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            f"lim = lambda: resource.setrlimit(resource.RLIMIT_AS, ({LIMIT_BYTES}, {LIMIT_BYTES})); "
            "p = subprocess.run([sys.executable, '-m', 'fmcluster.cli', 'validate', 'acme'], capture_output=True, "
            f"text=True, preexec_fn=lim, timeout={LIMIT_SECONDS}); "
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.returncode); "
            "out = (p.stdout.strip() or p.stderr.strip()).splitlines(); print(out[0] if p.returncode in (0, 2) and out "
            "else (out[-1] if out else ''))")
    started = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT_SECONDS + 30,
                             env={**os.environ, "FMCLUSTER_ROOT": str(root), "PYTHONPATH": str(src)}).stdout
    except subprocess.TimeoutExpired:
        return time.perf_counter() - started, 0, -1, "timed out"
    lines = out.splitlines()
    if not lines or len(lines[0].split()) != 3:
        return time.perf_counter() - started, 0, -1, f"no answer ({out[-120:]!r}; timed out after {LIMIT_SECONDS} s?)"
    wall, rss, rc = lines[0].split()
    return float(wall), int(rss), int(rc), lines[1] if len(lines) > 1 else ""


def memory(src: Path) -> list[str]:
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
            wall, rss, rc, line = _child(spec, src)
        shown = line.split("tenant.yml", 1)[-1].strip(": ")[:70]
        rows.append(f"| {label} | {size / 1024 / 1024:.2f} MiB | {wall:.2f} s | {rss / 1024:.0f} MiB | exit {rc}: {shown} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20, help="runs per tenant (and per hostile case: repeat // 5)")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the fmcluster sources the file cases run")
    parser.add_argument("--files-only", action="store_true", help="only the hostile-file cases (e.g. with --src)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print(f"validate benchmark, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"load {os.getloadavg()[0]:.1f}\n")
    sections = [] if args.files_only else [("Bundled tenants", bundled(args.repeat)),
                                           ("Hostile spec suite (in-process)", hostile(max(1, args.repeat // 5)))]
    sections.append((f"Hostile files (fresh process each, sources {args.src})", memory(args.src)))
    for title, rows in sections:
        print(f"### {title}\n")
        print("\n".join(rows) + "\n")
    print(f"done in {time.perf_counter() - started:.1f} s; peak RSS of this process "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
