"""End to end: a local tenant's real Slurm cluster with node health, accounting and Slurm metrics.

One cluster for every fault, judged by what Slurm says (sinfo reasons, sacct) and what Prometheus serves:
jobs are recorded by slurmdbd on MariaDB; then three compute nodes break at once — cpu-1's slurmd is killed,
cpu-2 restarts with a munge key different from the controller's, cpu-3 loses its shared file system — and each
is drained with a reason naming its check within about one HealthCheckInterval; repaired, each returns to
service by itself; the jobs from before are still in accounting; the dashboards' Slurm queries return data.

The faults are injected into the local substrate by the helpers below (the only part that knows how the nodes
were converged). Each compute node's "shared file system" is a bind mount of the tenant's shared directory at
<runtime root>/nodes/<node>/fsx, standing in for the FSx mount the boot path adds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest

from fmcluster import cluster, dashboards
from fmcluster.converge import converge
from fmcluster.inventory import write_inventory
from fmcluster.localnodes import LocalNode, load_nodes, nodes_down, nodes_up, runtime_root
from fmcluster.model import Tenant, load_tenant
from localtenant import make_root
from test_localnodes import leftovers, quiet

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]

ORG, SUBNET = "t-health", "10.79.61.0/24"
INTERVAL = 15  # HealthCheckInterval and the controller's pass, seconds
DEADLINE = 2 * INTERVAL + 30  # waiting for a drain: one interval, slack for a loaded 2-core machine
MEASURED: dict[str, float] = {}


def sinfo(tenant: Tenant) -> dict[str, tuple[str, str]]:
    """{node: (state, reason)} as `sinfo -N` shows them (the reason in full)."""
    done = cluster.slurm(tenant, ["sinfo", "--noheader", "--Node", "--format=%N|%T|%E"], timeout=30)
    return {n: (s, r) for n, s, r in (line.split("|", 2) for line in done.stdout.splitlines())}


def wait_for(what: str, test: Callable[[], Any], timeout: float) -> Any:
    started = time.monotonic()
    while True:
        got = test()
        if got:
            MEASURED[what] = round(time.monotonic() - started, 1)
            return got
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(1)


def sacct_jobs(tenant: Tenant) -> dict[str, str]:
    done = cluster.slurm(tenant, ["sacct", "--allusers", "--allocations", "--noheader", "--parsable2",
                                  "--starttime=2020-01-01", "--format=JobID,JobName,State"], timeout=30)
    assert done.returncode == 0, done.stderr
    return {job: f"{name} {state}" for job, name, state in (l.split("|") for l in done.stdout.splitlines())}


def prometheus(address: str, query: str) -> list[dict[str, Any]]:
    url = f"http://{address}:9090/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as response:
        return list(json.load(response)["data"]["result"])


# --- the local substrate: how to break and repair a namespace node --------------------------------------------

def node(tenant: Tenant, name: str) -> LocalNode:
    return next(n for n in load_nodes(tenant.org) if n.name == name)


def fsx(tenant: Tenant, name: str) -> Path:
    return runtime_root(tenant.org) / "nodes" / name / "fsx"


def mount_shared(tenant: Tenant, name: str) -> None:
    shared = runtime_root(tenant.org) / "shared"  # the common role owns it (mode 1777); it may not exist yet
    shared.mkdir(parents=True, exist_ok=True)
    shared.chmod(0o1777)
    fsx(tenant, name).mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(runtime_root(tenant.org) / "shared"), str(fsx(tenant, name))], check=True)


def unmount_shared(tenant: Tenant, name: str) -> None:
    subprocess.run(["umount", str(fsx(tenant, name))], check=False)


def slurmd_pid(tenant: Tenant, name: str) -> int:
    return int((runtime_root(tenant.org) / "slurm" / "run" / f"slurmd-{name}.pid").read_text())


def kill_slurmd(tenant: Tenant, name: str) -> None:
    pid = slurmd_pid(tenant, name)
    os.kill(pid, signal.SIGKILL)
    while Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text():
        time.sleep(0.1)


def start_slurmd(tenant: Tenant, name: str) -> None:
    conf = runtime_root(tenant.org) / "nodes" / name / "etc" / "slurm" / "slurm.conf"
    subprocess.run(["nsenter", f"--net={node(tenant, name).netns_path}", "/usr/sbin/slurmd", "-f", str(conf),
                    "-N", name], check=True)


def break_munge(tenant: Tenant, name: str) -> str:
    """Start a munged with a key of its own in the node and point the node's Slurm at it: the node now signs
    with a key the controller does not have. Returns the original AuthInfo line."""
    base = runtime_root(tenant.org) / "faults" / f"munge-{name}"
    for sub in ("etc", "run", "log", "lib"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "etc" / "munge.key").write_bytes(os.urandom(1024))
    subprocess.run(["chown", "-R", "munge:munge", str(base)], check=True)
    for sub in ("etc", "log", "lib"):
        (base / sub).chmod(0o700)
    (base / "etc" / "munge.key").chmod(0o400)
    subprocess.run(["nsenter", f"--net={node(tenant, name).netns_path}", "runuser", "-u", "munge", "--",
                    "/usr/sbin/munged", f"--socket={base}/run/munge.socket.2", f"--key-file={base}/etc/munge.key",
                    f"--pid-file={base}/run/munged.pid", f"--log-file={base}/log/munged.log",
                    f"--seed-file={base}/lib/munged.seed"], check=True)
    conf = runtime_root(tenant.org) / "nodes" / name / "etc" / "slurm" / "slurm.conf"
    text = conf.read_text()
    original = re.search(r"^AuthInfo=.*$", text, re.M).group(0)  # type: ignore[union-attr]
    conf.write_text(text.replace(original, f"AuthInfo=socket={base}/run/munge.socket.2"))
    kill_slurmd(tenant, name)
    start_slurmd(tenant, name)
    return original


def repair_munge(tenant: Tenant, name: str, original: str) -> None:
    conf = runtime_root(tenant.org) / "nodes" / name / "etc" / "slurm" / "slurm.conf"
    conf.write_text(re.sub(r"^AuthInfo=.*$", original, conf.read_text(), flags=re.M))
    kill_slurmd(tenant, name)
    start_slurmd(tenant, name)
    pidfile = runtime_root(tenant.org) / "faults" / f"munge-{name}" / "run" / "munged.pid"
    os.kill(int(pidfile.read_text()), signal.SIGTERM)


# --- the test ----------------------------------------------------------------------------------------------------

def test_broken_nodes_are_drained_with_the_check_that_caught_them_and_accounting_keeps_every_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    tenant = load_tenant(ORG, make_root(tmp_path, ORG, SUBNET, login=1, queues={"cpu": 3}))
    nodes = nodes_up(tenant, quiet)
    write_inventory(tenant, nodes)
    compute = ["cpu-1", "cpu-2", "cpu-3"]
    mounted: list[str] = []
    started = time.monotonic()
    try:
        for name in compute:
            mount_shared(tenant, name)
            mounted.append(name)
        settings = {"slurm_health_check_interval": INTERVAL, "node_health_interval": INTERVAL,
                    "node_health_mounts": [{"path": "{{ fmcluster_local_root }}/nodes/{{ inventory_hostname }}/fsx",
                                            "fstype": ""}]}
        assert converge(tenant, extra=["-e", json.dumps(settings)]) == 0
        assert converge(tenant, playbook="playbooks/monitoring.yml", extra=["-e", json.dumps(settings)]) == 0
        MEASURED["converge (slurm-cluster + monitoring)"] = round(time.monotonic() - started, 1)

        # Accounting records the jobs.
        job = cluster.slurm(tenant, ["sbatch", "--parsable", "--wait", "-N3", "--job-name=before-faults",
                                     f"--output={runtime_root(ORG)}/shared/job-%j.out", "--wrap", "srun hostname"],
                            timeout=120)
        assert job.returncode == 0, job.stderr
        before = job.stdout.strip()
        assert wait_for("sacct shows the job", lambda: sacct_jobs(tenant).get(before) == "before-faults COMPLETED", 30)
        assert {n: s for n, (s, _) in sinfo(tenant).items()} == {n: "idle" for n in compute}

        # Three faults at once; each node drained by the check that catches it.
        t0 = time.monotonic()
        kill_slurmd(tenant, "cpu-1")
        auth = break_munge(tenant, "cpu-2")
        unmount_shared(tenant, "cpu-3")
        mounted.remove("cpu-3")
        expected = {"cpu-1": "fmcluster-health: slurmd: nothing answers on ", "cpu-2": "fmcluster-health: munge: ",
                    "cpu-3": "fmcluster-health: mounts: "}
        for name, prefix in expected.items():
            reason = wait_for(f"{name} drained", lambda: (lambda s: s[1] if s[0].startswith(("drain", "down"))
                                                          and s[1].startswith(prefix) else "")(
                sinfo(tenant).get(name, ("", ""))), DEADLINE - (time.monotonic() - t0))
            MEASURED[f"{name} drained after (s)"] = round(time.monotonic() - t0, 1)
            print(f"{name}: {reason}")
        reasons = {n: r for n, (_, r) in sinfo(tenant).items()}
        assert reasons["cpu-2"].endswith("the munge key here differs from the controller's")
        assert reasons["cpu-3"] == f"fmcluster-health: mounts: {fsx(tenant, 'cpu-3')} is not mounted"

        # The Slurm metrics carry the drained nodes and their reasons; the dashboard panels' queries answer.
        controller = node(tenant, "controller-1").address
        drained = wait_for("Prometheus shows the drained nodes", lambda: {
            r["metric"]["slurm_node"] for r in prometheus(controller, "slurm_node_unavailable_info == 1")} >= set(compute),
            90)
        assert drained
        for _, title, expr in dashboards.expressions():
            if title.startswith("Slurm nodes"):
                assert prometheus(controller, expr.replace("$node", ".*")), f"panel {title!r} has no data"

        # Repaired, every node comes back by itself; the accounting still has the job from before.
        t1 = time.monotonic()
        mount_shared(tenant, "cpu-3")
        mounted.append("cpu-3")
        repair_munge(tenant, "cpu-2", auth)
        start_slurmd(tenant, "cpu-1")
        wait_for("all nodes back in service", lambda: {s for s, _ in sinfo(tenant).values()} == {"idle"},
                 DEADLINE + 60)
        MEASURED["all back after (s)"] = round(time.monotonic() - t1, 1)
        after = cluster.slurm(tenant, ["sbatch", "--parsable", "--wait", "-N3", "--job-name=after-repair",
                                       f"--output={runtime_root(ORG)}/shared/job-%j.out", "--wrap", "srun hostname"],
                              timeout=120)
        assert after.returncode == 0, after.stderr
        jobs = wait_for("sacct shows both jobs", lambda: (lambda j: j if after.stdout.strip() in j else {})(
            sacct_jobs(tenant)), 30)
        assert jobs[before] == "before-faults COMPLETED" and jobs[after.stdout.strip()] == "after-repair COMPLETED"
    finally:
        for name in mounted:
            unmount_shared(tenant, name)
        known = load_nodes(ORG)
        nodes_down(tenant, quiet)
        MEASURED["total (s)"] = round(time.monotonic() - started, 1)
        print("measured:", json.dumps(MEASURED))
    assert leftovers(tenant, known) == []
