"""The nodes' reports as the deploy reads them (fmcluster.reports), and when the deploy may reuse an acceptance
PASS (fmcluster.acceptance.gate.reusable_pass). Both gates fail closed: no evidence, old evidence or unreadable
evidence is never "converged" or "passed".
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from fmcluster.acceptance.gate import LAST_PASS, cluster_state, reusable_pass
from fmcluster.acceptance.results import acceptance_dir
from fmcluster.manifest import digest, membership_digest
from fmcluster.model import load_tenant
from fmcluster.nodes import Node
from fmcluster.reports import (
    ReportReader, failed_node_reports, failure_details, node_status, read_log, read_report, statuses, wait_for_reports,
)
from fmcluster.stacks import aws
from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator
from localtenant import make_root

REF, OLD = "a" * 40, "b" * 40
MANIFEST = digest({"manifest": 1})
CONTROLLER = Node("ip-10-0-128-10", "10.0.128.10", "controller", None, "i-1", "m5.xlarge")
COMPUTE = Node("ip-10-0-128-11", "10.0.128.11", "compute", "cpu", "i-2", "c5.2xlarge")
NODES = [CONTROLLER, COMPUTE]
MEMBERSHIP = membership_digest(NODES)
BUCKET = "fmc-t-reports-data"


def report(**changes: Any) -> dict[str, Any]:
    base = {"ok": True, "stage": "done", "ref": REF, "manifest_digest": MANIFEST, "membership_digest": MEMBERSHIP,
            "seconds": 12.5, "changed": 3}
    return {**base, **changes}


# --- one node's state ------------------------------------------------------------------------------------------

def test_a_node_without_a_report_is_silent() -> None:
    status = node_status(COMPUTE, None, REF, MANIFEST, MEMBERSHIP)
    assert (status.state, status.detail) == ("silent", "no report yet")
    assert status.line() == "ip-10-0-128-11 (compute, cpu, 10.0.128.11): silent: no report yet"


def test_a_report_of_what_is_published_now_is_converged() -> None:
    status = node_status(CONTROLLER, report(), REF, MANIFEST, MEMBERSHIP)
    assert status.state == "converged"
    assert status.line() == f"ip-10-0-128-10 (controller, 10.0.128.10): converged {REF[:12]} in 12.5s, changed=3"


@pytest.mark.parametrize("changes", [{"ref": OLD}, {"manifest_digest": "0" * 16}, {"ref": None}])
def test_a_report_of_an_older_commit_or_manifest_is_not_converged(changes: dict[str, Any]) -> None:
    assert node_status(COMPUTE, report(**changes), REF, MANIFEST, MEMBERSHIP).state == "converging"


def test_the_controller_must_have_converged_the_current_membership_a_compute_node_need_not() -> None:
    joined = membership_digest([*NODES, Node("ip-10-0-128-12", "10.0.128.12", "compute", "cpu", "i-3", "c5.2xlarge")])
    assert node_status(CONTROLLER, report(), REF, MANIFEST, joined).state == "converging"
    assert node_status(COMPUTE, report(), REF, MANIFEST, joined).state == "converged"


def test_a_failure_of_what_is_published_now_is_final() -> None:
    status = node_status(COMPUTE, report(ok=False, stage="secrets", error="cannot read secret x"), REF, MANIFEST,
                         MEMBERSHIP)
    assert status.state == "failed"
    assert status.line().endswith("FAILED at secrets: cannot read secret x")


def test_a_failure_before_the_node_knew_its_commit_is_final() -> None:
    early = {"address": "10.0.128.11", "ok": False, "stage": "bundle", "error": "cannot fetch s3://b/fmcluster/bootstrap/"}
    assert node_status(COMPUTE, early, REF, MANIFEST, MEMBERSHIP).state == "failed"


def test_a_node_of_the_published_commit_that_could_not_read_the_manifest_has_failed() -> None:
    status = node_status(COMPUTE, report(ok=False, stage="manifest", manifest_digest="",
                                         error="cannot read s3://b/fmcluster/manifest/cluster.json after 2 tries"),
                         REF, MANIFEST, MEMBERSHIP)
    assert status.state == "failed" and "FAILED at manifest" in status.line()


def test_a_failure_of_an_older_commit_may_still_be_superseded() -> None:
    status = node_status(COMPUTE, report(ok=False, stage="converge", ref=OLD), REF, MANIFEST, MEMBERSHIP)
    assert (status.state, status.detail) == ("converging", "its last converge (of an older commit or manifest) failed")


# --- reading them from the bucket (the tenant's emulator) --------------------------------------------------------

@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("reports")
    emulator = ensure_emulator("t-reports", root)
    try:
        client = aws.client("s3", "ap-northeast-1", emulator.endpoint)
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "ap-northeast-1"})
        yield client
    finally:
        stop_emulator("t-reports", root)


#: The instance role's id: a node files under its aws:userid, "<role id>:<session>", named by its instance id.
ROLE_ID = "AROAEXAMPLENODEROLE01"
#: The one role session SageMaker HyperPod gives every node of an instance group (tests/test_node_iam.py).
SHARED = "SageMaker"


def key(node: Node, role_id: str = ROLE_ID, session: str = "") -> str:
    """EC2's layout by default: the session named after the instance."""
    return f"fmcluster/report/{role_id}:{session or node.instance_id}/{node.instance_id}.json"


