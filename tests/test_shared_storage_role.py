"""The Lustre client on AWS: the FSx repository builds lustre-client-modules per Ubuntu kernel, some days after the
kernel ships, so a node whose image has a newer kernel stops with the kernel and the fix, not with apt's "no
package". The check is Ansible's own templating of the role's condition on apt-cache's two answers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, venv_tool

pytestmark = pytest.mark.slow

NO_BUILD = "lustre-client-modules-6.17.0-1012-aws:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n"
BUILD = "lustre-client-modules-6.8.0-1040-aws:\n  Installed: (none)\n  Candidate: 2.15.6-1fsx1\n"


def the_check() -> str:
    tasks = yaml.safe_load((ROOT / "roles/shared_storage/tasks/main.yml").read_text())
    block = next(t for t in tasks if t["name"].startswith("Check the FSx Lustre client repository has modules"))
    assert block["block"][0]["ansible.builtin.command"]["argv"][:2] == ["apt-cache", "policy"]
    return str(block["block"][1]["ansible.builtin.assert"]["that"])


@pytest.mark.parametrize(("answer", "passes"), [(NO_BUILD, False), (BUILD, True)])
def test_a_kernel_without_a_lustre_client_build_is_refused_by_name(tmp_path: Path, answer: str, passes: bool) -> None:
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "check", "ansible.builtin.assert": {"that": the_check(), "quiet": True}}]}]))
    done = subprocess.run([venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(play),
                           "-e", json.dumps({"shared_storage_lustre_policy": {"stdout": answer},
                                             "ansible_python_interpreter": venv_tool("python")})],
                          capture_output=True, text=True, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
    assert (done.returncode == 0) is passes, done.stdout
