"""The only I/O the checks do: run a command under a deadline, read a file. Tests point both at recorded outputs."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence


@dataclass
class Completed:
    argv: Sequence[str]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    missing: bool = False  # the program does not exist

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.missing

    def why(self) -> str:
        """One line saying how the command failed, for a check's detail."""
        name = os.path.basename(self.argv[0]) if self.argv else "command"
        if self.missing:
            return f"{name} is not installed (not found: {self.argv[0]})"
        if self.timed_out:
            return f"{name} did not finish in time"
        text = " ".join((self.stderr.strip() or self.stdout.strip()).split())
        return f"{name} exited {self.returncode}" + (f": {text[:160]}" if text else "")


class Probe:
    """Runs commands and reads files for the checks. `env` is added to every command's environment."""

    def __init__(self, env: Optional[Mapping[str, str]] = None) -> None:
        self.env: Dict[str, str] = dict(os.environ)
        self.env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        self.env.update(env or {})

    def run(self, argv: Sequence[str], timeout: float, stdin: Optional[str] = None) -> Completed:
        """Run argv; never waits much past `timeout`, even for a child stuck in the kernel (a hung mount):
        the child is killed and, if it cannot die, abandoned."""
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        except FileNotFoundError:
            return Completed(argv, 127, "", "", missing=True)
        except PermissionError as denied:
            return Completed(argv, 126, "", str(denied))
        try:
            out, err = proc.communicate(stdin, timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                out, err = proc.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:
                out, err = "", ""
            return Completed(argv, -9, out or "", err or "", timed_out=True)
        return Completed(argv, proc.returncode, out, err)

    def read(self, path: str) -> str:
        """A file's text; OSError propagates (the caller says what could not be read)."""
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def now(self) -> float:
        return time.time()


class Deadline:
    """The run's time budget: Slurm kills a HealthCheckProgram after 60 s, and a killed run drains nothing."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def timeout(self, wanted: float) -> float:
        return max(min(wanted, self.left()), 0.0)