def put(s3: Any, node: Node, body: bytes, role_id: str = ROLE_ID, session: str = "") -> None:
    s3.put_object(Bucket=BUCKET, Key=key(node, role_id, session), Body=body)



@pytest.mark.slow
def test_an_unreadable_report_is_a_failure_and_an_absent_one_silence(s3: Any) -> None:
    put(s3, COMPUTE, b"{not json")
    assert read_report(s3, BUCKET, COMPUTE.instance_id) == {"ok": False, "stage": "report",
                                                            "error": "unreadable report (9 bytes)"}
    assert read_report(s3, BUCKET, "i-0999999999999999") is None
    put(s3, COMPUTE, b"[1, 2]")
    assert read_report(s3, BUCKET, COMPUTE.instance_id) is None


@pytest.mark.slow
def test_a_report_speaks_for_the_instance_its_key_names_never_for_what_its_body_claims(s3: Any) -> None:
    """A node may write only below fmcluster/report/<its aws:userid>/: the key, not the body, says whose it is, and
    a session named after an instance (EC2's) speaks for that instance only."""
    s3.delete_object(Bucket=BUCKET, Key=key(CONTROLLER))
    forged = {**report(), "address": CONTROLLER.address, "instance_id": CONTROLLER.instance_id, "node": CONTROLLER.name}
    put(s3, COMPUTE, json.dumps(forged).encode())
    assert read_report(s3, BUCKET, CONTROLLER.instance_id) is None
    compute_session = f"{ROLE_ID}:{COMPUTE.instance_id}"
    for stem in (CONTROLLER.address, CONTROLLER.instance_id, f"{ROLE_ID}:{CONTROLLER.instance_id}",
                 f"{ROLE_ID}:/{CONTROLLER.instance_id}", f":{SHARED}/{CONTROLLER.instance_id}",
                 f"{ROLE_ID}/{CONTROLLER.instance_id}", f"{ROLE_ID}:{SHARED}/{CONTROLLER.address}",
                 f"{ROLE_ID}:{SHARED}/x/{CONTROLLER.instance_id}", f"{ROLE_ID}:{SHARED}/{CONTROLLER.instance_id}/x",
                 # EC2: the compute node's session filing under the controller's instance id, within its own prefix.
                 f"{compute_session}/{CONTROLLER.instance_id}"):
        s3.put_object(Bucket=BUCKET, Key=f"fmcluster/report/{stem}.json", Body=json.dumps(report()).encode())
        assert read_report(s3, BUCKET, CONTROLLER.instance_id) is None, stem
        s3.delete_object(Bucket=BUCKET, Key=f"fmcluster/report/{stem}.json")
    # The instance's role replaced (a new role id): its newest report speaks for it, and the older one is said.
    put(s3, CONTROLLER, json.dumps(report(ref=OLD)).encode())
    time.sleep(1.1)  # S3's LastModified has whole seconds
    put(s3, CONTROLLER, json.dumps(report()).encode(), role_id="AROAEXAMPLENEWROLE02")
    assert read_report(s3, BUCKET, CONTROLLER.instance_id) == report()
    (found,) = [s for s in statuses(s3, BUCKET, NODES, REF, MANIFEST) if s.node == CONTROLLER]
    assert found.state == "converged", found.line()
    assert found.line().endswith(f"[also filed under {ROLE_ID}:{CONTROLLER.instance_id} (older; the newest, under "
                                 f"AROAEXAMPLENEWROLE02:{CONTROLLER.instance_id}, is the one read)]"), found.line()
    s3.delete_object(Bucket=BUCKET, Key=key(CONTROLLER, "AROAEXAMPLENEWROLE02"))


