"""One AWS emulator (moto server mode) per local tenant, kept running between tasks.

moto keeps its state in memory only, so "a second deploy changes nothing" needs the emulator to
outlive one `invoke` run: it runs detached on a free port of the address it is given (the tenant's VPC
router address on its local bridge, so the local hosts reach it as they would reach AWS's endpoints), and
its pid, address, port and log are recorded in inventories/<org>/generated/emulator.json. A later task reuses it when that pid is still
our emulator on that port; if it died, the task says so and starts a fresh (empty) one.
`stop_emulator(org)` stops it (called by `invoke destroy`, and by the deploy flow's cleanup).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fmcluster.paths import PACKAGE_DIR, generated_dir, real_dir, tenant_dir, write_fresh
from fmcluster.providers.local import daemons

STATE_FILE = "emulator.json"
LOG_FILE = "emulator.log"
MODULE = "fmcluster.providers.local.emulator_server"
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Emulator:
    org: str
    pid: int
    host: str
    port: int
    log: Path
    started: bool  # True: started by this call; False: an already running one was reused
    note: str  # what happened, for the progress display

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"


def _state_path(org: str, root: Path | None) -> Path:
    return generated_dir(org, root) / STATE_FILE


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _is_our_emulator(pid: int, port: int) -> bool:
    """The pid is alive and is our emulator server on that port (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return MODULE.encode() in cmdline and str(port).encode() in cmdline


def _answers(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/moto-api/", timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def read_state(org: str, root: Path | None = None) -> dict[str, object] | None:
    path = _state_path(org, root)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def running_emulator(org: str, root: Path | None = None) -> Emulator | None:
    """The tenant's emulator if it is alive and answering, else None (reads state only)."""
    state = read_state(org, root)
    if not state:
        return None
    pid, port = int(str(state.get("pid", 0))), int(str(state.get("port", 0)))
    host = str(state.get("host", "127.0.0.1"))
    if pid and port and _is_our_emulator(pid, port) and _answers(host, port):
        return Emulator(org, pid, host, port, Path(str(state.get("log", ""))), False,
                        f"reusing the AWS emulator of '{org}' (moto, pid {pid}, {host}:{port})")
    return None


def ensure_emulator(org: str, root: Path | None = None, host: str = "127.0.0.1") -> Emulator:
    """Reuse the tenant's running emulator (on `host`) or start one there; says which in `Emulator.note`."""
    alive = running_emulator(org, root)
    if alive and alive.host == host:
        return alive
    if alive:  # listening where the local hosts cannot reach it: its state cannot be kept
        stop_emulator(org, root)
    previous = read_state(org, root)
    gen = real_dir(generated_dir(org, root), tenant_dir(org, root))
    port, log = _free_port(host), gen / LOG_FILE
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_DIR.parent), env.get("PYTHONPATH", "")]))
    env.setdefault("AWS_ACCESS_KEY_ID", "emulator")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "emulator")
    pid = daemons.start([sys.executable, "-m", MODULE, "--host", host, "--port", str(port)], log, host, port,
                        START_TIMEOUT_S, "the AWS emulator", env=env, ready=lambda: _answers(host, port))
    write_fresh(_state_path(org, root), json.dumps({"pid": pid, "host": host, "port": port, "log": str(log),
                                                    "started_at": time.time()}) + "\n", tenant_dir(org, root))
    if previous:
        note = (f"the AWS emulator of '{org}' (pid {previous.get('pid')}) is gone, and its state with it: "
                f"started a fresh one (pid {pid}, {host}:{port}); every stack will be created again")
    else:
        note = f"started the AWS emulator of '{org}' (moto, pid {pid}, {host}:{port}, log {log})"
    return Emulator(org, pid, host, port, log, True, note)


def stop_emulator(org: str, root: Path | None = None, timeout_s: float = 10.0) -> bool:
    """Stop the tenant's emulator if it runs; forget its state. True if one was stopped."""
    state = read_state(org, root)
    _state_path(org, root).unlink(missing_ok=True)
    if not state:
        return False
    pid, port = int(str(state.get("pid", 0))), int(str(state.get("port", 0)))
    if not (pid and _is_our_emulator(pid, port)):
        return False
    daemons.stop(pid, timeout_s)
    return True
