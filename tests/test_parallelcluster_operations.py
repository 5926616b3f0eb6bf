"""The pcluster operations the scheduler layer calls: the exact command lines they build, and how they read
ParallelCluster's answers. Nothing here reaches AWS: the answers are recorded describe/create/update/delete
outputs (tests/golden/parallelcluster/recorded/, shaped as ParallelCluster 3.16's own OpenAPI models and
messages — DescribeClusterResponseContent, DryrunOperationExceptionResponseContent, ...), replayed in order.

The OnNodeConfigured script is run for real: against a real S3 API (moto's server) with a stand-in AWS CLI
(tests/fixtures/awscli, boto3 underneath), as the node bootstrap's own tests do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fmcluster.model import load_spec
from fmcluster.schedulers.parallelcluster import operations as ops
from fmcluster.schedulers.parallelcluster.config import (
    CUSTOM_ACTION_KEY, CUSTOM_ACTION_SOURCE, custom_action_script, render_cluster_config,
)

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "parallelcluster"
RECORDED = GOLDEN / "recorded"
NAME, REGION = "fmc-trnlab-cluster", "us-east-2"
CONFIG = Path("/srv/x/cluster-config.yaml")


def trn1() -> ops.ClusterConfig:
    return render_cluster_config(load_spec(GOLDEN / "trn1-tenant.yml"), yaml.safe_load((GOLDEN / "trn1-outputs.yml").read_text()))


class Replay:
    """Answers each pcluster command with the next recorded output; the command must be the expected one."""

    def __init__(self, *steps: tuple[str, int, str]) -> None:
        self.steps = list(steps)
        self.argvs: list[list[str]] = []

    def __call__(self, argv: list[str]) -> ops.PclusterResult:
        self.argvs.append(argv)
        assert self.steps, f"unexpected command {argv[1:]}"
        command, rc, recorded = self.steps.pop(0)
        assert argv[1] == command, f"expected {command}, got {argv[1:]}"
        return ops.parse_result(argv, rc, (RECORDED / f"{recorded}.json").read_text())

    def done(self) -> bool:
        return not self.steps


def test_command_lines_name_the_cluster_config_and_region_and_dry_run_explicitly() -> None:
    pcluster = ops.pcluster_bin()
    assert pcluster.endswith(".tools/pcluster-venv/bin/pcluster")
    assert ops.create_argv(NAME, CONFIG, REGION, dryrun=True) == [
        pcluster, "create-cluster", "--cluster-name", NAME, "--cluster-configuration", str(CONFIG), "--region", REGION,
        "--dryrun", "true"]
    assert ops.update_argv(NAME, CONFIG, REGION, dryrun=False)[-2:] == ["--dryrun", "false"]
    assert ops.update_argv(NAME, CONFIG, REGION, dryrun=False)[1] == "update-cluster"
    assert ops.describe_argv(NAME, REGION) == [pcluster, "describe-cluster", "--cluster-name", NAME, "--region", REGION]
    assert ops.delete_argv(NAME, REGION) == [pcluster, "delete-cluster", "--cluster-name", NAME, "--region", REGION]


@pytest.mark.slow
def test_these_are_options_the_installed_pcluster_knows() -> None:
    pcluster = Path(ops.pcluster_bin())
    if not pcluster.exists():
        pytest.skip("the aws-parallelcluster tool environment is not installed (bash scripts/bootstrap.sh)")
    for argv in (ops.create_argv(NAME, CONFIG, REGION, dryrun=True), ops.update_argv(NAME, CONFIG, REGION, dryrun=True)):
        usage = subprocess.run([argv[0], argv[1], "--help"], capture_output=True, text=True, check=True).stdout
        assert all(opt in usage for opt in argv[2:] if opt.startswith("--")), usage


def test_describe_reads_status_fleet_head_node_and_login_pools() -> None:
    state = ops.describe(NAME, REGION, Replay(("describe-cluster", 0, "describe-create-complete")))
    assert (state.exists, state.status, state.stack_status, state.fleet, state.version) == (
        True, "CREATE_COMPLETE", "CREATE_COMPLETE", "RUNNING", "3.16.1")
    assert state.head_node["instanceId"] == "i-0a1b2c3d4e5f60718"
    lines = ops.status_lines(state)
    assert lines[0] == f"{NAME}: CREATE_COMPLETE (ParallelCluster 3.16.1, stack CREATE_COMPLETE), compute fleet RUNNING"
    assert "head node i-0a1b2c3d4e5f60718 m5.2xlarge running 10.0.140.17" in lines[1]
    assert lines[2].startswith("  login pool login: active, 1 healthy, 0 unhealthy, fmc-trnl-login-")


def test_describe_of_an_older_cluster_with_one_login_object() -> None:
    state = ops.describe(NAME, REGION, Replay(("describe-cluster", 0, "describe-login-object-before-3.11")))
    assert [p["poolName"] for p in state.login_pools] == ["login"]


def test_a_cluster_that_does_not_exist_is_absent_not_an_error() -> None:
    state = ops.describe(NAME, REGION, Replay(("describe-cluster", 1, "describe-not-found")))
    assert not state.exists and ops.status_lines(state) == [f"{NAME}: does not exist (ParallelCluster)"]


def test_other_describe_failures_raise_with_parallelclusters_words() -> None:
    with pytest.raises(ops.PclusterError, match="Unable to locate credentials"):
        ops.describe(NAME, REGION, Replay(("describe-cluster", 1, "no-credentials")))
    with pytest.raises(ops.PclusterError, match="printed no JSON"):
        ops.parse_result(["pcluster", "describe-cluster"], 1, "Traceback (most recent call last):\n  boom")


def test_create_runs_the_dry_run_first_then_creates_and_wait_follows_it_with_progress() -> None:
    run = Replay(("describe-cluster", 1, "describe-not-found"), ("create-cluster", 1, "create-dryrun-ok"),
                 ("create-cluster", 0, "create-accepted"), ("describe-cluster", 0, "describe-create-in-progress"),
                 ("describe-cluster", 0, "describe-create-in-progress"), ("describe-cluster", 0, "describe-create-complete"))
    lines: list[str] = []
    outcome = ops.apply(trn1(), CONFIG, run, lines.append)
    assert outcome.action == "create" and outcome.notes[0].startswith("WARNING PlacementGroupCapacityTypeValidator")
    assert [a[-1] for a in run.argvs[1:3]] == ["true", "false"], "dry run, then for real"
    clock = iter(float(t) for t in range(0, 10000, 60))
    progress: list[str] = []
    state = ops.wait(NAME, REGION, run, progress.append, poll_s=60, sleep=lambda s: None, clock=lambda: next(clock))
    assert state.status == "CREATE_COMPLETE" and run.done()
    assert progress[0].startswith(f"  {NAME}: CREATE_IN_PROGRESS, stack CREATE_IN_PROGRESS, compute fleet UNKNOWN")
    assert progress[-1].startswith(f"  {NAME}: CREATE_COMPLETE, stack CREATE_COMPLETE, compute fleet RUNNING")
    assert len(progress) == 2, "one line per change, not per poll"


def test_a_refused_dry_run_creates_nothing_and_says_why() -> None:
    run = Replay(("describe-cluster", 1, "describe-not-found"), ("create-cluster", 1, "create-dryrun-refused"))
    with pytest.raises(ops.PclusterError) as err:
        ops.apply(trn1(), CONFIG, run, print)
    assert "--dryrun refused the config: Invalid cluster configuration." in str(err.value)
    assert err.value.lines == ["ERROR CapacityReservationValidator: Capacity reservation cr-0fedcba9876543210 must have "
                               "the same instance type as trn1.32xlarge."]
    assert run.done(), "no real create-cluster after the refusal"


def test_update_of_an_unchanged_cluster_is_a_no_op() -> None:
    run = Replay(("describe-cluster", 0, "describe-create-complete"), ("update-cluster", 1, "update-dryrun-no-changes"))
    assert ops.apply(trn1(), CONFIG, run, print).action == "no-changes" and run.done()


def test_update_shows_the_change_set_of_its_dry_run_then_updates() -> None:
    run = Replay(("describe-cluster", 0, "describe-create-complete"), ("update-cluster", 1, "update-dryrun-changes"),
                 ("update-cluster", 0, "update-accepted"))
    lines: list[str] = []
    assert ops.apply(trn1(), CONFIG, run, lines.append).action == "update" and run.done()
    assert "    Scheduling.SlurmQueues[trn].ComputeResources[trn1-32xlarge].MinCount: 4 → 6" in lines


def test_an_update_parallelcluster_cannot_do_is_refused_with_the_parameter() -> None:
    run = Replay(("describe-cluster", 0, "describe-create-complete"), ("update-cluster", 1, "update-dryrun-refused"))
    with pytest.raises(ops.PclusterError) as err:
        ops.apply(trn1(), CONFIG, run, print)
    assert err.value.lines[0].startswith("update refused for HeadNode.InstanceType: Update actions are not currently "
                                         "supported") and err.value.lines[0].endswith("(m5.2xlarge → m5.4xlarge)")


def test_a_failed_first_create_is_deleted_and_created_again() -> None:
    run = Replay(("describe-cluster", 0, "describe-create-failed"), ("describe-cluster", 0, "describe-create-failed"),
                 ("delete-cluster", 0, "delete-accepted"), ("describe-cluster", 0, "describe-create-failed"),
                 ("describe-cluster", 0, "describe-delete-in-progress"), ("describe-cluster", 1, "describe-not-found"),
                 ("create-cluster", 1, "create-dryrun-ok"), ("create-cluster", 0, "create-accepted"))
    outcome = ops.apply(trn1(), CONFIG, run, print, poll_s=0, sleep=lambda s: None)
    assert outcome.action == "create" and run.done()


def test_a_failed_create_stops_the_wait_with_parallelclusters_reason() -> None:
    run = Replay(("describe-cluster", 0, "describe-create-in-progress"), ("describe-cluster", 0, "describe-create-failed"))
    with pytest.raises(ops.PclusterError, match="is CREATE_FAILED") as err:
        ops.wait(NAME, REGION, run, print, poll_s=0, sleep=lambda s: None)
    assert err.value.lines == ["HeadNodeBootstrapFailure: Cluster creation failed because there was a failure while "
                               "running the head node bootstrap script (OnNodeConfigured)."]


def test_wait_gives_up_after_its_timeout() -> None:
    run = Replay(*[("describe-cluster", 0, "describe-update-in-progress")] * 3)
    clock = iter([0.0, 0.0, 100.0, 200.0])  # the start, then one reading per poll
    with pytest.raises(ops.PclusterError, match="still UPDATE_IN_PROGRESS after 3 min"):
        ops.wait(NAME, REGION, run, print, poll_s=100, timeout_s=180, sleep=lambda s: None, clock=lambda: next(clock))


def test_delete_waits_until_the_cluster_is_gone_and_is_a_no_op_when_absent() -> None:
    run = Replay(("describe-cluster", 0, "describe-create-complete"), ("delete-cluster", 0, "delete-accepted"),
                 ("describe-cluster", 0, "describe-delete-in-progress"), ("describe-cluster", 1, "describe-not-found"))
    assert not ops.delete(NAME, REGION, run, print, poll_s=0, sleep=lambda s: None).exists and run.done()
    assert not ops.delete(NAME, REGION, Replay(("describe-cluster", 1, "describe-not-found")), print).exists


def test_apply_refuses_a_config_that_still_holds_placeholders() -> None:
    cfg = render_cluster_config(load_spec(GOLDEN / "trn1-tenant.yml"))
    with pytest.raises(ops.PclusterError, match="still holds placeholders for DataBucketName"):
        ops.apply(cfg, CONFIG, Replay(), print)


# --- the OnNodeConfigured custom action, for real ------------------------------------------------------------

@pytest.fixture
def s3_endpoint() -> object:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.mark.slow
def test_on_node_configured_runs_the_first_boot_of_every_node_with_the_tenant_settings(
        tmp_path: Path, s3_endpoint: str) -> None:
    import boto3

    bucket = "fmc-trnlab-storage-databucket-4j2k9x0z1y3w"
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=s3_endpoint, aws_access_key_id="emulator",
                      aws_secret_access_key="emulator")
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    env = {"PATH": f"{ROOT / 'tests' / 'fixtures' / 'awscli'}:{Path(sys.executable).parent}:/usr/bin:/bin",
           "HOME": str(tmp_path), "AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "emulator",
           "AWS_SECRET_ACCESS_KEY": "emulator", "FMCLUSTER_BIN_DIR": str(tmp_path / "sbin"),
           "RECORD": str(tmp_path / "bootstrap-ran-with")}
    from fmcluster.schedulers.parallelcluster.operations import upload_custom_action
    from fmcluster.stacks.render import first_boot_script

    upload_custom_action(s3, bucket, print)
    uploaded = s3.get_object(Bucket=bucket, Key=CUSTOM_ACTION_KEY)["Body"].read()
    assert uploaded.startswith(CUSTOM_ACTION_SOURCE.read_bytes()) and uploaded.endswith(first_boot_script().encode()), \
        "the argument check, then the first boot every node runs"
    # The node bootstrap itself is specified elsewhere (test_node_boot); here a stand-in records its settings. It is
    # published as the deploy publishes (the index, and the SSM parameter naming it) since nodes verify before running.
    from fmcluster.publish import publish, trust_index

    stand_in = b'#!/bin/sh\nenv | grep ^FMCLUSTER_ | sort > "$RECORD"\n'
    done = publish(s3, bucket, {"node-bootstrap.sh": stand_in}, {"ref": "a" * 40}, out=print)
    ssm = boto3.client("ssm", region_name=REGION, endpoint_url=s3_endpoint, aws_access_key_id="emulator",
                       aws_secret_access_key="emulator")
    assert trust_index(ssm, "trnlab", done.index_sha256, out=print)
    args = trn1().data["Scheduling"]["SlurmQueues"][0]["CustomActions"]["OnNodeConfigured"]["Args"]
    # ParallelCluster downloads the script itself and runs it with the Args; so does this test.
    script = tmp_path / "on-node-configured.sh"
    script.write_bytes(uploaded)
    run = subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    ran_with = (tmp_path / "bootstrap-ran-with").read_text().splitlines()
    for line in (f"FMCLUSTER_BUCKET={bucket}", f"FMCLUSTER_REGION={REGION}", "FMCLUSTER_ORG=trnlab",
                 "FMCLUSTER_ROLE=compute", "FMCLUSTER_QUEUE=trn"):
        assert line in ran_with


@pytest.mark.parametrize("bad", ['FMCLUSTER_ORG=x"; rm -rf /; "', "FMCLUSTER_BUCKET=a\nb", "FMCLUSTER_ROLE=root",
                                 "FMCLUSTER_EVIL=1", "FMCLUSTER_QUEUE=$(id)"])
def test_on_node_configured_refuses_arguments_that_are_not_of_their_form(tmp_path: Path, bad: str) -> None:
    good = ["FMCLUSTER_BUCKET=fmc-x-storage-databucket-1", "FMCLUSTER_REGION=us-east-2", "FMCLUSTER_ORG=trnlab",
            "FMCLUSTER_ROLE=compute"]
    env = {"PATH": "/usr/bin:/bin", "FMCLUSTER_BIN_DIR": str(tmp_path / "sbin")}
    script = tmp_path / "on-node-configured.sh"
    script.write_bytes(custom_action_script())
    run = subprocess.run(["bash", str(script), *good, bad], env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "fmcluster on-node-configured:" in run.stderr
    assert not (tmp_path / "sbin").exists(), "nothing fetched or written before every argument is checked"
