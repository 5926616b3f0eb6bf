"""One role converged on this machine with the project's Ansible, as the role tests run it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from conftest import ROOT, venv_tool


def converge_role(role: str, tmp: Path, variables: dict[str, Any], *extra: str) -> tuple[int, int, str]:
    """(exit code, changed count, output) of a play applying `role` to localhost with `variables`."""
    (tmp / "vars.yml").write_text(yaml.safe_dump(variables))
    (tmp / "play.yml").write_text(yaml.safe_dump([{"name": role, "hosts": "localhost", "gather_facts": True,
                                                   "gather_subset": ["min"], "roles": [role]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
           "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run([venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=/usr/bin/python3", "-e", f"@{tmp / 'vars.yml'}",
                           str(tmp / "play.yml"), *extra], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    changed = re.search(r"^localhost\s+: ok=\d+\s+changed=(\d+)", done.stdout, re.M)
    return done.returncode, int(changed.group(1)) if changed else -1, done.stdout + done.stderr
