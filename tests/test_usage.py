"""`invoke usage` (fmcluster.health.usage): sacct's job allocations become GPU-, CPU- and node-hours per team and user;
garbage in sacct's output is an error naming the line, never a figure quietly dropped; the three renderings (table,
JSON, Prometheus text checked by the real promtool) hold the same numbers; the command reaches the cluster the way
`invoke slurm` does (the provider's remote shell on the login node), here a local shell with a recording sacct."""

from __future__ import annotations

import json
import shlex
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, venv_tool
from fmcluster import commands
from fmcluster.cli import main as fmcluster_main
from fmcluster.commands.diagnose import fleet
from fmcluster.exits import ExitCode
from fmcluster.nodes import Node
from fmcluster.health.usage import (
    METRIC, TRES, Usage, UsageError, check_since, default_since, parse_sacct, parse_tres, render_json,
    render_prometheus, render_table, sacct_argv, sacct_command, summarize,
)
from monitoring_helpers import PROMTOOL

SACCT = ROOT / "tests" / "fixtures" / "sacct"
P5 = (SACCT / "p5_month.txt").read_text()
HOURS = {  # (team, user): (jobs, GPU-h, CPU-h, node-h), from the fixture by hand
    ("llm", "alice"): (4, 32 + 4 + 120 * 8 / 3600, 768 + 96 + 120 * 4 / 3600 + 6.4, 4 + 0.5 + 240 / 3600),
    ("llm", "dave"): (1, 3000 * 16 / 3600, 320, 3000 * 2 / 3600),
    ("root", "root"): (1, 0, 30 / 3600, 30 / 3600),
    ("vision", "bob"): (3, 0, 600 * 8 / 3600 + 60 * 2 / 3600, 660 / 3600),
    ("vision", "carol"): (1, 1, 24, 0.25),
}


def by_key(rows: list[Usage]) -> dict[tuple[str, str], tuple[int, float, float, float]]:
    return {(r.team, r.user): (r.jobs, r.hours["gres/gpu"], r.hours["cpu"], r.hours["node"]) for r in rows}


def test_hours_are_elapsed_seconds_times_the_allocated_count_per_team_and_user() -> None:
    rows = summarize(parse_sacct(P5))
    assert [(r.team, r.user) for r in rows] == list(HOURS)  # sorted by team, then user
    for key, (jobs, gpu, cpu, node) in HOURS.items():
        got = by_key(rows)[key]
        assert got[0] == jobs and got[1:] == pytest.approx((gpu, cpu, node)), key


def test_a_typed_gpu_count_is_not_counted_twice_and_memory_units_are_ignored() -> None:
    counts = parse_tres("billing=192,cpu=192,gres/gpu=8,gres/gpu:h100=8,mem=2000G,node=1", "here")
    assert counts == {"gres/gpu": 8, "cpu": 192, "node": 1}
    assert parse_tres("", "here") == {t: 0 for t in TRES}  # a job that never ran allocated nothing


def test_the_demo_cpu_cluster_reports_cpu_hours_and_no_gpu_hours() -> None:
    rows = by_key(summarize(parse_sacct((SACCT / "demo_cpu.txt").read_text())))
    assert rows[("llm", "alice")] == pytest.approx((1, 0, 95 * 8 / 3600, 95 / 3600))
    assert rows[("vision", "bob")] == pytest.approx((2, 0, 63 * 16 / 3600, 63 * 2 / 3600))


