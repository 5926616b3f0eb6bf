"""The accelerator roles, playbook and scenarios pass ansible-lint (production profile) and yamllint."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, venv_tool

pytestmark = pytest.mark.slow

PATHS = ["roles/accel_detect", "roles/efa", "roles/nccl", "roles/nvidia_driver", "roles/neuron",
         "playbooks/accelerators.yml", "molecule/accelerators", "molecule/efa_aws_without_device", "tests/golden/packages"]


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(venv_tool(tool)).parent}:{os.environ['PATH']}"}
    return subprocess.run([venv_tool(tool), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_ansible_lint_production_profile_is_clean() -> None:
    result = _run("ansible-lint", "--profile", "production", *[p for p in PATHS if (ROOT / p).exists()])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


def test_yamllint_is_clean() -> None:
    result = _run("yamllint", "--strict", *[p for p in PATHS if (ROOT / p).exists()], "src/fmcluster/data/nccl_profiles.yml")
    assert result.returncode == 0, result.stdout[-4000:]
