"""Helpers shared by the monitoring tests: free ports, a real Prometheus process, its HTTP API."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RULES_FILE = ROOT / "roles" / "prometheus" / "files" / "rules" / "fmcluster-alerts.yml"
RULE_TESTS = ROOT / "tests" / "promtool" / "fmcluster-alerts.test.yml"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def api_get(base: str, path: str, **params: str) -> dict[str, Any]:
    """GET a Prometheus API path; error responses (400 bad_data ...) come back as their JSON body."""
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return dict(json.load(response))
    except urllib.error.HTTPError as err:
        return dict(json.load(err))


def wait_ready(base: str, process: subprocess.Popen[bytes] | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"prometheus at {base} not ready after {timeout}s")
