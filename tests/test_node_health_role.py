"""roles/node_health converges on a harness host that boots systemd as PID 1 (over ssh, as on a node), as two
inventory hosts of one machine: compute node cpu-7 and the controller controller-1, every path under one test
directory. The program and its config install, a second run and a --check run change nothing, the program
slurm.conf names runs as slurmd would run it, the config equals what fmcluster.health.data builds, and the
controller's pass runs as its systemd unit. Tools it would call (scontrol, munge) are stand-in scripts: nothing
here needs a cluster."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fmcluster.catalog import load_catalog
from fmcluster.health import data
from fmcluster.images import load_images
from fmcluster.providers.local.hosts import Host, host_run
from role_helpers import converge_hosts, systemd_hosts
from health_helpers import diag_r2_pass, gpu_outputs
from slurm_outputs import node_block

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="harness hosts (namespaces, systemd-nspawn) need root")]

ORG = "t-health"
VPC = "10.95.42.0/24"
#: Everything the role writes, on the host.
BASE = Path("/srv/fmct-health")
UNIT = "fmcluster-health-cluster"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Host]]:
    with systemd_hosts(ORG, VPC, 1, tmp_path_factory.mktemp("health-hosts")) as (inventory, hosts):
        yield inventory, hosts[0]


def on_host(node: Host, path: Path) -> Path:
    """A path of the host as this machine sees it (its root file system)."""
    return node.root / path.relative_to("/")


def stand_in(node: Host, path: Path, stdout: str) -> list[str]:
    target = on_host(node, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}EOF\n")
    target.chmod(0o755)
    return [str(path)]


def inventory(harness_inventory: Path, node: Host, tmp: Path) -> Path:
    """cpu-7 and controller-1, both this host, with the harness's connection settings."""
    connection = yaml.safe_load(harness_inventory.read_text())["all"]["vars"]
    commands = {"scontrol": stand_in(node, BASE / "bin" / "scontrol", node_block("cpu-7")),
                "munge": stand_in(node, BASE / "bin" / "munge", "MUNGE:cred:\n"),
                "unmunge": stand_in(node, BASE / "bin" / "unmunge", "STATUS: Success (0)\n")}
    common = {
        **connection, "ansible_host": node.address,
        "fmcluster_capabilities": {"real_accelerators": False, "slurm_owner": "fmcluster"},
        "fmcluster_instance": load_catalog()["c5.2xlarge"].as_vars(),
        "slurm_nodes": [{"name": "cpu-7", "real_memory_mb": 1024}],
        "node_health_install_dir": str(BASE / "health"),
        "node_health_config_path": str(BASE / "nodes" / "%n" / "health" / "config.json"),
        "node_health_cluster_config_path": str(BASE / "health" / "cluster.json"),
        "node_health_state_dir": str(BASE / "nodes" / "%n" / "state"),
        "node_health_report_dir": str(BASE / "reports"),
        "node_health_reports_shared": True,
        "node_health_textfile_dir": str(BASE / "nodes" / "{{ inventory_hostname }}" / "textfile"),
        "node_health_commands": commands,
        "node_health_disk": [{"path": str(BASE), "min_free_percent": 1, "min_free_mib": 1}],
        "node_health_interval": 5,
    }
    # A p5 node of a substrate with the catalog's GPUs, whose dcgmi is a stand-in answering as 8 healthy GPUs do.
    dcgmi = on_host(node, BASE / "bin" / "dcgmi")
    dcgmi.write_text("#!/bin/sh\ncase \"$1\" in\n  discovery) cat <<'EOF'\n"
                     + gpu_outputs.fixture("dcgmi-discovery-8.txt") + "EOF\n  ;;\n  diag) cat <<'EOF'\n"
                     + diag_r2_pass() + "\nEOF\n  ;;\nesac\n")
    dcgmi.chmod(0o755)
    # ... booted from slurm-ec2's GPU image, whose contract names DCGM's host engine unit (the manifest's group vars).
    dlami = load_images().ec2_image("cuda").contract.role_vars()
    gpu = {"node_health_scope": "node", "fmcluster_capabilities": {"real_accelerators": True, "slurm_owner": "fmcluster"},
           "fmcluster_instance": load_catalog()["p5.48xlarge"].as_vars(),
           "node_health_dcgm_service": dlami["node_health_dcgm_service"],
           "slurm_nodes": [{"name": "gpu-3", "real_memory_mb": 1024}],
           "node_health_commands": {**commands, "dcgmi": [str(BASE / "bin" / "dcgmi")]}}
    # cpu-7 shares this machine with gpu-3: its "no boot diagnostic here" must not remove gpu-3's unit.
    doc = {"all": {"vars": common, "hosts": {"cpu-7": {"node_health_scope": "node",
                                                       "node_health_unit_dir": str(BASE / "nodes" / "cpu-7")},
                                              "controller-1": {"node_health_scope": "cluster"},
                                              "gpu-3": gpu}}}
    path = tmp / "health-hosts.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


