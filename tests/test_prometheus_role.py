"""roles/prometheus converges a real Prometheus on a harness host that boots systemd as PID 1 (over ssh, as on a
node; Prometheus from Debian's package through the VPC's package source): it runs as the role's systemd unit,
listens on loopback only, its lifecycle API is off (anyone who reaches the port could otherwise POST /-/quit), a
changed configuration is reloaded by SIGHUP through the unit's ExecReload (same process, new configuration), a
second converge and a --check run change nothing, and extra flags that would enable the lifecycle or admin API
are refused before anything runs (issue 42)."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fmcluster.providers.local.hosts import Host, host_run
from role_helpers import converge_hosts, converge_role, systemd_hosts

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="harness hosts (namespaces, systemd-nspawn) need root")]

ORG = "t-prom"
VPC = "10.95.41.0/24"
PORT = 19090
UNIT = "fmcluster-prometheus"
#: A TSDB directory whose parent the image lacks: the role makes that parent root's, 0755.
DATA_DIR = "/var/lib/fmct/prometheus/data"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Host]]:
    with systemd_hosts(ORG, VPC, 1, tmp_path_factory.mktemp("prometheus-hosts")) as (inventory, hosts):
        yield inventory, hosts[0]


def run(host: Host, *argv: str) -> str:
    done = host_run(host, argv, timeout=60)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done.stdout


def post(host: Host, path: str) -> int:
    return int(run(host, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                   f"http://127.0.0.1:{PORT}{path}"))


def loaded_config(host: Host) -> str:
    return str(json.loads(run(host, "curl", "-sf", f"http://127.0.0.1:{PORT}/api/v1/status/config"))["data"]["yaml"])


def main_pid(host: Host) -> str:
    return run(host, "systemctl", "show", "--property=MainPID", "--value", UNIT).strip()


def listening(host: Host) -> set[str]:
    """Local addresses with a TCP socket listening on PORT in the host's network namespace."""
    found = set()
    for line in run(host, "cat", "/proc/net/tcp", "/proc/net/tcp6").splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[0] == "sl":
            continue
        address, hexport = fields[1].rsplit(":", 1)
        if fields[3] == "0A" and int(hexport, 16) == PORT:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]) if len(address) == 8 else address)
    return found


def play(variables: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": "prometheus", "hosts": "all", "gather_facts": False, "vars": variables, "roles": ["prometheus"]}]


def test_prometheus_runs_as_its_unit_on_loopback_without_lifecycle_api_and_reloads_by_sighup(
        host: tuple[Path, Host], tmp_path: Path) -> None:
    inventory, node = host
    settings = {"prometheus_port": PORT, "prometheus_data_dir": DATA_DIR,
                "prometheus_external_labels": {"cluster": "first"}, "prometheus_environment_file": ""}
    code, changed, out = converge_hosts(inventory, play(settings), tmp_path)
    assert code == 0 and changed[node.hostname] > 0, out[-4000:]
    assert run(node, "systemctl", "is-active", UNIT).strip() == "active"
    assert run(node, "systemctl", "is-enabled", UNIT).strip() == "enabled"
    pid = main_pid(node)
    assert pid != "0"
    assert listening(node) == {"127.0.0.1"}
    argv = run(node, "cat", f"/proc/{pid}/cmdline").split("\0")
    assert argv[0] == "/usr/bin/prometheus", argv
    assert not [arg for arg in argv if "enable-lifecycle" in arg or "enable-admin-api" in arg], argv
    assert post(node, "/-/quit") == 403
    assert post(node, "/-/reload") == 403
    assert main_pid(node) == pid
    # The TSDB's missing parent is made as root's (0755), not the prometheus user's 0750.
    assert run(node, "stat", "-c", "%U %a", str(Path(DATA_DIR).parent)).split() == ["root", "755"]
    # The packaged unit Debian started on install is stopped, disabled and not left failed.
    assert host_run(node, ["systemctl", "is-active", "--quiet", "prometheus"]).returncode != 0
    assert host_run(node, ["systemctl", "is-failed", "--quiet", "prometheus"]).returncode != 0

    code, changed, out = converge_hosts(inventory, play(settings), tmp_path)
    assert (code, changed[node.hostname]) == (0, 0), out[-4000:]
    second = {**settings, "prometheus_external_labels": {"cluster": "second"}}
    code, changed, out = converge_hosts(inventory, play(second), tmp_path, "--check")
    assert code == 0 and changed[node.hostname] > 0, out[-4000:]
    assert "cluster: first" in loaded_config(node)

    code, changed, out = converge_hosts(inventory, play(second), tmp_path)
    assert code == 0 and "RUNNING HANDLER [prometheus : Reload prometheus]" in out, out[-4000:]
    deadline = time.monotonic() + 30
    while "cluster: second" not in loaded_config(node) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "cluster: second" in loaded_config(node)
    assert main_pid(node) == pid, "reloaded in place, not restarted"
    assert run(node, "systemctl", "show", "--property=NRestarts", "--value", UNIT).strip() == "0"


def test_extra_flags_enabling_the_lifecycle_api_are_refused_before_anything_runs(tmp_path: Path) -> None:
    code, _, out = converge_role("prometheus", tmp_path, {"prometheus_install": False,
                                                          "prometheus_config_dir": str(tmp_path / "etc"),
                                                          "prometheus_extra_args": ["--web.enable-lifecycle"]})
    assert code != 0
    assert "prometheus_extra_args enables --web.enable-lifecycle" in " ".join(out.split())
    assert not (tmp_path / "etc").exists()