def filing_agent(s3: Any, identity: str, instance: str, state: Path) -> Any:
    """The node agent's report filing as a node runs it, against the emulator: its caller identity `identity`,
    the instance metadata service's answer `instance`."""
    from fmcluster.node.agent import Agent, Settings

    agent = Agent.__new__(Agent)
    agent.settings = Settings(BUCKET, "ap-northeast-1", "t-reports", REF, "playbooks/site.yml")
    agent.state_dir, agent.s3 = state, s3
    agent._identity, agent._instance = identity, ""
    agent.metadata_instance_id = lambda: instance  # type: ignore[method-assign]
    return agent


@pytest.mark.slow
def test_two_nodes_sharing_one_role_session_both_report_and_both_are_read(s3: Any, tmp_path: Path) -> None:
    """HyperPod gives every node of an instance group one role session ("<role id>:SageMaker"): each node names its
    report by its own instance id below it, and the deploy (statuses: deploy's wait, `invoke status`) reads both,
    one as converged and the other as failed, with its own log."""
    from fmcluster.node.agent import Report

    shared = f"{ROLE_ID}:{SHARED}"
    login = Node("ip-10-0-128-12", "10.0.128.12", "login", None, "i-0login00000000001", "m5.xlarge")
    worker = Node("ip-10-0-128-13", "10.0.128.13", "compute", "cpu", "i-0worker0000000001", "trn1.32xlarge")
    nodes = [login, worker]
    for node, ok in ((login, True), (worker, False)):
        (tmp_path / node.name).mkdir()
        log = tmp_path / node.name / "converge.log"
        log.write_text(f"converge of {node.name}\n")
        filed = Report(address=node.address, trigger="first-boot", started="s", ok=ok, stage="done" if ok else "converge",
                       error="" if ok else "ansible-pull exited 2", node=node.name, role=node.role, queue=node.queue,
                       instance_id=node.instance_id, ref=REF, manifest_digest=MANIFEST,
                       membership_digest=membership_digest(nodes), log=str(log))
        filing_agent(s3, shared, node.instance_id, tmp_path / node.name).file_report(filed)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"fmcluster/report/{shared}/")["Contents"]}
    assert keys == {f"fmcluster/report/{shared}/{n.instance_id}{suffix}" for n in nodes for suffix in (".json", ".log")}
    found = statuses(s3, BUCKET, nodes, REF, MANIFEST)
    assert [(s.node, s.state) for s in found] == [(login, "converged"), (worker, "failed")], [s.line() for s in found]
    assert [s.report["node"] for s in found if s.report] == [login.name, worker.name]
    assert read_log(s3, BUCKET, worker.instance_id) == [f"converge of {worker.name}"]
    lines = failed_node_reports(s3, BUCKET)
    assert f"{worker.name} ({worker.instance_id}): FAILED at converge: ansible-pull exited 2" in lines
    assert not any(login.instance_id in line for line in lines)
    # A node of the shared session that fails before it knows itself files under the metadata service's instance id.
    (tmp_path / "early").mkdir()
    filing_agent(s3, shared, worker.instance_id, tmp_path / "early").file_report(
        Report(address=worker.address, trigger="first-boot", started="s", stage="manifest", error="NoSuchKey"))
    assert read_report(s3, BUCKET, worker.instance_id)["stage"] == "manifest"  # type: ignore[index]
    assert read_report(s3, BUCKET, login.instance_id)["ok"] is True  # type: ignore[index]
    for node in nodes:
        for suffix in (".json", ".log"):
            s3.delete_object(Bucket=BUCKET, Key=f"fmcluster/report/{shared}/{node.instance_id}{suffix}")


