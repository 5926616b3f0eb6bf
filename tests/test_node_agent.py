"""The node agent's choice of how to run a membership pass: in the checkout ansible-pull left, only when that
checkout is exactly the commit the node runs (tests/test_cluster_e2e.py runs it on the local cluster)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fmcluster.node.agent import checked_out, private_dir, write_private


def git(where: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), "-c", "user.email=t@example.org", "-c", "user.name=t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "pull"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "site.yml").write_text("---\n")
    git(repo, "add", "site.yml")
    git(repo, "commit", "-qm", "one")
    return repo, git(repo, "rev-parse", "HEAD")


def test_the_commit_checked_out_unchanged_is_reused(checkout: tuple[Path, str]) -> None:
    repo, ref = checkout
    assert checked_out(repo, ref)


def test_another_commit_a_changed_or_an_extra_file_or_no_checkout_is_pulled_again(
        checkout: tuple[Path, str], tmp_path: Path) -> None:
    repo, ref = checkout
    assert not checked_out(repo, "0" * 40)
    assert not checked_out(repo, ref[:12]), "only the full commit id is compared"
    (repo / "site.yml").write_text("--- # edited on the node\n")
    assert not checked_out(repo, ref)
    git(repo, "checkout", "-q", "site.yml")
    (repo / "stray.yml").write_text("---\n")
    assert not checked_out(repo, ref)
    assert not checked_out(tmp_path / "missing", ref)


@pytest.mark.slow
def test_a_membership_pass_reads_the_facts_the_last_converge_recorded(tmp_path: Path) -> None:
    """Ansible through ansible-runner, as the agent runs it: a converge gathers and records; a membership pass
    gathers nothing and still has the recorded facts (pkg_mgr here, which common's apt steps read). The
    runner's own fact cache (a fresh directory every run) must not take the node's place."""
    import sys

    from fmcluster.node.agent import clean_environment, fact_cache_env, run_ansible

    play = tmp_path / "play.yml"
    play.write_text("- hosts: localhost\n  gather_subset: [min]\n  tasks:\n"
                    "    - ansible.builtin.debug:\n        msg: 'mgr={{ ansible_facts.pkg_mgr }}'\n")

    def run(reuse: bool) -> tuple[list[str], str]:
        tasks: list[str] = []
        env = {**clean_environment(), **fact_cache_env(tmp_path / "facts", reuse=reuse), "ANSIBLE_NOCOLOR": "1",
               "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0"}
        stdout, stderr, rc = run_ansible(Path(sys.executable).parent / "ansible-playbook", [str(play)], None, env,
                                         tmp_path / "runner",
                                         lambda event: tasks.append(str(event.get("event_data", {}).get("task"))) or True)
        assert rc == 0, stdout + stderr
        return tasks, stdout

    (first, _), (second, shown) = run(reuse=False), run(reuse=True)
    assert "Gathering Facts" in first and "Gathering Facts" not in second
    assert "mgr=" in shown and "mgr=}" not in shown
    assert list((tmp_path / "facts").iterdir()), "the converge recorded this host's facts where the node keeps them"


def test_what_the_agent_keeps_that_may_hold_a_secret_is_root_s_alone_even_when_it_was_not(tmp_path: Path) -> None:
    """The inventory (receiver URLs), the fact cache and the runner's artifacts (the converge's environment), the
    converge log and the report: 0700 folders and 0600 files, from the first byte, also over an older 0644 file."""
    folder = tmp_path / "inventory"
    folder.mkdir(mode=0o755)
    old = folder / "hosts.yml"
    old.write_text("old\n")
    old.chmod(0o644)
    previous = os.umask(0)
    try:
        assert private_dir(folder) == folder and (folder.stat().st_mode & 0o777) == 0o700
        write_private(old, "receiver: https://hooks.slack.com/services/T/B/secret\n")
    finally:
        os.umask(previous)
    assert (old.stat().st_mode & 0o777) == 0o600 and old.read_text().startswith("receiver:")
    assert sorted(p.name for p in folder.iterdir()) == ["hosts.yml"]


# --- a first boot survives the transient ------------------------------------------------------------------------

def _agent_with(attempts: list[object], filed: list[object], signalled: list[object],
                monkeypatch: pytest.MonkeyPatch) -> object:
    """An Agent whose converges are the given reports, one per try, and whose reports and signals are recorded."""
    from fmcluster.node import agent as node_agent

    agent = node_agent.Agent.__new__(node_agent.Agent)
    tries = iter(attempts)
    monkeypatch.setattr(agent, "attempt", lambda trigger, membership_only: next(tries), raising=False)
    monkeypatch.setattr(agent, "file_report", lambda report: filed.append(node_agent.Report(**vars(report))),
                        raising=False)
    monkeypatch.setattr(agent, "signal", signalled.append, raising=False)
    monkeypatch.setattr(agent, "bootstrap_stages", lambda: {"fetch": 1.0}, raising=False)
    monkeypatch.setattr(node_agent.time, "sleep", lambda seconds: None)
    return agent


def _failed(msg: str) -> object:
    from fmcluster.node.agent import Report

    return Report(address="10.0.0.5", trigger="first-boot", started="t", stage="converge", error="ansible-pull exited 2",
                  failed_tasks=[{"task": "slurm_compute : Install Slurm", "msg": msg}])


def test_a_first_boot_that_fails_on_a_package_mirror_hiccup_tries_again_and_signals_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.node.agent import Report

    filed: list[object] = []
    signalled: list[object] = []
    ok = Report(address="10.0.0.5", trigger="first-boot", started="t", ok=True, stage="done")
    agent = _agent_with([_failed("Failed to fetch http://archive.ubuntu.com/... 503 Service Unavailable"), ok],
                        filed, signalled, monkeypatch)
    report = agent.converge("first-boot")  # type: ignore[attr-defined]
    assert report.ok and len(signalled) == 1 and signalled[0] is report
    assert [(r.ok, bool(r.retry)) for r in filed] == [(False, True), (True, False)]  # type: ignore[attr-defined]
    assert "attempt 1 of 3 failed on a transient error" in filed[0].retry  # type: ignore[attr-defined]
    assert "first boot converged on attempt 2 of 3" in report.notes


def test_a_first_boot_that_fails_for_a_real_reason_signals_failure_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    filed: list[object] = []
    signalled: list[object] = []
    agent = _agent_with([_failed("the instance catalog says 32 EFA interfaces, found none")], filed, signalled,
                        monkeypatch)
    report = agent.converge("first-boot")  # type: ignore[attr-defined]
    assert not report.ok and not report.retry and len(filed) == 1 and signalled == [report]


def test_a_transient_failure_every_time_ends_after_the_last_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.node.agent import FIRST_BOOT_ATTEMPTS

    filed: list[object] = []
    signalled: list[object] = []
    agent = _agent_with([_failed("Temporary failure resolving 'archive.ubuntu.com'") for _ in range(FIRST_BOOT_ATTEMPTS)],
                        filed, signalled, monkeypatch)
    report = agent.converge("first-boot")  # type: ignore[attr-defined]
    assert not report.ok and not report.retry and len(filed) == FIRST_BOOT_ATTEMPTS and signalled == [report]
    assert f"first boot failed {FIRST_BOOT_ATTEMPTS} times" in report.notes


def test_the_deploy_waits_on_a_node_that_retries_and_fails_on_one_that_does_not() -> None:
    from fmcluster.nodes import Node
    from fmcluster.reports import node_status

    node = Node("ip-10-0-128-11", "10.0.128.11", "compute", "cpu", "i-1", "c5.2xlarge")
    failed = {"ok": False, "stage": "converge", "ref": "r", "manifest_digest": "m", "error": "ansible-pull exited 2"}
    waiting = node_status(node, {**failed, "retry": "attempt 1 of 3 failed on a transient error; trying again in 60s"},
                          "r", "m", "x")
    assert waiting.state == "converging" and "trying again in 60s" in waiting.detail
    assert node_status(node, failed, "r", "m", "x").state == "failed"


def test_a_first_boot_that_failed_before_the_node_knew_itself_still_signals_failure_under_its_instance_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A converge that failed reading the manifest has no instance id in its report; the FAILURE signal (which fails
    the group at once instead of at the signal Timeout) takes it from the instance metadata service or, without one,
    from the node's caller identity's session where that names the instance (EC2's)."""
    from fmcluster.node import agent as node_agent

    sent: list[dict[str, str]] = []

    class CloudFormation:
        def signal_resource(self, **kwargs: str) -> None:
            sent.append(kwargs)

    agent = node_agent.Agent.__new__(node_agent.Agent)
    agent.settings = node_agent.Settings("b", "r", "o", "ref", "playbooks/site.yml", "fmc-o-cluster", "QueueCpuGroup")
    monkeypatch.setattr(agent, "client", lambda service: CloudFormation(), raising=False)
    monkeypatch.setattr(agent, "identity", lambda: "AROAEXAMPLENODEROLE01:i-0123456789abcdef0", raising=False)
    monkeypatch.setattr(agent, "metadata_instance_id", lambda: "", raising=False)  # no metadata service here
    agent.signal(node_agent.Report(address="10.0.0.5", trigger="first-boot", started="t", stage="manifest",
                                   error="NoSuchKey"))
    agent.signal(node_agent.Report(address="10.0.0.6", trigger="first-boot", started="t", ok=True,
                                   instance_id="i-0fedcba9876543210"))
    assert sent == [{"StackName": "fmc-o-cluster", "LogicalResourceId": "QueueCpuGroup",
                     "UniqueId": "i-0123456789abcdef0", "Status": "FAILURE"},
                    {"StackName": "fmc-o-cluster", "LogicalResourceId": "QueueCpuGroup",
                     "UniqueId": "i-0fedcba9876543210", "Status": "SUCCESS"}]


