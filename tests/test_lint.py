"""The repository is clean under the real linters: yamllint, ansible-lint (production profile, offline), mypy,
ruff and shellcheck.

Each linter runs once, over the whole tree (ansible-lint alone takes a minute or more on two cores): the
per-component suites (monitoring, accelerators, acceptance) used to lint their own paths again. That every
role, playbook and Molecule scenario is in the one run is checked here instead, from the files each tool
says it read, so a path left out by an exclude or ignore entry fails a test rather than going unlinted.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import venv_tool

ROOT = Path(__file__).resolve().parent.parent

#: Paths that are not roles, playbooks or scenarios but that a component's checks relied on being linted.
ALSO_LINTED = ["tests/golden/packages", "tests/promtool", "src/fmcluster/data/nccl_profiles.yml"]


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def ansible_paths() -> list[str]:
    """Every role, playbook and Molecule scenario (each has something ansible-lint must read)."""
    roles = [f"roles/{p.name}" for p in sorted((ROOT / "roles").iterdir()) if p.is_dir()]
    playbooks = [f"playbooks/{p.name}" for p in sorted((ROOT / "playbooks").glob("*.yml"))]
    scenarios = [f"molecule/{p.parent.name}" for p in sorted((ROOT / "molecule").glob("*/molecule.yml"))]
    return roles + playbooks + scenarios


def missing(paths: list[str], linted: set[str]) -> list[str]:
    return [p for p in paths if not any(f == p or f.startswith(p.rstrip("/") + "/") for f in linted)]


@pytest.fixture(scope="module")
def ansible_lint() -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """One ansible-lint run over the tree; -vv makes it name each file it examines."""
    result = run(venv_tool("ansible-lint"), "--offline", "--profile=production", "-vv")
    output = result.stdout + result.stderr
    examined = set(re.findall(r"Examining (\S+) of type", re.sub(r"\x1b\[[0-9;]*m", "", output)))
    return result, examined


@pytest.mark.slow
def test_ansible_lint_production_profile_is_clean(ansible_lint: tuple[subprocess.CompletedProcess[str], set[str]]) -> None:
    result, _ = ansible_lint
    output = result.stdout + result.stderr
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    assert "Profile 'production' was required, and it passed" in output, output[-2000:]


@pytest.mark.slow
def test_ansible_lint_examined_every_role_playbook_and_scenario(
        ansible_lint: tuple[subprocess.CompletedProcess[str], set[str]]) -> None:
    _, examined = ansible_lint
    assert examined, "ansible-lint -vv named no file it examined (its log format changed?)"
    assert missing(ansible_paths() + ALSO_LINTED[:1], examined) == [], "not linted: check .ansible-lint's exclude_paths"


def test_ansible_lint_never_reaches_for_galaxy() -> None:
    """The run must not try to install collections or roles (Galaxy is unreachable here and in CI)."""
    assert yaml.safe_load((ROOT / ".ansible-lint").read_text()).get("offline") is True


@pytest.mark.slow
def test_yamllint_is_clean() -> None:
    result = run(venv_tool("yamllint"), "-c", ".yamllint.yml", "--strict", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint_reads_every_role_playbook_scenario_and_data_file() -> None:
    listed = run(venv_tool("yamllint"), "-c", ".yamllint.yml", "--list-files", ".")
    assert listed.returncode == 0, listed.stderr
    files = {line.removeprefix("./") for line in listed.stdout.splitlines()}
    yaml_dirs = [p for p in ansible_paths() if any((ROOT / p).rglob("*.yml")) or p.endswith(".yml")]
    assert missing(yaml_dirs + ALSO_LINTED, files) == [], "not linted: check .yamllint.yml's ignore"


def repo_files() -> list[str]:
    """Every file of the checkout, tracked or new, that git does not ignore (so a new script is linted before its
    commit, and nothing under .venv or a generated folder is)."""
    listed = run("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    assert listed.returncode == 0, listed.stderr
    return sorted(f for f in set(listed.stdout.split("\0")) if f and (ROOT / f).is_file())


def interpreter(path: str) -> str:
    """The program a file's shebang names ("bash" for `#!/usr/bin/env bash` and `#!/bin/bash`), or ""."""
    with open(ROOT / path, "rb") as handle:
        first = handle.readline(200).decode("utf-8", "replace")
    words = first[2:].split() if first.startswith("#!") else []
    if words and words[0].endswith("/env"):
        words = [w for w in words[1:] if not w.startswith("-")]
    return words[0].rsplit("/", 1)[-1] if words else ""


def shell_scripts() -> list[str]:
    """Shell the repository ships, by rule: a .sh file (a sourced fragment or user-data part may have no shebang:
    it says its shell in a `# shellcheck shell=` directive) or a file whose shebang names sh or bash. Jinja
    templates (.j2) are not shell until rendered; the rendered goldens under tests/golden are checked instead."""
    return [f for f in repo_files()
            if not f.endswith(".j2") and (f.endswith(".sh") or interpreter(f) in ("sh", "bash", "dash"))]


def python_scripts_without_suffix() -> list[str]:
    """Python files ruff would not pick up by name (node scripts such as src/fmcluster/node/boot/fmcluster-s3), by their shebang."""
    return [f for f in repo_files() if not f.endswith((".py", ".pyi")) and interpreter(f).startswith("python")]


def test_ruff_is_clean() -> None:
    """pyflakes' dead-code checks (unused imports and variables, redefinitions), undefined names and syntax
    errors, over every Python file: ruff's own discovery of *.py plus the suffix-less scripts (pyproject's
    [tool.ruff] says which rules and why)."""
    scripts = python_scripts_without_suffix()
    assert "src/fmcluster/node/boot/fmcluster-s3" in scripts, scripts
    result = run(venv_tool("ruff"), "check", "--no-cache", "--output-format=concise", ".", *scripts)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_is_clean() -> None:
    scripts = shell_scripts()
    assert {".ci/run", "scripts/bootstrap.sh", "src/fmcluster/node/boot/node-user-data.sh"} <= set(scripts), scripts
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: scripts/bootstrap.sh installs it (Debian package shellcheck)")
    result = run("shellcheck", "--format=gcc", *scripts)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_strict_is_clean() -> None:
    result = run(venv_tool("mypy"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_tenant_reference_is_current() -> None:
    from fmcluster.schemadoc import render_reference

    assert render_reference() in (ROOT / "README.md").read_text(), "run: .venv/bin/fmcluster schema-doc and paste into README.md"
