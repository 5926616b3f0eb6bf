"""The few Slurm commands acceptance needs: list a partition's nodes, submit, wait, cancel, drain, resume.

Plain subprocess calls to the Slurm clients (`sinfo`, `sbatch`, `scontrol`, `scancel`) with the tenant's
environment (e.g. SLURM_CONF). `prefix` puts a remote shell in front of every command (the deploy's is ssh to the
cluster's login node, as an operator would type it); job outputs are paths on the cluster and are read
back through the same shell.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

FINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
    "PREEMPTED", "GONE",
})


class SlurmError(RuntimeError):
    """A Slurm command failed; the message holds the command and its stderr."""


@dataclass(frozen=True)
class Job:
    job_id: int
    nodes: tuple[str, ...]
    output: PurePosixPath


@dataclass(frozen=True)
class SlurmClient:
    env: Mapping[str, str] = field(default_factory=dict)
    prefix: tuple[str, ...] = ()
    #: Where the node's Slurm clients are when not on the system PATH (its image contract's slurm_bin_dir): sudo
    #: runs its command with its own secure_path, so what root runs is named by its path.
    slurm_bin_dir: str | None = None

    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        import os

        # Through a remote shell the command is one string, each word quoted for that shell.
        full = [*self.prefix, shlex.join(argv)] if self.prefix else list(argv)
        proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env})
        if check and proc.returncode != 0:
            raise SlurmError(f"`{' '.join(full)}` failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def partition_nodes(self, partition: str) -> list[str]:
        """Nodes of a partition, in Slurm's order (sorted by name)."""
        out = self.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N"]).stdout.split()
        return list(dict.fromkeys(out))

    def node_state(self, node: str) -> tuple[str, str]:
        """(State, Reason) of a node, e.g. ("IDLE+DRAIN", "fmcluster acceptance ...")."""
        line = self.run(["scontrol", "-o", "show", "node", node]).stdout
        fields = _fields(line)
        return fields.get("State", "?"), fields.get("Reason", "")

    def read_file(self, path: PurePosixPath) -> str | None:
        """A file on the cluster (a job's output), None when it does not exist."""
        proc = self.run(["cat", str(path)], check=False, timeout=120)
        return proc.stdout if proc.returncode == 0 else None

    def make_dir(self, path: PurePosixPath) -> None:
        """A directory the operator's jobs write their logs to, on the cluster's shared file system. Where its parent
        is root's and not writable by the operator (a fresh file system's root; nothing else makes one for the runs
        where the scheduler's service makes the mounts), root makes it, owned by the operator
        (whose sudo needs no password on the images' default user, as drain already relies on)."""
        made = self.run(["env", "LC_ALL=C", "mkdir", "-p", str(path)], check=False)  # its message in English
        if made.returncode == 0:
            return
        if "Permission denied" not in made.stderr:  # anything else (no such mount, read-only) is said as it is
            raise SlurmError(f"`mkdir -p {path}` failed ({made.returncode}): {made.stderr.strip()}")
        user = self.run(["id", "-un"]).stdout.strip()
        self.run(["sudo", "-n", "install", "-d", "-m", "0755", "-o", user, str(path)])

    def submit(self, script: PurePosixPath, *, nodes: Sequence[str], output: PurePosixPath,
               ntasks_per_node: int | None = None,
               job_name: str | None = None, time_limit: str | None = None,
               args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Job:
        argv = ["sbatch", "--parsable", f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}",
                f"--output={output}", "--exclusive"]
        if ntasks_per_node:
            argv.append(f"--ntasks-per-node={ntasks_per_node}")
        if job_name:
            argv.append(f"--job-name={job_name}")
        if time_limit:
            argv.append(f"--time={time_limit}")
        if env:
            argv.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in env.items()))
        proc = self.run([*argv, str(script), *args])
        return Job(int(proc.stdout.strip().split(";")[0]), tuple(nodes), output)

    def job_state(self, job_id: int) -> str:
        proc = self.run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        if proc.returncode != 0:
            return "GONE"  # purged after MinJobAge: it ended
        return _fields(proc.stdout).get("JobState", "UNKNOWN")

    def wait(self, jobs: Sequence[Job], timeout: float, poll: float = 0.5) -> dict[int, str]:
        """Final state of every job; jobs still running at `timeout` are cancelled (state TIMEOUT)."""
        states: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while len(states) < len(jobs):
            for job in jobs:
                if job.job_id in states:
                    continue
                state = self.job_state(job.job_id)
                if state in FINAL_STATES:
                    states[job.job_id] = state
            if len(states) < len(jobs):
                if time.monotonic() > deadline:
                    for job in jobs:
                        if job.job_id not in states:
                            self.cancel(job.job_id)
                            states[job.job_id] = "TIMEOUT"
                    break
                time.sleep(poll)
        return states

    def cancel(self, job_id: int) -> None:
        self.run(["scancel", str(job_id)], check=False)

    # The operator logs in as the image's default user: changing a node's state is root's (or SlurmUser's).
    def drain(self, node: str, reason: str) -> None:
        self.run(["sudo", "-n", self._as_root("scontrol"), "update", f"nodename={node}", "state=drain",
                  f"reason={reason}"])

    def resume(self, node: str) -> None:
        self.run(["sudo", "-n", self._as_root("scontrol"), "update", f"nodename={node}", "state=resume"])

    def _as_root(self, command: str) -> str:
        return f"{self.slurm_bin_dir}/{command}" if self.slurm_bin_dir else command


def _fields(line: str) -> dict[str, str]:
    """`Key=Value Key2=Value two` from `scontrol -o show`; Reason may contain spaces and is the last key."""
    out: dict[str, str] = {}
    key = None
    for token in line.strip().split(" "):
        if "=" in token and token.split("=", 1)[0].isidentifier():
            key, value = token.split("=", 1)
            out[key] = value
        elif key:
            out[key] += " " + token
    return out
