"""Converge a tenant's nodes: run playbooks/slurm-cluster.yml against the generated inventory directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from fmcluster.model import Tenant
from fmcluster.paths import generated_dir, repo_root

PLAYBOOK = "playbooks/slurm-cluster.yml"


class ConvergeError(RuntimeError):
    """Converge cannot start (no generated inventory, no ansible-playbook)."""


def _ansible_playbook() -> str:
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    if not found:
        raise ConvergeError("ansible-playbook is not installed; run scripts/bootstrap.sh")
    return found


def ansible_env(tenant: Tenant) -> dict[str, str]:
    """Environment for Ansible runs against the tenant: the repo's ansible.cfg, the venv first on PATH, and
    (provider local) ssh ControlPersist sockets in the tenant's runtime dir so nodes-down can close them."""
    env = dict(os.environ)
    root = repo_root()
    env["ANSIBLE_CONFIG"] = str(root / "ansible.cfg")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    if tenant.provider == "local":
        from fmcluster.localnodes import control_path_dir

        cp = control_path_dir(tenant.org)
        cp.mkdir(parents=True, exist_ok=True)
        env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(cp)
    return env


def converge_command(tenant: Tenant, limit: str = "", check: bool = False, playbook: str = PLAYBOOK,
                     extra: Sequence[str] = ()) -> list[str]:
    inventory = generated_dir(tenant.org)
    argv = [_ansible_playbook(), "-i", f"{inventory}/", str(repo_root() / playbook)]
    if limit:
        argv += ["--limit", limit]
    if check:
        argv += ["--check", "--diff"]
    return argv + list(extra)


def converge(tenant: Tenant, limit: str = "", check: bool = False, playbook: str = PLAYBOOK,
             extra: Sequence[str] = ()) -> int:
    """Run the playbook against inventories/<org>/generated/ (per-host progress on stdout); return its exit code.

    `limit` is Ansible's --limit pattern (e.g. "controller,cpu-4" to add node cpu-4: slurmctld learns of a
    node only when the controller is converged too). `check` runs with --check --diff (changes nothing).
    """
    if not (generated_dir(tenant.org) / "hosts.yml").is_file():
        hint = "invoke nodes-up" if tenant.provider == "local" else "invoke deploy"
        raise ConvergeError(f"no generated inventory for {tenant.org}; run `{hint} --org={tenant.org}` first")
    argv = converge_command(tenant, limit, check, playbook, extra)
    print("converge: " + " ".join(argv), flush=True)
    return subprocess.run(argv, cwd=repo_root(), env=ansible_env(tenant)).returncode
