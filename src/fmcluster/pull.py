"""Compute nodes converge themselves with ansible-pull (scripts/node-converge.sh), as EC2 user data and
HyperPod lifecycle scripts do on AWS. Locally the tenant repository is served by a real `git daemon` on the
tenant bridge's address, and each namespace node runs the same script its user data would run."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fmcluster.model import Tenant
from fmcluster.paths import generated_dir, repo_root

PULL_PLAYBOOK = "playbooks/site.yml"
GIT_PORT = 9418

Out = Callable[[str], object]


@dataclass(frozen=True)
class PullReport:
    node: str
    rc: int
    changed: int | None
    failed: int | None
    drift: bool
    seconds: float
    log: str

    def render(self) -> str:
        state = "ok" if self.rc == 0 else f"FAILED (rc {self.rc})"
        drift = ", DRIFT: a re-converge changed something" if self.drift else ""
        return f"{self.node}: {state}, changed={self.changed}{drift} in {self.seconds:.1f}s (log {self.log})"


def pinned_ref(root: Path | None = None) -> tuple[str, bool]:
    """The commit nodes converge to, and whether the work tree has changes ansible-pull will not see."""
    top = root or repo_root()
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=top, capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=top,
                           capture_output=True, text=True, check=True).stdout.strip()
    return sha, bool(dirty)


def report_dir(org: str) -> Path:
    """Where nodes leave their status files for the controller (shared storage on AWS)."""
    return generated_dir(org) / "pull"


@contextmanager
def served_repository(tenant: Tenant) -> Iterator[str]:
    """Serve this checkout read-only over git:// on the tenant bridge's address; yield the clone URL."""
    from fmcluster.localnodes import bridge_address, runtime_root

    top = repo_root()
    address = str(bridge_address(tenant).ip)
    pidfile = runtime_root(tenant.org) / "git-daemon.pid"
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        ["git", "daemon", "--reuseaddr", f"--listen={address}", f"--port={GIT_PORT}", f"--base-path={top.parent}",
         "--export-all", f"--pid-file={pidfile}", str(top)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(address, GIT_PORT, proc)
        yield f"git://{address}:{GIT_PORT}/{top.name}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        pidfile.unlink(missing_ok=True)


def _wait_for_port(address: str, port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"git daemon exited with {proc.returncode} before listening on {address}:{port}")
        with socket.socket() as sock:
            if sock.connect_ex((address, port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"git daemon did not listen on {address}:{port} within {timeout:.0f}s")


def _node_env(tenant: Tenant, node: str, url: str, ref: str) -> dict[str, str]:
    from fmcluster.localnodes import runtime_root

    venv = repo_root() / ".venv"
    return {
        "PATH": f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "FMCLUSTER_REPO_URL": url,
        "FMCLUSTER_REF": ref,
        "FMCLUSTER_NODE": node,
        # What a node needs of the deploy, as the deploy publishes it (to the tenant bucket on AWS).
        "FMCLUSTER_INVENTORY": " ".join(str(generated_dir(tenant.org) / f) for f in ("hosts.yml", "stack_outputs.yml")),
        "FMCLUSTER_PLAYBOOK": PULL_PLAYBOOK,
        "FMCLUSTER_STATE_DIR": str(runtime_root(tenant.org)),
        "FMCLUSTER_REPORT_DIR": str(report_dir(tenant.org)),
        "FMCLUSTER_VENV": str(venv),
    }


def _pull_one(tenant: Tenant, node: str, url: str, ref: str) -> PullReport:
    from fmcluster.localnodes import run_on_node

    started = time.monotonic()
    script = str(repo_root() / "scripts" / "node-converge.sh")
    # Only the variables user data would set: the node's own environment, not the deploy machine's.
    result = run_on_node(tenant, node, ["env", "-i", *[f"{k}={v}" for k, v in _node_env(tenant, node, url, ref).items()],
                                        "bash", script], timeout=1800)
    seconds = time.monotonic() - started
    status_file = report_dir(tenant.org) / f"{node}.json"
    try:
        status = json.loads(status_file.read_text())
    except (OSError, ValueError):
        return PullReport(node, result.returncode or 1, None, None, False, seconds,
                          f"(no status file; output: {(result.stdout + result.stderr)[-300:]!r})")
    return PullReport(node, int(status["rc"]), status.get("changed"), status.get("failed"), bool(status.get("drift")),
                      seconds, str(status.get("log", "")))


def pull_converge(tenant: Tenant, nodes: Sequence[str], out: Out = print, parallel: int = 4) -> list[PullReport]:
    """Run ansible-pull on every node in `nodes` (at most `parallel` at once); print each as it finishes."""
    ref, dirty = pinned_ref()
    if dirty:
        out(f"    note: the work tree has uncommitted changes; nodes converge to the committed {ref[:12]} only")
    reports: list[PullReport] = []
    with served_repository(tenant) as url:
        out(f"    serving {url} at {ref[:12]}; {len(nodes)} node(s) run ansible-pull")
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            futures = {pool.submit(_pull_one, tenant, node, url, ref): node for node in nodes}
            for future in as_completed(futures):
                report = future.result()
                reports.append(report)
                out(f"    {report.render()}")
    return sorted(reports, key=lambda r: r.node)
