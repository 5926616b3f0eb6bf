"""The whole flow for real, on one local cluster: `invoke deploy` as an AWS tenant gets it, on the local substrate.

One tenant (org `e2e`, VPC 10.83.0.0/16) is deployed once for the module and then grown, shrunk, broken and
mended, in order:
- the cold deploy builds the cluster with no Ansible run from this machine: every node converges itself from
  its user data and reports; the summary shows each node's report; secrets never reach the repository, the
  generated inventory or a log;
- a second deploy changes nothing; a node's own re-converge changes nothing; --check shows nothing to do;
- Slurm runs jobs across the nodes; a compute node added (3 → 4) joins without the other compute nodes
  converging again, and one removed (4 → 3) leaves Slurm and Prometheus;
- a node that cannot read the manifest reports what it could not reach, and the deploy lists it at once instead
  of waiting; then, killed in the middle of its own converge, it comes back with `invoke nodes-up`;
- a throttled node fails the acceptance gate, which bisects and drains it;
- a second user logs in to the login node over ssh with his own key and writes in his home (root's home root);
  a user's processes on the login node read none of the tenant's secrets and reach neither Prometheus's
  lifecycle nor Grafana's admin; a user's `~/.ssh` linked to /etc changes nothing there at a converge;
- two users of two teams (the demo tenant's) have the same UID on every node and on their homes, run jobs
  charged to their team's account, are refused a job over their QoS's CPU cap, and `invoke usage` reports their
  hours as sacct has them;
- sacct lists the acceptance jobs; a killed slurmd, a wrong munge key and a lost shared file system each drain
  their node with the reason of the health check that caught it, the Slurm panels answer from Prometheus, and
  the repaired nodes return by themselves with no job lost from accounting (docs/health.md);
- a drained node is listed by `invoke nodes` and replaced by `invoke replace`: its Auto Scaling group's new
  instance joins through the boot path and passes health and a job, with the users' UIDs unchanged;
- the controller's repair agent (paused by its pause file for the manual flows above, as for a person's
  maintenance) repairs nothing when half the compute nodes fail at once (breaker, alert fired); a node halted
  hard while running a requeue-able job is replaced by it through the controller's own instance role, the new
  instance booted by the substrate's hypervisor stand-in, while Slurm requeues the job, which resumes from its
  checkpoint and completes; a queue that needs one replacement more than its budget is quarantined (nothing
  replaced, the alert fired);
- `invoke destroy --yes` leaves no namespace, mount, process or substrate directory behind.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, venv_tool
from localtenant import clear_previous_run

pytestmark = pytest.mark.e2e
ORG = "e2e"
VPC = "10.91.0.0/16"
SPEC = ROOT / "inventories" / ORG / "group_vars" / "all" / "tenant.yml"
BOB_KEY = ROOT / "inventories" / ORG / "bob_ed25519"


def invoke(*args: str, env: dict[str, str] | None = None, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([venv_tool("invoke"), *args, f"--org={ORG}"], cwd=ROOT, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, env={**os.environ, **(env or {})})


def set_compute_count(count: int) -> None:
    SPEC.write_text(re.sub(r"(\n    - name: cpu\n      instance_type: c5\.2xlarge\n      count: )\d+",
                           rf"\g<1>{count}", SPEC.read_text()))


def descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


class AnsibleWatch:
    """Samples the process table while a deploy runs: any ansible-playbook or ansible-pull started by the deploy
    in this machine's own mount namespace would be the deploy machine pushing configuration (the hosts' run in
    their own). Processes of anything else on the machine are not the deploy's and are ignored."""

    def __init__(self, deploy_pid: int) -> None:
        self.deploy_pid = deploy_pid
        self.own_ns = os.readlink("/proc/self/ns/mnt")
        self.here: set[str] = set()
        self.in_hosts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    if not re.search(r"ansible-(playbook|pull)\b", cmdline):
                        continue
                    ns = os.readlink(proc / "ns" / "mnt")
                except OSError:
                    continue
                if ns == self.own_ns and descends_from(int(proc.name), self.deploy_pid):
                    self.here.add(cmdline[:200])
                else:
                    self.in_hosts += 1
            time.sleep(1.0)  # ansible-pull and ansible-playbook runs last minutes: a scan a second sees them

    def __enter__(self) -> AnsibleWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Cluster:
    first: subprocess.CompletedProcess[str]
    #: `invoke image` before the first deploy: the tenant's cpu image every node of the tier boots (issue 40), and
    #: `invoke image --check` of it (a host booted from it runs the install steps).
    image: subprocess.CompletedProcess[str]
    image_check: subprocess.CompletedProcess[str]
    ansible_here: set[str]
    ansible_in_hosts: int
    notes: list[str] = field(default_factory=list)


