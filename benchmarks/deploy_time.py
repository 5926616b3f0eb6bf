"""Cold and warm end-to-end time of the local deploy, per step: `invoke deploy` twice on a fresh copy of the
demo tenant (its own subnet), then `invoke destroy --yes`.

    .venv/bin/python benchmarks/deploy_time.py

Prints the per-step seconds of both runs and the totals, as the deploy summary reports them, plus the
wall-clock time of each command. Removes its tenant afterwards.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORG = "benchdep"
STEP_LINE = re.compile(r"^  (\S.*?)\s{2,}(ok|changed|skipped|failed)\s+([\d.]+)s\s", re.M)


def invoke(*args: str) -> tuple[float, str, int]:
    started = time.monotonic()
    result = subprocess.run([str(ROOT / ".venv" / "bin" / "invoke"), *args], cwd=ROOT, capture_output=True,
                            text=True, stdin=subprocess.DEVNULL)
    return time.monotonic() - started, result.stdout + result.stderr, result.returncode


def steps(output: str) -> dict[str, tuple[str, float]]:
    summary = output[output.rindex("=== deploy summary"):]
    return {m.group(1).strip(): (m.group(2), float(m.group(3))) for m in STEP_LINE.finditer(summary)}


def main() -> int:
    spec = ROOT / "inventories" / ORG / "group_vars" / "all" / "tenant.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    demo = (ROOT / "inventories" / "demo" / "group_vars" / "all" / "tenant.yml").read_text()
    spec.write_text(demo.replace("org: demo", f"org: {ORG}").replace("10.77.0.0/24", "10.84.0.0/24"))
    try:
        cold_wall, cold_out, cold_rc = invoke("deploy", f"--org={ORG}")
        warm_wall, warm_out, warm_rc = invoke("deploy", f"--org={ORG}")
        destroy_wall, _, destroy_rc = invoke("destroy", f"--org={ORG}", "--yes")
    finally:
        invoke("destroy", f"--org={ORG}", "--yes")
        shutil.rmtree(ROOT / "inventories" / ORG, ignore_errors=True)
    if cold_rc or warm_rc or destroy_rc:
        print(cold_out[-3000:], warm_out[-3000:], sep="\n")
        return 1
    cold, warm = steps(cold_out), steps(warm_out)
    print(f"{'step':<16} | {'cold':>16} | {'warm':>16}")
    for name in cold:
        c, w = cold[name], warm.get(name, ("-", 0.0))
        print(f"{name:<16} | {c[1]:>6.1f}s {c[0]:<8} | {w[1]:>6.1f}s {w[0]:<8}")
    print(f"{'invoke deploy':<16} | {cold_wall:>6.1f}s wall     | {warm_wall:>6.1f}s wall")
    print(f"{'invoke destroy':<16} | {destroy_wall:>6.1f}s wall     |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
