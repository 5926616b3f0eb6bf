"""Node convergence: the node_convergence role (re-converge timer) run for real with ansible-playbook on this
machine, and the AWS first-boot path as the rendered templates hold it.

This machine has no systemd: the role must skip and say why. With the service manager given as systemd
(`node_convergence_service_mgr`) and the timer not enabled, the role writes the unit files into a temporary
directory, so their content, idempotence and --check safety are checked without touching /etc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, VENV_BIN
from fmcluster.bootstrap import upload_bootstrap, upload_inventory
from fmcluster.model import load_tenant
from fmcluster.paths import generated_dir
from fmcluster.stacks import aws
from fmcluster.stacks.emulator import ensure_emulator, stop_emulator
from fmcluster.stacks.render import load_cfn_yaml, render_stacks, user_data_text

PLAY = """\
- name: node_convergence under test
  hosts: all
  gather_facts: false
  roles:
    - role: node_convergence
"""


def run_role(tmp_path: Path, extra: dict[str, Any], *flags: str) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp")}
    return subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={VENV_BIN / 'python'}", "-e", json.dumps(extra), *flags, str(play)],
        capture_output=True, text=True, check=False, cwd=ROOT, env=env, timeout=300)


def recap(run: subprocess.CompletedProcess[str]) -> dict[str, int]:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("localhost") and "ok=" in line)
    return {k: int(v) for k, v in (part.split("=") for part in line.split(":", 1)[1].split())}


def systemd_vars(tmp_path: Path) -> dict[str, Any]:
    return {
        "node_convergence_service_mgr": "systemd",
        "node_convergence_enable_timer": False,
        "node_convergence_systemd_dir": str(tmp_path / "units"),
        "node_convergence_env_file": str(tmp_path / "etc" / "converge.env"),
        "node_convergence_repo_url": "/var/lib/fmcluster/repo.git",
        "node_convergence_ref": "0123456789abcdef0123456789abcdef01234567",
        "node_convergence_node": "gpu-1",
        "node_convergence_inventory": ["/etc/fmcluster/inventory/hosts.yml", "/etc/fmcluster/node-vars.yml"],
        "node_convergence_refresh_command": "/usr/local/sbin/fmcluster-bootstrap --fetch",
    }


def test_without_systemd_the_role_installs_nothing_and_says_why(tmp_path: Path) -> None:
    extra = {**systemd_vars(tmp_path)}
    del extra["node_convergence_service_mgr"]  # from this machine's facts: not systemd
    for _ in range(2):
        run = run_role(tmp_path, extra)
        assert recap(run)["changed"] == 0
        said = " ".join(run.stdout.split())
        assert "fmcluster-converge.timer not installed on localhost: the service manager is" in said
        assert "not systemd (the local rehearsal has none)" in said
    assert not (tmp_path / "units").exists() and not (tmp_path / "etc").exists()


def test_without_a_repository_the_role_installs_nothing_and_says_why(tmp_path: Path) -> None:
    extra = {**systemd_vars(tmp_path), "node_convergence_repo_url": ""}
    run = run_role(tmp_path, extra)
    assert recap(run)["changed"] == 0
    said = " ".join(run.stdout.split())
    assert "fmcluster-converge.timer not installed on localhost: node_convergence_repo_url or node_convergence_ref " \
        "is empty" in said
    assert not (tmp_path / "units").exists()


def test_with_systemd_the_role_writes_a_timer_service_and_environment_idempotently(tmp_path: Path) -> None:
    extra = systemd_vars(tmp_path)
    fresh = run_role(tmp_path, extra, "--check")
    assert recap(fresh)["changed"] == 1 and "--check on a fresh node" in fresh.stdout
    assert not (tmp_path / "units").exists(), "--check writes nothing"
    (tmp_path / "units").mkdir()
    (tmp_path / "etc").mkdir()
    check = run_role(tmp_path, extra, "--check", "--diff")
    assert recap(check)["changed"] == 2 and "+OnUnitActiveSec=30min" in check.stdout, "the diff shows the units"
    assert not list((tmp_path / "units").iterdir()), "--check writes nothing"

    assert recap(run_role(tmp_path, extra))["changed"] == 2
    service = (tmp_path / "units" / "fmcluster-converge.service").read_text()
    timer = (tmp_path / "units" / "fmcluster-converge.timer").read_text()
    env = (tmp_path / "etc" / "converge.env").read_text()
    assert f"EnvironmentFile={tmp_path / 'etc' / 'converge.env'}\n" in service
    assert "ExecStartPre=/usr/local/sbin/fmcluster-bootstrap --fetch\n" in service
    assert "ExecStart=/bin/bash /opt/fmcluster/bootstrap/node-converge.sh\n" in service
    assert "Type=oneshot\n" in service
    for line in ("OnBootSec=15min", "OnUnitActiveSec=30min", "RandomizedDelaySec=5min", "WantedBy=timers.target"):
        assert f"{line}\n" in timer
    assert env.splitlines()[1:] == [
        "FMCLUSTER_REPO_URL=/var/lib/fmcluster/repo.git",
        "FMCLUSTER_REF=0123456789abcdef0123456789abcdef01234567",
        "FMCLUSTER_NODE=gpu-1",
        "FMCLUSTER_INVENTORY=/etc/fmcluster/inventory/hosts.yml /etc/fmcluster/node-vars.yml",
        "FMCLUSTER_PLAYBOOK=playbooks/site.yml",
        "FMCLUSTER_STATE_DIR=/var/lib/fmcluster",
        "FMCLUSTER_REPORT_DIR=/var/lib/fmcluster/report",
        "FMCLUSTER_VENV=/opt/fmcluster/venv",
    ]

    assert recap(run_role(tmp_path, extra))["changed"] == 0, "second converge changes nothing"
    assert recap(run_role(tmp_path, extra, "--check"))["changed"] == 0


def test_the_bootstrap_writes_the_environment_file_exactly_as_the_role_keeps_it() -> None:
    """First boot (node-bootstrap.sh) and the role write the same converge.env, so the first converge
    after the bootstrap leaves it unchanged (no drift from two writers)."""
    script = (ROOT / "scripts" / "node-bootstrap.sh").read_text()
    template = (ROOT / "roles" / "node_convergence" / "templates" / "converge.env.j2").read_text()
    written = script.split('cat >"$etc/converge.env" <<ENV\n', 1)[1].split("\nENV\n", 1)[0].splitlines()
    assert [line.split("=", 1)[0] for line in written] == [line.split("=", 1)[0] for line in template.splitlines()]


@pytest.mark.parametrize("org", ["demo", "stockmark"])
def test_every_launch_template_fetches_the_bootstrap_from_the_tenant_bucket_and_runs_it(org: str) -> None:
    cluster = next(s for s in render_stacks(load_tenant(org)) if s.key == "cluster")
    templates = {lid: r for lid, r in load_cfn_yaml(cluster.body)["Resources"].items()
                 if r["Type"] == "AWS::EC2::LaunchTemplate"}
    assert templates
    for lid, resource in templates.items():
        user_data = user_data_text(resource["Properties"]["LaunchTemplateData"]["UserData"])
        assert "export FMCLUSTER_BUCKET=${DataBucketName}\n" in user_data, lid
        assert '"s3://$FMCLUSTER_BUCKET/fmcluster/bootstrap/" /opt/fmcluster/bootstrap/ && break' in user_data, lid
        assert "for try in $(seq 1 30)" in user_data, f"{lid}: the fetch retries (boot networks come up late)"
        assert user_data.rstrip().endswith("/usr/local/sbin/fmcluster-bootstrap"), lid


def test_the_hyperpod_lifecycle_script_fetches_and_runs_the_bootstrap() -> None:
    script = (ROOT / "cfn" / "hyperpod-lifecycle" / "on_create.sh").read_text()
    assert '. "$here/fmcluster-lifecycle.env"' in script
    assert '"s3://$FMCLUSTER_BUCKET/fmcluster/bootstrap/" /opt/fmcluster/bootstrap/ && break' in script
    assert script.rstrip().endswith("/usr/local/sbin/fmcluster-bootstrap")


# --- the first-boot fetch, against the tenant's real moto server -------------------------------------

@pytest.fixture
def emulator_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private copy of the bundled tenants; the emulator started in it is stopped afterwards."""
    root = tmp_path / "root"
    shutil.copytree(ROOT / "inventories", root / "inventories", ignore=shutil.ignore_patterns("generated", "hosts.yml"))
    monkeypatch.setenv("FMCLUSTER_ROOT", str(root))
    yield root
    stop_emulator("demo", root)