@pytest.mark.parametrize("line, reason", [
    ("4101|alice|llm|7200|cpu=4,node=1", "has 5 fields, not 6"),
    ("4101|alice|llm|7200|cpu=4,node=1|COMPLETED|x", "has 7 fields, not 6"),
    ("4101|alice|llm|02:00:00|cpu=4,node=1|COMPLETED", "ElapsedRaw '02:00:00' is not a whole number"),
    ("4101|alice|llm|-5|cpu=4,node=1|COMPLETED", "ElapsedRaw '-5'"),
    ("4101|alice|llm||cpu=4,node=1|COMPLETED", "ElapsedRaw ''"),
    ("4101|alice|llm|7200|cpu=four,node=1|COMPLETED", "cpu='four' is not a number"),
    ("4101|alice|llm|7200|cpu=4,gres/gpu=nan|COMPLETED", "gres/gpu='nan' is not a finite non-negative count"),
    ("4101|alice|llm|7200|cpu=4,gres/gpu=inf|COMPLETED", "is not a finite non-negative count"),
    ("4101|alice|llm|7200|cpu=-4,node=1|COMPLETED", "cpu='-4' is not a finite non-negative count"),
    ("4101|alice|llm|7200|cpu=4,,node=1|COMPLETED", "AllocTRES item '' is not NAME=VALUE"),
    ("4101|alice|llm|7200|cpu 4|COMPLETED", "is not NAME=VALUE"),
])
def test_output_that_is_not_sacct_s_fails_closed_naming_the_line(line: str, reason: str) -> None:
    with pytest.raises(UsageError, match="sacct line 3") as err:
        parse_sacct(P5.splitlines()[0] + "\n\n" + line + "\n" + P5.splitlines()[1])
    assert reason in str(err.value)


def test_the_sacct_command_lists_every_user_s_allocations_in_six_fields() -> None:
    assert sacct_command("2026-12-01") == (
        "sacct --allusers --allocations --noheader --parsable2 --starttime=2026-12-01 --endtime=now "
        "--format=JobID,User,Account,ElapsedRaw,AllocTRES,State")
    assert shlex.split(sacct_command("2026-12-01")) == sacct_argv("2026-12-01")


@pytest.mark.parametrize("since", ["2026-13-01", "2026-02-30", "26-12-01", "now-1days", "2026-12-01; reboot",
                                   "2026-12-01\n", "", "２０２６-12-01"])
def test_since_is_a_calendar_date_or_refused(since: str) -> None:
    with pytest.raises(UsageError):
        check_since(since)


def test_since_defaults_to_the_first_of_the_month() -> None:
    import datetime

    assert check_since("2026-02-28") == "2026-02-28"
    assert default_since(datetime.date(2026, 12, 3)) == "2026-12-01"


def test_the_table_shows_team_user_gpu_and_cpu_hours_and_jobs() -> None:
    text = render_table(summarize(parse_sacct(P5)), "acme", "2026-12-01")
    lines = text.splitlines()
    assert lines[0].startswith("usage of acme since 2026-12-01")
    assert lines[1].split() == ["team", "user", "GPU-h", "CPU-h", "jobs"]
    assert lines[3].split() == ["llm", "alice", "36.3", "870.5", "4"]
    assert lines[-1].split() == ["total", "50.6", "1215.9", "10"]


def test_the_json_holds_rows_teams_and_totals() -> None:
    document = json.loads(render_json(summarize(parse_sacct(P5)), "acme", "2026-12-01"))
    assert document["org"] == "acme" and document["since"] == "2026-12-01" and document["tres"] == list(TRES)
    assert document["teams"]["llm"]["gres/gpu"] == pytest.approx(HOURS[("llm", "alice")][1] + HOURS[("llm", "dave")][1],
                                                                  abs=1e-5)
    assert document["total"]["cpu"] == pytest.approx(sum(h[2] for h in HOURS.values()), abs=1e-5)
    assert {(r["team"], r["user"]): r["jobs"] for r in document["rows"]} == {k: v[0] for k, v in HOURS.items()}


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    """promtool check metrics: parsed and lint-clean (exit 3 for lint findings, 1 for text it cannot parse)."""
    if not Path(PROMTOOL).is_file():
        pytest.skip("promtool is not installed")
    return subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)


def test_the_prometheus_text_passes_promtool_with_one_sample_per_team_user_and_tres() -> None:
    text = render_prometheus(summarize(parse_sacct(P5)), "acme")
    done = promtool_check(text)
    assert done.returncode == 0, done.stdout + done.stderr
    samples = [line for line in text.splitlines() if line.startswith(METRIC + "{")]
    assert len(samples) == len(HOURS) * len(TRES)
    assert f'{METRIC}{{org="acme",team="vision",user="carol",tres="gres/gpu"}} 3600' in samples
    assert promtool_check(render_prometheus([], "acme")).returncode == 0