@pytest.mark.slow
def test_waiting_stops_at_the_first_failure_and_names_it(s3: Any) -> None:
    put(s3, CONTROLLER, json.dumps(report()).encode())
    put(s3, COMPUTE, json.dumps(report(ok=False, stage="converge", error="ansible-pull exited 2")).encode())
    said: list[str] = []
    wait = wait_for_reports(s3, BUCKET, lambda: NODES, REF, MANIFEST, timeout_s=60, out=said.append, poll_s=0.1)
    assert not wait.ok and not wait.timed_out and [s.node for s in wait.failed] == [COMPUTE]
    assert said[0].strip().startswith("1/2 nodes converged, 1 failed")


@pytest.mark.slow
def test_waiting_for_a_silent_node_ends_after_the_bound_and_is_not_a_pass(s3: Any) -> None:
    s3.delete_object(Bucket=BUCKET, Key=key(COMPUTE))
    put(s3, CONTROLLER, json.dumps(report()).encode())
    wait = wait_for_reports(s3, BUCKET, lambda: NODES, REF, MANIFEST, timeout_s=0.3, out=lambda _: None, poll_s=0.1)
    assert wait.timed_out and not wait.ok
    assert [(s.node.name, s.state) for s in wait.failed] == [(COMPUTE.name, "silent")]


@pytest.mark.slow
def test_what_a_node_that_did_not_converge_left_is_shown_its_console_where_it_hangs_its_log_where_it_failed(
        s3: Any) -> None:
    """`invoke deploy` and `invoke replace` show the same: a failed node's failed task and uploaded log, a silent
    node's last console lines (no report, no log: the console is all there is)."""
    s3.delete_object(Bucket=BUCKET, Key=key(COMPUTE))
    failed = report(ok=False, stage="converge", error="ansible-pull exited 2",
                    failed_tasks=[{"task": "Install runc", "msg": "apt timed out"}])
    put(s3, CONTROLLER, json.dumps(failed).encode())
    s3.put_object(Bucket=BUCKET, Key=key(CONTROLLER).removesuffix(".json") + ".log", Body=b"TASK [slurm_containers]\nfatal\n")
    wait = wait_for_reports(s3, BUCKET, lambda: NODES, REF, MANIFEST, timeout_s=0.3, out=lambda _: None, poll_s=0.1)
    consoles = {COMPUTE.name: "cloud-init: running\nfmcluster-pull: apt-get install runc\n"}
    details = failure_details(wait, s3, BUCKET, lambda node: consoles.get(node.name, "never asked"))
    assert details == [f"--- {CONTROLLER.name} (failed) ---", "    task 'Install runc': apt timed out",
                       "    log: TASK [slurm_containers]", "    log: fatal",
                       f"--- {COMPUTE.name} (silent) ---", "    console: cloud-init: running",
                       "    console: fmcluster-pull: apt-get install runc"]


@pytest.mark.slow
def test_every_node_converged_is_a_pass_and_no_node_at_all_is_not(s3: Any) -> None:
    for node in NODES:
        put(s3, node, json.dumps(report()).encode())
    assert [s.state for s in statuses(s3, BUCKET, NODES, REF, MANIFEST)] == ["converged", "converged"]
    assert wait_for_reports(s3, BUCKET, lambda: NODES, REF, MANIFEST, 5, lambda _: None, 0.1).ok
    assert not wait_for_reports(s3, BUCKET, lambda: [], REF, MANIFEST, 0.2, lambda _: None, 0.1).ok


def counted(s3: Any) -> Counter[str]:
    """The S3 calls `s3` makes from now on, by operation."""
    calls: Counter[str] = Counter()
    s3.meta.events.register("before-call.s3.*", lambda model, **_: calls.update([model.name]))
    return calls