def test_first_boot_fetch_unpacks_the_pinned_commit_and_writes_what_the_role_keeps(
        emulator_root: Path, tmp_path: Path) -> None:
    tenant = load_tenant("demo")
    endpoint = ensure_emulator("demo", emulator_root).endpoint
    s3 = aws.client("s3", tenant.region, endpoint)
    bucket = "fmc-demo-bootstrap-test"
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": tenant.region})
    upload_bootstrap(tenant, bucket, endpoint, out=lambda _: None)
    generated = generated_dir("demo", emulator_root)
    generated.mkdir(parents=True, exist_ok=True)
    (generated / "hosts.yml").write_text("all:\n  hosts:\n    cpu-1: {}\n")
    (generated / "stack_outputs.yml").write_text("all:\n  vars: {}\n")
    assert upload_inventory(tenant, bucket, endpoint, out=lambda _: None) == [
        "fmcluster/inventory/hosts.yml", "fmcluster/inventory/stack_outputs.yml"]

    node = tmp_path / "node"
    env = {"PATH": f"{ROOT / 'tests' / 'fixtures' / 'awscli'}:{VENV_BIN}:/usr/bin:/bin", "HOME": str(tmp_path),
           "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "emulator", "AWS_SECRET_ACCESS_KEY": "emulator",
           "FMCLUSTER_NODE": "cpu-1", "FMCLUSTER_ETC_DIR": str(node / "etc"),
           "FMCLUSTER_BOOTSTRAP_DIR": str(node / "opt"), "FMCLUSTER_SBIN_DIR": str(node / "sbin"),
           "FMCLUSTER_STATE_DIR": str(node / "state"), "FMCLUSTER_VENV": str(node / "venv"),
           "FMCLUSTER_INVENTORY_WAIT": "1"}
    # What the user data does first, then the bootstrap's own fetch (the timer's ExecStartPre).
    subprocess.run(["aws", "s3", "cp", "--recursive", "--region", tenant.region, f"s3://{bucket}/fmcluster/bootstrap/",
                    str(node / "opt")], env=env, check=True, timeout=60)
    run = subprocess.run(["bash", str(node / "opt" / "node-bootstrap.sh"), "--fetch"], env=env, capture_output=True,
                         text=True, check=False, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    repo = node / "state" / "repo.git"
    assert subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip() == head, "the bare repository holds the pinned commit"
    assert (node / "sbin" / "fmcluster-bootstrap").read_bytes() == (ROOT / "scripts" / "node-bootstrap.sh").read_bytes()
    assert (node / "etc" / "inventory" / "hosts.yml").read_text() == "all:\n  hosts:\n    cpu-1: {}\n"
    node_vars = yaml.safe_load((node / "etc" / "node-vars.yml").read_text())["all"]["vars"]
    assert node_vars["fmcluster_repo_url"] == str(repo) and node_vars["fmcluster_repo_ref"] == head
    converge_env = (node / "etc" / "converge.env").read_text()
    assert f"FMCLUSTER_REF={head}\nFMCLUSTER_NODE=cpu-1\n" in converge_env

    # The role, given what the bootstrap left (as playbooks/node-convergence.yml maps it), keeps the file as is.
    role = run_role(tmp_path, {
        "node_convergence_service_mgr": "systemd", "node_convergence_enable_timer": False,
        "node_convergence_systemd_dir": str(tmp_path / "units"), "node_convergence_node": "cpu-1",
        "node_convergence_env_file": str(node / "etc" / "converge.env"),
        "node_convergence_repo_url": node_vars["fmcluster_repo_url"],
        "node_convergence_ref": node_vars["fmcluster_repo_ref"],
        "node_convergence_inventory": node_vars["fmcluster_node_inventory"],
        "node_convergence_refresh_command": node_vars["fmcluster_converge_refresh"],
        "node_convergence_state_dir": str(node / "state"), "node_convergence_venv": str(node / "venv"),
    }, "--diff")
    assert recap(role)["changed"] == 2, "only the units directory and the units are new, not converge.env"
    assert (node / "etc" / "converge.env").read_text() == converge_env, "no second writer rewrites it"