def leftovers() -> list[str]:
    found = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
             if ns.startswith(f"fmc-{ORG}-")]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [line.split()[4] for line in mounts.splitlines() if f"fmcluster-substrate/{ORG}" in line]
    if Path(f"/var/lib/fmcluster-substrate/{ORG}").exists():
        found.append(f"/var/lib/fmcluster-substrate/{ORG}")
    if subprocess.run(["ip", "link", "show", f"fmcbr-{ORG}"], capture_output=True).returncode == 0:
        found.append(f"bridge fmcbr-{ORG}")
    for proc in Path("/proc").iterdir():  # the hypervisor stand-in (fmcluster.providers.local.hypervisor_daemon)
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if b"fmcluster.providers.local.hypervisor_daemon" in argv and f"--org={ORG}".encode() in argv:
            found.append(f"hypervisor daemon pid {proc.name}")
    return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("local hosts need root (namespaces, mounts)")
    SPEC.parent.mkdir(parents=True, exist_ok=True)
    demo = (ROOT / "inventories" / "demo" / "group_vars" / "all" / "tenant.yml").read_text()
    spec = demo.replace("org: demo", f"org: {ORG}").replace("10.77.0.0/16", VPC)
    # bob logs in with his own key (a person's, not the operator's): the e2e tenant lists its public half.
    BOB_KEY.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bob@e2e", "-f", str(BOB_KEY)], check=True)
    bob = "      teams: [vision, llm]\n"
    assert bob in spec, "the demo tenant's bob changed: update the e2e spec"
    spec = spec.replace(bob, bob + f"      ssh_keys: [{json.dumps(BOB_KEY.with_suffix('.pub').read_text().strip())}]\n", 1)
    SPEC.write_text(spec.replace("    grafana: true\n", "    grafana: true\n    alert_receivers:\n      - name: e2e-oncall\n"
                                 "        type: email\n        target: oncall@example.org\n"))
    clear_previous_run(ORG)
    try:
        # The tier deploys from the tenant's baked image (issue 40): first boots (the deploy's five, each join,
        # replacement and repair) only configure. The pristine path is the README's demo, tests/test_node_boot.py
        # and the stand-ins' clusters.
        image = invoke("image", timeout=1800)
        image_check = invoke("image", "--check", timeout=1800)
        deploy = subprocess.Popen([venv_tool("invoke"), "deploy", f"--org={ORG}"], cwd=ROOT, text=True,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with AnsibleWatch(deploy.pid) as watch:
            stdout, stderr = deploy.communicate(timeout=2400)
        first = subprocess.CompletedProcess(deploy.args, deploy.returncode, stdout, stderr)
        if first.returncode == 0:  # the manual flows first; the repair agent's own tests lift the pause
            pause_repair_agent("e2e: manual flows (tests/test_cluster_e2e.py)")
        yield Cluster(first, image, image_check, watch.here, watch.in_hosts)
    finally:
        from fmcluster.providers.local.layers import baked_root

        invoke("destroy", "--yes")
        shutil.rmtree(ROOT / "inventories" / ORG, ignore_errors=True)
        shutil.rmtree(baked_root(ORG), ignore_errors=True)


def nodes_of(output: str) -> dict[str, str]:
    """name → role from the summary's converge lines (`ip-… (compute, cpu, 10.83.128.6): converged …`)."""
    return dict(re.findall(r"(ip-[\d-]+) \((controller|login|compute)", output))


def reports(*_: object) -> dict[str, dict[str, object]]:
    """Each node's last report, as the bucket holds them (read through the emulator like `invoke status`)."""
    from fmcluster.inventory import read_nodes
    from fmcluster.model import load_tenant
    from fmcluster.providers.registry import provider_for
    from fmcluster.reports import read_report
    from fmcluster.stacks import aws
    from fmcluster.stacks.outputs import read_stack_outputs

    tenant = load_tenant(ORG)
    endpoint = provider_for(tenant).endpoint(False, print)
    s3 = aws.client("s3", tenant.region, endpoint)
    bucket = read_stack_outputs(ORG)["DataBucketName"]
    return {n.name: read_report(s3, bucket, n.instance_id) or {} for n in read_nodes(ORG)}


def slurm(cmd: str) -> subprocess.CompletedProcess[str]:
    return invoke("slurm", f"--cmd={cmd}", timeout=300)


def as_operator(name: str, command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`command` on node `name` as the operator runs it: ssh as the image's default user, no sudo."""
    return invoke("slurm", f"--cmd={command}", f"--node={name}", timeout=timeout)


def on_node(name: str, command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`command` on node `name` as root: the operator's ssh, then sudo (faults and what only root reads)."""
    return as_operator(name, f"sudo -n bash -c {shlex.quote(command)}", timeout)


def test_the_first_deploy_builds_the_cluster_with_every_node_converging_itself(cluster: Cluster) -> None:
    out = cluster.first.stdout
    assert cluster.first.returncode == 0, out[-8000:] + cluster.first.stderr[-3000:]
    assert "=== deploy summary: e2e (local, slurm-ec2) ===" in out
    assert cluster.ansible_here == set(), f"the deploy machine ran Ansible itself: {cluster.ansible_here}"
    assert cluster.ansible_in_hosts > 0, "no node ran ansible-pull while the deploy waited"
    roles = nodes_of(out)
    assert sorted(roles.values()) == ["compute", "compute", "compute", "controller", "login"]
    assert re.search(r"5/5 nodes converged themselves, 5 during this run", out)
    assert len(re.findall(r"\): converged [0-9a-f]{12} in [\d.]+s, changed=\d+", out)) == 5
    assert "Prometheus scrapes exactly the 5 current nodes" in out
    assert "acceptance passed" in out
    # Issue 39: the gate's CPU jobs ran fmcluster's bench from its image in the VPC's registry, as users' jobs run.
    assert "acceptance image: fmcluster's CPU bench " in out, out[-8000:]
    logs = on_node(compute_nodes()[0], "grep -rlE '^# fmcluster acceptance job: [a-z_]+_perf in "
                   "[0-9.]+:5000/fmcluster/cpu-bench:' /fsx/fmcluster/acceptance", timeout=60)
    assert logs.returncode == 0 and logs.stdout.split(), logs.stdout + logs.stderr
    assert "not created by the AWS emulator" in out and "bound at /fsx on every host" in out
    assert "2 secret(s) created" in out and "published commit" in out
    # No node has a public address here: every node-facing step went through the (stood-in) Session Manager channel.
    assert "reaching the nodes through a Session Manager session" in out and "channel is stood in" in out


def in_host(host: Any, command: str) -> str:
    from fmcluster.providers.local.hosts import host_run

    done = host_run(host, ["bash", "-c", command], timeout=120)
    assert done.returncode == 0, f"{host.hostname}: {command}: {done.stderr}"
    return done.stdout


def test_every_node_booted_the_tenant_s_baked_image_and_installed_nothing_at_first_boot(cluster: Cluster) -> None:
    """Issue 40: `invoke image` baked the tenant's cpu image from the pristine one, and every node booted it and
    installed nothing at first boot. Lend nothing: each node's root is an overlay of the baked layer over the pristine
    image alone, no path of this machine is mounted in it (but the FSx stand-in), its toolchain came from the
    bundle's wheelhouse and its Slurm, munge and Prometheus from the builder's apt run through the VPC's package
    source."""
    from fmcluster import versions
    from fmcluster.baked import BUILDER_NAME
    from fmcluster.providers.local.hosts import host_run, load_hosts
    from fmcluster.providers.local.image import image_dir
    from fmcluster.providers.local.layers import record_path

    assert cluster.image.returncode == 0, cluster.image.stdout[-4000:] + cluster.image.stderr[-3000:]
    assert re.search(r"image: baked cpu image [0-9a-f]{12} of 'e2e'", cluster.image.stdout), cluster.image.stdout
    assert cluster.first.returncode == 0
    rootfs = image_dir() / "rootfs"
    for absent in ("usr/sbin/slurmd", "usr/sbin/slurmctld", "usr/sbin/munged", "usr/bin/prometheus", "usr/bin/git",
                   "usr/local/bin/aws", "usr/bin/aws", "opt/fmcluster"):
        assert not (rootfs / absent).exists(), f"the pristine image carries {absent}"
    record = json.loads(record_path(ORG, "cpu").read_text())
    layer = Path(record["layer"]) / "rootfs"
    assert (layer / "usr/sbin/slurmd").is_file(), layer  # an install task's package
    assert (layer / "usr/share/fmcluster/image.json").is_file(), "the baked image's marker"
    for gone in ("etc/munge/munge.key", "var/lib/fmcluster", "etc/fmcluster", "etc/cloud/cloud-init.disabled",
                 "usr/sbin/policy-rc.d", "var/log/dpkg.log"):
        assert not (layer / gone).exists(), f"baked: {gone}"
    assert not list((layer / "etc/ssh").glob("ssh_host_*")), "baked: the builder's ssh host keys"
    # `invoke image --check`: a host booted from the image ran the install steps, and they installed nothing.
    check = cluster.image_check
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-3000:]
    assert re.search(rf"a host booted from baked {record['digest']}.* nothing installed by them", check.stdout), check.stdout
    wanted = {"controller": ("slurmctld", "munge", "prometheus", "slurmdbd"), "login": ("slurm-client", "munge"),
              "compute": ("slurmd", "munge")}
    roles = {n: r for n, r in nodes_of(cluster.first.stdout).items()}
    pins = versions.load()["node_toolchain"]
    hosts = load_hosts(ORG)
    assert BUILDER_NAME not in {h.hostname for h in hosts}, "the builder host was left"
    for host in hosts:
        mounts = in_host(host, "cat /proc/self/mountinfo")
        root = next(line for line in mounts.splitlines() if line.split()[4] == "/")
        assert f"lowerdir={layer}:{rootfs}" in root, root
        targets = {line.split()[4] for line in mounts.splitlines()}
        for path in (str(ROOT), str(ROOT / ".venv"), "/root/.pyenv", "/opt/fmcluster/venv"):
            assert path not in targets, f"{host.hostname}: {path} of this machine is mounted in the node"
        assert in_host(host, "command -v aws || echo none").strip() == "none"
        venv = in_host(host, "readlink /opt/fmcluster/venv").strip()
        assert venv.startswith("/opt/fmcluster/venv-"), venv
        wheels = set(in_host(host, "ls /opt/fmcluster/bootstrap/wheelhouse").split())
        installed = in_host(host, f"ls {venv}/lib/python3*/site-packages | grep dist-info$").split()
        for dist in installed:  # every distribution in the venv is a wheel of the bundle's wheelhouse
            name, version = dist.removesuffix(".dist-info").rsplit("-", 1)
            assert any(w.lower().startswith(f"{name.lower()}-{version}-") for w in wheels), f"{host.hostname}: {dist}"
        assert f"ansible_core-{pins['ansible-core']}.dist-info" in installed
        history = in_host(host, "cat /var/log/apt/history.log 2>/dev/null || true")
        for package in wanted[roles[host.hostname]]:
            assert in_host(host, f"dpkg-query -W -f='${{Status}}' {package}") == "install ok installed", package
        assert "Install:" not in history, f"{host.hostname} installed at first boot: {history[-2000:]}"
        # An unprivileged user reads neither the munge key nor the node's credentials, and IMDS is root's only.
        for secret in ("/etc/fmcluster/secrets/munge-key", "/etc/munge/munge.key", "/etc/fmcluster/node.env"):
            denied = host_run(host, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", secret])
            assert denied.returncode != 0 and "Permission denied" in denied.stderr, (host.hostname, secret)
        assert "-A OUTPUT -d 169.254.169.254/32 -j FMCLUSTER-IMDS" in in_host(host, "iptables -S"), host.hostname
        # Slurm's and munge's accounts have the same ids on every node (slurmd refuses RPCs from another uid).
        assert in_host(host, "id -u slurm; id -u munge").split() == ["401", "402"], host.hostname
        proxy = in_host(host, "cat /etc/apt/apt.conf.d/90fmcluster-vpc-package-source")
        assert re.search(r'Acquire::http::Proxy "http://10\.91\.128\.1:3142/";', proxy)
    # Every report carries the first boot's stage times, and the summary prints them.
    for name, report in reports().items():
        stages = report.get("boot_stages") or {}
        assert set(stages) >= {"fetch", "packages", "toolchain", "commit", "converge"}, (name, stages)
    assert len(re.findall(r"first boot \d+s: fetch [\d.]+s, packages [\d.]+s, toolchain [\d.]+s", cluster.first.stdout)) == 5
    assert len(re.findall(r"; image baked [0-9a-f]{12} \(cpu, commit [0-9a-f]{12}\), nothing installed at first boot",
                          cluster.first.stdout)) == 5, cluster.first.stdout[-6000:]


def test_each_node_is_a_booted_instance_the_operator_reaches_as_the_default_user(cluster: Cluster) -> None:
    """Issue 35: a local node is the machine AWS boots, minus the hardware. Its PID 1 is systemd and it sees only its
    own processes; its daemons are systemd units; cloud-init read it from its metadata service; the operator
    reaches it as the image's default user (sudo for root); an unprivileged account gets no IMDS token; and
    killing slurmd on one node kills no other node's."""
    roles = nodes_of(cluster.first.stdout)
    units = {"controller": ("fmcluster-munged", "fmcluster-slurmctld"), "login": ("fmcluster-munged",),
             "compute": ("fmcluster-munged", "fmcluster-slurmd")}
    token = ("curl -s -m 3 -o /dev/null -w '%{http_code}' -X PUT http://169.254.169.254/latest/api/token "
             "-H 'X-aws-ec2-metadata-token-ttl-seconds: 60'")
    for name, role in roles.items():
        seen = as_operator(name, "whoami; ps -o comm= -p 1; ps -e -o comm= | sort | uniq -c | sort -rn | head -n 40; "
                                 f"cloud-init status; systemctl is-active {' '.join(units[role])}; "
                                 f"{token} || echo refused", timeout=120)
        assert seen.returncode == 0, f"{name}: {seen.stdout}{seen.stderr}"
        lines = seen.stdout.split("\n")
        assert lines[:2] == ["debian", "systemd"], (name, lines[:2])
        counts = {comm: int(n) for n, comm in (line.split() for line in lines[2:] if re.fullmatch(r"\s*\d+ \S+", line))}
        assert counts.get("slurmd", 0) <= 1 and counts.get("munged", 0) == 1, (name, counts)
        assert "systemd-nspawn" not in counts and "pytest" not in counts, (name, counts)
        assert "status: done" in seen.stdout, (name, seen.stdout)
        assert seen.stdout.count("\nactive") == len(units[role]), (name, seen.stdout)
        assert seen.stdout.rstrip().endswith("refused"), f"{name}: the operator's account reached IMDS: {seen.stdout}"
        assert "200" in on_node(name, token, timeout=60).stdout, f"{name}: root must reach IMDS"
    compute = sorted(n for n, r in roles.items() if r == "compute")
    assert on_node(compute[0], "pkill -KILL -x slurmd").returncode == 0
    for other in compute[1:]:
        assert on_node(other, "pgrep -x slurmd").returncode == 0, f"killing slurmd on {compute[0]} killed {other}'s"
    # The node's systemd starts the daemon it lost again (Restart=always), as on an instance.
    wait_for("slurmd restarted by systemd", lambda: on_node(compute[0], "pgrep -x slurmd", 60).returncode == 0, 60)
    wait_for(f"{compute[0]} idle again", lambda: node_states().get(compute[0], ("", ""))[0] == "idle", 120)


def test_secrets_reach_neither_the_repository_nor_the_inventory_nor_any_log(cluster: Cluster) -> None:
    from fmcluster.model import load_tenant
    from fmcluster.providers.registry import provider_for
    from fmcluster.stacks import aws

    tenant = load_tenant(ORG)
    endpoint = provider_for(tenant).endpoint(False, print)
    sm = aws.client("secretsmanager", tenant.region, endpoint)
    munge = sm.get_secret_value(SecretId=f"fmcluster/{ORG}/munge-key")["SecretString"]
    assert len(munge) >= 32
    places = [ROOT / "inventories" / ORG, Path(f"/var/lib/fmcluster-substrate/{ORG}/layers")]
    hits = subprocess.run(["grep", "-rlF", munge[:48], *map(str, places), "--exclude=munge-key", "--exclude=munge.key"],
                          capture_output=True, text=True).stdout.split()
    assert hits == [], f"the munge key appears in {hits}"
    tracked = subprocess.run(["git", "grep", "-lF", munge[:48]], cwd=ROOT, capture_output=True, text=True).stdout
    assert tracked == ""
    assert munge[:48] not in cluster.first.stdout + cluster.first.stderr
    for report in reports().values():
        assert munge[:48] not in json.dumps(report)


def test_a_second_deploy_changes_nothing(cluster: Cluster) -> None:
    started = time.monotonic()
    again = invoke("deploy")
    seconds = time.monotonic() - started
    assert again.returncode == 0, again.stdout[-6000:]
    assert "0 step(s) changed something" in again.stdout, again.stdout[-4000:]
    assert "0 during this run" in again.stdout and "not re-run: the cluster is unchanged" in again.stdout
    print(f"warm no-op deploy: {seconds:.1f}s")


def controller_api(path: str, data: Any = None, port: int = 9090) -> Any:
    """Prometheus/Alertmanager HTTP API on the controller, asked from the controller itself (over ssh)."""
    import base64

    name = next(n for n, r in reports().items() if r.get("role") == "controller")
    body = "None" if data is None else repr(json.dumps(data).encode())
    code = (f"import urllib.request,sys\nr = urllib.request.Request('http://127.0.0.1:{port}{path}', data={body}, "
            "headers={'Content-Type': 'application/json'})\nsys.stdout.write(urllib.request.urlopen(r, timeout=10).read().decode())\n")
    done = on_node(name, f"echo {base64.b64encode(code.encode()).decode()} | base64 -d | python3", timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def test_alert_rules_are_loaded_silent_and_alerts_are_routed_to_the_tenant_s_receiver(cluster: Cluster) -> None:
    groups = controller_api("/api/v1/rules")["data"]["groups"]
    assert {g["name"] for g in groups} >= {"fmcluster-gpu"}
    firing = [a["labels"]["alertname"] for a in controller_api("/api/v1/alerts")["data"]["alerts"]
              if a["state"] == "firing"]
    assert firing == [], f"alerts firing on a healthy cluster: {firing}"
    managers = controller_api("/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
    assert [m["url"] for m in managers] == ["http://127.0.0.1:9093/api/v2/alerts"]
    controller_api("/api/v2/alerts", [{"labels": {"alertname": "FmcE2eProbe", "severity": "info"},
                                       "annotations": {"summary": "end-to-end probe"}}], port=9093)
    routed = [a for a in controller_api("/api/v2/alerts", port=9093) if a["labels"]["alertname"] == "FmcE2eProbe"]
    assert [r["name"] for r in routed[0]["receivers"]] == ["e2e-oncall"]


#: alice points her ~/.ssh on the shared home at /etc (issue 42); root's converge must change nothing there.
PLANT_LINK = ("runuser -u alice -- bash -c 'cd /fsx/home/alice && { [ ! -e .ssh ] || mv .ssh .ssh.e2e-keep; } && "
              "ln -s /etc .ssh' && echo canary > /etc/authorized_keys && stat -c '%U %G %a' /etc")
UNPLANT_LINK = ("rm -f /etc/authorized_keys; runuser -u alice -- bash -c 'cd /fsx/home/alice && rm .ssh && "
                "{ [ ! -e .ssh.e2e-keep ] || mv .ssh.e2e-keep .ssh; }'")


def test_a_node_s_own_converge_changes_nothing_and_check_mode_finds_nothing_to_do(cluster: Cluster) -> None:
    """A node's own converge of the same commit changes nothing — even with a user's `~/.ssh` linked to /etc on
    the shared home (issue 42): root follows no link the user controls, so /etc and its files stay as they were."""
    name = next(n for n, role in nodes_of(cluster.first.stdout).items() if role == "compute")
    planted = on_node(name, PLANT_LINK)
    assert planted.returncode == 0 and planted.stdout.split() == ["root", "root", "755"], planted.stdout + planted.stderr
    try:
        again = on_node(name, "set -a; . /etc/fmcluster/node.env; PYTHONPATH=/var/lib/fmcluster/agent/src "
                              "/opt/fmcluster/venv/bin/python -m fmcluster.node converge --trigger idempotence-check")
        etc = on_node(name, "stat -c '%U %G %a' /etc && cat /etc/authorized_keys")
        assert etc.stdout.split() == ["root", "root", "755", "canary"], f"the converge followed ~/.ssh: {etc.stdout}"
    finally:
        assert on_node(name, UNPLANT_LINK).returncode == 0
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    report = reports()[name]
    assert report["trigger"] == "idempotence-check" and report["ok"] is True and report["changed"] == 0, report
    check = on_node(name, "cd /var/lib/fmcluster/pull && ANSIBLE_INVENTORY=/var/lib/fmcluster/inventory/hosts.yml "
                          f"/opt/fmcluster/venv/bin/ansible-playbook -c local -l {name} --check --diff "
                          "-e ansible_python_interpreter=/opt/fmcluster/venv/bin/python playbooks/site.yml")
    assert check.returncode == 0, check.stdout[-4000:]
    assert re.search(rf"{name}\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", check.stdout), check.stdout[-2000:]


def test_jobs_run_across_every_compute_node(cluster: Cluster) -> None:
    done = slurm("srun -N3 hostname")
    assert done.returncode == 0, done.stderr
    compute = sorted(n for n, role in nodes_of(cluster.first.stdout).items() if role == "compute")
    assert sorted(done.stdout.split()) == compute


def test_a_compute_node_added_joins_without_the_others_converging_again(cluster: Cluster) -> None:
    before = reports()
    set_compute_count(4)
    grown = invoke("deploy")
    assert grown.returncode == 0, grown.stdout[-6000:]
    assert re.search(r"6 instance\(s\); 1 booted, 0 removed, 5 already running", grown.stdout)
    after = reports()
    new = sorted(set(after) - set(before))
    assert len(new) == 1 and after[new[0]]["trigger"] == "first-boot"
    for name, report in before.items():
        if report["role"] == "compute":  # configless slurmd: nothing on the other compute nodes changes
            assert after[name]["finished"] == report["finished"], name
        else:  # the controller and login nodes rewrite only what membership changes (playbooks/membership.yml)
            assert after[name]["playbook"] == "playbooks/membership.yml", after[name]
            assert any("in the checkout of" in note for note in after[name]["notes"]), after[name]["notes"]
            assert after[name]["slowest_tasks"], after[name]
            MEASURED[f"join_membership_pass_{report['role']}_s"] = after[name]["seconds"]
            MEASURED[f"join_membership_pass_{report['role']}_slowest"] = after[name]["slowest_tasks"][:4]
    print("measured:", json.dumps(MEASURED))
    assert "Prometheus scrapes exactly the 6 current nodes" in grown.stdout
    done = slurm("srun -N4 hostname")
    assert done.returncode == 0 and new[0] in done.stdout.split(), done.stdout + done.stderr


def test_a_compute_node_removed_leaves_slurm_and_prometheus(cluster: Cluster) -> None:
    set_compute_count(3)
    shrunk = invoke("deploy")
    assert shrunk.returncode == 0, shrunk.stdout[-6000:]
    assert re.search(r"5 instance\(s\); 0 booted, 1 removed", shrunk.stdout)
    assert "Prometheus scrapes exactly the 5 current nodes" in shrunk.stdout
    listed = slurm("sinfo -h -N -o %N").stdout.split()
    assert len(listed) == 3 and set(listed) <= set(reports())
    controller = next(r for r in reports().values() if r["role"] == "controller")
    assert controller["playbook"] == "playbooks/membership.yml", controller
    MEASURED["leave_membership_pass_controller_s"] = controller["seconds"]


def test_a_node_that_cannot_read_the_manifest_reports_it_and_killed_while_converging_comes_back_with_nodes_up(
        cluster: Cluster) -> None:
    from fmcluster.model import load_tenant
    from fmcluster.providers.registry import provider_for
    from fmcluster.stacks import aws
    from fmcluster.stacks.outputs import read_stack_outputs

    tenant = load_tenant(ORG)
    s3 = aws.client("s3", tenant.region, provider_for(tenant).endpoint(False, print))
    bucket = read_stack_outputs(ORG)["DataBucketName"]
    name = sorted(n for n, r in reports().items() if r.get("role") == "compute")[-1]
    manifest = s3.get_object(Bucket=bucket, Key="fmcluster/manifest/cluster.json")["Body"].read()
    s3.delete_object(Bucket=bucket, Key="fmcluster/manifest/cluster.json")
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        assert invoke("halt", f"--node={name}").returncode == 0
        assert invoke("nodes-up", env={"FMCLUSTER_FETCH_TRIES": "2"}).returncode == 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and str(reports()[name].get("started", "")) < since:
            time.sleep(2)
        report = reports()[name]
        assert report["ok"] is False and report["stage"] == "manifest", report
        assert "fmcluster/manifest/cluster.json" in str(report["error"]) and "after 2 tries" in str(report["error"])
        status = invoke("status")
        assert f"{name} (compute" in status.stdout and "FAILED at manifest" in status.stdout, status.stdout
    finally:
        s3.put_object(Bucket=bucket, Key="fmcluster/manifest/cluster.json", Body=manifest)
    started = time.monotonic()
    listed = invoke("deploy")
    assert listed.returncode != 0 and "FAILED at manifest" in listed.stdout
    assert time.monotonic() - started < 120, "the deploy waited for a node that had already failed"
    # The manifest back, the node converges on its own; killed while it converges (its host halted), it comes
    # back with `invoke nodes-up` alone: a whole first boot, nobody else converging again. Its failed report
    # stands until the new boot files its own.
    before = {n: r["finished"] for n, r in reports().items() if n != name and r.get("role") == "compute"}
    on_node(name, "set -a; . /etc/fmcluster/node.env; PYTHONPATH=/var/lib/fmcluster/agent/src nohup "
                  "/opt/fmcluster/venv/bin/python -m fmcluster.node converge --trigger killed >/dev/null 2>&1 &")
    time.sleep(3)
    killed = datetime.now(timezone.utc).isoformat(timespec="seconds")
    assert invoke("halt", f"--node={name}").returncode == 0
    up = invoke("nodes-up")
    assert up.returncode == 0 and f"host {name} " in up.stdout, up.stdout
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (str(reports()[name].get("started", "")) >= killed
                                               and reports()[name].get("ok")):
        time.sleep(2)
    after = reports()
    assert after[name]["trigger"] == "first-boot" and after[name]["ok"] is True, after[name]
    assert {n: r["finished"] for n, r in after.items() if n != name and r.get("role") == "compute"} == before
    mended = invoke("deploy")
    assert mended.returncode == 0, mended.stdout[-6000:]


def test_a_throttled_node_fails_the_gate_and_is_bisected_and_drained(cluster: Cluster) -> None:
    from fmcluster.providers.local.hosts import load_hosts

    name = sorted(n for n, r in reports().items() if r.get("role") == "compute")[1]
    host = next(h for h in load_hosts(ORG) if h.hostname == name)
    subprocess.run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                    "rate", "300mbit", "burst", "32kbit", "latency", "400ms"], check=True)
    try:
        gate = invoke("acceptance")
        assert gate.returncode == 1, gate.stdout[-6000:]
        assert f"drained {name}" in gate.stdout, gate.stdout[-6000:]
        state = slurm(f"scontrol -o show node {name}").stdout
        assert "DRAIN" in state and "fmcluster acceptance" in state
        doctor_judges_the_failed_run_s_log()  # docs/doctor.md
        # Issue 38: neither a deploy nor acceptance calls a cluster with a drained node done or a PASS.
        degraded = invoke("deploy")
        assert degraded.returncode == 1 and "below its declared shape: cpu 2/3" in degraded.stdout, degraded.stdout[-6000:]
        assert re.search(rf"{name} \(queue cpu\): drained — fmcluster acceptance .*; triage action: replace",
                         degraded.stdout) and "waiting up to" not in degraded.stdout, degraded.stdout[-6000:]
        partial = invoke("acceptance")
        assert partial.returncode == 1 and f"could not be tested (drained or down before this run): {name}" \
            in partial.stdout, partial.stdout[-6000:]
    finally:
        subprocess.run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        slurm(f"sudo -n scontrol update nodename={name} state=resume")


# --- node health, accounting and Slurm metrics (docs/health.md) --------------------------------------------
#: Seconds a drain or a return may take: one HealthCheckInterval (30 s locally, from the manifest) twice, with
#: slack for a loaded 2-core machine.
HEALTH_DEADLINE = 150
MEASURED: dict[str, float] = {}


def compute_nodes() -> list[str]:
    return sorted(slurm("sinfo --noheader --Node --format=%N").stdout.split())


def node_states() -> dict[str, tuple[str, str]]:
    """{node: (state, reason)} as `sinfo -N` shows them (the reason in full)."""
    done = slurm("sinfo --noheader --Node '--format=%N|%T|%E'")
    assert done.returncode == 0, done.stderr
    return {n: (s, r) for n, s, r in (line.split("|", 2) for line in done.stdout.splitlines())}


def sacct_jobs() -> dict[str, str]:
    done = slurm("sacct --allusers --allocations --noheader --parsable2 --starttime=2020-01-01 "
                 "--format=JobID,JobName,State")
    assert done.returncode == 0, done.stderr
    return {job: f"{name} {state}" for job, name, state in (line.split("|") for line in done.stdout.splitlines())}


def health_diagnosis() -> str:
    """What a failed health wait saw: Slurm's node states and the controller's pass log (for the failure text)."""
    controller = next((n for n, r in reports().items() if r.get("role") == "controller"), "")
    log = on_node(controller, "tail -n 30 /var/lib/fmcluster/health/run/fmcluster-health-cluster.log", timeout=60) if controller else None
    states = node_states()
    stuck = sorted(n for n, (state, _) in states.items() if state != "idle")
    seen = [f"\nnode states: {states}\ncontroller's pass log:\n{log.stdout + log.stderr if log else '-'}"]
    for name in stuck:  # what slurmctld and the node's slurmd said of it: why it does not answer
        ctld = on_node(controller, f"scontrol show node {name}; grep -a '{name}' /var/log/slurm/slurmctld.log | tail -n 15",
                       timeout=60) if controller else None
        node = on_node(name, "ps -o pid,stat,wchan:24,etime,args -C slurmd,munged; ss -ltn 'sport = :6818'; "
                             f"tail -n 25 /var/log/slurm/slurmd-{name}.log", timeout=60)
        seen.append(f"\n--- {name}, as slurmctld sees it:\n{ctld.stdout + ctld.stderr if ctld else '-'}"
                    f"\n--- {name}, on the node:\n{node.stdout + node.stderr}")
    return "".join(seen)


def wait_for(what: str, test: Any, timeout: float, diagnose: Any = None) -> Any:
    started = time.monotonic()
    while True:
        got = test()
        if got:
            MEASURED[what] = round(time.monotonic() - started, 1)
            return got
        if time.monotonic() - started >= timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s" + (diagnose() if diagnose else ""))
        time.sleep(2)


def start_again(name: str, service: str) -> None:
    """Start a daemon's unit on node `name` again (no converge)."""
    done = on_node(name, f"systemctl start {service}", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def stop(name: str, service: str) -> None:
    """Stop a daemon's unit on node `name`: it stays down (systemd restarts only a daemon that failed)."""
    done = on_node(name, f"systemctl stop {service}", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def prometheus_query(expr: str) -> list[dict[str, Any]]:
    import urllib.parse

    result: list[dict[str, Any]] = controller_api("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["data"]["result"]
    return result


def test_accounting_lists_the_acceptance_jobs_and_a_job_just_run(cluster: Cluster) -> None:
    done = slurm("sbatch --parsable --wait -N3 --job-name=before-faults --output=/fsx/job-%j.out --wrap 'srun hostname'")
    assert done.returncode == 0, done.stdout + done.stderr
    job = done.stdout.strip().splitlines()[-1]
    jobs = wait_for("sacct shows the job", lambda: (lambda j: j if j.get(job) else {})(sacct_jobs()), 60)
    assert jobs[job] == "before-faults COMPLETED"
    assert any(v.startswith("fmc-accept-") for v in jobs.values()), jobs


#: The demo tenant's people (inventories/demo): name → (uid, default team).
USERS = {"alice": (20001, "llm"), "bob": (20002, "vision")}


def as_user(user: str, command: str, node: str = "") -> subprocess.CompletedProcess[str]:
    """`command` run by `user` from their home on the login node (or `node`), as they would after ssh."""
    inner = f"cd /fsx/home/{user} && runuser -u {user} -- {command}"
    return invoke("slurm", f"--cmd=sudo -n bash -c {shlex.quote(inner)}", *([f"--node={node}"] if node else []),
                  timeout=300)


def uids_everywhere() -> dict[str, list[str]]:
    """node → [uid of each of USERS, owner of each home] as that node sees them."""
    probe = "; ".join([f"id -u {u}" for u in USERS] + [f"stat -c %u /fsx/home/{u}" for u in USERS])
    seen = {}
    for name in reports():
        done = on_node(name, probe, timeout=60)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
        seen[name] = done.stdout.split()
    return seen


def usage_cpu_hours(document: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(team, user) → CPU hours, from `invoke usage --json`."""
    return {(row["team"], row["user"]): float(row["hours"]["cpu"]) for row in document["rows"]}


def test_users_of_two_teams_run_within_their_qos_and_usage_reports_their_hours(cluster: Cluster) -> None:
    """Users and teams (docs/users.md): the same UID on every node and on their shared home; each runs a job
    charged to their team's account; a job over the QoS's per-user CPU cap is refused at submission; `invoke
    usage` reports each team's and user's hours as sacct has them."""
    expected = [str(uid) for uid, _ in USERS.values()] * 2
    assert {n: ids for n, ids in uids_everywhere().items() if ids != expected} == {}
    for user, (_, team) in USERS.items():
        done = as_user(user, f"srun --ntasks=1 --job-name=usage-{user} sleep 2")
        assert done.returncode == 0, done.stdout + done.stderr
    refused = as_user("alice", "srun --ntasks=6 --job-name=over-qos hostname")
    assert refused.returncode != 0 and "QOS" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    def accounted() -> list[list[str]]:
        done = slurm("sacct --allusers --allocations --noheader --parsable2 --starttime=2020-01-01 "
                     "--format=User,Account,JobName,State,ElapsedRaw,AllocTRES")
        assert done.returncode == 0, done.stderr
        return [line.split("|") for line in done.stdout.splitlines()]

    def charged(rows: list[list[str]]) -> set[tuple[str, str]]:
        return {(u, a) for u, a, name, state, _, _ in rows if name.startswith("usage-") and state == "COMPLETED"}

    # slurmctld hands a finished job to slurmdbd asynchronously: the last job may reach sacct a moment after srun returns.
    wanted = {(u, team) for u, (_, team) in USERS.items()}
    wait_for("usage jobs in accounting", lambda: charged(accounted()) == wanted, 60,
             lambda: f"\n{accounted()}")
    rows = accounted()
    cpu_hours: dict[tuple[str, str], float] = {}
    for user, account, _, _, elapsed, tres in rows:
        cpus = dict(item.split("=", 1) for item in tres.split(",") if "=" in item).get("cpu", "0")
        cpu_hours[(account, user)] = cpu_hours.get((account, user), 0.0) + int(elapsed) * int(cpus) / 3600
    usage = invoke("usage", "--json", timeout=120)
    assert usage.returncode == 0, usage.stdout + usage.stderr
    reported = usage_cpu_hours(json.loads(usage.stdout))
    for user, (_, team) in USERS.items():
        assert reported[(team, user)] == pytest.approx(cpu_hours[(team, user)], abs=1e-5), (reported, cpu_hours)
    table = invoke("usage", timeout=120)
    assert table.returncode == 0 and all(u in table.stdout for u in USERS), table.stdout


def test_a_second_user_logs_in_to_the_login_node_with_their_own_key_and_writes_in_their_home(cluster: Cluster) -> None:
    """Issue 38: a person other than the first (bob) logs in to the login node over ssh as himself, with his own
    key from the tenant, lands in his home on the shared file system and writes there; the home root is root's
    (0755), his home his own, so no user's home creation took the root from the others."""
    from fmcluster.inventory import read_nodes
    from fmcluster.model import load_tenant
    from fmcluster.providers import operator_argv
    from fmcluster.providers.registry import provider_for

    login = next(n for n in read_nodes(ORG) if n.role == "login")
    argv = operator_argv(provider_for(load_tenant(ORG)).route(login), str(BOB_KEY), "bob")
    done = subprocess.run([*argv, "cd && echo written-by-$(id -un) > hello && cat hello && pwd && "
                                  "stat -c '%U %a %n' . .. hello"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    written, home, *modes = done.stdout.strip().splitlines()
    assert (written, home) == ("written-by-bob", "/fsx/home/bob"), done.stdout
    assert modes == ["bob 700 .", "root 755 ..", "bob 644 hello"], modes


#: What each task of the container step prints, from inside the image (python3 and coreutils: the tests' image).
CONTAINER_PROBE = ("echo $(hostname) $(id -u) $(cat /proc/self/uid_map) $(pwd) "
                   "$(test -d /fsx/.fmcluster/containers/images && echo fsx) "
                   "$(python3 -c 'print(6 * 7)') && touch container-$(hostname)")


def test_alice_runs_the_tenant_s_image_with_srun_container_on_every_compute_node_as_herself(cluster: Cluster) -> None:
    """Issue 39: the tests' image pushed to the tenant's registry (the VPC's, standing for ECR), alice runs it with
    `srun --container` across every compute node: root of her own user namespace inside (uid 0 mapped to hers, 1
    id), herself outside (the files it writes in her home are hers), her home and /fsx mounted; sacct records the job
    under her team; the second run takes the image and her bundle from the cache on /fsx (nothing pulled)."""
    from fmcluster.providers.local import image
    from fmcluster.providers.local.hosts import router_address
    from fmcluster.providers.local.registry import ensure_registry, push_bench_image
    from fmcluster.stacks.render import subnet_cidrs

    started = time.monotonic()
    registry = ensure_registry(ORG, router_address(subnet_cidrs(VPC)["private"]).split("/")[0])
    assert not registry.started, "the deploy did not start the tenant's registry"
    reference = push_bench_image(registry, image.ensure_image(lambda _: None).rootfs, tag="alice")
    MEASURED["container image built and pushed (s)"] = round(time.monotonic() - started, 1)
    nodes = compute_nodes()
    uid, team = USERS["alice"]
    srun = (f"srun -N{len(nodes)} --ntasks-per-node=1 --job-name=container-e2e "
            f"--container=\"$(fmcluster-container bundle {reference})\" sh -c {shlex.quote(CONTAINER_PROBE)}")
    runs = []
    for _ in range(2):
        done = as_user("alice", f"sh -c {shlex.quote(srun)}")
        assert done.returncode == 0, done.stdout + done.stderr
        runs.append(done)
        seen = sorted(line.split() for line in done.stdout.splitlines() if line.startswith("ip-"))
        assert [row[0] for row in seen] == nodes, done.stdout
        assert {tuple(row[1:]) for row in seen} == {("0", "0", str(uid), "1", "/fsx/home/alice", "fsx", "42")}, seen
    first, second = (r.stderr for r in runs)
    assert "pulled into /fsx/.fmcluster/containers/images/sha256-" in first, first
    assert "not pulled again" in second and "(cached)" in second and "pulled into" not in second, second
    owners = on_node(nodes[0], "stat -c %u:%g /fsx/home/alice/container-ip-*", timeout=60)
    assert owners.stdout.split() == [f"{uid}:{uid}"] * len(nodes), owners.stdout + owners.stderr

    def charged() -> list[str]:
        done = slurm("sacct --allusers --allocations --noheader --parsable2 --starttime=2020-01-01 "
                     "--name=container-e2e --format=User,Account,State,NNodes")
        return sorted(done.stdout.split())
    wait_for("container jobs in accounting", lambda: charged() == [f"alice|{team}|COMPLETED|{len(nodes)}"] * 2, 60,
             lambda: f"\n{charged()}")
    MEASURED["container test (s)"] = round(time.monotonic() - started, 1)
    print(f"container e2e: {MEASURED['container test (s)']} s (image {MEASURED['container image built and pushed (s)']} s)")


def test_alice_on_the_login_node_reads_no_secret_and_cannot_stop_prometheus_or_be_grafana_s_admin(
        cluster: Cluster) -> None:
    """Issue 42: a user's processes on the login node find none of the tenant's secrets in any file they can read,
    get no credentials from IMDS, cannot reach the controller's Prometheus or Grafana (both on the controller's
    loopback), and on the controller itself Prometheus refuses /-/quit and Grafana (where the image has one; Debian
    packages none) refuses the package's admin/admin."""
    import base64

    from fmcluster.model import load_tenant
    from fmcluster.providers.registry import provider_for
    from fmcluster.stacks import aws

    tenant = load_tenant(ORG)
    sm = aws.client("secretsmanager", tenant.region, provider_for(tenant).endpoint(False, print))
    names = [s["Name"] for s in sm.list_secrets()["SecretList"] if s["Name"].startswith(f"fmcluster/{ORG}/")]
    values = [sm.get_secret_value(SecretId=name)["SecretString"] for name in names]
    assert len(values) >= 2 and all(len(v) >= 16 for v in values), names
    login = next(n for n, r in reports().items() if r.get("role") == "login")
    controller = controller_node()
    address = reports()[controller]["address"]
    # The patterns travel base64-encoded (never the secrets themselves in a command line or a log), land in a file
    # only root reads, and reach alice's grep as its standard input, opened by root's shell.
    patterns = base64.b64encode("\n".join(v.splitlines()[0][:32] for v in values).encode()).decode()
    where = "/etc /var /opt /run /tmp /srv /usr/local /fsx /home /root"
    probe = (f"umask 077; echo {patterns} | base64 -d > /root/.e2e-patterns; "
             f"runuser -u alice -- grep -rlsF -D skip -f - {where} < /root/.e2e-patterns; "
             "rm -f /root/.e2e-patterns; true")
    readable = on_node(login, probe, timeout=300)
    assert readable.returncode == 0 and readable.stdout.split() == [], f"alice reads a secret in {readable.stdout}"
    for path in ("/etc/munge/munge.key", "/var/lib/fmcluster/inventory/hosts.yml", "/etc/fmcluster/node.env"):
        opened = on_node(login, f"runuser -u alice -- cat {path} >/dev/null 2>&1 && echo READ || echo refused")
        assert opened.stdout.strip() == "refused", f"alice reads {path} on {login}"

    def alice_http(url: str, *curl: str) -> str:
        done = as_user("alice", f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' {' '.join(curl)} {url}")
        return done.stdout.strip()[-3:]

    assert alice_http("http://169.254.169.254/latest/meta-data/iam/security-credentials/") in ("000", "403")
    assert alice_http(f"http://{address}:9090/-/quit", "-X", "POST") == "000", "Prometheus answers beyond loopback"
    assert alice_http(f"http://{address}:3000/api/user", "-u", "admin:admin") == "000", "Grafana answers beyond loopback"
    on_controller = on_node(controller, "curl -s -o /dev/null -w '%{http_code} ' -X POST http://127.0.0.1:9090/-/quit; "
                                        "curl -s -o /dev/null -w '%{http_code} ' -u admin:admin http://127.0.0.1:3000/api/user; "
                                        "command -v grafana-server || echo no-grafana")
    quit_code, admin_code, grafana = on_controller.stdout.split()
    assert quit_code == "403", on_controller.stdout + on_controller.stderr
    # Debian packages no Grafana (docs/stacks.md): where the node has one, admin/admin must be refused.
    assert admin_code == "401" or (admin_code == "000" and grafana == "no-grafana"), on_controller.stdout
    assert prometheus_query("up"), "Prometheus stopped"


def test_broken_nodes_are_drained_with_the_check_that_caught_them_and_return_once_repaired(cluster: Cluster) -> None:
    """Three faults at once: a slurmd killed, a munge key the controller does not have, the shared file system
    gone. Each node is drained with the reason of the check that caught it (by itself, or by the controller's
    pass for a node that cannot drain itself); the Slurm panels show it from Prometheus; repaired, each returns
    to service by itself; accounting keeps every job."""
    from fmcluster import dashboards

    started = time.monotonic()
    killed, bad_key, no_fs = compute_nodes()
    before = sacct_jobs()
    wait_for("every node idle before the faults", lambda: {s for s, _ in node_states().values()} == {"idle"}, 60)
    # Keep what the repairs put back on the nodes themselves: the good key, a second bind of the shared file system.
    assert on_node(bad_key, "cp -p /etc/munge/munge.key /root/munge.key.good").returncode == 0
    assert on_node(no_fs, "mkdir -p /root/fsx-keep && mount --bind /fsx /root/fsx-keep").returncode == 0
    t0 = time.monotonic()
    try:
        assert on_node(killed, "systemctl stop fmcluster-slurmd").returncode == 0
        assert on_node(bad_key, "head -c 1024 /dev/urandom > /etc/munge/munge.key").returncode == 0
        stop(bad_key, "fmcluster-munged")
        start_again(bad_key, "fmcluster-munged")
        assert on_node(no_fs, "umount -l /fsx").returncode == 0
        # slurmctld starts HealthCheckProgram by an RPC that a node with another munge key cannot authenticate, so
        # that node never reports; the controller's pass drains it with munge as the suspect (docs/health.md).
        expected = {killed: "fmcluster-health: slurmd: nothing answers on ",
                    bad_key: "fmcluster-health: slurmd: ",
                    no_fs: "fmcluster-health: mounts: /fsx is not mounted"}
        for name, prefix in expected.items():
            wait_for(f"{name} drained", lambda: (lambda s: s[0].startswith(("drain", "down")) and s[1].startswith(prefix))(
                node_states().get(name, ("", ""))), HEALTH_DEADLINE - (time.monotonic() - t0), health_diagnosis)
        MEASURED["three nodes drained after (s)"] = round(time.monotonic() - t0, 1)
        assert "does not answer slurmctld (munge key" in node_states()[bad_key][1]
        doctor_names({killed: "slurmd-not-responding", bad_key: "munge-key-mismatch", no_fs: "fsx-not-mounted"})

        # The Slurm metrics carry the drained nodes and their reasons; every Slurm panel's query answers.
        wait_for("Prometheus shows the drained nodes", lambda: {
            r["metric"]["slurm_node"] for r in prometheus_query("slurm_node_unavailable_info == 1")} >= set(expected), 90)
        empty = [title for _, title, expr in dashboards.expressions()
                 if title.startswith("Slurm") and not prometheus_query(expr.replace("$node", ".*"))]
        assert empty == [], f"Slurm panels without data: {empty}"
    finally:
        t1 = time.monotonic()
        on_node(no_fs, "mountpoint -q /fsx || mount --bind /root/fsx-keep /fsx; umount /root/fsx-keep")
        # The munge key repaired as doctor's fix says (knowledge.yml munge-key-mismatch): munged, then slurmd.
        on_node(bad_key, "cp -p /root/munge.key.good /etc/munge/munge.key")
        stop(bad_key, "fmcluster-munged")
        start_again(bad_key, "fmcluster-munged")
        stop(bad_key, "fmcluster-slurmd")
        start_again(bad_key, "fmcluster-slurmd")
        start_again(killed, "fmcluster-slurmd")
    wait_for("all nodes back in service", lambda: {s for s, _ in node_states().values()} == {"idle"}, HEALTH_DEADLINE,
             health_diagnosis)
    MEASURED["all back after repair (s)"] = round(time.monotonic() - t1, 1)
    after = slurm("sbatch --parsable --wait -N3 --job-name=after-repair --output=/fsx/job-%j.out --wrap 'srun hostname'")
    assert after.returncode == 0, after.stdout + after.stderr
    job = after.stdout.strip().splitlines()[-1]
    jobs = wait_for("sacct shows the job after the repair", lambda: (lambda j: j if j.get(job) else {})(sacct_jobs()), 60)
    assert jobs[job] == "after-repair COMPLETED"
    assert {k: v for k, v in jobs.items() if k in before} == before, "accounting lost a job"
    MEASURED["health faults total (s)"] = round(time.monotonic() - started, 1)
    print("measured:", json.dumps(MEASURED))


# --- invoke doctor and invoke fleet (docs/doctor.md) ---------------------------------------------------------
NCCL_ENV = "/etc/profile.d/fmcluster-nccl.sh"
#: node_exporter's unit (roles/node_exporter: node_exporter_service_name).
EXPORTER = "fmcluster-node-exporter"
DOCTOR_RUNS: list[float] = []


def doctor(*args: str) -> tuple[int, dict[str, Any]]:
    started = time.monotonic()
    done = invoke("doctor", "--json", *args, timeout=300)
    DOCTOR_RUNS.append(round(time.monotonic() - started, 1))
    assert done.stdout.strip(), done.stderr[-3000:]
    diagnosis: dict[str, Any] = json.loads(done.stdout)
    assert (done.returncode == 0) == diagnosis["healthy"], done.stdout[-3000:]
    return done.returncode, diagnosis


def found(diagnosis: dict[str, Any]) -> dict[str, set[str]]:
    """entry id → where it fired (node names for node-level evidence)."""
    return {f["id"]: {e["where"].split(":")[0] for e in f["evidence"]} for f in diagnosis["findings"]}


def doctor_names(expected: dict[str, str]) -> None:
    """`invoke doctor` names each node's fault with its entry (node → entry id)."""
    _, diagnosis = doctor()
    ids = found(diagnosis)
    missing = {node: entry for node, entry in expected.items() if node not in ids.get(entry, set())}
    assert not missing, f"doctor did not name {missing}: {json.dumps(diagnosis['findings'], indent=1)[-4000:]}"


def doctor_judges_the_failed_run_s_log() -> None:
    """`invoke doctor --log` on the gate's failed job log gives the gate's own diagnosis."""
    base = ROOT / "inventories" / ORG / "generated" / "acceptance"
    run_dir = sorted(p for p in base.iterdir() if (p / "result.json").is_file())[-1]
    result = json.loads((run_dir / "result.json").read_text())
    failed = next(t for t in result["tests"] if not t["passed"])
    code, diagnosis = doctor(f"--log={run_dir / Path(failed['log']).name}")
    assert code == 1 and diagnosis["acceptance"]["status"] == "fail", diagnosis
    if "below_floor" in {f["code"] for f in result["verdicts"][failed["name"]]["findings"]}:
        assert "acceptance-below-floor" in found(diagnosis), diagnosis


def test_doctor_names_each_fault_with_its_entry_and_is_clean_once_repaired(cluster: Cluster) -> None:
    """munged stopped on one node, node_exporter on another, a harmful NCCL override in a third node's NCCL
    environment: doctor names each with the right entry (the health faults above are named in their own test,
    the throttle by --log on the gate's log); repaired, doctor and fleet are clean. Clock skew is not reproducible
    here: the namespaces share this machine's clock."""
    started = time.monotonic()
    wait_for("every node idle before doctor's faults", lambda: {s for s, _ in node_states().values()} == {"idle"},
             HEALTH_DEADLINE)
    last: dict[str, Any] = {}

    def clean() -> bool:
        code, last["diagnosis"] = doctor()
        return code == 0
    try:
        wait_for("doctor clean before the faults", clean, 90)
    except AssertionError:
        raise AssertionError(json.dumps(last["diagnosis"], indent=1)[-4000:]) from None
    no_munge, no_exporter, bad_env = compute_nodes()
    t0 = time.monotonic()
    try:
        stop(no_munge, "fmcluster-munged")
        stop(no_exporter, EXPORTER)
        assert on_node(bad_env, f"(test -e {NCCL_ENV} && cp -p {NCCL_ENV} /root/nccl-env.keep || true) && "
                                f"mkdir -p /etc/profile.d && echo 'export NCCL_PROTO=simple' >> {NCCL_ENV}").returncode == 0
        expected = {no_munge: "munged-down", no_exporter: "node-exporter-down", bad_env: "nccl-proto-override"}

        def named() -> bool:
            _, last["diagnosis"] = doctor()
            ids = found(last["diagnosis"])
            return all(node in ids.get(entry, set()) for node, entry in expected.items())
        try:
            wait_for("doctor names munged, node_exporter and the NCCL override", named, 120)
        except AssertionError:
            raise AssertionError(json.dumps(last["diagnosis"], indent=1)[-4000:]) from None
        MEASURED["doctor faults named after (s)"] = round(time.monotonic() - t0, 1)
        fleet = subprocess.run([venv_tool("invoke"), "fleet"], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert re.search(rf"^{ORG} .*degraded$", fleet.stdout, re.M), fleet.stdout
    finally:
        start_again(no_munge, "fmcluster-munged")
        start_again(no_exporter, EXPORTER)
        on_node(bad_env, f"if test -e /root/nccl-env.keep; then mv /root/nccl-env.keep {NCCL_ENV}; else rm -f {NCCL_ENV}; fi")
    t1 = time.monotonic()
    try:
        wait_for("doctor clean after the repair", clean, HEALTH_DEADLINE)
    except AssertionError:
        raise AssertionError(json.dumps(last["diagnosis"], indent=1)[-4000:]) from None
    MEASURED["doctor clean after repair (s)"] = round(time.monotonic() - t1, 1)
    fleet = subprocess.run([venv_tool("invoke"), "fleet"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert re.search(rf"^{ORG} .*healthy$", fleet.stdout, re.M), fleet.stdout
    print(fleet.stdout)
    MEASURED["doctor faults total (s)"] = round(time.monotonic() - started, 1)
    print("measured:", json.dumps(MEASURED), "doctor runs (s):", DOCTOR_RUNS)


def unit_state(name: str, unit: str = "fmcluster-slurmd") -> dict[str, str]:
    """What systemd on node `name` says of `unit`: its state, main pid, automatic restarts and restart budget."""
    done = on_node(name, f"systemctl show --property=ActiveState,MainPID,NRestarts,StartLimitBurst,"
                         f"StartLimitIntervalUSec,Restart,RestartUSec {unit}", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def restart_bound_s() -> float:
    """docs/health.md's bound on a killed slurmd's node serving again: RestartSec + HealthCheckInterval + 60 s."""
    import yaml

    from fmcluster.model import load_tenant

    defaults = yaml.safe_load((ROOT / "roles" / "supervised_service" / "defaults" / "main.yml").read_text())
    interval = load_tenant(ORG).capabilities.provider.health_interval_s
    return float(defaults["supervised_service_restart_sec"] + interval + 60)


def test_a_killed_slurmd_is_restarted_and_its_node_serves_again_without_anyone(cluster: Cluster) -> None:
    """Issue 38: slurmd killed on a compute node — SIGKILL, then SIGTERM (a clean exit to systemd, which
    Restart=on-failure left down) — is started again by the node's systemd (its unit's NRestarts counts it) and the
    node is idle and not drained again within docs/health.md's bound, with nobody acting: if the controller's pass
    drained it meanwhile, the node's own next healthy health run resumed it."""
    victim = compute_nodes()[0]
    wait_for("every node idle before slurmd is killed", lambda: {s for s, _ in node_states().values()} == {"idle"},
             HEALTH_DEADLINE, health_diagnosis)
    unit = unit_state(victim)
    assert (unit["Restart"], unit["StartLimitBurst"], unit["StartLimitIntervalUSec"]) == ("always", "10", "10min"), unit
    bound = restart_bound_s()
    for how, command in (("SIGKILL", "pkill -KILL -x slurmd"), ("SIGTERM", "pkill -TERM -x slurmd")):
        before = unit_state(victim)
        seen: list[tuple[str, str]] = []
        killed = time.monotonic()
        assert on_node(victim, command).returncode == 0

        def restarted() -> bool:
            now = unit_state(victim)
            return (int(now["NRestarts"]) > int(before["NRestarts"]) and now["ActiveState"] == "active"
                    and now["MainPID"] not in ("0", before["MainPID"]))

        def serving() -> bool:
            state = node_states().get(victim, ("", ""))
            seen.append(state)
            return state[0] == "idle"
        wait_for(f"slurmd restarted by systemd after {how}", restarted, bound)
        MEASURED[f"{how}: slurmd restarted after (s)"] = round(time.monotonic() - killed, 1)
        wait_for(f"{victim} serving after {how}", serving, bound - (time.monotonic() - killed), health_diagnosis)
        MEASURED[f"{how}: serving after (s)"] = took = round(time.monotonic() - killed, 1)
        drained = sorted({r for s, r in seen if s != "idle" and r})
        print(f"{how}: slurmd on {victim} restarted by systemd after {MEASURED[f'{how}: slurmd restarted after (s)']} s, "
              f"node serving {took} s after the kill (bound {bound:.0f} s); seen meanwhile: {drained or 'nothing drained'}")
        assert took <= bound
    assert int(unit_state(victim)["NRestarts"]) >= int(unit["NRestarts"]) + 2
    print("measured:", json.dumps(MEASURED))


def test_a_drained_node_is_listed_with_its_check_and_replaced_by_a_new_one_that_joins(cluster: Cluster) -> None:
    """drain → `invoke nodes` → `invoke replace` → rejoin (docs/health.md): a compute node whose slurmd is killed is
    drained by the controller's pass; `invoke nodes` lists it with the check and the action; `invoke replace`
    terminates it in its Auto Scaling group, whose new instance boots through the boot path and joins: idle in
    Slurm, scraped, healthy, running a job; the old node gone from Slurm; no job lost from accounting."""
    victim = compute_nodes()[0]
    jobs_before = sacct_jobs()
    wait_for("every node idle before the replace", lambda: {s for s, _ in node_states().values()} == {"idle"}, 90)
    assert on_node(victim, "systemctl stop fmcluster-slurmd").returncode == 0
    wait_for(f"{victim} drained for replace", lambda: node_states().get(victim, ("", ""))[1].startswith(
        "fmcluster-health: slurmd: "), HEALTH_DEADLINE)
    listed = invoke("nodes", timeout=120)
    assert listed.returncode == 1, listed.stdout + listed.stderr
    row = next(line.split() for line in listed.stdout.splitlines() if line.startswith(victim + " "))
    assert row[1:5] == ["compute", row[2], "drain", "slurmd"] and row[2].startswith(("drain", "down")), listed.stdout
    as_json = {n["node"]: n for n in json.loads(invoke("nodes", "--json", timeout=120).stdout)}
    assert (as_json[victim]["check"], as_json[victim]["unhealthy"]) == ("slurmd", True)
    auto = invoke("nodes", "--replace", timeout=120)  # the e2e tenant has not opted in: nothing is replaced
    assert auto.returncode == 1 and "has not opted in (health.auto_replace: true" in auto.stdout, auto.stdout
    controller = next(n for n, r in as_json.items() if r["role"] == "controller")
    refused = invoke("replace", f"--node={controller}", timeout=120)
    assert refused.returncode == 2 and "compute nodes only" in refused.stdout, refused.stdout
    hostile = invoke("replace", f"--node={victim}; touch /tmp/fmc-e2e-pwned", timeout=120)
    assert hostile.returncode == 2 and "no live node" in hostile.stdout and not Path("/tmp/fmc-e2e-pwned").exists()

    started = time.monotonic()
    replaced = invoke("replace", f"--node={victim}", "--timeout=600", timeout=900)
    MEASURED["replace (s)"] = round(time.monotonic() - started, 1)
    assert replaced.returncode == 0, replaced.stdout[-6000:] + replaced.stderr[-2000:]
    print(replaced.stdout[replaced.stdout.find("=== replace summary"):])
    assert "terminated in Auto Scaling group" in replaced.stdout and "=== replace summary" in replaced.stdout
    new = re.search(r"new node\s+(ip-[\d-]+) ", replaced.stdout)
    assert new, replaced.stdout[-3000:]
    assert victim not in compute_nodes() and new.group(1) in compute_nodes()
    assert node_states()[new.group(1)][0] == "idle"
    assert invoke("nodes", timeout=120).returncode == 0
    assert reports()[new.group(1)]["trigger"] == "first-boot"
    assert uids_everywhere()[new.group(1)] == [str(uid) for uid, _ in USERS.values()] * 2
    jobs = sacct_jobs()
    assert {k: v for k, v in jobs.items() if k in jobs_before} == jobs_before, "accounting lost a job"
    for report in reports().values():
        if report["role"] in ("controller", "login"):  # the new membership, without a whole converge
            assert report["playbook"] == "playbooks/membership.yml", report
            MEASURED[f"replace_membership_pass_{report['role']}_s"] = report["seconds"]
    print("measured:", json.dumps(MEASURED))


# --- the repair agent (docs/health.md, "The repair agent") -------------------------------------------------------
REPAIR_PAUSE = "/var/lib/fmcluster/health/repair.paused"
REPAIR_CONFIG = "/etc/fmcluster/health/repair.json"
REPAIR_LEDGER = "/var/lib/fmcluster/health/repair-ledger.json"


def controller_node() -> str:
    return next(n for n, r in reports().items() if r.get("role") == "controller")


def pause_repair_agent(why: str) -> None:
    """A person's maintenance: the agent's pause file (converges leave it)."""
    done = on_node(controller_node(), f"echo {shlex.quote(why)} > {REPAIR_PAUSE}", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def repair_ledger() -> dict[str, Any]:
    """The controller's repair agent's ledger (`fmcluster-health repair --show`)."""
    done = on_node(controller_node(), f"/opt/fmcluster/health/bin/fmcluster-health repair --config {REPAIR_CONFIG} "
                                      "--show", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    ledger: dict[str, Any] = json.loads(done.stdout)
    return ledger


@contextmanager
def repair_running(policy: dict[str, Any]) -> Iterator[None]:
    """The agent running (its pause lifted) with `policy` over the tenant's budgets; afterwards paused again with its
    config restored and the drill's breaker and quarantines forgotten."""
    edit = (f"import json; p = {REPAIR_CONFIG!r}; d = json.load(open(p)); d['policy'].update({json.dumps(policy)}); "
            "json.dump(d, open(p, 'w'), indent=1)")
    done = on_node(controller_node(), f"cp -p {REPAIR_CONFIG} {REPAIR_CONFIG}.e2e && python3 -c {shlex.quote(edit)} "
                                      f"&& rm -f {REPAIR_PAUSE} && systemctl restart fmcluster-repair", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        yield
    finally:
        forget = (f"import json; p = {REPAIR_LEDGER!r}; d = json.load(open(p)); d['quarantined'] = {{}}; "
                  "d['breaker'] = ''; json.dump(d, open(p, 'w'))")
        on_node(controller_node(), f"echo e2e > {REPAIR_PAUSE}; mv {REPAIR_CONFIG}.e2e {REPAIR_CONFIG}; "
                                   f"python3 -c {shlex.quote(forget)}; systemctl restart fmcluster-repair", timeout=60)


def live_instances() -> dict[str, str]:
    """Compute node name → instance id, as `invoke nodes --json` matches Slurm's nodes to their instances."""
    done = invoke("nodes", "--json", timeout=300)
    return {line["node"]: line["instance_id"] for line in json.loads(done.stdout)
            if line.get("role") == "compute" and line.get("instance_id")}


def firing(alert: str) -> list[dict[str, Any]]:
    return prometheus_query(f'ALERTS{{alertname="{alert}", alertstate="firing"}}')


def test_half_the_compute_nodes_failing_at_once_open_the_breaker_nothing_is_replaced_and_the_alert_fires(
        cluster: Cluster) -> None:
    """Issue 38: when half the compute nodes need a replacement at once, the repair agent replaces none (a shared
    cause is likelier), its ledger and `invoke nodes` say why, RepairBreakerOpen fires; once they are back the
    breaker closes."""
    wait_for("every node idle before the breaker drill", lambda: {s for s, _ in node_states().values()} == {"idle"},
             HEALTH_DEADLINE, health_diagnosis)
    nodes = compute_nodes()
    victims = nodes[: (len(nodes) + 1) // 2]
    before = live_instances()
    with repair_running({}):
        for name in victims:  # what acceptance writes when it convicts a node: triage says replace
            done = slurm(f"sudo -n scontrol update nodename={name} state=drain "
                         "'reason=fmcluster acceptance e2e-breaker: busbw 0.01 < 0.2 GB/s'")
            assert done.returncode == 0, done.stdout + done.stderr
        try:
            opened = wait_for("repair agent: breaker open", lambda: repair_ledger().get("breaker", ""), 120)
            assert all(name in opened for name in victims), opened
            alerts = wait_for("repair agent: RepairBreakerOpen firing", lambda: firing("RepairBreakerOpen"), 180)
            assert alerts[0]["metric"]["severity"] == "critical", alerts
            ledger = repair_ledger()
            assert not [e for e in ledger.get("entries", []) if e["node"] in victims], ledger
            assert {n: before[n] for n in victims} == {n: live_instances().get(n) for n in victims}
            shown = invoke("nodes", timeout=300)
            assert "repair agent: breaker OPEN" in shown.stdout, shown.stdout[-3000:]
        finally:
            for name in victims:
                slurm(f"sudo -n scontrol update nodename={name} state=resume")
        wait_for("repair agent: breaker closed once the nodes are back", lambda: not repair_ledger().get("breaker"), 120)
    print("measured:", json.dumps(MEASURED))


def pid1_age_s(name: str) -> int:
    """Seconds since the node's PID 1 (systemd) started: its boot, as the node itself sees it."""
    done = on_node(name, "ps -o etimes= -p 1", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return int(done.stdout.split()[-1])


def test_a_node_whose_triage_says_reboot_is_rebooted_by_the_repair_agent_and_serves_again(cluster: Cluster) -> None:
    """Issue 38, with nobody acting: a compute node drained with Slurm's own `Kill task failed` (processes stuck in
    the kernel: triage says reboot) is rebooted by the repair agent through `scontrol reboot ASAP nextstate=RESUME`
    (slurmd runs RebootProgram); the node boots again, passes its health run and serves; the ledger records it."""
    wait_for("every node idle before the reboot", lambda: {s for s, _ in node_states().values()} == {"idle"},
             HEALTH_DEADLINE, health_diagnosis)
    victim = compute_nodes()[-1]
    booted_before = pid1_age_s(victim)
    with repair_running({}):
        drained = time.monotonic()
        assert slurm(f"sudo -n scontrol update nodename={victim} state=drain 'reason=Kill task failed'").returncode == 0

        def rebooted() -> list[dict[str, Any]]:
            return [e for e in repair_ledger().get("entries", []) if e["node"] == victim and e["kind"] == "reboot"]
        entry = wait_for("repair agent: reboot asked", rebooted, 120, health_diagnosis)[0]
        assert entry["ok"], entry
        MEASURED["reboot: drained to reboot asked (s)"] = round(time.monotonic() - drained, 1)
        wait_for(f"{victim} serving after its reboot", lambda: node_states().get(victim, ("", ""))[0] == "idle", 300,
                 health_diagnosis)
        MEASURED["reboot: drained to serving (s)"] = round(time.monotonic() - drained, 1)
        age = pid1_age_s(victim)
        assert age < time.monotonic() - drained + 5 and age < booted_before, (age, booted_before)
    print(f"reboot: {victim} drained 'Kill task failed'; reboot asked after "
          f"{MEASURED['reboot: drained to reboot asked (s)']} s, serving after {MEASURED['reboot: drained to serving (s)']}"
          f" s (PID 1 up {age} s)")
    print("measured:", json.dumps(MEASURED))


#: A job that opts in to being resumed (docs/health.md, "Jobs survive node loss"): requeue-able, its progress on
#: shared storage, and a restart path keyed on SLURM_RESTART_COUNT. 20 one-second steps. Submitted over every
#: compute node of the queue, as a training job is, so it can only run again once the lost node is replaced.
RESUMABLE_JOB = """#!/bin/bash
#SBATCH --requeue
#SBATCH --job-name=resumable
set -eu
dir=/fsx/resumable/$SLURM_JOB_ID
mkdir -p "$dir"
step=0
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && [ -s "$dir/step" ]; then step=$(cat "$dir/step"); fi
nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sort | paste -sd, -)
echo "run ${SLURM_RESTART_COUNT:-0} on $nodes from step $step" >> "$dir/runs"
while [ "$step" -lt 20 ]; do
  sleep 1
  step=$((step + 1))
  echo "$step" > "$dir/step.tmp" && mv "$dir/step.tmp" "$dir/step"
done
echo "done at step $step on $nodes" >> "$dir/runs"
"""


def job_times(job: str) -> tuple[float, float]:
    """(start, end) of a job's last run as Unix times, from Slurm's accounting (the hosts share this clock)."""
    done = slurm(f"sacct --jobs={job} --allocations --noheader --parsable2 --format=Start,End")
    start, end = done.stdout.strip().splitlines()[-1].split("|")
    assert done.returncode == 0 and start and end, done.stdout + done.stderr
    # sacct prints local time without a zone; the hosts' zone is this machine's (the pristine image keeps UTC).
    return (datetime.fromisoformat(start).replace(tzinfo=timezone.utc).timestamp(),
            datetime.fromisoformat(end).replace(tzinfo=timezone.utc).timestamp())


def job_where(job: str) -> tuple[str, str]:
    """(state, batch host) of a job as squeue shows it; ("", "") once it left the queue."""
    done = slurm(f"squeue --noheader --jobs={job} '--format=%T|%B'")
    parts = done.stdout.strip().split("|") if done.returncode == 0 and "|" in done.stdout else ["", ""]
    return parts[0], parts[1]


def test_a_node_halted_hard_is_replaced_by_the_repair_agent_and_its_requeued_job_completes_on_the_replacement(
        cluster: Cluster) -> None:
    """Issue 38, with nobody acting: a requeue-able job over every compute node, checkpointing to /fsx, runs when
    one of its hosts is halted hard. Slurm requeues the job once the node is DOWN; the controller's pass drains the
    lost node and the repair agent (restart grace shortened to 30 s for the drill) has its Auto Scaling group
    replace it through the controller's own instance role; the substrate's hypervisor stand-in boots the new
    instance, which joins by itself; the job starts again on the queue's nodes, the replacement among them, resumes
    from its checkpoint and completes. A queue that then needs one replacement more than its budget (1 for the
    drill) is quarantined: nothing replaced, the node kept drained, the alert fired."""
    import base64

    from fmcluster.model import load_tenant
    from fmcluster.providers.local import hypervisor

    tenant = load_tenant(ORG)  # (the controller role's grant for this call: tests/test_node_replace.py)
    assert hypervisor.running(ORG) is not None, "the deploy started no hypervisor stand-in"
    wait_for("every node idle before the halt", lambda: {s for s, _ in node_states().values()} == {"idle"},
             HEALTH_DEADLINE, health_diagnosis)
    # Idle is slurmctld's view, which lags: a node rebooted just before (the previous drill) can read idle while its
    # slurmd is still down, and then fails during this drill, past the drill's budget of one replacement (the run of
    # 6a051f4: its queue quarantined). A step on every compute node is the positive evidence that each serves.
    count = len(node_states())
    wait_for("a step on every compute node before the halt",
             lambda: slurm(f"timeout 60 srun -N{count} --ntasks-per-node=1 hostname").returncode == 0,
             HEALTH_DEADLINE, health_diagnosis)
    before = live_instances()
    interval = tenant.capabilities.provider.health_interval_s
    with repair_running({"restart_grace_s": 30, "replacements_per_queue": 1, "backoff_s": 0}):
        script = base64.b64encode(RESUMABLE_JOB.encode()).decode()
        submitted = slurm(f"mkdir -p /fsx/resumable && echo {script} | base64 -d > /fsx/resumable/job.sh && "
                          f"sbatch --parsable --nodes={len(before)} --output=/fsx/resumable/%j.out "
                          "/fsx/resumable/job.sh")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        job = submitted.stdout.strip().splitlines()[-1]
        victim = wait_for("the resumable job running",
                          lambda: (lambda w: w[1] if w[0] == "RUNNING" else "")(job_where(job)), 60)
        assert victim in before, (victim, before)

        def progress() -> int:
            return int((slurm(f"cat /fsx/resumable/{job}/step 2>/dev/null || echo 0").stdout.split() or ["0"])[-1])
        wait_for("the resumable job's first checkpoints", lambda: progress() >= 3, 60)
        failed, failed_at = time.monotonic(), time.time()
        assert invoke("halt", f"--node={victim}").returncode == 0
        # Slurm sets the node DOWN after SlurmdTimeout (3 health intervals) and requeues the job.
        requeue_bound = 3 * interval + interval + 60
        wait_for("requeue: the resumable job pending again",
                 lambda: job_where(job)[0] in ("PENDING", "REQUEUED"), requeue_bound, health_diagnosis)
        MEASURED["requeue: failure to requeued (s)"] = round(time.monotonic() - failed, 1)

        def replaced() -> list[dict[str, Any]]:
            return [e for e in repair_ledger().get("entries", []) if e["node"] == victim and e["kind"] == "replace"]
        entry = wait_for("repair agent: replacement of the halted node asked", replaced, 300, health_diagnosis)[0]
        assert entry["ok"], entry
        MEASURED["repair agent: failure to replacement asked (s)"] = round(time.monotonic() - failed, 1)

        def joined() -> str:
            live = live_instances()
            fresh = [name for name, instance in live.items() if instance not in before.values()]
            states = node_states()
            return (fresh[0] if fresh and states.get(fresh[0], ("", ""))[0] in ("idle", "allocated", "mixed")
                    and victim not in states else "")
        new = wait_for("repair agent: the new node serving in Slurm, the lost one gone", joined, 600, health_diagnosis)
        MEASURED["repair agent: failure to a new node serving (s)"] = round(time.monotonic() - failed, 1)
        log = (hypervisor.substrate_root(ORG) / hypervisor.LOG_FILE).read_text()
        assert live_instances()[new] in log, log[-3000:]
        assert sorted(live_instances()) == sorted([*[n for n in before if n != victim], new])
        # The requeued job waits at least the provider's credential lifetime before it may start again
        # (docs/health.md); by now that has passed, so it starts as soon as Slurm schedules it on the new node, and
        # may well have run its remaining steps while the waits above polled: its times are Slurm's, not the polls'.
        wait_for("requeue: the resumable job completed", lambda: sacct_jobs().get(job) == "resumable COMPLETED",
                 tenant.capabilities.provider.credential_lifetime_s + 150,
                 lambda: health_diagnosis() + "\njob: " + slurm(f"scontrol show job {job}").stdout)
        started, ended = job_times(job)
        MEASURED["requeue: failure to running again (s)"] = round(started - failed_at, 1)
        MEASURED["requeue: failure to completed (s)"] = round(ended - failed_at, 1)
        runs = slurm(f"cat /fsx/resumable/{job}/runs").stdout.strip().splitlines()
        assert re.fullmatch(r"run 0 on \S+ from step 0", runs[0]) and victim in runs[0].split()[3].split(","), runs
        resumed = re.fullmatch(r"run (\d+) on (\S+) from step (\d+)", runs[-2])
        assert resumed and int(resumed.group(1)) >= 1 and int(resumed.group(3)) >= 3, runs
        assert new in resumed.group(2).split(",") and victim not in resumed.group(2).split(","), runs
        assert runs[-1] == f"done at step 20 on {resumed.group(2)}", runs
        print(f"halted {victim}: job {job} requeued after {MEASURED['requeue: failure to requeued (s)']} s; "
              f"replaced by {new}, serving {MEASURED['repair agent: failure to a new node serving (s)']} s after the "
              f"halt; the job running again on the replacement after {MEASURED['requeue: failure to running again (s)']}"
              f" s and completed after {MEASURED['requeue: failure to completed (s)']} s; runs {runs}")

        # The queue's budget (1 for the drill) is spent: its next node in need is quarantined, not replaced.
        instance = live_instances()[new]
        assert slurm(f"sudo -n scontrol update nodename={new} state=drain "
                     "'reason=fmcluster acceptance e2e-quarantine: busbw 0.01 < 0.2 GB/s'").returncode == 0
        try:
            wait_for("repair agent: queue cpu quarantined", lambda: "cpu" in repair_ledger().get("quarantined", {}), 120)
            assert node_states()[new][1].startswith("fmcluster-repair: quarantined (queue cpu)"), node_states()[new]
            wait_for("repair agent: RepairQueueQuarantined firing", lambda: firing("RepairQueueQuarantined"), 180)
            assert live_instances().get(new) == instance, "a quarantined queue's node was replaced"
        finally:
            slurm(f"sudo -n scontrol update nodename={new} state=resume")
    print("measured:", json.dumps(MEASURED))


def test_destroy_leaves_nothing_behind(cluster: Cluster) -> None:
    gone = invoke("destroy", "--yes")
    assert gone.returncode == 0, gone.stdout[-3000:] + gone.stderr[-2000:]
    assert leftovers() == []
    assert sorted(p.name for p in (ROOT / "inventories" / ORG / "generated").iterdir()) == ["acceptance"]
