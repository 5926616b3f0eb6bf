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
from collections.abc import Callable
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


def start(argv: list[str], console: Path, address: str, port: int, timeout_s: float, what: str,
          env: dict[str, str] | None = None, ready: Callable[[], bool] | None = None) -> int:
    """Start `argv` detached (with `env`, else this process's), its output appended to `console`; its pid once it
    is `ready` (default: accepts connections on address:port), else SubstrateError naming `what` and the console log
    (the process is killed)."""
    # O_NOFOLLOW: a link planted at the console's path is refused, not appended through.
    with os.fdopen(os.open(console, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644), "ab") as sink:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        except FileNotFoundError:
            raise SubstrateError(f"{argv[0]} is missing; run scripts/bootstrap.sh (it installs {what} from Debian's "
                                 "packages)") from None
    is_ready = ready or (lambda: answers(address, port))
    deadline = time.monotonic() + timeout_s
    while not is_ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise SubstrateError(f"{what} ({address}:{port}) did not start (exit {proc.returncode}); see {console}")
        time.sleep(0.1)
    return proc.pid


def stop(pid: int, timeout_s: float = 10.0) -> None:
    """TERM, wait up to `timeout_s`, then KILL and wait as long again; a child of ours is reaped."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s  # KILL is not refused, but a process in D state dies late
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def alive(pid: int) -> bool:
    """Still running; a zombie child of ours is reaped and counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True