@pytest.mark.slow
def test_a_poll_lists_the_reports_and_reads_only_those_filed_or_changed_since_the_last(s3: Any) -> None:
    for node in NODES:
        put(s3, node, json.dumps(report()).encode())
    reader, calls = ReportReader(s3, BUCKET), counted(s3)
    ids = [n.instance_id for n in NODES]
    first = reader.read(ids)
    assert first[COMPUTE.instance_id] == report() and calls["GetObject"] == 2 and calls["ListObjectsV2"] == 1
    calls.clear()
    assert reader.read(ids) == first and calls == Counter({"ListObjectsV2": 1})
    put(s3, COMPUTE, json.dumps(report(ref=OLD)).encode())
    calls.clear()
    assert reader.read(ids)[COMPUTE.instance_id]["ref"] == OLD and calls["GetObject"] == 1
    s3.delete_object(Bucket=BUCKET, Key=key(COMPUTE))
    assert reader.read(ids)[COMPUTE.instance_id] is None, "a report gone is silence, not the old one"


@pytest.mark.slow
def test_without_a_listing_no_report_is_taken_and_the_wait_says_why(s3: Any) -> None:
    for node in NODES:
        put(s3, node, json.dumps(report()).encode())
    denied = aws.client("s3", "ap-northeast-1", s3.meta.endpoint_url)

    def deny(**_: Any) -> None:
        raise PermissionError("s3:ListBucket denied")

    denied.meta.events.register("before-call.s3.ListObjectsV2", deny)
    calls = counted(denied)
    reader = ReportReader(denied, BUCKET)
    for _ in range(2):
        found = statuses(denied, BUCKET, NODES, REF, MANIFEST, reader)
        assert [s.state for s in found] == ["silent", "silent"]
        assert found[0].detail == f"cannot list s3://{BUCKET}/fmcluster/report/: PermissionError: s3:ListBucket denied"
    assert calls["GetObject"] == 0


# --- reusing the last acceptance PASS --------------------------------------------------------------------------

@pytest.fixture
def tenant_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_root(tmp_path, "t-gate", "10.93.50.0/24")
    monkeypatch.setenv("FMCLUSTER_ROOT", str(root))
    return root


def record(root: Path, content: str) -> None:
    path = acceptance_dir("t-gate", root) / LAST_PASS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


STATE = cluster_state({"ref": REF, "x": 1}, NODES)


def passed(finished: datetime, **changes: Any) -> str:
    return json.dumps({**STATE, "run_dir": "/r", "finished": finished.isoformat(), "tests": [], **changes})


def test_a_recent_pass_of_the_very_same_cluster_is_reused(tenant_root: Path) -> None:
    record(tenant_root, passed(datetime.now(timezone.utc) - timedelta(hours=1)))
    reused = reusable_pass(load_tenant("t-gate"), STATE)
    assert reused is not None and reused["run_dir"] == "/r"


@pytest.mark.parametrize("changes", [{"ref": OLD}, {"manifest_digest": "0"}, {"membership_digest": "0"}])
def test_a_pass_of_another_commit_manifest_or_membership_is_run_again(tenant_root: Path, changes: dict[str, str]) -> None:
    record(tenant_root, passed(datetime.now(timezone.utc), **changes))
    assert reusable_pass(load_tenant("t-gate"), STATE) is None


def test_a_pass_older_than_a_day_is_run_again(tenant_root: Path) -> None:
    record(tenant_root, passed(datetime.now(timezone.utc) - timedelta(hours=25)))
    assert reusable_pass(load_tenant("t-gate"), STATE) is None


@pytest.mark.parametrize("content", [
    "", "{", "[]", "null", json.dumps({**STATE}), json.dumps({**STATE, "finished": "yesterday"}),
    json.dumps({**STATE, "finished": 1700000000}),
    json.dumps({**STATE, "finished": datetime.now().isoformat()}),  # no time zone: when was it?
], ids=["empty", "cut-short", "a-list", "null", "no-finished", "finished-words", "finished-number", "finished-no-zone"])
# Fixed ids: pytest-xdist's workers must collect the same test names, and one case holds the current time.
def test_an_unreadable_or_incomplete_record_is_run_again(tenant_root: Path, content: str) -> None:
    record(tenant_root, content)
    assert reusable_pass(load_tenant("t-gate"), STATE) is None


def test_without_a_record_the_gate_runs(tenant_root: Path) -> None:
    assert reusable_pass(load_tenant("t-gate"), STATE) is None


