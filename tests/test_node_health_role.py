"""roles/node_health converges on this host (a local connection, everything under a temporary directory): the
program and its config install, a second run and a --check run change nothing, the program slurm.conf names runs
as slurmd would run it, the config equals what fmcluster.health.data builds, and the controller's pass runs as a
supervised process. Tools it would call (scontrol, munge) are stand-in scripts: nothing here needs a cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, venv_tool
from fmcluster.catalog import load_catalog
from fmcluster.health import data
from slurm_outputs import node_block

pytestmark = pytest.mark.slow


def stand_in(path: Path, stdout: str) -> list[str]:
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}EOF\n")
    path.chmod(0o755)
    return [str(path)]


def inventory(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    commands = {"scontrol": stand_in(bin_dir / "scontrol", node_block("cpu-7")),
                "munge": stand_in(bin_dir / "munge", "MUNGE:cred:\n"),
                "unmunge": stand_in(bin_dir / "unmunge", "STATUS: Success (0)\n")}
    common = {
        "ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3",
        "fmcluster_capabilities": {"real_accelerators": False, "slurm_owner": "fmcluster"},
        "fmcluster_instance": load_catalog()["c5.2xlarge"].as_vars(),
        "slurm_nodes": [{"name": "cpu-7", "real_memory_mb": 1024}],
        "node_health_install_dir": str(tmp / "health"),
        "node_health_config_path": str(tmp / "nodes" / "%n" / "health" / "config.json"),
        "node_health_cluster_config_path": str(tmp / "health" / "cluster.json"),
        "node_health_state_dir": str(tmp / "nodes" / "%n" / "state"),
        "node_health_report_dir": str(tmp / "reports"),
        "node_health_reports_shared": True,
        "node_health_textfile_dir": str(tmp / "nodes" / "{{ inventory_hostname }}" / "textfile"),
        "node_health_run_dir": str(tmp / "run"),
        "node_health_commands": commands,
        "node_health_disk": [{"path": str(tmp), "min_free_percent": 1, "min_free_mib": 1}],
        "node_health_interval": 5,
    }
    doc = {"all": {"vars": common, "hosts": {"cpu-7": {"node_health_scope": "node"},
                                              "controller-1": {"node_health_scope": "cluster"}}}}
    path = tmp / "hosts.yml"
    path.write_text(yaml.safe_dump(doc))
    (tmp / "play.yml").write_text(yaml.safe_dump([{"name": "node_health", "hosts": "all", "gather_facts": True, "gather_subset": ["min"],
                                                    "roles": [{"role": "node_health"}]}]))
    return path


def converge(tmp: Path, *extra: str) -> tuple[int, dict[str, int], str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
           "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp / "facts")}
    done = subprocess.run([venv_tool("ansible-playbook"), "-i", str(tmp / "hosts.yml"), str(tmp / "play.yml"), *extra],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    changed = {host: int(n) for host, n in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", done.stdout, re.M)}
    return done.returncode, changed, done.stdout


def test_node_health_converges_idempotently_and_runs_as_slurm_runs_it(tmp_path: Path) -> None:
    inventory(tmp_path)
    pidfile = tmp_path / "run" / "fmcluster-health-cluster.pid"
    try:
        code, changed, out = converge(tmp_path)
        assert code == 0, out[-4000:]
        assert changed["cpu-7"] > 0 and changed["controller-1"] > 0
        assert "skip  gpu-count" in out  # the role shows which checks apply, and why the others skip

        code, changed, out = converge(tmp_path)
        assert code == 0 and changed == {"cpu-7": 0, "controller-1": 0}, out[-4000:]
        code, changed, out = converge(tmp_path, "--check", "--diff")
        assert code == 0 and changed == {"cpu-7": 0, "controller-1": 0}, out[-4000:]

        # The program slurm.conf names, in the bare environment slurmd gives it.
        check = tmp_path / "health" / "bin" / "fmcluster-health-slurmd"
        done = subprocess.run([str(check)], env={"SLURMD_NODENAME": "cpu-7"}, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads((tmp_path / "reports" / "cpu-7.json").read_text())
        assert report["healthy"] and {r["check"]: r["status"] for r in report["results"]}["munge"] == "pass"
        assert (tmp_path / "nodes" / "cpu-7" / "textfile" / "fmcluster_health.prom").is_file()

        # The same program is the Prolog: a job given no GPU leaves at once; a GPU job runs the prolog checks.
        prolog_report = tmp_path / "reports" / "cpu-7.prolog.json"
        done = subprocess.run([str(check)], env={"SLURMD_NODENAME": "cpu-7", "SLURM_JOB_ID": "7"},
                              capture_output=True, text=True)
        assert done.returncode == 0 and not prolog_report.exists(), done.stdout + done.stderr
        done = subprocess.run([str(check)], env={"SLURMD_NODENAME": "cpu-7", "SLURM_JOB_ID": "8", "SLURM_JOB_GPUS": "0"},
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(prolog_report.read_text())["context"] == "prolog"

        # The config the role wrote is the one fmcluster builds for the same node (doctor runs the same checks).
        installed = json.loads((tmp_path / "nodes" / "cpu-7" / "health" / "config.json").read_text())
        built = data.node_config("cpu-7", load_catalog()["c5.2xlarge"].as_vars(), False, 1024,
                                 # a compute node is configless: scontrol reads the copy slurmd caches
                                 slurm_conf="/var/spool/slurmd/conf-cache/slurm.conf", munge_socket="",
                                 report_dir=str(tmp_path / "reports"),
                                 state_dir=str(tmp_path / "nodes" / "%n" / "state"),
                                 textfile_dir=str(tmp_path / "nodes" / "cpu-7" / "textfile"),
                                 disk=[{"path": str(tmp_path), "min_free_percent": 1, "min_free_mib": 1}],
                                 commands=installed["commands"])
        assert installed == json.loads(json.dumps(built))

        # The controller's pass runs supervised.
        pid = int(pidfile.read_text())
        assert Path(f"/proc/{pid}/cmdline").read_text().split("\0")[1:4] == [
            str(tmp_path / "health" / "bin" / "fmcluster-health"), "cluster",
            f"--config={tmp_path / 'health' / 'cluster.json'}"]
    finally:
        if pidfile.exists():
            subprocess.run(["start-stop-daemon", "--stop", "--quiet", "--retry=TERM/5/KILL/2", "--remove-pidfile",
                            f"--pidfile={pidfile}"], check=False)
