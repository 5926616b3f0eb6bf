"""The observability roles, playbook and Molecule scenario are clean under yamllint and ansible-lint."""

from __future__ import annotations

import subprocess

import pytest

from conftest import venv_tool
from monitoring_helpers import ROOT

pytestmark = pytest.mark.slow
PATHS = ["roles/supervised_service", "roles/node_exporter", "roles/dcgm_exporter", "roles/efa_exporter",
         "roles/prometheus", "roles/grafana", "roles/alertmanager", "playbooks/monitoring.yml", "molecule/monitoring"]


def test_yamllint_is_clean() -> None:
    result = subprocess.run([venv_tool("yamllint"), "-s", *PATHS, "tests/promtool"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_production_profile_is_clean() -> None:
    result = subprocess.run([venv_tool("ansible-lint"), *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert "Profile 'production' was required, and it passed" in result.stdout + result.stderr
