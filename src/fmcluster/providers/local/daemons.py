"""The substrate's own daemons (the package source, the stand-in directory): started detached, known by a pid
recorded in a state file, checked by the program and argument they run with, stopped with TERM then KILL.

A daemon outlives the task that started it (its own session) and is stopped by the task that removes the
substrate; a pid the state file names is only ever signalled when /proc says it is still that daemon."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from fmcluster.providers.local.hosts import SubstrateError


def answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def runs(pid: int, program: str, argument: str) -> bool:
    """Whether `pid` is still `program` (its argv[0] ends so) started with `argument` among its arguments."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(pid) and bool(cmdline) and cmdline[0].endswith(program.encode()) and argument.encode() in cmdline


def read_state(path: Path) -> dict[str, Any]:
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def start(argv: list[str], console: Path, address: str, port: int, timeout_s: float, what: str) -> int:
    """Start `argv` detached, its output appended to `console`; its pid once it accepts connections on
    address:port, else SubstrateError naming `what` and the console log (the process is killed)."""
    with console.open("ab") as sink:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        except FileNotFoundError:
            raise SubstrateError(f"{argv[0]} is missing; run scripts/bootstrap.sh (it installs {what} from Debian's "
                                 "packages)") from None
    deadline = time.monotonic() + timeout_s
    while not answers(address, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SubstrateError(f"{what} ({address}:{port}) did not start; see {console}")
        time.sleep(0.1)
    return proc.pid


def stop(pid: int, timeout_s: float = 10.0) -> None:
    """TERM, wait up to `timeout_s` (reaping it when it is our child), then KILL."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if Path(f"/proc/{pid}").exists():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
