"""A minimal real Slurm cluster for the acceptance e2e test — a STAND-IN for the Slurm role's cluster.

Used only when the local node provider of the Slurm issue (fmcluster.localnodes + the slurm roles) is
not available on this branch. Real daemons, nothing mocked: one network namespace per compute node
(`fma-<tag>-nN`, veth to bridge `fmabr-<tag>` on 10.79.0.0/24), munged with its own key and socket,
slurmctld on this machine's side of the bridge, one `slurmd -N nN` per namespace started with
`nsenter --net=` (not `ip netns exec`, which remounts /sys and breaks slurmd). Everything lives under
one temporary directory; `down()` kills the recorded pids and removes namespaces, links and files.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.79.0"
CTLD_PORT = 7817
SLURMD_PORT = 7818


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


@dataclass
class StandinCluster:
    nodes: int = 3
    tag: str = field(default_factory=lambda: f"{os.getpid() % 10000}")
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fma-slurm-")))
    pids: list[int] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"fmabr-{self.tag}"

    def node(self, i: int) -> str:
        return f"fma-n{i}"

    def netns(self, i: int) -> str:
        return f"fma-{self.tag}-n{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{10 + i}"

    @property
    def conf(self) -> Path:
        return self.base / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    @property
    def node_names(self) -> list[str]:
        return [self.node(i) for i in range(1, self.nodes + 1)]

    # -- network -----------------------------------------------------------------------------------
    def _network_up(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{SUBNET}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(1, self.nodes + 1):
            ns, host_if, peer = self.netns(i), f"fmah{self.tag}-{i}", f"fmap{self.tag}-{i}"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", peer)
            _run("ip", "link", "set", host_if, "master", self.bridge, "up")
            _run("ip", "link", "set", peer, "netns", ns)
            _run("ip", "-n", ns, "link", "set", peer, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _network_down(self) -> None:
        for i in range(1, self.nodes + 1):
            _run("ip", "link", "del", f"fmah{self.tag}-{i}", check=False)
            _run("ip", "netns", "del", self.netns(i), check=False)
        _run("ip", "link", "del", self.bridge, check=False)

    # -- daemons -----------------------------------------------------------------------------------
    def _write_conf(self) -> None:
        b = self.base
        nodes = "\n".join(f"NodeName={self.node(i)} NodeAddr={self.address(i)} NodeHostname={self.node(i)} "
                          f"CPUs={os.cpu_count()} State=UNKNOWN" for i in range(1, self.nodes + 1))
        self.conf.write_text(f"""# stand-in cluster for the acceptance e2e test (tests/acceptance/standin.py)
ClusterName=fma{self.tag}
SlurmctldHost={os.uname().nodename}({SUBNET}.1)
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={b}/munge.sock
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool-%n
SlurmctldPidFile={b}/slurmctld.pid
SlurmdPidFile={b}/slurmd-%n.pid
SlurmctldLogFile={b}/slurmctld.log
SlurmdLogFile={b}/slurmd-%n.log
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=20
InactiveLimit=0
KillWait=5
MinJobAge=600
{nodes}
PartitionName=cpu Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
""")

    def _spawn(self, argv: list[str]) -> int:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.pids.append(proc.pid)
        return proc.pid

    def up(self, timeout: float = 60) -> "StandinCluster":
        b = self.base
        (b / "state").mkdir(parents=True)
        key = b / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._write_conf()
        self._network_up()
        self._spawn(["munged", "--foreground", "--force", f"--socket={b}/munge.sock", f"--key-file={key}",
                     f"--pid-file={b}/munged.pid", f"--log-file={b}/munged.log", f"--seed-file={b}/munge.seed"])
        self._wait(lambda: (b / "munge.sock").exists(), timeout, "munged socket")
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for i in range(1, self.nodes + 1):
            self._spawn(["nsenter", f"--net=/run/netns/{self.netns(i)}", "slurmd", "-D", "-N", self.node(i),
                         "-f", str(self.conf)])
        self._wait(self._all_idle, timeout, "all nodes idle in sinfo")
        return self

    def _all_idle(self) -> bool:
        proc = _run("sinfo", "-h", "-N", "-o", "%N %t", check=False) if False else subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env={**os.environ, **self.env})
        states = [line.split()[1] for line in proc.stdout.splitlines() if line.strip()]
        return len(states) == self.nodes and all(s == "idle" for s in states)

    @staticmethod
    def _wait(ready, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"stand-in cluster: timed out waiting for {what}")
            time.sleep(0.3)

    def throttle(self, i: int, rate: str = "200mbit") -> None:
        """The deliberately broken fabric: rate-limit node i's egress with a token bucket."""
        _run("ip", "netns", "exec", self.netns(i), "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
             "rate", rate, "burst", "32kbit", "latency", "400ms")

    def unthrottle(self, i: int) -> None:
        _run("ip", "netns", "exec", self.netns(i), "tc", "qdisc", "del", "dev", "eth0", "root", check=False)

    def down(self) -> None:
        for pid in reversed(self.pids):
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for pid in self.pids:
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        # job steps (slurmstepd and the bench) started by slurmd live in the namespaces: end them by pid
        for i in range(1, self.nodes + 1):
            for pid in _run("ip", "netns", "pids", self.netns(i), check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        self._network_down()
        shutil.rmtree(self.base, ignore_errors=True)
