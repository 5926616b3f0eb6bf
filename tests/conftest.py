"""Shared test fixtures. Tests run against the real tools; nothing here mocks a daemon."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("FMCLUSTER_ROOT", str(ROOT))
VENV_BIN = ROOT / ".venv" / "bin"


@pytest.fixture
def repo_root() -> Path:
    return ROOT


def venv_tool(name: str) -> str:
    """Path of a tool installed in the project's venv (falls back to PATH)."""
    candidate = VENV_BIN / name
    return str(candidate) if candidate.exists() else name


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS credentials of any kind reach boto3 (an AWS tenant on this machine, as CI has it)."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@contextmanager
def substrate_root_at(root: Path) -> Iterator[Path]:
    """FMCLUSTER_SUBSTRATE_ROOT at `root` while a module-scoped fixture lives (monkeypatch is per test), then as before."""
    previous = os.environ.get("FMCLUSTER_SUBSTRATE_ROOT")
    os.environ["FMCLUSTER_SUBSTRATE_ROOT"] = str(root)
    try:
        yield root
    finally:
        if previous is None:
            del os.environ["FMCLUSTER_SUBSTRATE_ROOT"]
        else:
            os.environ["FMCLUSTER_SUBSTRATE_ROOT"] = previous
