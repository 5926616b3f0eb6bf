"""benchmarks/control_plane_scale.py still runs (at 16 nodes; BENCHMARKS.md has the figures up to 1,000). No time
is asserted: the benchmark measures, the test only keeps it working as the code it calls changes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def test_the_control_plane_benchmark_runs_every_operation_at_16_nodes() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "control_plane_scale.py"), "--sizes", "16"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for row in ("discovery (DescribeInstances)", "slurm.conf (render)", "converge wait: a later round",
                "invoke status", "invoke nodes", "invoke doctor --org", "invoke fleet"):
        assert f"| {row}" in done.stdout, row
    assert "| converge wait: a later round, no report changed | " in done.stdout
    later = next(line for line in done.stdout.splitlines() if line.startswith("| converge wait: a later round"))
    assert "Get" not in later.rsplit("|", 2)[1], "a round in which no report changed reads none"
