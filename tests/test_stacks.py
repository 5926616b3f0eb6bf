"""CloudFormation stacks: rendering from the tenant, checks, and the change-set flow against a real
moto server process (the tenant's emulator, started by the code under test and stopped by the fixture).

Every test works in a temporary copy of inventories/ ($FMCLUSTER_ROOT), never in the real one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, venv_tool
from signalling import NodesSignal
from fmcluster.model import Tenant, load_tenant
from fmcluster import commands as fmcluster_commands
from fmcluster.exits import ExitCode
from fmcluster.stacks import aws, cfn
from fmcluster.providers.registry import provider_for
from fmcluster.stacks import api
from fmcluster.stacks.api import write_rendered
from scheduler_stacks import destroy_stacks, plan_stacks, stacks_status
import scheduler_stacks
from fmcluster.stacks.checks import check_stack
from fmcluster.providers.local.emulator import ensure_emulator, read_state, stop_emulator
from fmcluster.stacks.outputs import outputs_path
from fmcluster.stacks.render import RenderedStack, load_cfn_yaml
from scheduler_stacks import render_stacks
from fmcluster.stacks.result import EMULATOR_SKIPPED_TYPES

BUNDLED = ("demo", "stockmark", "neuronlab")


def quiet(_: str) -> None:
    """Progress lines are the display's business; tests read the result object."""


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private copy of the bundled tenants; any emulator started in it is stopped afterwards."""
    shutil.copytree(ROOT / "inventories", tmp_path / "inventories",
                    ignore=shutil.ignore_patterns("generated", "hosts.yml"))
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    yield tmp_path
    for org in BUNDLED:
        stop_emulator(org, tmp_path)


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def deploy_stacks(tenant: Tenant, endpoint: str | None, **options: Any) -> api.StacksResult:
    """deploy_stacks as the deploy calls it: the provider maps the public image parameters to its endpoint's. No node
    boots here: while the cluster stack waits for its nodes' signals, NodesSignal sends what their first boots would."""
    if endpoint is not None:
        options.setdefault("while_waiting", NodesSignal(tenant.region, endpoint))
    return scheduler_stacks.deploy_stacks(tenant, endpoint, image_parameter=provider_for(tenant).image_parameter,
                                          **options)


def endpoint_of(root: Path, org: str = "demo") -> str:
    """The tenant's AWS endpoint on provider local (the command layer starts the emulator, then calls the API)."""
    return ensure_emulator(org, root).endpoint


def stack(tenant: Tenant, key: str) -> RenderedStack:
    return next(s for s in render_stacks(tenant) if s.key == key)


def set_in_spec(root: Path, org: str, old: str, new: str) -> None:
    spec = root / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    text = spec.read_text(encoding="utf-8")
    assert old in text
    spec.write_text(text.replace(old, new, 1), encoding="utf-8")


# --- rendering (offline) ---------------------------------------------------------------------------

@pytest.mark.parametrize("org", BUNDLED)
def test_every_bundled_tenant_renders_network_storage_cluster_in_that_order(org: str) -> None:
    stacks = render_stacks(load_tenant(org))
    assert [s.name for s in stacks] == [f"fmc-{org}-network", f"fmc-{org}-storage", f"fmc-{org}-cluster"]
    for s in stacks:
        declared = load_cfn_yaml(s.body).get("Parameters", {})  # the network stack takes none
        assert set(s.parameters) <= set(declared)
        assert all(spec.get("Description") for spec in declared.values()), "every parameter is documented"
        assert all(spec.get("Description") for spec in load_cfn_yaml(s.body)["Outputs"].values())


