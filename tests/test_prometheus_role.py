"""roles/prometheus converges a real Prometheus on this host (a local connection, a plain supervised process, every
path and the port under a temporary directory): it listens on loopback only, its lifecycle API is off (anyone who
reaches the port could otherwise POST /-/quit), a changed configuration is reloaded by SIGHUP (same process, new
configuration), a second converge and a --check run change nothing, and extra flags that would enable the
lifecycle or admin API are refused before anything runs (issue 42)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from role_helpers import converge_role

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/usr/bin/prometheus").exists(), reason="Debian's prometheus is missing"),
              pytest.mark.skipif(os.geteuid() != 0, reason="runs Prometheus as the prometheus user")]


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory the prometheus user can reach (pytest's own are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="fmct-prometheus-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def converge(tmp: Path, variables: dict[str, Any], *extra: str) -> tuple[int, int, str]:
    return converge_role("prometheus", tmp, variables, *extra)


def post(url: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def loaded_config(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/status/config", timeout=5) as answer:
        return str(json.loads(answer.read())["data"]["yaml"])


def listening(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]) if len(address) == 8 else address)
    return found


def test_prometheus_listens_on_loopback_without_lifecycle_api_and_reloads_by_sighup(base: Path) -> None:
    tmp_path, port = base, free_port()
    settings = {"prometheus_install": False, "prometheus_port": port, "prometheus_config_dir": str(tmp_path / "etc"),
            "prometheus_data_dir": str(tmp_path / "lib" / "prometheus" / "data"),
            "prometheus_run_dir": str(tmp_path / "run"), "prometheus_service_name": f"fmct-prometheus-{port}",
            "prometheus_external_labels": {"cluster": "first"}, "supervised_service_mode": "process",
            "prometheus_environment_file": ""}
    pidfile = tmp_path / "run" / f"fmct-prometheus-{port}.pid"
    try:
        code, changed, out = converge(tmp_path, settings)
        assert code == 0 and changed > 0, out[-4000:]
        pid = pidfile.read_text().strip()
        assert listening(port) == {"127.0.0.1"}
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        assert not [arg for arg in argv if "enable-lifecycle" in arg or "enable-admin-api" in arg], argv
        assert post(f"http://127.0.0.1:{port}/-/quit") == 403
        assert post(f"http://127.0.0.1:{port}/-/reload") == 403
        assert Path(f"/proc/{pid}").exists()
        # The TSDB's missing parent is made as root's (0755), not the prometheus user's 0750.
        parent = (tmp_path / "lib" / "prometheus").stat()
        assert (parent.st_uid, oct(parent.st_mode & 0o777)) == (0, "0o755")

        code, changed, out = converge(tmp_path, settings)
        assert (code, changed) == (0, 0), out[-4000:]
        code, changed, out = converge(tmp_path, {**settings, "prometheus_external_labels": {"cluster": "second"}},
                                      "--check")
        assert code == 0 and "cluster: first" in loaded_config(port), out[-4000:]

        code, changed, out = converge(tmp_path, {**settings, "prometheus_external_labels": {"cluster": "second"}})
        assert code == 0 and "Reload prometheus (plain process)" in out, out[-4000:]
        deadline = time.monotonic() + 20
        while "cluster: second" not in loaded_config(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "cluster: second" in loaded_config(port)
        assert pidfile.read_text().strip() == pid, "reloaded in place, not restarted"
    finally:
        subprocess.run(["start-stop-daemon", "--stop", "--quiet", "--retry=TERM/10/KILL/5", "--remove-pidfile",
                        f"--pidfile={pidfile}", "--exec=/usr/bin/prometheus"], check=False)


def test_extra_flags_enabling_the_lifecycle_api_are_refused_before_anything_runs(tmp_path: Path) -> None:
    code, _, out = converge(tmp_path, {"prometheus_install": False, "prometheus_config_dir": str(tmp_path / "etc"),
                                       "prometheus_extra_args": ["--web.enable-lifecycle"]})
    assert code != 0
    assert "prometheus_extra_args enables --web.enable-lifecycle" in " ".join(out.split())
    assert not (tmp_path / "etc").exists()