def test_a_hostile_name_from_sacct_stays_one_label_value_and_one_table_cell() -> None:
    hostile = 'x"} 1\nfmcluster_usage_tres_seconds{org="evil"} 9 # \\\x1b[2J'
    rows = [Usage("llm", hostile, 1, {"gres/gpu": 1.0, "cpu": 2.0, "node": 1.0})]
    text = render_prometheus(rows, "acme")
    assert promtool_check(text).returncode == 0
    assert len([line for line in text.splitlines() if line.startswith(METRIC)]) == 3
    table = render_table(rows, "acme", "2026-12-01")
    assert "\x1b" not in table and len(table.splitlines()) == 6


# --- the command: the provider's remote shell on the login node ------------------------------------------------
LOGIN = Node("login-1", "10.77.0.10", "login", None, "i-0c00000000000001", "m5.xlarge")
CONTROLLER = Node("controller-1", "10.77.0.9", "controller", None, "i-0c00000000000002", "m5.xlarge")


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The demo tenant 'deployed': its nodes recorded, and a provider whose remote shell is a local bash where
    `sacct` prints the P5 fixture and records how it was called (the node it was asked on, its argv)."""
    from fmcluster import inventory
    from fmcluster.providers import registry

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    sacct = bin_dir / "sacct"
    sacct.write_text(f"#!/bin/bash\nprintf '%s\\n' \"$NODE $*\" >> {calls}\ncat {SACCT / 'p5_month.txt'}\n"
                     "exit ${SACCT_EXIT:-0}\n")
    sacct.chmod(sacct.stat().st_mode | stat.S_IEXEC)
    asked: list[str] = []

    class Shell:
        def client_argv(self, node: Node) -> list[str]:
            asked.append(node.name)
            return ["env", f"PATH={bin_dir}:/usr/bin:/bin", f"NODE={node.name}", "bash", "-c"]

    monkeypatch.setattr(registry, "provider_for", lambda tenant: Shell())
    monkeypatch.setattr(inventory, "read_nodes", lambda org, root=None: [CONTROLLER, LOGIN])
    return {"calls": calls, "asked": asked}


def run_usage(*args: Any, **kwargs: Any) -> tuple[int, str]:
    lines: list[str] = []
    code = commands.usage("demo", *args, out=lines.append, **kwargs)
    return code, "\n".join(lines)


def test_invoke_usage_asks_sacct_on_the_login_node_and_prints_the_table(cluster: dict[str, Any]) -> None:
    code, text = run_usage(since="2026-11-01")
    assert code == 0, text
    assert cluster["asked"] == ["login-1"]
    assert cluster["calls"].read_text().splitlines() == ["login-1 " + " ".join(sacct_argv("2026-11-01")[1:])]
    assert text.splitlines()[3].split() == ["llm", "alice", "36.3", "870.5", "4"]


def test_invoke_usage_json_is_the_report_document(cluster: dict[str, Any]) -> None:
    code, text = run_usage(since="2026-11-01", as_json=True)
    assert code == 0 and json.loads(text)["rows"][0]["user"] == "alice"


def test_a_failing_sacct_or_a_bad_since_is_an_error_not_a_report(cluster: dict[str, Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_usage(since="2026-11-31")[0] == ExitCode.INVALID and cluster["asked"] == []
    monkeypatch.setenv("SACCT_EXIT", "1")
    code, text = run_usage(since="2026-11-01")
    assert code == ExitCode.FAILED and "on login-1: `sacct` failed (1)" in text


def test_before_a_deploy_there_is_no_cluster_to_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster import inventory

    monkeypatch.setattr(inventory, "read_nodes", lambda org, root=None: [])
    code, text = run_usage(since="2026-11-01")
    assert code == ExitCode.NOT_READY and "run `invoke deploy --org=demo` first" in text


def test_the_fmcluster_cli_and_invoke_both_reach_the_command(cluster: dict[str, Any],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert fmcluster_main(["usage", "demo", "--since", "2026-11-01", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["org"] == "demo"
    done = subprocess.run([venv_tool("invoke"), "usage", "--org=demo", "--since=2026-13-01"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "is not a calendar date" in done.stdout, done.stdout + done.stderr


def test_fleet_shows_a_deployed_org_s_usage_this_month(tmp_path: Path, cluster: dict[str, Any],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from fmcluster.doctor.report import Diagnosis
    from fmcluster.providers.local import emulator

    shutil.copytree(ROOT / "inventories" / "demo" / "group_vars", tmp_path / "inventories" / "demo" / "group_vars")
    monkeypatch.setattr(emulator, "running_emulator", lambda org, root=None: object())
    lines: list[str] = []
    fleet(out=lines.append, root=tmp_path, diagnose=lambda org: Diagnosis(org, [], checked=["sinfo"]))
    row = next(line for line in lines[0].splitlines() if line.startswith("demo "))
    assert row.endswith("50.6 GPU-h, 1215.9 CPU-h  healthy") and "usage (month)" in lines[0]


def test_the_module_runs_with_the_system_python_alone_and_writes_the_textfile(tmp_path: Path) -> None:
    """Standard library only: what a node has. `python3 -m fmcluster.health.usage` runs sacct where it is (the controller)
    and writes the metric for node_exporter's textfile collector."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text(f"#!/bin/sh\ncat {SACCT / 'p5_month.txt'}\n")
    (bin_dir / "sacct").chmod(0o755)
    output = tmp_path / "textfile" / "usage.prom"
    done = subprocess.run(["/usr/bin/python3", "-S", "-m", "fmcluster.health.usage", "--org=acme", "--since=2026-11-01",
                           "--format=prometheus", f"--output={output}"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert output.read_text() == render_prometheus(summarize(parse_sacct(P5)), "acme")
    failing = subprocess.run(["/usr/bin/python3", "-S", "-m", "fmcluster.health.usage", "--org=acme"], cwd=tmp_path,
                             capture_output=True, text=True, env={"PATH": "/nonexistent", "PYTHONPATH": str(ROOT / "src")},
                             timeout=60)
    assert failing.returncode == 1 and failing.stderr.startswith("usage: ")


def test_a_month_without_jobs_is_a_report_of_zeros_not_an_error() -> None:
    rows = summarize(parse_sacct(""))
    assert rows == []
    assert render_table(rows, "acme", "2026-12-01").splitlines()[-1].split() == ["total", "0.0", "0.0", "0"]
    assert json.loads(render_json(rows, "acme", "2026-12-01"))["total"] == {t: 0 for t in TRES}


def test_the_controller_s_collector_writes_this_month_s_usage_and_says_when_sacct_does_not_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fmcluster-health usage-metrics on the controller: the usage series with fmcluster_usage_up 1, or only
    fmcluster_usage_up 0 when sacct fails (last round's figures are never left looking current)."""
    from fmcluster.health.usage import collect

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sacct = bin_dir / "sacct"
    sacct.write_text(f"#!/bin/bash\ncat {SACCT / 'p5_month.txt'}\nexit ${{SACCT_EXIT:-0}}\n")
    sacct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    textfile = tmp_path / "fmcluster_usage.prom"
    assert collect("acme", str(textfile), now=lambda: 1.5)
    text = textfile.read_text()
    assert promtool_check(text).returncode == 0, promtool_check(text).stdout
    assert "fmcluster_usage_up 1" in text and f'{METRIC}{{org="acme",team="llm",user="dave",tres="node"}} 6000' in text
    monkeypatch.setenv("SACCT_EXIT", "1")
    assert not collect("acme", str(textfile), now=lambda: 2.5)
    text = textfile.read_text()
    assert "fmcluster_usage_up 0" in text and METRIC not in text.replace(f"# HELP {METRIC}", "")
    assert promtool_check(text).returncode == 0