def test_p5_queue_launch_template_attaches_one_efa_interface_per_catalog_device() -> None:
    tenant = load_tenant("stockmark")
    data = load_cfn_yaml(stack(tenant, "cluster").body)["Resources"]["QueueGpuLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    nics = data["NetworkInterfaces"]
    assert len(nics) == tenant.queues[0].instance.efa_interfaces == 32
    assert [n["NetworkCardIndex"] for n in nics] == list(range(32))
    assert [n["DeviceIndex"] for n in nics] == [0] + [1] * 31
    # AWS's P5 guidance: EFA with ENA on the primary interface, EFA-only (no IP address) on cards 1-31.
    assert [n["InterfaceType"] for n in nics] == ["efa"] + ["efa-only"] * 31
    assert nics[0]["Groups"] == [{"Ref": "EfaSecurityGroupId"}, {"Ref": "NodeSecurityGroupId"}]
    assert all(n["Groups"] == [{"Ref": "EfaSecurityGroupId"}] for n in nics[1:])
    assert data["CapacityReservationSpecification"]["CapacityReservationTarget"]["CapacityReservationId"] == "cr-0123456789abcdef0"


def test_cpu_only_cluster_has_plain_interfaces_and_no_efa_or_placement_parameters() -> None:
    body = load_cfn_yaml(stack(load_tenant("demo"), "cluster").body)
    nics = body["Resources"]["QueueCpuLaunchTemplate"]["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    assert len(nics) == 1 and "InterfaceType" not in nics[0]
    assert "EfaSecurityGroupId" not in body["Parameters"] and "PlacementGroupName" not in body["Parameters"]


def test_ssh_is_admitted_only_from_the_tenants_cidr_and_only_when_set() -> None:
    stockmark = load_cfn_yaml(stack(load_tenant("stockmark"), "network").body)["Resources"]
    (rule,) = stockmark["LoginSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert (rule["CidrIp"], rule["FromPort"], rule["ToPort"]) == ("203.0.113.0/24", 22, 22)
    assert "LoginSecurityGroup" not in load_cfn_yaml(stack(load_tenant("demo"), "network").body)["Resources"]


def test_every_resource_with_tags_carries_the_org_and_programme() -> None:
    for s in render_stacks(load_tenant("stockmark")):
        for name, res in load_cfn_yaml(s.body)["Resources"].items():
            tags = res.get("Properties", {}).get("Tags")
            if isinstance(tags, list):
                assert {"Key": "fmcluster:org", "Value": "stockmark"} in [
                    {k: t[k] for k in ("Key", "Value")} for t in tags], name


def test_output_keys_are_unique_across_a_tenants_stacks() -> None:
    for org in BUNDLED:
        keys = [k for s in render_stacks(load_tenant(org)) for k in load_cfn_yaml(s.body)["Outputs"]]
        assert len(keys) == len(set(keys)), org


@pytest.mark.parametrize("org", BUNDLED)
def test_security_checks_are_clean_for_every_bundled_tenant(org: str) -> None:
    assert [f.render() for s in render_stacks(load_tenant(org)) for f in check_stack(s)] == []


def edited(stack_: RenderedStack, edit: Callable[[dict[str, Any]], None]) -> RenderedStack:
    """The stack with its parsed template changed by `edit` (as a reviewer or an attacker might)."""
    template = load_cfn_yaml(stack_.body)
    edit(template)
    return RenderedStack(stack_.key, stack_.name, stack_.source, cfn.dump(template))


def test_security_checks_flag_world_open_ssh_an_efa_group_open_to_others_and_a_public_bucket() -> None:
    def open_network(t: dict[str, Any]) -> None:
        resources = t["Resources"]
        resources["LoginSecurityGroup"]["Properties"]["SecurityGroupIngress"][0]["CidrIp"] = "0.0.0.0/0"
        resources["EfaSelfIngress"]["Properties"]["SourceSecurityGroupId"] = {"Ref": "NodeSecurityGroup"}

    problems = [f.render() for f in check_stack(edited(stack(load_tenant("stockmark"), "network"), open_network))]
    assert any("LoginSecurityGroup: ingress open to 0.0.0.0/0" in p for p in problems)
    assert any("EfaSelfIngress: EFA ingress rule not limited to the group itself" in p for p in problems)

    def public_bucket(t: dict[str, Any]) -> None:
        bucket = t["Resources"]["DataBucket"]
        bucket["Properties"]["PublicAccessBlockConfiguration"]["RestrictPublicBuckets"] = False
        bucket["DeletionPolicy"] = "Delete"

    problems = [f.render() for f in check_stack(edited(stack(load_tenant("stockmark"), "storage"), public_bucket))]
    assert any("public access not fully blocked" in p for p in problems)
    assert any("data bucket is not retained" in p for p in problems)


def test_plan_for_the_p5_tenant_renders_everything_offline_and_says_the_change_set_needs_aws(
        root: Path, no_aws_credentials: None) -> None:
    lines: list[str] = []
    result = plan_stacks(load_tenant("stockmark"), None, offline=True, out=lines.append)
    assert [s.action for s in result.stacks] == ["rendered"] * 3
    assert result.endpoint is None and read_state("stockmark", root) is None, "no emulator, no AWS call"
    rendered = root / "inventories" / "stockmark" / "generated" / "cfn"
    assert sorted(p.name for p in rendered.iterdir()) == sorted(
        f"fmc-stockmark-{k}.{ext}" for k in ("network", "storage", "cluster") for ext in ("yaml", "parameters.json"))
    text = "\n".join(lines)
    assert "QueueGpuLaunchTemplate (AWS::EC2::LaunchTemplate)  [p5.48xlarge, 32 EFA interfaces" in text
    assert "the change sets need AWS" in text
    assert "security check: clean" in text


@pytest.mark.slow
@pytest.mark.parametrize("org", BUNDLED)
def test_cfn_lint_is_clean_for_the_tenants_region_including_informational_checks(org: str, tmp_path: Path) -> None:
    tenant = load_tenant(org)
    folder = write_rendered(tenant, render_stacks(tenant), tmp_path)
    files = sorted(str(p) for p in folder.glob("*.yaml"))
    assert len(files) == 3
    # The tenant's own region: resource types, properties and instance types are checked against what
    # that region offers (a template valid in us-east-1 may not be in ap-northeast-1).
    run = subprocess.run([venv_tool("cfn-lint"), "--regions", tenant.region, "--include-checks", "I", "--", *files],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


# --- against the emulator (a real moto server process) ---------------------------------------------

@pytest.mark.slow
def test_deploy_of_demo_creates_all_stacks_and_writes_the_stack_outputs_inventory(root: Path) -> None:
    nodes = NodesSignal("ap-northeast-1", endpoint_of(root))
    lines: list[str] = []
    result = deploy_stacks(load_tenant("demo"), endpoint_of(root), out=lines.append, while_waiting=nodes)
    assert result.ok, result.failure
    # The cluster stack waited for its groups' signals (login 1, cpu 3; the controller has no CreationPolicy),
    # the instances "booting" meanwhile; each signal is a stack event, as on AWS.
    assert nodes.calls >= 1 and list(nodes.sent.values()) == ["SUCCESS"] * 4
    assert any("fmc-demo-cluster waits for its nodes' signals" in line for line in lines)
    assert sum("Received SUCCESS signal with UniqueId i-" in line for line in lines) == 4
    assert result.changed == ["fmc-demo-network", "fmc-demo-storage", "fmc-demo-cluster"]
    state = read_state("demo", root)
    assert state and result.endpoint == f"http://127.0.0.1:{state['port']}"

    written = outputs_path("demo", root)
    assert written == result.outputs_file
    assert written.read_text(encoding="utf-8").startswith(
        "# generated by fmcluster (CloudFormation stack outputs of fmc-demo-network, fmc-demo-storage, "
        "fmc-demo-cluster); edits will be reverted\n")
    inventory = yaml.safe_load(written.read_text(encoding="utf-8"))["all"]["vars"]
    outputs = inventory["fmcluster_stack_outputs"]
    assert outputs == result.outputs
    assert outputs["VpcId"].startswith("vpc-") and outputs["QueueCpuAutoScalingGroupName"]
    assert outputs["ControllerPrivateIp"].count(".") == 3
    assert outputs["DataBucketName"].startswith("fmc-demo-storage-databucket-")
    assert "LustreDnsName" not in outputs and "PlacementGroupName" not in outputs, "left out with the resources moto skips"
    assert outputs["CpuImageId"].startswith("ami-"), "the AMI pinned at create is recorded"
    assert any(note.startswith(f"CpuImageId: pinned {outputs['CpuImageId']}, resolved from ")
               for note in result.stacks[2].notes)

    # What moto skipped is reported, per stack, and matches what plan predicts for the emulator.
    skipped = {(s, lid): t for s, items in result.not_created.items() for lid, t in items}
    assert skipped == {
        ("fmc-demo-network", "EfaSelfEgress"): "AWS::EC2::SecurityGroupEgress",
        ("fmc-demo-network", "ClusterPlacementGroup"): "AWS::EC2::PlacementGroup",
        ("fmc-demo-storage", "DataBucketPolicy"): "AWS::S3::BucketPolicy",
        ("fmc-demo-storage", "LustreFileSystem"): "AWS::FSx::FileSystem",
        ("fmc-demo-storage", "LustreDataRepositoryAssociation"): "AWS::FSx::DataRepositoryAssociation",
    }
    assert set(skipped.values()) <= EMULATOR_SKIPPED_TYPES
    assert len(inventory["fmcluster_stack_resources_not_created"]) == len(skipped)
    # The same templates as on AWS: the outputs reading what moto skipped are left out with it, and said.
    left_out = {s.name: note for s in result.stacks for note in s.notes if note.startswith("outputs left out")}
    assert left_out == {
        "fmc-demo-network": "outputs left out with the resources they read: PlacementGroupName",
        "fmc-demo-storage": "outputs left out with the resources they read: LustreFileSystemId, LustreDnsName, "
                            "LustreMountName"}

    # The resources really exist in the emulator, tagged for cost allocation.
    ec2 = aws.client("ec2", "ap-northeast-1", result.endpoint)
    (vpc,) = ec2.describe_vpcs(VpcIds=[outputs["VpcId"]])["Vpcs"]
    assert {"Key": "fmcluster:org", "Value": "demo"} in vpc["Tags"]
    asg = aws.client("autoscaling", "ap-northeast-1", result.endpoint).describe_auto_scaling_groups(
        AutoScalingGroupNames=[outputs["QueueCpuAutoScalingGroupName"]])["AutoScalingGroups"][0]
    assert asg["DesiredCapacity"] == 3


@pytest.mark.slow
def test_second_deploy_is_a_no_op_and_reuses_the_running_emulator(root: Path) -> None:
    first = deploy_stacks(load_tenant("demo"), endpoint_of(root), out=quiet)
    assert first.ok
    before = outputs_path("demo", root).stat().st_mtime_ns
    lines: list[str] = []
    second = deploy_stacks(load_tenant("demo"), endpoint_of(root), out=lines.append)
    assert second.ok and second.changed == []
    assert second.skipped == ["fmc-demo-network", "fmc-demo-storage", "fmc-demo-cluster"]
    assert second.endpoint == first.endpoint
    assert second.outputs == first.outputs and second.not_created == first.not_created
    assert f"CpuImageId: keeping the pinned {first.outputs['CpuImageId']}" in second.stacks[2].notes
    assert outputs_path("demo", root).stat().st_mtime_ns == before, "unchanged outputs file is left alone"


@pytest.mark.slow
def test_a_changed_queue_count_yields_a_change_set_touching_only_that_queues_group(root: Path) -> None:
    assert deploy_stacks(load_tenant("demo"), endpoint_of(root), out=quiet).ok
    set_in_spec(root, "demo", "count: 3", "count: 5")
    tenant = load_tenant("demo")

    plan = plan_stacks(tenant, endpoint_of(root), out=quiet)
    assert [(s.name, s.action) for s in plan.stacks] == [
        ("fmc-demo-network", "no-changes"), ("fmc-demo-storage", "no-changes"), ("fmc-demo-cluster", "would-update")]
    assert [(c.action, c.logical_id) for c in plan.stacks[2].changes] == [("Modify", "QueueCpuGroup")]

    result = deploy_stacks(tenant, endpoint_of(root), out=quiet)
    assert result.ok and result.changed == ["fmc-demo-cluster"]
    assert result.skipped == ["fmc-demo-network", "fmc-demo-storage"]
    assert [(c.action, c.logical_id) for c in result.stacks[2].changes] == [("Modify", "QueueCpuGroup")]
    asg = aws.client("autoscaling", "ap-northeast-1", result.endpoint).describe_auto_scaling_groups(
        AutoScalingGroupNames=[result.outputs["QueueCpuAutoScalingGroupName"]])["AutoScalingGroups"][0]
    assert asg["DesiredCapacity"] == 5


@pytest.mark.slow
def test_a_failing_resource_is_reported_with_its_reason_and_a_rerun_resumes_cleanly(root: Path) -> None:
    emulator = ensure_emulator("demo", root)
    ec2 = aws.client("ec2", "ap-northeast-1", emulator.endpoint)
    # Someone created a launch template with the name the cluster stack wants: a real conflict.
    ec2.create_launch_template(LaunchTemplateName="fmc-demo-cluster-queue-cpu",
                               LaunchTemplateData={"InstanceType": "c5.large"})
    lines: list[str] = []
    failed = deploy_stacks(load_tenant("demo"), endpoint_of(root), out=lines.append)
    assert not failed.ok and failed.outputs_file is None
    assert failed.failure is not None
    assert (failed.failure.logical_id, failed.failure.resource_type, failed.failure.status) == (
        "QueueCpuLaunchTemplate", "AWS::EC2::LaunchTemplate", "CREATE_FAILED")
    assert "already in use" in failed.failure.reason
    assert [(s.action, s.status) for s in failed.stacks] == [
        ("created", "CREATE_COMPLETE"), ("created", "CREATE_COMPLETE"), ("failed", "ROLLBACK_COMPLETE")]
    assert any("FAILED: QueueCpuLaunchTemplate (AWS::EC2::LaunchTemplate) CREATE_FAILED" in line for line in lines)
    assert any("ROLLBACK_COMPLETE" in line for line in lines), "rollback is streamed"

    ec2.delete_launch_template(LaunchTemplateName="fmc-demo-cluster-queue-cpu")
    lines.clear()
    rerun = deploy_stacks(load_tenant("demo"), endpoint_of(root), out=lines.append)
    assert rerun.ok, rerun.failure
    assert rerun.changed == ["fmc-demo-cluster"] and rerun.skipped == ["fmc-demo-network", "fmc-demo-storage"]
    assert any("deleting it so it can be created again" in line for line in lines)
    assert outputs_path("demo", root).exists()


@pytest.mark.slow
def test_destroy_removes_the_stacks_and_names_the_retained_bucket(root: Path) -> None:
    deployed = deploy_stacks(load_tenant("demo"), endpoint_of(root), out=quiet)
    assert deployed.ok
    asked: list[str] = []
    assert destroy_stacks(load_tenant("demo"), endpoint_of(root), confirm=lambda q: asked.append(q) is not None,
                          out=quiet).notes == [
        "cancelled"]
    assert asked == ["Delete 3 stack(s) of 'demo'?"]
    cf = aws.client("cloudformation", "ap-northeast-1", deployed.endpoint)
    assert len(cf.describe_stacks()["Stacks"]) == 3, "declining deletes nothing"

    lines: list[str] = []
    result = destroy_stacks(load_tenant("demo"), endpoint_of(root), confirm=None, out=lines.append)
    assert result.ok
    assert [(s.name, s.action) for s in result.stacks] == [
        ("fmc-demo-cluster", "deleted"), ("fmc-demo-storage", "deleted"), ("fmc-demo-network", "deleted")]
    bucket = deployed.outputs["DataBucketName"]
    assert any(f"kept (DeletionPolicy Retain): DataBucket of fmc-demo-storage: s3://{bucket}" in line for line in lines)
    assert not outputs_path("demo", root).exists()
    assert stacks_status(load_tenant("demo"), endpoint_of(root), out=quiet).stacks[0].action == "absent"


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_a_dead_emulator_is_reported_and_replaced_by_a_fresh_one(root: Path) -> None:
    first = ensure_emulator("demo", root)
    os.kill(first.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not _is_zombie(first.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        os.waitpid(first.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    second = ensure_emulator("demo", root)
    assert second.pid != first.pid and second.started
    assert f"(pid {first.pid}) is gone, and its state with it" in second.note


@pytest.mark.slow
def test_destroy_asks_and_deletes_nothing_without_a_terminal_unless_yes(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_emulator("demo", root)
    assert deploy_stacks(load_tenant("demo"), endpoint_of(root), out=quiet).ok
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert fmcluster_commands.destroy("demo", yes=False) == ExitCode.CANCELLED
    assert stacks_status(load_tenant("demo"), endpoint_of(root), out=quiet).stacks[0].status == "CREATE_COMPLETE"


@pytest.mark.slow
@pytest.mark.parametrize(("org", "skipped_in_cluster"), [
    ("stockmark", []),
    ("neuronlab", []),  # the HyperPod cluster is made by the emulator's stand-in (tests/test_emulator_hyperpod.py)
])
def test_the_aws_example_tenants_rehearse_on_the_emulator_with_every_gap_reported(
        root: Path, org: str, skipped_in_cluster: list[tuple[str, str]]) -> None:
    set_in_spec(root, org, "provider: aws", "provider: local")
    tenant = load_tenant(org)
    result = deploy_stacks(tenant, endpoint_of(root, org), out=quiet)
    assert result.ok, result.failure
    assert result.not_created.get(f"fmc-{org}-cluster", []) == skipped_in_cluster
    storage_gaps = {t for _, t in result.not_created[f"fmc-{org}-storage"]}
    assert "AWS::FSx::FileSystem" in storage_gaps
    if tenant.scheduler == "hyperpod":
        pass  # the lifecycle uploads are the deploy's (tests/test_aws_deploy_path.py)
    else:
        notes = " ".join(note for s in result.stacks for note in s.notes)
        assert "QueueGpuGroup UpdatePolicy (the emulator replaces no instance on an update)" in notes
        assert "CreationPolicy" not in notes, "honoured by the emulator (its signals were waited for)"
        assert "DataBucket.LifecycleConfiguration (moto drops it)" in notes
        assert "S3GatewayEndpoint.Tags (moto drops it)" in notes
    assert destroy_stacks(tenant, endpoint_of(root, org), confirm=None, out=quiet).ok


@pytest.mark.slow
def test_an_efa_queue_without_a_reservation_uses_the_placement_group_and_the_emulator_gap_is_said(root: Path) -> None:
    set_in_spec(root, "stockmark", "provider: aws", "provider: local")
    set_in_spec(root, "stockmark", "      capacity_reservation_id: cr-0123456789abcdef0\n", "")
    tenant = load_tenant("stockmark")
    group = load_cfn_yaml(stack(tenant, "cluster").body)["Resources"]["QueueGpuGroup"]["Properties"]
    assert group["PlacementGroup"] == {"Fn::If": ["HasPlacementGroup", {"Ref": "PlacementGroupName"},
                                                  {"Ref": "AWS::NoValue"}]}
    result = deploy_stacks(tenant, endpoint_of(root, "stockmark"), out=quiet)
    assert result.ok, result.failure
    assert any("PlacementGroupName: <output PlacementGroupName of the network stack> does not exist; using ''"
               in note for note in result.stacks[2].notes), "the substitute is said"


def test_the_resources_a_value_reads_are_found_in_ref_getatt_and_sub() -> None:
    from fmcluster.stacks.references import referenced

    value = {"Fn::Join": ["", [{"Ref": "Bucket"}, {"Fn::GetAtt": ["Fs", "DNSName"]}, {"Fn::GetAtt": "Db.Endpoint.Address"},
                               {"Fn::Sub": "s3://${Bucket2}/${AWS::Region}/${Fs2.DNSName}/${!Literal}"},
                               {"Fn::Sub": ["${Name}-${Other}", {"Name": {"Ref": "Named"}}]}]]}
    assert referenced(value) == {"Bucket", "Fs", "Db", "Bucket2", "Fs2", "Other", "Named"}
    assert referenced("plain") == set() and referenced([]) == set()


@pytest.mark.slow
def test_plan_passes_a_template_over_the_inline_limit_through_the_bucket_as_the_deploy_does(root: Path) -> None:
    """stockmark's cluster template is over CloudFormation's 51,200 inline bytes: plan (with credentials) used to
    raise where deploy uploaded it."""
    from fmcluster.stacks.changesets import MAX_TEMPLATE_BODY

    set_in_spec(root, "stockmark", "provider: aws", "provider: local")
    tenant = load_tenant("stockmark")
    assert len(stack(tenant, "cluster").body.encode()) > MAX_TEMPLATE_BODY
    assert deploy_stacks(tenant, endpoint_of(root, "stockmark"), out=quiet).ok
    lines: list[str] = []
    plan = plan_stacks(tenant, endpoint_of(root, "stockmark"), image_parameter=provider_for(tenant).image_parameter,
                       out=lines.append)
    assert [s.action for s in plan.stacks] == ["no-changes"] * 3, lines
    assert destroy_stacks(tenant, endpoint_of(root, "stockmark"), confirm=None, out=quiet).ok
