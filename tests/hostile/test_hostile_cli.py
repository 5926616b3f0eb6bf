"""Hostile command-line input: `--org` is a name, never a path, for every task that takes it; `new-tenant`
checks every option before writing, writes atomically, and `--force` keeps what it replaces."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from invoke import Context, Exit, Task

from conftest import venv_tool
from fmcluster.scaffold import BACKUP_DIR, NewTenantInvalid, TenantExists, new_tenant
from hostile_helpers import ROOT


def _tasks_module() -> Any:
    spec = importlib.util.spec_from_file_location("fmcluster_tasks", ROOT / "tasks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TASKS = _tasks_module()
ORG_TASKS = sorted(name for name, task in vars(TASKS).items()
                   if isinstance(task, Task) and "org" in inspect.signature(task.body).parameters)
BAD_ORGS = ["../demo", "/etc/passwd", "demo\n", "{{ 7*7 }}", "Demo", "a" * 200]


def test_every_task_taking_an_org_is_covered() -> None:
    assert {"validate", "new_tenant", "deploy", "plan", "stacks", "destroy", "status", "nodes_up", "halt",
            "slurm", "acceptance"} <= set(ORG_TASKS)


def _snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("org", BAD_ORGS, ids=repr)
@pytest.mark.parametrize("task", ORG_TASKS)
def test_an_org_that_is_not_a_name_is_refused_by_every_task(task: str, org: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "inventories" / "demo" / "group_vars" / "all").mkdir(parents=True)
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    before = _snapshot(tmp_path)
    body = getattr(TASKS, task).body
    required = {"cmd": "sinfo", "node": "ip-10-0-128-10"}
    kwargs: dict[str, Any] = {k: v for k, v in required.items() if k in inspect.signature(body).parameters}
    with pytest.raises((Exit, SystemExit)) as raised:
        body(Context(), org=org, **({"output_dir": str(tmp_path / "inventories")} if task == "new_tenant" else {}),
             **kwargs)
    code = raised.value.code if isinstance(raised.value, SystemExit) else raised.value.code
    captured = capsys.readouterr()
    message = captured.out + captured.err + str(getattr(raised.value, "message", "") or "")
    assert code == 2, message
    assert "is not a tenant name" in message and "fix:" in message, message
    assert "Traceback" not in message
    assert _snapshot(tmp_path) == before


# --- new-tenant ------------------------------------------------------------------------------------------------

BAD_OPTIONS: list[tuple[str, dict[str, str], str]] = [
    ("count-zero", {"count": "0"}, "--count=0"),
    ("count-negative", {"count": "-1"}, "--count"),
    ("count-float", {"count": "2.0"}, "is not a count"),
    ("count-words", {"count": "two"}, "is not a count"),
    ("count-typo", {"count": "100000"}, "at most 1000"),
    ("count-unicode-digit", {"count": "²"}, "is not a count"),
    ("instance-type-unknown", {"instance_type": "p9.huge"}, "not in the instance catalog"),
    ("instance-type-newline", {"instance_type": "p5.48xlarge\n  evil: 1"}, "control character"),
    ("instance-type-quote", {"instance_type": 'p5.48xlarge" evil'}, "not in the instance catalog"),
    ("instance-type-jinja", {"instance_type": "{{ cycler.__init__.__globals__.os.system('id') }}"}, "template syntax"),
    ("region-jinja", {"region": "{{ 7*7 }}", "availability_zone": "{{ 7*7 }}a"}, "template syntax"),
    ("region-unknown", {"region": "eu-mars-1", "availability_zone": "eu-mars-1a"}, "not a known AWS region"),
    ("region-yaml", {"region": "us-east-1\nprovider: aws", "availability_zone": "us-east-1a"}, "control character"),
    ("scheduler-unknown", {"scheduler": "slurm"}, "did you mean 'slurm-ec2'"),
    ("scheduler-other", {"scheduler": "pbs"}, "use one of: slurm-ec2, hyperpod"),
    ("provider-unknown", {"provider": "gcp"}, "use one of: aws, local"),
    ("value-too-long", {"instance_type": "p" * 300}, "300 characters"),
]


@pytest.mark.parametrize("case_id,answers,expected", BAD_OPTIONS, ids=[c[0] for c in BAD_OPTIONS])
def test_new_tenant_refuses_a_bad_option_and_writes_nothing(tmp_path: Path, case_id: str, answers: dict[str, str],
                                                           expected: str) -> None:
    target = tmp_path / "inventories"
    with pytest.raises(NewTenantInvalid) as raised:
        new_tenant("acme", answers, output_dir=target)
    message = str(raised.value)
    assert expected in message and "fix:" in message and "nothing was written" in message, message
    assert not target.exists(), _snapshot(tmp_path)


@pytest.mark.parametrize("org", BAD_ORGS, ids=repr)
def test_new_tenant_refuses_an_org_that_is_not_a_name(tmp_path: Path, org: str) -> None:
    with pytest.raises(NewTenantInvalid, match="not a tenant name"):
        new_tenant(org, {}, output_dir=tmp_path / "inventories")
    assert _snapshot(tmp_path) == []


def test_new_tenant_failing_in_an_existing_inventory_leaves_it_untouched(tmp_path: Path) -> None:
    new_tenant("other", {}, output_dir=tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(NewTenantInvalid):
        new_tenant("acme", {"count": "0"}, output_dir=tmp_path)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_force_keeps_the_replaced_tenant_and_carries_its_history_over(tmp_path: Path) -> None:
    new_tenant("acme", {}, output_dir=tmp_path)
    spec = tmp_path / "acme" / "group_vars" / "all" / "tenant.yml"
    spec.write_text(spec.read_text() + "# hand-tuned\n")
    history = tmp_path / "acme" / "generated" / "acceptance" / "2026-01-01T00-00-00" / "result.json"
    history.parent.mkdir(parents=True)
    history.write_text('{"verdict": "pass"}')
    with pytest.raises(TenantExists, match="--force"):
        new_tenant("acme", {"count": "4"}, output_dir=tmp_path)
    assert "# hand-tuned" in spec.read_text()
    tenant = new_tenant("acme", {"count": "4"}, output_dir=tmp_path, force=True)
    assert tenant.queues[0].count == 4 and "# hand-tuned" not in spec.read_text()
    backups = list((tmp_path / BACKUP_DIR).iterdir())
    assert len(backups) == 1
    assert "# hand-tuned" in (backups[0] / "group_vars" / "all" / "tenant.yml").read_text()
    assert (backups[0] / history.relative_to(tmp_path / "acme")).read_text() == '{"verdict": "pass"}'
    assert history.read_text() == '{"verdict": "pass"}'
    new_tenant("acme", {"count": "5"}, output_dir=tmp_path, force=True)
    assert len(list((tmp_path / BACKUP_DIR).iterdir())) == 2


def test_force_with_a_bad_option_changes_nothing(tmp_path: Path) -> None:
    new_tenant("acme", {}, output_dir=tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(NewTenantInvalid):
        new_tenant("acme", {"count": "0"}, output_dir=tmp_path, force=True)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / BACKUP_DIR).exists()


def test_new_tenant_leaves_no_cookiecutter_replay_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    new_tenant("acme", {}, output_dir=tmp_path / "inventories")
    assert not (tmp_path / "home").exists()
    assert sorted(p.name for p in (tmp_path / "inventories").iterdir()) == ["acme"]


@pytest.mark.parametrize("args,expected", [
    (["--org=acme", "--count=0"], "--count=0"),
    (["--org=../acme"], "is not a tenant name"),
], ids=["count-zero", "org-path"])
def test_invoke_new_tenant_exits_2_with_the_option_named(tmp_path: Path, args: list[str], expected: str) -> None:
    result = subprocess.run([venv_tool("invoke"), "new-tenant", *args, f"--output-dir={tmp_path}"], cwd=ROOT,
                            capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_cli_module_refuses_an_org_path(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "fmcluster.cli", "validate", "../../etc"], cwd=ROOT,
                            capture_output=True, text=True,
                            env={"FMCLUSTER_ROOT": str(tmp_path), "PYTHONPATH": str(ROOT / "src")})
    assert result.returncode == 2 and "is not a tenant name" in result.stdout and not result.stderr


def test_the_scaffold_s_own_hook_refuses_an_org_that_is_not_a_name(tmp_path: Path) -> None:
    """Interactive answers reach cookiecutter without fmcluster's checks: its pre_gen hook refuses the name and
    cookiecutter removes what it had made."""
    from cookiecutter.exceptions import FailedHookException
    from cookiecutter.main import cookiecutter

    out = tmp_path / "a" / "b"
    out.mkdir(parents=True)
    with pytest.raises(FailedHookException):
        cookiecutter(str(ROOT / "cookiecutters/tenant"), no_input=True, output_dir=str(out),
                     extra_context={"org": "../escaped"}, default_config={"replay_dir": str(tmp_path / "replay")})
    assert not (tmp_path / "a" / "escaped").exists() and list(out.iterdir()) == []
