"""`invoke doctor` without a cluster: a job log gets the acceptance parser's own diagnosis plus the knowledge
base's entries; output is safe with hostile values; a cluster that cannot be read is a finding, not a pass."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, venv_tool
from fmcluster.cli import main as fmcluster_main
from fmcluster.doctor import knowledge
from fmcluster.doctor.detect import Evidence, Finding, Hit
from fmcluster.doctor.gather import first_json, node_script, parse_node_output
from fmcluster.commands.diagnose import doctor
from fmcluster.doctor.report import Diagnosis, render
from fmcluster.nodes import Node

NCCL = ROOT / "tests" / "fixtures" / "nccl"
LOGS = sorted(NCCL.glob("*.log"))
HOSTILE = "\x1b[2J\x1b]0;pwned\x07<script>alert(1)</script> | `rm -rf /` {{ lookup('pipe','id') }}"


def run_doctor(*args: str, **kwargs: str) -> tuple[int, str]:
    lines: list[str] = []
    code = doctor(*args, out=lines.append, **kwargs)  # type: ignore[arg-type]
    return code, "\n".join(lines)


def parse_json(log: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = fmcluster_main(["acceptance", "parse", "--json", str(log), *extra])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
@pytest.mark.parametrize("instance_type", ["", "p5.48xlarge"])
def test_doctor_on_a_log_gives_the_diagnosis_of_acceptance_parse(log: Path, instance_type: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    parse_code, parsed = parse_json(log, *(["--instance-type", instance_type] if instance_type else []), capsys=capsys)
    code, out = run_doctor(log=str(log), as_json=True, instance_type=instance_type)
    diagnosis = json.loads(out)
    assert diagnosis["acceptance"] == {"status": parsed["status"], "codes": parsed["codes"], "cause": parsed["cause"]}
    assert (code == 0) == (parse_code == 0) == diagnosis["healthy"]
    codes = set(parsed["codes"])  # type: ignore[arg-type]
    expected = {e.id for e in knowledge.load() if e.kind == "acceptance" and e.detect["code"] in codes
                and (e.detect.get("severity") != "fail" or parsed["status"] == "fail")}
    assert expected <= {f["id"] for f in diagnosis["findings"]}


def test_the_socket_fallback_log_names_the_entry_its_fix_and_source() -> None:
    code, out = run_doctor(log=str(NCCL / "p5_2node_socket_fallback.log"), instance_type="p5.48xlarge")
    assert code == 1
    assert "[nccl-socket-fallback] NCCL moved data over TCP sockets instead of EFA" in out
    assert "  fix: Make the aws-ofi-nccl plugin load" in out
    assert "  source: https://github.com/aws/aws-ofi-nccl" in out
    assert "verdict: UNHEALTHY" in out


def test_invoke_doctor_log_runs_without_a_cluster() -> None:
    done = subprocess.run([venv_tool("invoke"), "doctor", f"--log={NCCL / 'p5_2node_all_reduce_ok.log'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "acceptance verdict: PASS" in done.stdout and "verdict: healthy" in done.stdout


def test_an_unreadable_log_or_an_unknown_instance_type_is_bad_input(tmp_path: Path) -> None:
    assert run_doctor(log=str(tmp_path / "missing.log"))[0] == 2
    assert run_doctor(log=str(tmp_path))[0] == 2
    code, out = run_doctor(log=str(NCCL / "p5_2node_all_reduce_ok.log"), instance_type=HOSTILE)
    assert code == 2 and "\x1b" not in out.replace(repr(HOSTILE), "")
    assert run_doctor()[0] == 2


def test_a_log_naming_a_harmful_override_is_a_finding(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text((NCCL / "p5_2node_all_reduce_ok.log").read_text()
                   + "p5-st-p5-1:1:1 [0] NCCL INFO NCCL_PROTO set by environment to simple\n")
    code, out = run_doctor(log=str(log))
    assert code == 1 and "[nccl-proto-override]" in out


def test_nothing_read_is_never_healthy() -> None:
    assert not Diagnosis("demo", []).healthy
    assert Diagnosis("demo", [], checked=["sinfo"]).healthy
    assert not Diagnosis("x.log", [], checked=["log"], acceptance={"status": "not_judged", "codes": [], "cause": ""}).healthy


def test_terminal_output_shows_hostile_evidence_without_sending_control_characters() -> None:
    entry = knowledge.by_id()["node-unreachable"]
    d = Diagnosis(HOSTILE, [Finding(entry, (Hit(HOSTILE, HOSTILE),))], checked=[HOSTILE], notes=[HOSTILE])
    text = render(d)
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[2J" in text and "<script>alert(1)</script>" in text
    assert json.loads(json.dumps(d.to_dict()))["findings"][0]["evidence"][0]["where"] == HOSTILE


def test_the_node_script_quotes_the_node_name_and_its_sections_are_read_back() -> None:
    node = Node.from_dict({"name": "n1'; reboot; '", "address": "10.0.0.5", "role": "compute", "instance_id": "i-1",
                           "instance_type": "t3.large", "queue": "cpu"})
    script = node_script(node)
    assert "--node='n1'\"'\"'; reboot; '\"'\"''" in script
    report = {"node": "n1", "results": [{"check": "munge", "status": "pass", "detail": "ok"}]}
    out = ("==fmcluster-doctor:up==\n==fmcluster-doctor:health==\nwarning: something\n" + json.dumps(report)
           + "\n==fmcluster-doctor:rc=0==\n==fmcluster-doctor:nccl-env==\nexport NCCL_PROTO=simple\n")
    sections = parse_node_output(out)
    assert first_json(sections["health"]) == report
    assert sections["rc"] == "0" and sections["nccl-env"] == "export NCCL_PROTO=simple\n"
    with pytest.raises(ValueError):
        first_json("Traceback (most recent call last):\n  boom\n")


def test_an_undeployed_local_tenant_is_a_finding_not_a_pass() -> None:
    """demo is not deployed in the fast tier: no emulator runs for it."""
    from fmcluster.providers.local.emulator import running_emulator

    if running_emulator("demo") is not None:
        pytest.skip("demo is deployed on this machine right now")
    code, out = run_doctor("demo", as_json=True)
    diagnosis = json.loads(out)
    assert code == 1 and not diagnosis["healthy"]
    assert [f["id"] for f in diagnosis["findings"]] == ["cluster-unreachable"]
    assert "no AWS emulator is running" in diagnosis["findings"][0]["evidence"][0]["evidence"]


def test_an_aws_tenant_without_credentials_is_a_finding_not_a_pass(no_aws: None) -> None:
    code, out = run_doctor("stockmark", as_json=True)
    diagnosis = json.loads(out)
    assert code == 1 and [f["id"] for f in diagnosis["findings"]] == ["cluster-unreachable"]
    assert "no AWS credentials" in out


def test_evidence_facts_are_the_registered_ones() -> None:
    ev = Evidence()
    ev.add_fact("node_unreachable", "n1", "ssh failed")
    assert ev.facts == {"node_unreachable": [("n1", "ssh failed")]}


def compute_node(name: str = "n1") -> Node:
    return Node.from_dict({"name": name, "address": "10.0.0.5", "role": "compute", "instance_id": "i-1",
                           "instance_type": "t3.large", "queue": "cpu"})


def test_a_node_that_cannot_be_reached_is_a_finding() -> None:
    """The provider's client argv stands in as a local shell: one that fails is an ssh failure."""
    from fmcluster.doctor.gather import read_node

    ev = Evidence()
    read_node(compute_node(), ["sh", "-c", "echo 'ssh: connect to host 10.0.0.5 port 22: No route to host' >&2; exit 255"],
              ev)
    assert ev.facts["node_unreachable"] == [("n1", "ssh failed: ssh: connect to host 10.0.0.5 port 22: No route to host")]
    assert ev.reports == {}


def test_a_node_whose_health_program_gives_no_report_is_a_finding_not_a_pass() -> None:
    """The script really runs (here, in a local shell): this machine has no installed health program."""
    from fmcluster.doctor.gather import HEALTH_PROGRAM, read_node

    if Path(HEALTH_PROGRAM).exists():
        pytest.skip("this machine has the node health program installed")
    ev = Evidence()
    read_node(compute_node(), ["sh", "-c"], ev)
    (where, why), = ev.facts["node_unreachable"]
    # sudo (the operator is the image's default user) answers a missing program with exit 1 and says so.
    assert where == "n1" and why.startswith("its health checks gave no report (exit ") and "not found" in why, why


def test_fmcluster_doctor_reads_a_log_like_invoke_doctor(capsys: pytest.CaptureFixture[str]) -> None:
    field = ROOT / "tests" / "fixtures" / "field_logs"
    assert fmcluster_main(["doctor", "--log", str(field / "nccl-342-shm-docker.log")]) == 1
    assert "[dev-shm-too-small]" in capsys.readouterr().out
    assert fmcluster_main(["doctor", "--log", str(field / "pyxis-readme-healthy.log"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["healthy"] is True