def test_a_pass_from_the_future_is_run_again(tenant_root: Path) -> None:
    record(tenant_root, passed(datetime.now(timezone.utc) + timedelta(hours=2)))
    assert reusable_pass(load_tenant("t-gate"), STATE) is None


@pytest.mark.slow
def test_the_repository_bundle_is_current_when_its_commit_is_whatever_its_bytes(s3: Any) -> None:
    """A `git bundle` of one commit is not byte-stable in a checkout with loose objects: a deploy that publishes
    the same commit again must find it current (else a no-op deploy reports a change), and a new commit is written."""
    from fmcluster.publish import publish

    manifest = {"ref": REF}
    first = publish(s3, BUCKET, {"repo.bundle": b"pack one"}, manifest, out=lambda _: None,
                    identities={"repo.bundle": f"git:{REF}"})
    assert first.written == ["fmcluster/bootstrap/repo.bundle", "fmcluster/manifest/cluster.json",
                             "fmcluster/manifest/index.json"]
    again = publish(s3, BUCKET, {"repo.bundle": b"pack two, same commit"}, manifest, out=lambda _: None,
                    identities={"repo.bundle": f"git:{REF}"})
    # The index lists the bytes the bucket holds (pack one), so it too is unchanged.
    assert again.written == [] and len(again.unchanged) == 3 and again.index_sha256 == first.index_sha256
    newer = publish(s3, BUCKET, {"repo.bundle": b"pack three"}, manifest, out=lambda _: None,
                    identities={"repo.bundle": "git:" + "b" * 40})
    assert newer.written == ["fmcluster/bootstrap/repo.bundle", "fmcluster/manifest/index.json"]
    body = s3.get_object(Bucket=BUCKET, Key="fmcluster/bootstrap/repo.bundle")["Body"].read()
    assert body == b"pack three"


#: A window as ParallelCluster's default is (fmcluster's config raises it: ParallelCluster.first_boot_window).
PCLUSTER_DEFAULT_WINDOW = ("ParallelCluster's ComputeNodeBootstrapTimeout (default)", 1800.0)


def test_a_first_boot_near_the_scheduler_s_window_is_warned_about_naming_its_largest_stage() -> None:
    from fmcluster.reports import NodeStatus, first_boot_warnings
    from fmcluster.schedulers.hyperpod.scheduler import HyperPod
    from fmcluster.schedulers.parallelcluster.scheduler import ParallelCluster
    from fmcluster.schedulers.slurm_ec2.scheduler import SlurmEc2

    def booted(node: Node, **stages: float) -> NodeStatus:
        return NodeStatus(node, {"boot_stages": stages}, "converged")

    quick = booted(CONTROLLER, fetch=2.0, packages=20.0, toolchain=15.0, commit=1.0, converge=300.0)
    slow = booted(COMPUTE, fetch=2.0, packages=700.0, toolchain=15.0, commit=1.0, converge=300.0)
    assert SlurmEc2.first_boot_window == ("the cluster stack's CreationPolicy signal timeout (PT60M)", 3600.0)
    assert ParallelCluster.first_boot_window == ("ParallelCluster's ComputeNodeBootstrapTimeout (the config's)", 3600.0)
    assert first_boot_warnings([quick, slow], SlurmEc2.first_boot_window) == []
    assert first_boot_warnings([quick, slow], PCLUSTER_DEFAULT_WINDOW) == [
        "warning: ip-10-0-128-11's first boot took 1018s (packages 700s the largest stage): it uses more than half "
        "of ParallelCluster's ComputeNodeBootstrapTimeout (default), 1800s"]
    assert "would not fit" in first_boot_warnings([booted(COMPUTE, packages=2000.0)], PCLUSTER_DEFAULT_WINDOW)[0]
    assert first_boot_warnings([slow], HyperPod.first_boot_window) == []
    assert first_boot_warnings([NodeStatus(COMPUTE, {}, "converged")], PCLUSTER_DEFAULT_WINDOW) == []