# --- where a node files its report ------------------------------------------------------------------------------

class _S3:
    def __init__(self) -> None:
        self.put: list[str] = []

    def put_object(self, **kwargs: object) -> None:
        self.put.append(str(kwargs["Key"]))


def _filing_agent(identity: str, metadata: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> object:
    from fmcluster.node import agent as node_agent

    agent = node_agent.Agent.__new__(node_agent.Agent)
    agent.settings = node_agent.Settings("b", "r", "o", "ref", "playbooks/site.yml")
    agent.state_dir = tmp_path
    agent.s3 = _S3()
    monkeypatch.setattr(agent, "identity", lambda: identity, raising=False)
    monkeypatch.setattr(agent, "metadata_instance_id", lambda: metadata, raising=False)
    return agent


@pytest.mark.parametrize("identity", ["AROAEXAMPLENODEROLE01:SageMaker", "AROAEXAMPLENODEROLE01:i-0aaaaaaaaaaaaaaaa"])
def test_a_report_is_filed_under_the_caller_identity_named_by_the_instance_id(
        identity: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """fmcluster/report/<aws:userid>/<instance id>.json: the instance discovery found, else the metadata service's.
    HyperPod's nodes all run as "<role id>:SageMaker": the instance id is what keeps their reports apart."""
    from fmcluster.node.agent import Report

    found = _filing_agent(identity, "i-0aaaaaaaaaaaaaaaa", monkeypatch, tmp_path)
    found.file_report(Report(address="10.0.0.5", trigger="t", started="s", instance_id="i-0aaaaaaaaaaaaaaaa"))  # type: ignore[attr-defined]
    (tmp_path / "early").mkdir()
    early = _filing_agent(identity, "i-0aaaaaaaaaaaaaaaa", monkeypatch, tmp_path / "early")
    early.file_report(Report(address="10.0.0.5", trigger="t", started="s", stage="manifest"))  # type: ignore[attr-defined]
    expected = f"fmcluster/report/{identity}/i-0aaaaaaaaaaaaaaaa.json"
    assert found.s3.put == [expected] and early.s3.put == [expected]  # type: ignore[attr-defined]


def test_without_a_metadata_service_only_a_session_named_after_the_instance_gives_the_report_its_name(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before discovery, with no metadata service: EC2's session names the instance and is used; HyperPod's
    ("SageMaker") names none, and the report is filed nowhere rather than under a name no node has (said)."""
    from fmcluster.node.agent import Report

    ec2 = _filing_agent("AROAEXAMPLENODEROLE01:i-0aaaaaaaaaaaaaaaa", "", monkeypatch, tmp_path)
    ec2.file_report(Report(address="10.0.0.5", trigger="t", started="s", stage="manifest"))  # type: ignore[attr-defined]
    assert ec2.s3.put == ["fmcluster/report/AROAEXAMPLENODEROLE01:i-0aaaaaaaaaaaaaaaa/i-0aaaaaaaaaaaaaaaa.json"]  # type: ignore[attr-defined]
    shared = _filing_agent("AROAEXAMPLENODEROLE01:SageMaker", "", monkeypatch, tmp_path)
    shared.file_report(Report(address="10.0.0.5", trigger="t", started="s", stage="manifest"))  # type: ignore[attr-defined]
    assert shared.s3.put == []  # type: ignore[attr-defined]
    assert "cannot file the report to s3://b/fmcluster/report/AROAEXAMPLENODEROLE01:SageMaker/<instance id>.json: " \
           "no instance id" in capsys.readouterr().err


class _UnreachableOnce(_S3):
    def put_object(self, **kwargs: object) -> None:
        if not hasattr(self, "failed"):
            self.failed = True
            raise ConnectionError('Connect timeout on endpoint URL: "http://10.91.128.1:52325/b"')
        super().put_object(**kwargs)


def test_a_report_the_bucket_did_not_take_is_filed_again_by_the_watch_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The deploy waits for each node's report: one lost to an endpoint out of reach (CI, stop 48: the login node's
    membership report, the deploy then waiting past its caller's 20 minutes) is filed again at the watch's next
    round, once."""
    from fmcluster.node import agent as node_agent
    from fmcluster.node.agent import Report

    agent = _filing_agent("AROAEXAMPLENODEROLE01:i-0aaaaaaaaaaaaaaaa", "i-0aaaaaaaaaaaaaaaa", monkeypatch, tmp_path)
    agent.s3 = _UnreachableOnce()  # type: ignore[attr-defined]
    agent.file_report(Report(address="10.0.0.5", trigger="changed: membership_digest", started="t0",  # type: ignore[attr-defined]
                             instance_id="i-0aaaaaaaaaaaaaaaa", ok=True, stage="done"))
    assert agent.s3.put == [] and (tmp_path / node_agent.UNFILED_MARK).is_file()  # type: ignore[attr-defined]
    assert "cannot file the report" in capsys.readouterr().err
    agent.file_unfiled_report()  # type: ignore[attr-defined]
    agent.file_unfiled_report()  # type: ignore[attr-defined]
    assert agent.s3.put == ["fmcluster/report/AROAEXAMPLENODEROLE01:i-0aaaaaaaaaaaaaaaa/i-0aaaaaaaaaaaaaaaa.json"]  # type: ignore[attr-defined]
    assert not (tmp_path / node_agent.UNFILED_MARK).exists()
    assert "filed the report of the converge started t0" in capsys.readouterr().out


def test_the_instance_id_comes_from_the_metadata_service_with_an_imdsv2_token(tmp_path: Path) -> None:
    """The agent asks IMDS as EC2 (and HyperPod's nodes, and the local stand-in) require: a token first. Asked of the
    local substrate's stand-in itself, which refuses a request without one."""
    from fmcluster.node.agent import metadata_instance_id
    from imds_standin import serving

    with serving(tmp_path, "i-0fedcba9876543210") as url:
        assert metadata_instance_id(url) == "i-0fedcba9876543210"
    assert metadata_instance_id("http://127.0.0.1:9", timeout=0.5) == ""
