"""`invoke deploy` runs the whole flow on a local tenant — stacks on the AWS emulator, namespace nodes, push
converge of the controller, ansible-pull on compute nodes, acceptance through Slurm — a second deploy changes
nothing, and `invoke destroy --yes` leaves no namespace, process or runtime file behind."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import venv_tool

ROOT = Path(__file__).resolve().parent.parent
ORG = "flow"
pytestmark = pytest.mark.e2e


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([venv_tool("invoke"), *args], cwd=ROOT, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=1500)


@pytest.fixture
def flow_tenant() -> Iterator[Path]:
    """A copy of the demo tenant on its own subnet, so it never meets a running demo cluster."""
    spec = ROOT / "inventories" / ORG / "group_vars" / "all" / "tenant.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    demo = (ROOT / "inventories" / "demo" / "group_vars" / "all" / "tenant.yml").read_text()
    spec.write_text(demo.replace("org: demo", f"org: {ORG}").replace("10.77.0.0/24", "10.83.0.0/24"))
    try:
        yield spec
    finally:
        invoke("destroy", f"--org={ORG}", "--yes")
        shutil.rmtree(ROOT / "inventories" / ORG, ignore_errors=True)


def leftovers() -> list[str]:
    found = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
             if ns.startswith(f"fmc-{ORG}-")]
    procs = subprocess.run(["pgrep", "-af", f"/fmcluster/{ORG}/|inventories/{ORG}/"], capture_output=True, text=True).stdout
    found += [line for line in procs.splitlines() if "pgrep" not in line]
    if Path(f"/var/lib/fmcluster/{ORG}").exists():
        found.append(f"/var/lib/fmcluster/{ORG}")
    return found


def test_deploy_converges_accepts_then_redeploys_as_a_no_op_and_destroy_leaves_nothing(flow_tenant: Path) -> None:
    first = invoke("deploy", f"--org={ORG}")
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-3000:]
    assert "=== deploy summary: flow (local) ===" in first.stdout
    assert "acceptance passed" in first.stdout
    assert "compute node(s) converged themselves with ansible-pull" in first.stdout
    assert "not created by the AWS emulator" in first.stdout
    assert "Prometheus scrapes all 5 nodes" in first.stdout

    second = invoke("deploy", f"--org={ORG}")
    assert second.returncode == 0, second.stdout[-6000:]
    assert "0 step(s) changed something" in second.stdout, second.stdout[-4000:]
    assert "DRIFT" not in second.stdout

    gone = invoke("destroy", f"--org={ORG}", "--yes")
    assert gone.returncode == 0, gone.stdout[-3000:] + gone.stderr[-2000:]
    assert leftovers() == []
    generated = ROOT / "inventories" / ORG / "generated"
    assert sorted(p.name for p in generated.iterdir()) == ["acceptance"]
