"""Cold and warm `invoke deploy` of the demo tenant, per step, beside the previous push-based flow, in one run.

    .venv/bin/python benchmarks/deploy_time.py [--baseline REV] [--skip-baseline]

For each flow — this checkout (every node converges itself) and the baseline commit (the deploy machine pushed
the controller and login nodes and ran ansible-pull on the compute nodes; default: BASELINE below) — it
deploys a fresh copy of the demo tenant twice (cold, then warm: nothing changed), then destroys it. The
baseline runs from a git worktree under .cache/bench-baseline with its own .venv (made by its own
scripts/bootstrap.sh on first use). The flows run one after the other, never together. Prints one table with
each step's seconds and status as the deploy summaries report them, and the wall-clock time of each command.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: main before the one boot path (issue 11): the push-based flow.
BASELINE = "d16e9a0"
ORG = "benchdep"
STEP_LINE = re.compile(r"^  (\S.*?)\s{2,}(ok|changed|skipped|failed)\s+([\d.]+)s\s", re.M)
Run = tuple[float, dict[str, tuple[str, float]], int, str]


def invoke(checkout: Path, *args: str) -> tuple[float, str, int]:
    started = time.monotonic()
    result = subprocess.run([str(checkout / ".venv" / "bin" / "invoke"), *args], cwd=checkout, capture_output=True,
                            text=True, stdin=subprocess.DEVNULL)
    return time.monotonic() - started, result.stdout + result.stderr, result.returncode


def steps(output: str) -> dict[str, tuple[str, float]]:
    if "=== deploy summary" not in output:
        return {}
    summary = output[output.rindex("=== deploy summary"):]
    return {m.group(1).strip(): (m.group(2), float(m.group(3))) for m in STEP_LINE.finditer(summary)}


def flow(checkout: Path, spec_text: str) -> tuple[Run, Run, float]:
    """Cold deploy, warm deploy, destroy of a fresh copy of the demo tenant in `checkout`."""
    spec = checkout / "inventories" / ORG / "group_vars" / "all" / "tenant.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(spec_text)
    try:
        cold_wall, cold_out, cold_rc = invoke(checkout, "deploy", f"--org={ORG}")
        warm_wall, warm_out, warm_rc = invoke(checkout, "deploy", f"--org={ORG}")
        destroy_wall, _, _ = invoke(checkout, "destroy", f"--org={ORG}", "--yes")
    finally:
        invoke(checkout, "destroy", f"--org={ORG}", "--yes")
        shutil.rmtree(checkout / "inventories" / ORG, ignore_errors=True)
    return ((cold_wall, steps(cold_out), cold_rc, cold_out), (warm_wall, steps(warm_out), warm_rc, warm_out),
            destroy_wall)


def baseline_checkout(rev: str) -> Path:
    path = ROOT / ".cache" / "bench-baseline"
    if not (path / ".git").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT, check=True)
    subprocess.run(["git", "checkout", "--quiet", "--detach", rev], cwd=path, check=True)
    subprocess.run(["bash", "scripts/bootstrap.sh"], cwd=path, check=True)
    return path


def table(name: str, cold: Run, warm: Run, destroy: float) -> list[str]:
    lines = [f"\n{name}", f"{'step':<18} | {'cold':>18} | {'warm':>18}"]
    for step in cold[1]:
        c, w = cold[1][step], warm[1].get(step, ("-", 0.0))
        lines.append(f"{step:<18} | {c[1]:>7.1f}s {c[0]:<9} | {w[1]:>7.1f}s {w[0]:<9}")
    lines.append(f"{'invoke deploy':<18} | {cold[0]:>7.1f}s wall      | {warm[0]:>7.1f}s wall")
    lines.append(f"{'invoke destroy':<18} | {destroy:>7.1f}s wall      |")
    for label, run in (("cold", cold), ("warm", warm)):
        if run[2]:
            lines.append(f"!! {label} deploy FAILED (exit {run[2]}):\n{run[3][-3000:]}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="commit of the previous flow (default: %(default)s)")
    parser.add_argument("--skip-baseline", action="store_true", help="measure this checkout only")
    args = parser.parse_args()
    demo = (ROOT / "inventories" / "demo" / "group_vars" / "all" / "tenant.yml").read_text()
    current = demo.replace("org: demo", f"org: {ORG}").replace("10.77.0.0/16", "10.84.0.0/16")
    out = table(f"this checkout ({subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}):"
                " every node converges itself", *flow(ROOT, current))
    if not args.skip_baseline:
        base = baseline_checkout(args.baseline)
        old_demo = (base / "inventories" / "demo" / "group_vars" / "all" / "tenant.yml").read_text()
        old = old_demo.replace("org: demo", f"org: {ORG}").replace("10.77.0.0/24", "10.84.0.0/24")
        out += table(f"baseline {args.baseline}: push converge of controller and login, ansible-pull on compute",
                     *flow(base, old))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
