"""The node program as slurmd runs it: `python3 -m fmcluster.health check --context=interval` with only
SLURMD_NODENAME set, a real process reading a real config file. scontrol is a stand-in script that answers
`show node` with a recorded block and logs every update it is asked for: the drain and resume decisions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from fmcluster.catalog import load_catalog
from fmcluster.health import data
from slurm_outputs import node_block

NODE = "cpu-7"


def stand_in(path: Path, stdout: str = "", code: int = 0, stderr: str = "", log: Path | None = None) -> list[str]:
    """An executable that prints `stdout`/`stderr`, appends its argv to `log`, exits `code`."""
    path.write_text(f"#!{sys.executable}\nimport sys, json\n"
                    + (f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n" if log else "")
                    + f"sys.stdout.write({stdout!r}); sys.stderr.write({stderr!r}); sys.exit({code})\n")
    path.chmod(0o755)
    return [str(path)]


def setup(tmp: Path, state: str = "IDLE", reason: str = "", by: str = "root", munge_ok: bool = True,
          scontrol_error: str = "", min_free_percent: float = 0) -> tuple[Path, Path]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp / "scontrol.log"
    shown = node_block(NODE, state, reason, by=by)
    commands = {
        "munge": stand_in(bin_dir / "munge", "MUNGE:cred:\n") if munge_ok else
        stand_in(bin_dir / "munge", "", 6, "munge: Error: Failed to access socket\n"),
        "unmunge": stand_in(bin_dir / "unmunge", "STATUS: Success (0)\n"),
        "scontrol": stand_in(bin_dir / "scontrol", "" if scontrol_error else shown, 1 if scontrol_error else 0,
                             scontrol_error, log),
    }
    config = data.node_config("%n", load_catalog()["c5.2xlarge"].as_vars(), False, 1, commands=commands,
                              disk=[{"path": str(tmp), "min_free_percent": min_free_percent}],
                              report_dir=str(tmp / "reports"), state_dir=str(tmp / "state" / "%n"),
                              textfile_dir=str(tmp / "textfile" / "%n"))
    path = tmp / "nodes" / NODE / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(config))
    return tmp / "nodes" / "%n" / "config.json", log


def slurmd_runs(config: Path, context: str = "interval", env: dict[str, str] | None = None,
                ) -> subprocess.CompletedProcess[str]:
    """The program as slurmd starts it: a bare environment with SLURMD_NODENAME (and PYTHONPATH for the test)."""
    base = {"SLURMD_NODENAME": NODE, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "fmcluster.health", "check", f"--context={context}",
                           f"--config={config}"], env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=60)


def updates(log: Path) -> list[list[str]]:
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [c for c in calls if c[0] == "update"]


def test_a_failing_check_drains_the_node_with_the_reason_naming_the_check(tmp_path: Path) -> None:
    config, log = setup(tmp_path, min_free_percent=101)
    done = slurmd_runs(config)
    assert done.returncode == 1, done.stdout + done.stderr
    (update,) = updates(log)
    assert update[:3] == ["update", f"nodename={NODE}", "state=drain"]
    assert update[3].startswith("reason=fmcluster-health: disk: ")
    report = json.loads((tmp_path / "reports" / f"{NODE}.json").read_text())
    assert report["drain"] == {"attempted": True, "ok": True, "action": "drain", "detail": update[3][len("reason="):]}
    assert 'fmcluster_health_check_failed{check="disk",context="interval"} 1' in (
        tmp_path / "textfile" / NODE / "fmcluster_health.prom").read_text()


def test_a_healthy_node_drained_by_the_health_program_is_resumed(tmp_path: Path) -> None:
    config, log = setup(tmp_path, "IDLE+DRAIN", "fmcluster-health: mounts: /fsx is not mounted")
    assert slurmd_runs(config).returncode == 0
    assert updates(log) == [["update", f"nodename={NODE}", "state=resume"]]


def test_a_node_drained_by_a_person_is_never_resumed_nor_redrained(tmp_path: Path) -> None:
    config, log = setup(tmp_path, "IDLE+DRAIN", "swapping the NIC", by="ops")
    assert slurmd_runs(config).returncode == 0 and updates(log) == []
    config, log = setup(tmp_path / "again", "IDLE+DRAIN", "swapping the NIC", by="ops", min_free_percent=101)
    done = slurmd_runs(config)
    assert done.returncode == 1 and updates(log) == []
    assert "already drained by ops (swapping the NIC); left as it is" in done.stdout


def test_a_node_already_drained_with_the_same_reason_is_left_as_it_is(tmp_path: Path) -> None:
    config, log = setup(tmp_path / "first", min_free_percent=101)
    slurmd_runs(config)
    reason = updates(log)[0][3][len("reason="):]
    config, log = setup(tmp_path / "again", "IDLE+DRAIN", reason, min_free_percent=101)
    assert slurmd_runs(config).returncode == 1 and updates(log) == []


def test_a_node_slurmctld_rejects_cannot_drain_itself_and_says_so_in_its_report(tmp_path: Path) -> None:
    config, log = setup(tmp_path, scontrol_error="slurm_load_node error: Zero Bytes were transmitted or received\n")
    assert slurmd_runs(config).returncode == 1
    report = json.loads((tmp_path / "reports" / f"{NODE}.json").read_text())
    assert report["reason"].startswith("fmcluster-health: munge: slurmctld rejects this node's credentials")
    assert report["drain"]["attempted"] is False and "cannot read this node's Slurm state" in report["drain"]["detail"]
    assert updates(log) == []


def test_the_prolog_of_a_job_without_gpus_does_nothing_at_all(tmp_path: Path) -> None:
    done = slurmd_runs(tmp_path / "no-such-config.json", context="prolog")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_the_prolog_of_a_gpu_job_runs_the_gpu_checks(tmp_path: Path) -> None:
    config, log = setup(tmp_path)
    done = slurmd_runs(config, context="prolog", env={"SLURM_JOB_GPUS": "0,1"})
    # c5.2xlarge has no GPU: every prolog check skips, the node stays in service.
    assert done.returncode == 0 and "SKIP  gpu-count" in done.stdout and updates(log) == []


def test_a_missing_config_is_a_usage_error_not_a_pass(tmp_path: Path) -> None:
    done = slurmd_runs(tmp_path / "nodes" / "%n" / "missing.json")
    assert done.returncode == 2 and "No such file" in done.stderr


def _packed_modules() -> list[str]:
    import yaml

    return [m for m in yaml.safe_load((ROOT / "roles/node_health/defaults/main.yml").read_text())["node_health_modules"]
            if m != "__init__"]


@pytest.mark.parametrize("module", _packed_modules())
def test_the_modules_installed_on_nodes_need_only_the_standard_library(module: str) -> None:
    """What the node_health role packs imports with a bare python3 and nothing of fmcluster beyond it (run, beside
    tests/test_node_runtime.py's reading of the import graph)."""
    lib = ROOT / "src"
    code = (f"import sys; sys.path[:0] = [{str(lib)!r}]; import fmcluster.health.{module}; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('yaml', 'jsonschema', 'boto3') "
            "or (m.startswith('fmcluster.') and not m.startswith('fmcluster.health'))); print(bad)")
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env={})
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_the_role_installs_every_node_module_and_none_that_needs_more() -> None:
    import yaml

    listed = set(yaml.safe_load((ROOT / "roles/node_health/defaults/main.yml").read_text())["node_health_modules"])
    present = {p.stem for p in (ROOT / "src/fmcluster/health").glob("*.py")}
    # the zip application has its own __main__; bundle packs it; data, inventory, docs are fmcluster's side
    assert present - listed == {"__main__", "bundle", "data", "inventory", "docs"}
    assert listed <= present


def test_the_packed_program_runs_as_an_executable_and_is_the_same_bytes_every_time(tmp_path: Path) -> None:
    import yaml

    from fmcluster.health import bundle

    modules = yaml.safe_load((ROOT / "roles/node_health/defaults/main.yml").read_text())["node_health_modules"]
    first = bundle.build(tmp_path / "a" / "fmcluster-health", modules).read_bytes()
    assert bundle.build(tmp_path / "b" / "fmcluster-health", list(reversed(modules))).read_bytes() == first
    assert first.startswith(b"#!/usr/bin/python3\n")
    done = subprocess.run([str(tmp_path / "a" / "fmcluster-health"), "--help"], capture_output=True,
                          text=True, env={})
    assert done.returncode == 0 and "which checks apply here" in done.stdout
