"""The whole gate for real on a local Slurm cluster: sbatch → parse → verdict → bisect → drain.

A tenant of its own (org `fmaccept`, subnet 10.79.0.0/24, in a temporary FMCLUSTER_ROOT) so it never
touches the demo cluster: `nodes_up` + `converge` (the Slurm issue's local provider and roles) bring up
controller, login and three compute namespaces with real munged/slurmctld/slurmd. The healthy fabric
passes; then node cpu-2's egress is rate-limited with a token bucket (`tc qdisc ... tbf rate 300mbit`),
the deliberately broken fabric setting, and the gate must fail, bisect node pairs, find cpu-2 and drain
it with a reason. Everything is removed at the end (nodes_down, tc goes with the namespace).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.e2e

ORG = "fmaccept"
BROKEN_NODE = "cpu-2"


@pytest.fixture(scope="module")
def tenant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    if os.geteuid() != 0:
        pytest.skip("local nodes need root (network namespaces)")
    root = tmp_path_factory.mktemp("fmaccept-root")
    for name in ("playbooks", "roles", "ansible.cfg", "src", ".venv"):
        (root / name).symlink_to(ROOT / name)
    spec = (ROOT / "inventories" / "demo" / "group_vars" / "all" / "tenant.yml").read_text()
    spec = spec.replace("org: demo", f"org: {ORG}").replace("10.77.0.0/24", "10.79.0.0/24")
    (root / "inventories" / ORG / "group_vars" / "all").mkdir(parents=True)
    (root / "inventories" / ORG / "group_vars" / "all" / "tenant.yml").write_text(spec)
    old_root = os.environ.get("FMCLUSTER_ROOT")
    os.environ["FMCLUSTER_ROOT"] = str(root)
    from fmcluster.converge import converge
    from fmcluster.inventory import write_inventory
    from fmcluster.localnodes import nodes_down, nodes_up
    from fmcluster.model import load_tenant

    t = load_tenant(ORG)
    try:
        write_inventory(t, nodes_up(t))
        assert converge(t) == 0
        yield t
    finally:
        nodes_down(t)
        os.environ["FMCLUSTER_ROOT"] = old_root or str(ROOT)
        shutil.rmtree(root, ignore_errors=True)


def test_healthy_cluster_passes_then_a_throttled_node_fails_the_gate_and_is_drained(tenant) -> None:  # type: ignore[no-untyped-def]
    from fmcluster.acceptance.runner import default_client, run_acceptance
    from fmcluster.localnodes import node_named

    lines: list[str] = []
    started = time.monotonic()
    healthy = run_acceptance(tenant, out=lines.append, timeout=240)
    healthy_s = time.monotonic() - started
    assert healthy.passed, "\n".join(lines)
    assert [t.name for t in healthy.tests] == ["cpu-all_reduce-1node", "cpu-all_reduce-3nodes"]
    assert all(t.parsed.network.network == "Socket" and t.parsed.completed for t in healthy.tests)
    assert healthy.run_dir is not None and (healthy.run_dir / "result.json").is_file()
    assert "first recorded run" in healthy.comparison[0]

    netns = node_named(tenant, BROKEN_NODE).netns
    subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                    "rate", "300mbit", "burst", "32kbit", "latency", "400ms"], check=True)
    started = time.monotonic()
    broken = run_acceptance(tenant, out=lines.append, install=False, timeout=240)
    broken_s = time.monotonic() - started
    print("\n".join(lines))
    print(f"gate: healthy {healthy_s:.0f} s, broken {broken_s:.0f} s")

    assert not broken.passed
    all_nodes = next(t for t in broken.tests if len(t.nodes) == 3)
    assert all_nodes.verdict.failures[0].code == "below_floor"
    assert broken.bisection is not None and broken.bisection.bad == (BROKEN_NODE,)
    assert [d.node for d in broken.drained] == [BROKEN_NODE]
    client = default_client(tenant)
    state, reason = client.node_state(BROKEN_NODE)
    assert "DRAIN" in state and reason.startswith("fmcluster acceptance") and "below_floor" in reason
    assert all("DRAIN" not in client.node_state(n)[0] for n in ("cpu-1", "cpu-3"))

    saved = json.loads((broken.run_dir / "result.json").read_text())  # type: ignore[operator]
    assert saved["passed"] is False and saved["drained"][0]["node"] == BROKEN_NODE
    assert saved["comparison"][0].startswith("compared with run ")
    summary = (broken.run_dir / "summary.md").read_text()  # type: ignore[operator]
    assert "## Drained" in summary and "state=resume" in summary
    assert sorted(p.name for p in broken.run_dir.glob("probe-*.log")) == [  # type: ignore[union-attr]
        "probe-cpu-cpu-1-cpu-2.log", "probe-cpu-cpu-3-cpu-1.log"]

    client.resume(BROKEN_NODE)
    assert "DRAIN" not in client.node_state(BROKEN_NODE)[0]
    assert client.run(["squeue", "-h"]).stdout.strip() == ""