PLAY: list[dict[str, Any]] = [{"name": "node_health", "hosts": "all", "gather_facts": True, "gather_subset": ["min"],
                               "roles": [{"role": "node_health"}]}]


def run(node: Host, *argv: str) -> str:
    done = host_run(node, argv, timeout=60)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done.stdout


def test_node_health_converges_idempotently_and_runs_as_slurm_runs_it(host: tuple[Path, Host], tmp_path: Path) -> None:
    harness_inventory, node = host
    hosts = inventory(harness_inventory, node, tmp_path)
    code, changed, out = converge_hosts(hosts, PLAY, tmp_path)
    assert code == 0, out[-4000:]
    assert changed["cpu-7"] > 0 and changed["controller-1"] > 0
    assert "skip  gpu-count" in out  # the role shows which checks apply, and why the others skip

    code, changed, out = converge_hosts(hosts, PLAY, tmp_path)
    assert code == 0 and changed == {"cpu-7": 0, "controller-1": 0, "gpu-3": 0}, out[-4000:]
    code, changed, out = converge_hosts(hosts, PLAY, tmp_path, "--check", "--diff")
    assert code == 0 and changed == {"cpu-7": 0, "controller-1": 0, "gpu-3": 0}, out[-4000:]

    # The program slurm.conf names, in the bare environment slurmd gives it.
    check = str(BASE / "health" / "bin" / "fmcluster-health-slurmd")
    done = host_run(node, ["env", "-i", "SLURMD_NODENAME=cpu-7", check], timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(on_host(node, BASE / "reports" / "cpu-7.json").read_text())
    assert report["healthy"] and {r["check"]: r["status"] for r in report["results"]}["munge"] == "pass"
    assert on_host(node, BASE / "nodes" / "cpu-7" / "textfile" / "fmcluster_health.prom").is_file()

    # The same program is the Prolog: a job given no GPU leaves at once; a GPU job runs the prolog checks.
    prolog_report = on_host(node, BASE / "reports" / "cpu-7.prolog.json")
    done = host_run(node, ["env", "-i", "SLURMD_NODENAME=cpu-7", "SLURM_JOB_ID=7", check], timeout=60)
    assert done.returncode == 0 and not prolog_report.exists(), done.stdout + done.stderr
    done = host_run(node, ["env", "-i", "SLURMD_NODENAME=cpu-7", "SLURM_JOB_ID=8", "SLURM_JOB_GPUS=0", check],
                    timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(prolog_report.read_text())["context"] == "prolog"

    # The config the role wrote is the one fmcluster builds for the same node (doctor runs the same checks).
    installed = json.loads(on_host(node, BASE / "nodes" / "cpu-7" / "health" / "config.json").read_text())
    built = data.node_config("cpu-7", load_catalog()["c5.2xlarge"].as_vars(), False, 1024,
                             # a compute node is configless: scontrol reads the copy slurmd caches
                             slurm_conf="/var/spool/slurmd/conf-cache/slurm.conf", munge_socket="",
                             report_dir=str(BASE / "reports"), state_dir=str(BASE / "nodes" / "%n" / "state"),
                             textfile_dir=str(BASE / "nodes" / "cpu-7" / "textfile"),
                             disk=[{"path": str(BASE), "min_free_percent": 1, "min_free_mib": 1}],
                             commands=installed["commands"])
    assert installed == json.loads(json.dumps(built))

    # The controller's pass runs as its systemd unit, enabled for the next boot.
    assert run(node, "systemctl", "is-active", UNIT).strip() == "active"
    assert run(node, "systemctl", "is-enabled", UNIT).strip() == "enabled"
    pid = run(node, "systemctl", "show", "--property=MainPID", "--value", UNIT).strip()
    assert run(node, "cat", f"/proc/{pid}/cmdline").split("\0")[1:4] == [
        str(BASE / "health" / "bin" / "fmcluster-health"), "cluster", f"--config={BASE / 'health' / 'cluster.json'}"]


def test_a_gpu_node_runs_its_boot_diagnostic_as_a_unit_before_slurmd_and_serves_only_on_its_record(
        host: tuple[Path, Host], tmp_path: Path) -> None:
    """Issue 38: on a GPU node the role installs fmcluster-health-boot (before slurmd, every boot) and runs it once
    at the converge; its record, of this boot at the tenant's level, is what the check return-diag passes on. A
    CPU node gets no unit. (The converge is the previous test's; this one reads what it left.)"""
    harness_inventory, node = host
    hosts = inventory(harness_inventory, node, tmp_path)
    code, _, out = converge_hosts(hosts, PLAY, tmp_path)
    assert code == 0, out[-4000:]
    unit = "fmcluster-health-boot.service"
    assert run(node, "systemctl", "is-enabled", unit).strip() == "enabled"
    shown = dict(line.split("=", 1) for line in run(
        node, "systemctl", "show", "--property=ActiveState,Result,Before,After,Wants,TimeoutStartUSec", unit).splitlines())
    assert (shown["ActiveState"], shown["Result"]) == ("active", "success"), shown
    assert "fmcluster-slurmd.service" in shown["Before"].split() and shown["TimeoutStartUSec"] == "16min 50s", shown
    # DCGM's host engine, as the image contract names it (the harness has no such unit: Wants= tolerates that)
    assert "nvidia-dcgm.service" in shown["Wants"].split() and "nvidia-dcgm.service" in shown["After"].split(), shown
    record = json.loads(on_host(node, BASE / "nodes" / "gpu-3" / "state" / "boot.json").read_text())
    boot_id = run(node, "cat", "/proc/sys/kernel/random/boot_id").strip()
    assert (record["boot_id"], record["level"], record["healthy"]) == (boot_id, 2, True), record
    config = str(BASE / "nodes" / "%n" / "health" / "config.json")
    done = host_run(node, [str(BASE / "health" / "bin" / "fmcluster-health"), "check", "--node=gpu-3",
                           f"--config={config}", "--only=return-diag", "--no-drain"], timeout=60)
    assert done.returncode == 0 and "this boot's DCGM diagnostic (level 2) passed" in done.stdout, done.stdout
    cpu_show = run(node, str(BASE / "health" / "bin" / "fmcluster-health"), "show", "--node=cpu-7", f"--config={config}")
    assert "skip  dcgm-deep" in cpu_show and "skip  return-diag" in cpu_show


def test_a_gpu_node_given_the_unit_while_serving_enables_it_without_running_it_and_keeps_serving(
        host: tuple[Path, Host], tmp_path: Path) -> None:
    """An upgrade of a running cluster: gpu-3 serves (slurmd active on this boot) and has neither the boot unit nor
    a record, as under a release before it. The converge enables the unit but starts no diagnostic on busy GPUs,
    leaves the serving marker of this boot, and return-diag passes on it, saying so; a second converge changes
    nothing. (slurmd is a stand-in unit under slurmd's unit name; the previous tests' converges left the unit.)"""
    harness_inventory, node = host
    hosts = inventory(harness_inventory, node, tmp_path)
    unit = "fmcluster-health-boot.service"
    state = on_host(node, BASE / "nodes" / "gpu-3" / "state")
    slurmd = on_host(node, Path("/etc/systemd/system/fmcluster-slurmd.service"))
    # As under an earlier release: no boot unit (removed and unloaded, so systemd forgets it ran) and no record.
    run(node, "systemctl", "disable", "--now", unit)
    on_host(node, Path("/etc/systemd/system") / unit).unlink()
    (state / "boot.json").unlink()
    slurmd.write_text("[Service]\nExecStart=/bin/sleep infinity\n")
    try:
        run(node, "systemctl", "daemon-reload")
        run(node, "systemctl", "start", "fmcluster-slurmd.service")
        assert run(node, "systemctl", "show", "--property=InactiveExitTimestampMonotonic", "--value", unit).strip() == "0"
        code, changed, out = converge_hosts(hosts, PLAY, tmp_path)
        assert code == 0 and changed["gpu-3"] > 0, out[-4000:]
        assert run(node, "systemctl", "is-enabled", unit).strip() == "enabled"
        assert run(node, "systemctl", "show", "--property=ActiveState", "--value", unit).strip() == "inactive"
        assert not (state / "boot.json").exists()  # no diagnostic ran on the serving node's GPUs
        boot_id = run(node, "cat", "/proc/sys/kernel/random/boot_id").strip()
        assert json.loads((state / "boot-serving.json").read_text()) == {"boot_id": boot_id}
        config = str(BASE / "nodes" / "%n" / "health" / "config.json")
        done = host_run(node, [str(BASE / "health" / "bin" / "fmcluster-health"), "check", "--node=gpu-3",
                               f"--config={config}", "--only=return-diag", "--no-drain"], timeout=60)
        assert done.returncode == 0 and "installed while this node served" in done.stdout, done.stdout
        code, changed, out = converge_hosts(hosts, PLAY, tmp_path)
        assert code == 0 and changed == {"cpu-7": 0, "controller-1": 0, "gpu-3": 0}, out[-4000:]
        assert not (state / "boot.json").exists()
    finally:
        host_run(node, ["systemctl", "stop", "fmcluster-slurmd.service"], timeout=60)
        slurmd.unlink(missing_ok=True)
        host_run(node, ["systemctl", "daemon-reload"], timeout=60)