def test_first_boots_that_shared_the_deploy_machine_s_cores_are_projected_to_instances_of_their_own() -> None:
    """Local nodes boot at once on this machine's cores: each stage ran at the share of a core its node had, so the
    warning judges the time it projects to on an instance of its own (overlap-weighted); one that ran alone is
    projected at what it took, and stage times that are not finite seconds are said, never read as fitting."""
    from fmcluster.reports import NodeStatus, first_boot_warnings

    def booted(name: str, finished: str, **stages: float) -> NodeStatus:
        node = Node(name, "10.0.128.9", "compute", "cpu", "i-0123456789abcdef0", "c5.2xlarge")
        return NodeStatus(node, {"boot_stages": stages, "finished": finished}, "converged")

    together = [booted(f"ip-10-0-128-{n}", "2026-12-04T10:20:00+00:00", toolchain=100.0, converge=900.0)
                for n in range(4)]
    alone = booted("ip-10-0-128-99", "2026-12-04T12:00:00+00:00", packages=1000.0, converge=900.0)
    lines = first_boot_warnings([*together, alone], PCLUSTER_DEFAULT_WINDOW, shared_cores=2)
    assert lines[0] == ("first boots projected to instances of their own: 500-1900s of ParallelCluster's "
                        "ComputeNodeBootstrapTimeout (default), 1800s (measured here 1000-1900s, 5 first boots on "
                        "2 shared cores)")
    assert lines[1:] == ["warning: ip-10-0-128-99's first boot projects to 1900s on an instance of its own (measured "
                         "1900s here, 1.0 first boots sharing 2 cores; packages 1000s the largest stage): it would "
                         "not fit ParallelCluster's ComputeNodeBootstrapTimeout (default), 1800s"]
    assert first_boot_warnings(together, PCLUSTER_DEFAULT_WINDOW) != [], "on AWS the measurement is the time"
    broken = booted("ip-10-0-128-7", "2026-12-04T10:20:00+00:00", converge=float("nan"))
    assert first_boot_warnings([broken], PCLUSTER_DEFAULT_WINDOW, shared_cores=2) == [
        "warning: ip-10-0-128-7's first-boot stage times are not finite seconds ({'converge': nan}): its fit in "
        "ParallelCluster's ComputeNodeBootstrapTimeout (default) is unknown"]


@pytest.mark.slow
def test_when_the_cluster_stack_fails_every_failed_node_is_named_with_its_task_and_log_tail(s3: Any) -> None:
    """On AWS one node's FAILURE signal rolls the cluster stack back and CloudFormation names only the group: the
    deploy reads the nodes' own reports and says which node failed, at which task, with its log's end."""
    from fmcluster.reports import failed_node_reports

    bucket = "fmc-failed-reports"
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "ap-northeast-1"})
    failed = report(ok=False, stage="converge", node=COMPUTE.name, error="ansible-pull exited 2",
                    finished="2026-12-04T10:20:00+00:00",
                    failed_tasks=[{"task": "slurm_compute : Install Slurm", "msg": "Failed to fetch http://archive"}],
                    log_tail=["TASK [slurm_compute : Install Slurm]", "fatal: [ip-10-0-128-11]: FAILED!"])
    s3.put_object(Bucket=bucket, Key=key(COMPUTE), Body=json.dumps(failed).encode())
    s3.put_object(Bucket=bucket, Key=key(CONTROLLER), Body=json.dumps(report(node=CONTROLLER.name)).encode())
    lines = failed_node_reports(s3, bucket)
    assert lines[0] == f"{COMPUTE.name} ({COMPUTE.instance_id}): FAILED at converge: ansible-pull exited 2"
    assert lines[1] == "    failed task: slurm_compute : Install Slurm: Failed to fetch http://archive"
    assert lines[-1] == "    | fatal: [ip-10-0-128-11]: FAILED!" and not any(CONTROLLER.name in line for line in lines)
    # A deploy reads only what its own run's nodes reported: an earlier, rolled-back attempt's nodes are not named.
    assert failed_node_reports(s3, bucket, since="2026-12-04T10:20:00+00:00") == lines
    assert failed_node_reports(s3, bucket, since="2026-12-04T10:20:01+00:00") == []
    assert failed_node_reports(s3, "no-such-bucket")[0].startswith("the node reports could not be listed")
