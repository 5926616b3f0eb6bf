"""Shared test fixtures. Tests run against the real tools; nothing here mocks a daemon."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("FMCLUSTER_ROOT", str(ROOT))
VENV_BIN = ROOT / ".venv" / "bin"

from fmcluster.node.strategy import mitogen_unless_chosen  # noqa: E402 (needs src/ on the path)

#: The tests' plays (role tests, Molecule, acceptance) run with Mitogen's strategy, as a node's agent runs its own:
#: a task's module runs in an interpreter kept for the play, not a payload started per task (BENCHMARKS.md). Export
#: ANSIBLE_STRATEGY=linear to run them with Ansible's own strategy instead.
os.environ.update(mitogen_unless_chosen(os.environ))
#: The interpreter of every play the tests run on this machine (local connection): the distribution's python3 with
#: its apt binding (scripts/bootstrap.sh installs python3-apt). Mitogen runs a module in place, so Ansible's apt
#: modules cannot re-start themselves under that interpreter from the venv's python, as they do with the linear
#: strategy; a node's plays use its image's python3 for the same reason (images.yml contract python_interpreter).
HOST_PYTHON = "/usr/bin/python3"


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


# --- the serial cluster tiers (e2e, standins): evidence even when a run goes long -------------------------------

def say(text: str) -> None:
    """To the process's own stderr, past pytest's capture of the running test's output."""
    stream = sys.__stderr__ or sys.stderr
    stream.write(text)
    stream.flush()


def pytest_configure(config: pytest.Config) -> None:
    """FMCLUSTER_TEST_BUDGET_S (tasks.py TIER_BUDGETS_S): past it, interrupt the run as Ctrl-C does, so the
    clusters' fixtures still tear down and the summary still names each failure."""
    budget = float(os.environ.get("FMCLUSTER_TEST_BUDGET_S", "0") or 0)
    if budget <= 0 or os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def interrupt() -> None:
        capture = config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            say(f"\ntest budget of {budget:.0f} s spent (FMCLUSTER_TEST_BUDGET_S): interrupting, as "
                "Ctrl-C would, so fixtures tear down and the summary names what failed\n")
        os.kill(os.getpid(), signal.SIGINT)

    watchdog = threading.Timer(budget, interrupt)
    watchdog.daemon = True
    watchdog.start()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A cluster test's failure printed as it happens: the summary comes only at the end of a half-hour tier, and a
    CI log cut short would have none of it."""
    if not report.failed or not ({"e2e", "standin"} & set(report.keywords)):
        return
    lines = str(report.longrepr).splitlines()
    say(f"\n--- FAILED {report.nodeid} ({report.when}), the last {min(len(lines), 80)} lines of "
        "its report:\n" + "\n".join(lines[-80:]) + "\n---\n")
