"""Roles converged with the project's Ansible, as the role tests run them: on this machine (a local connection,
for roles that start no daemon) or on harness hosts that boot systemd as PID 1 (over ssh, as on a node)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from conftest import HOST_PYTHON, ROOT, substrate_root_at, venv_tool
from fmcluster.providers.local import harness
from fmcluster.providers.local.hosts import Host, remove_all
from fmcluster.providers.local.packages import stop_package_source
from fmcluster.providers.local.registry import stop_registry


def converge_role(role: str, tmp: Path, variables: dict[str, Any], *extra: str) -> tuple[int, int, str]:
    """(exit code, changed count, output) of a play applying `role` to localhost with `variables`. For what needs
    no daemon (this machine has no systemd as PID 1): templates, refusals before anything runs."""
    (tmp / "vars.yml").write_text(yaml.safe_dump(variables))
    (tmp / "play.yml").write_text(yaml.safe_dump([{"name": role, "hosts": "localhost", "gather_facts": True,
                                                   "gather_subset": ["min"], "roles": [role]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
           "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run([venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                           f"ansible_python_interpreter={HOST_PYTHON}", "-e", f"@{tmp / 'vars.yml'}",
                           str(tmp / "play.yml"), *extra], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    changed = re.search(r"^localhost\s+: ok=\d+\s+changed=(\d+)", done.stdout, re.M)
    return done.returncode, int(changed.group(1)) if changed else -1, done.stdout + done.stderr


@contextlib.contextmanager
def systemd_hosts(org: str, vpc: str, count: int, tmp: Path,
                  shared: tuple[str, ...] | list[str] = ()) -> Iterator[tuple[Path, list[Host]]]:
    """`count` harness hosts of tenant `org` on `vpc` (fmcluster.providers.local.harness: the pristine node image
    booting its own systemd, sshd, apt through the VPC's package source), their inventory, and every trace of them
    removed afterwards whatever happens; `shared`: directories bound at the same path on every host (/fsx). The
    substrate lives under `tmp`; each test module takes its own org and VPC range (the slow tier runs modules in
    parallel). Needs root."""
    with substrate_root_at(tmp / "substrate"):
        try:
            inventory = tmp / "hosts.yml"
            yield inventory, harness.up(org, vpc, count, inventory, shared, out=lambda _: None).hosts
        finally:
            stop_package_source(org)
            stop_registry(org)
            remove_all(org)


def converge_hosts(inventory: Path, play: list[dict[str, Any]], tmp: Path, *extra: str) -> tuple[int, dict[str, int], str]:
    """(exit code, changed count per host, output) of `play` run with the project's Ansible over ssh against the
    hosts of `inventory` (a harness inventory, or one naming its hosts with the same connection settings)."""
    path = tmp / "play.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
           # Harness hosts reuse addresses across runs: never a fact cached for another run's host.
           "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run([venv_tool("ansible-playbook"), "-i", str(inventory), str(path), *extra], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=1200)
    recap = done.stdout.split("PLAY RECAP")[-1]
    changed = {host: int(n) for host, n in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", recap, re.M)}
    return done.returncode, changed, done.stdout + done.stderr


def trusted(value: Any) -> Any:
    """Values as Ansible holds a role's own files or the inventory the node agent writes: their strings may be
    templates (ansible-core 2.19's data tagging), so Templar renders them as a converge would."""
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, Mapping):
        return {key: trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [trusted(item) for item in value]
    return value
