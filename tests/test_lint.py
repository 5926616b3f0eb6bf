"""The repository is clean under the real linters: yamllint, ansible-lint (production profile, offline) and mypy."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import venv_tool

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def test_yamllint_is_clean() -> None:
    result = run(venv_tool("yamllint"), "-c", ".yamllint.yml", "--strict", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_production_profile_is_clean() -> None:
    result = run(venv_tool("ansible-lint"), "--offline", "--profile=production")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]


def test_mypy_strict_is_clean() -> None:
    result = run(venv_tool("mypy"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_tenant_reference_is_current() -> None:
    from fmcluster.schemadoc import render_reference

    assert render_reference() in (ROOT / "README.md").read_text(), "run: .venv/bin/fmcluster schema-doc and paste into README.md"
