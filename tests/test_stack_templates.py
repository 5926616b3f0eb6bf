"""What the rendered templates must hold to create reliably and update safely on real AWS (issue 17),
read from the rendered YAML as CloudFormation reads it. Offline, except where a test says it talks
to the tenant's emulator (a real moto server process, started and stopped by the test).
"""

from __future__ import annotations

from types import SimpleNamespace

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from fmcluster.model import Tenant, load_tenant
from fmcluster.stacks import aws, cfn
from fmcluster.stacks.api import emulator_ignored, existing_file_systems, image_resolver
from fmcluster.stacks.checks import check_stack
from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator
from fmcluster.schedulers.hyperpod.lifecycle import lifecycle_environment
from fmcluster.stacks.render import first_boot_script, BakedImageRef, ImageRef, RenderedStack, load_cfn_yaml, user_data_text
from scheduler_stacks import render_stacks


def rendered(tenant: Tenant, key: str) -> dict[str, Any]:
    return load_cfn_yaml(next(s for s in render_stacks(tenant) if s.key == key).body)


def resources(tenant: Tenant, key: str) -> dict[str, Any]:
    result: dict[str, Any] = rendered(tenant, key)["Resources"]
    return result


def with_queue(tenant: Tenant, **changes: Any) -> Tenant:
    return dataclasses.replace(tenant, queues=(dataclasses.replace(tenant.queues[0], **changes),))


def statements(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [st for policy in role["Properties"]["Policies"] for st in policy["PolicyDocument"]["Statement"]]


def flat(value: Any) -> str:
    """A rendered string property with its intrinsics shown as ${Name}."""
    if isinstance(value, str):
        return value
    if "Fn::Sub" in value:
        return str(value["Fn::Sub"])
    if "Ref" in value:
        return "${" + value["Ref"] + "}"
    delimiter, parts = value["Fn::Join"]
    return str(delimiter).join(flat(p) for p in parts)


def findings(stack: RenderedStack, template: dict[str, Any]) -> list[str]:
    changed = RenderedStack(stack.key, stack.name, stack.source, cfn.dump(template))
    return [f.render() for f in check_stack(changed)]


STOCKMARK, NEURONLAB, DEMO = (load_tenant(org) for org in ("stockmark", "neuronlab", "demo"))


# --- storage --------------------------------------------------------------------------------------

def test_the_home_export_lets_root_on_the_nodes_make_users_homes_and_only_the_vpc_mount_it() -> None:
    """With root squashed to nobody, root on a node could neither make a user's home nor hand it over."""
    export = resources(STOCKMARK, "storage")["OpenZfsFileSystem"]["Properties"]["OpenZFSConfiguration"][
        "RootVolumeConfiguration"]["NfsExports"][0]["ClientConfigurations"]
    assert export == [{"Clients": {"Ref": "VpcCidr"}, "Options": ["rw", "crossmnt", "no_root_squash"]}]


def test_file_systems_wait_for_their_groups_self_ingress_rule_and_outlive_the_stack() -> None:
    res = resources(STOCKMARK, "storage")
    for name in ("LustreFileSystem", "OpenZfsFileSystem"):
        assert res[name]["DependsOn"] == ["FileSystemSelfIngress"], name
        assert (res[name]["DeletionPolicy"], res[name]["UpdateReplacePolicy"]) == ("Retain", "Retain"), name
    rule = res["FileSystemSelfIngress"]["Properties"]
    assert rule["GroupId"] == rule["SourceSecurityGroupId"] == {"Ref": "FileSystemSecurityGroup"}
    assert (rule["FromPort"], rule["ToPort"]) == (988, 1023)
    assert (res["DataBucketPolicy"]["DeletionPolicy"], res["DataBucketPolicy"]["UpdateReplacePolicy"]) == (
        "Retain", "Retain"), "a retained bucket keeps its TLS-only policy"


def test_the_bucket_expires_old_versions_and_abandoned_multipart_uploads() -> None:
    rules = resources(STOCKMARK, "storage")["DataBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    by_id = {r["Id"]: r for r in rules}
    assert by_id["expire-old-versions"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 30,
                                                                          "NewerNoncurrentVersions": 3}
    assert by_id["abort-incomplete-multipart-uploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}
    assert {r["Status"] for r in rules} == {"Enabled"}


def test_checks_refuse_a_file_system_that_is_not_retained_or_races_its_ingress_rule() -> None:
    stack = next(s for s in render_stacks(STOCKMARK) if s.key == "storage")
    template = load_cfn_yaml(stack.body)
    del template["Resources"]["LustreFileSystem"]["DependsOn"]
    template["Resources"]["OpenZfsFileSystem"]["DeletionPolicy"] = "Delete"
    del template["Resources"]["DataBucket"]["Properties"]["LifecycleConfiguration"]
    problems = findings(stack, template)
    assert any("LustreFileSystem: created without waiting for its security group's self-ingress rule" in p
               for p in problems)
    assert any("OpenZfsFileSystem: file system is not retained" in p for p in problems)
    assert any("DataBucket: old object versions are kept forever" in p for p in problems)


@pytest.mark.slow
def test_destroy_sees_which_retained_file_systems_still_exist_through_the_fsx_api(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against the emulator's FSx API (which creates file systems; only its CloudFormation skips them)."""
    shutil.copytree(ROOT / "inventories" / "demo", tmp_path / "inventories" / "demo",
                    ignore=shutil.ignore_patterns("generated"))
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    try:
        fsx = aws.client("fsx", "ap-northeast-1", ensure_emulator("demo", tmp_path).endpoint)
        fs_id = fsx.create_file_system(FileSystemType="LUSTRE", StorageCapacity=1200, SubnetIds=["subnet-0123456789"],
                                       LustreConfiguration={"DeploymentType": "PERSISTENT_2"})["FileSystem"]["FileSystemId"]
        assert existing_file_systems(fsx, [fs_id, "fs-0123456789abcdef0"]) == {fs_id}
        fsx.delete_file_system(FileSystemId=fs_id)
        assert existing_file_systems(fsx, [fs_id]) == set()
    finally:
        stop_emulator("demo", tmp_path)


# --- capacity blocks and placement ------------------------------------------------------------------

def test_a_capacity_block_queue_launches_with_market_type_capacity_block_outside_the_placement_group() -> None:
    tenant = with_queue(STOCKMARK, capacity_reservation_type="capacity-block")
    res = resources(tenant, "cluster")
    data = res["QueueGpuLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}}
    assert "PlacementGroup" not in res["QueueGpuGroup"]["Properties"]
    assert "PlacementGroupName" not in rendered(tenant, "cluster")["Parameters"]


def test_a_capacity_block_queue_is_scaled_in_before_the_block_ends_at_the_time_the_pre_flight_read(
        tmp_path: Path) -> None:
    import subprocess

    from conftest import venv_tool
    from fmcluster.stacks.api import write_rendered
    from fmcluster.stacks.render import CapacityRef

    tenant = with_queue(STOCKMARK, capacity_reservation_type="capacity-block")
    template = rendered(tenant, "cluster")
    action = template["Resources"]["QueueGpuScaleInBeforeBlockEnds"]
    assert action["Type"] == "AWS::AutoScaling::ScheduledAction"
    assert action["Properties"] == {"AutoScalingGroupName": {"Ref": "QueueGpuGroup"},
                                    "StartTime": {"Ref": "QueueGpuScaleInTime"},
                                    "MinSize": 0, "MaxSize": 0, "DesiredCapacity": 0}
    assert template["Parameters"]["QueueGpuScaleInTime"]["AllowedPattern"].startswith("^[0-9]{4}-")
    stack = next(s for s in render_stacks(tenant) if s.key == "cluster")
    assert stack.parameters["QueueGpuScaleInTime"] == CapacityRef("gpu"), "the deploy passes it from EC2's answer"
    outputs = {"network": {k: "x" for k in ("PrivateSubnetId", "PublicSubnetId", "EfaSecurityGroupId",
                                            "NodeSecurityGroupId", "LoginSecurityGroupId", "PlacementGroupName")},
               "storage": {"DataBucketName": "b"}}
    params, _ = stack.resolved_parameters(outputs, lambda name, ref: "ami-0123456789abcdef0",
                                          {"gpu": "2026-12-24T23:00:00Z"})
    assert params["QueueGpuScaleInTime"] == "2026-12-24T23:00:00Z"
    with pytest.raises(KeyError, match="capacity pre-flight"):
        stack.resolved_parameters(outputs, lambda name, ref: "ami-0123456789abcdef0")
    assert "QueueGpuScaleInBeforeBlockEnds" not in resources(STOCKMARK, "cluster"), "On-Demand reservations do not end"
    assert check_stack(stack) == []
    folder = write_rendered(tenant, [stack], tmp_path)
    run = subprocess.run([venv_tool("cfn-lint"), "--regions", tenant.region, "--include-checks", "I", "--",
                          str(folder / f"{stack.name}.yaml")], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_an_on_demand_reservation_has_no_market_type_and_no_placement_group_but_a_plain_efa_queue_has_one() -> None:
    reserved = resources(STOCKMARK, "cluster")
    assert "InstanceMarketOptions" not in reserved["QueueGpuLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    assert "PlacementGroup" not in reserved["QueueGpuGroup"]["Properties"], \
        "an existing reservation cannot be moved into the stack's new placement group"
    plain = resources(with_queue(STOCKMARK, capacity_reservation_id=None), "cluster")
    assert plain["QueueGpuGroup"]["Properties"]["PlacementGroup"]["Fn::If"][0] == "HasPlacementGroup"


def test_the_spec_refuses_a_capacity_block_without_its_reservation_id(tmp_path: Path) -> None:
    from fmcluster.model import TenantInvalid, load_spec

    spec = tmp_path / "inventories" / "stockmark" / "group_vars" / "all" / "tenant.yml"
    spec.parent.mkdir(parents=True)
    text = (ROOT / "inventories/stockmark/group_vars/all/tenant.yml").read_text()
    spec.write_text(text.replace("      capacity_reservation_id: cr-0123456789abcdef0\n",
                                 "      capacity_reservation_type: capacity-block\n"))
    with pytest.raises(TenantInvalid) as refused:
        load_spec(spec)
    assert any(p.key == "tenant.queues[0]" and "capacity_reservation_id" in p.message for p in refused.value.problems)


# --- updates that keep the controller and roll the groups safely --------------------------------------

def test_images_are_pinned_ami_ids_not_ssm_parameters_that_move_on_every_deploy() -> None:
    stack = next(s for s in render_stacks(STOCKMARK) if s.key == "cluster")
    params = load_cfn_yaml(stack.body)["Parameters"]
    assert {params[name]["Type"] for name in ("GpuImageId", "CpuImageId")} == {"AWS::EC2::Image::Id"}
    # Ubuntu 24.04: its Slurm (23.11) runs with cgroup v2, Ubuntu 22.04's (21.08) does not (data/images.yml)
    # where no baked image is recorded (`invoke image`): tests/test_baked_aws.py
    gpu = stack.parameters["GpuImageId"]
    assert isinstance(gpu, BakedImageRef) and gpu.base == ImageRef(
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id")
    outputs = load_cfn_yaml(stack.body)["Outputs"]
    assert outputs["GpuImageId"]["Value"] == {"Ref": "GpuImageId"}, "the pin is recorded in stack_outputs.yml"


def test_the_controller_keeps_launch_template_version_1_and_the_pinned_image() -> None:
    controller = resources(STOCKMARK, "cluster")["ControllerInstance"]["Properties"]
    assert controller["LaunchTemplate"] == {"LaunchTemplateId": {"Ref": "ControllerLaunchTemplate"}, "Version": "1"}
    assert controller["ImageId"] == {"Ref": "CpuImageId"}
    assert controller["InstanceType"] == "m5.8xlarge", "a new instance type stops and starts it, never replaces it"


@pytest.mark.slow
def test_pinning_keeps_the_deployed_ami_and_resolves_only_new_stacks_or_on_refresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against the emulator: its SSM serves the public Amazon Linux parameter, its CloudFormation
    holds a stack whose CpuImageId was pinned earlier."""
    shutil.copytree(ROOT / "inventories" / "demo", tmp_path / "inventories" / "demo",
                    ignore=shutil.ignore_patterns("generated"))
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    tenant = load_tenant("demo")
    from fmcluster.providers.local import EMULATOR_IMAGE_PARAMETER

    # provider local maps each public image parameter to one the emulator serves
    stack = next(s for s in render_stacks(tenant, lambda path: EMULATOR_IMAGE_PARAMETER) if s.key == "cluster")
    ref = stack.parameters["CpuImageId"]
    assert isinstance(ref, ImageRef)
    try:
        endpoint = ensure_emulator("demo", tmp_path).endpoint
        cf = aws.client("cloudformation", tenant.region, endpoint)
        latest = aws.client("ssm", tenant.region, endpoint).get_parameter(Name=ref.ssm_path)["Parameter"]["Value"]
        notes: list[str] = []
        assert image_resolver(tenant, cf, stack, endpoint, False, notes)("CpuImageId", ref) == latest
        assert notes == [f"CpuImageId: pinned {latest}, resolved from {ref.ssm_path}"]

        cf.create_stack(StackName=stack.name, TemplateBody=cfn.dump({
            "Parameters": {"CpuImageId": {"Type": "AWS::EC2::Image::Id"}},
            "Resources": {"Placeholder": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.9.0.0/16"}}}}),
            Parameters=[{"ParameterKey": "CpuImageId", "ParameterValue": "ami-0aaaaaaaaaaaaaaa1"}])
        notes.clear()
        assert image_resolver(tenant, cf, stack, endpoint, False, notes)("CpuImageId", ref) == "ami-0aaaaaaaaaaaaaaa1"
        assert notes == ["CpuImageId: keeping the pinned ami-0aaaaaaaaaaaaaaa1"]
        notes.clear()
        assert image_resolver(tenant, cf, stack, endpoint, True, notes)("CpuImageId", ref) == latest
        assert notes == [f"CpuImageId: pinned {latest}, resolved from {ref.ssm_path} (was ami-0aaaaaaaaaaaaaaa1)"]
    finally:
        stop_emulator("demo", tmp_path)


def test_every_group_waits_for_its_nodes_signals_on_create_and_replaces_in_terminate_first_batches() -> None:
    res = resources(STOCKMARK, "cluster")
    gpu, login = res["QueueGpuGroup"], res["LoginGroup"]
    # 16 GPU nodes may come up one short (93 % of 16 is 15): one failed first boot does not roll the cluster back.
    assert gpu["CreationPolicy"] == {"ResourceSignal": {"Count": 16, "Timeout": "PT60M"},
                                     "AutoScalingCreationPolicy": {"MinSuccessfulInstancesPercent": 93}}
    assert login["CreationPolicy"]["AutoScalingCreationPolicy"]["MinSuccessfulInstancesPercent"] == 100
    rolling = gpu["UpdatePolicy"]["AutoScalingRollingUpdate"]
    assert (rolling["MaxBatchSize"], rolling["MinInstancesInService"]) == (4, 12), "16 nodes in 4 batches of 4"
    assert rolling["WaitOnResourceSignals"] is True and rolling["PauseTime"] == "PT60M"
    assert {"HealthCheck", "ReplaceUnhealthy", "AZRebalance"} <= set(rolling["SuspendProcesses"])
    assert login["CreationPolicy"]["ResourceSignal"]["Count"] == 1
    assert login["UpdatePolicy"]["AutoScalingRollingUpdate"]["MinInstancesInService"] == 0
    assert "CreationPolicy" not in res["ControllerInstance"]


@pytest.mark.parametrize(("count", "may_fail"), [(1, 0), (3, 0), (9, 0), (10, 1), (16, 1), (19, 1), (20, 2), (128, 12)])
def test_a_compute_group_of_ten_or_more_may_come_up_one_node_in_ten_short(count: int, may_fail: int) -> None:
    """CloudFormation needs ceil(percent x count) SUCCESS signals: exactly count - may_fail."""
    import math

    from fmcluster.schedulers.slurm_ec2.template import min_successful_percent

    group = SimpleNamespace(role="compute", count=count)
    percent = min_successful_percent(group)  # type: ignore[arg-type]
    assert count - math.ceil(percent * count / 100) == may_fail, percent
    assert min_successful_percent(SimpleNamespace(role="login", count=count)) == 100  # type: ignore[arg-type]


def test_each_node_is_told_which_logical_id_to_signal_and_may_signal_only_its_own_stack() -> None:
    res = resources(STOCKMARK, "cluster")
    for template, expected in (("QueueGpuLaunchTemplate", "QueueGpuGroup"), ("LoginLaunchTemplate", "LoginGroup"),
                               ("ControllerLaunchTemplate", "''")):
        script = user_data_text(res[template]["Properties"]["LaunchTemplateData"]["UserData"])
        assert f"export FMCLUSTER_SIGNAL_RESOURCE={expected}\n" in script, template
        assert expected == "''" or expected in res, "the named group exists"
    signal = [st for st in statements(res["NodeRole"]) if st["Action"] == "cloudformation:SignalResource"]
    assert [flat(st["Resource"]) for st in signal] == [
        "arn:${AWS::Partition}:cloudformation:${AWS::Region}:${AWS::AccountId}:stack/${AWS::StackName}/*"]


def test_every_node_boots_with_the_same_environment_on_ec2_and_on_hyperpod() -> None:
    script = user_data_text(resources(STOCKMARK, "cluster")["QueueGpuLaunchTemplate"]["Properties"][
        "LaunchTemplateData"]["UserData"])
    for line in ("export FMCLUSTER_BUCKET=${DataBucketName}", "export FMCLUSTER_REGION=${AWS::Region}",
                 "export FMCLUSTER_ORG=stockmark", "export FMCLUSTER_STACK=${AWS::StackName}",
                 "export FMCLUSTER_ROLE=compute", "export FMCLUSTER_QUEUE=gpu"):
        assert line + "\n" in script
    assert script.rstrip().endswith(first_boot_script().rstrip()), "then the first boot every node runs"
    env = lifecycle_environment(NEURONLAB, "fmc-neuronlab-storage-databucket-x", "fmc-neuronlab-cluster")
    assert {line.split("=", 1)[0] for line in env.splitlines() if "=" in line} >= {
        "FMCLUSTER_BUCKET", "FMCLUSTER_REGION", "FMCLUSTER_ORG", "FMCLUSTER_STACK"}
    on_create = (ROOT / "src/fmcluster/schedulers/hyperpod/node_files" / "on_create.sh").read_text()
    assert 'set -a\n# shellcheck source=/dev/null\n. "$here/fmcluster-lifecycle.env"\nset +a' in on_create, \
        "exported to the bootstrap"


# --- P5 network interfaces -------------------------------------------------------------------------

@pytest.mark.parametrize(("tenant", "template", "cards"), [
    (STOCKMARK, "QueueGpuLaunchTemplate", 32),
    (with_queue(STOCKMARK, instance=dataclasses.replace(NEURONLAB.queues[0].instance)), "QueueGpuLaunchTemplate", 8),
])
def test_efa_on_card_0_and_efa_only_on_every_other_card(tenant: Tenant, template: str, cards: int) -> None:
    nics = resources(tenant, "cluster")[template]["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    assert [(n["NetworkCardIndex"], n["DeviceIndex"], n["InterfaceType"]) for n in nics] == [
        (0, 0, "efa"), *((card, 1, "efa-only") for card in range(1, cards))]


# --- HyperPod -------------------------------------------------------------------------------------

def test_every_hyperpod_group_declares_its_slurm_node_type_storage_and_recovery() -> None:
    cluster = resources(NEURONLAB, "cluster")["Cluster"]["Properties"]
    groups = {g["InstanceGroupName"]: g for g in cluster["InstanceGroups"]}
    assert {name: g["SlurmConfig"] for name, g in groups.items()} == {
        "controller": {"NodeType": "Controller"}, "login": {"NodeType": "Login"},
        "trn": {"NodeType": "Compute", "PartitionNames": ["trn"]}}
    assert cluster["NodeRecovery"] == "Automatic"
    assert groups["trn"]["OnStartDeepHealthChecks"] == ["InstanceStress", "InstanceConnectivity"]
    assert "OnStartDeepHealthChecks" not in groups["controller"], "deep health checks are for accelerated groups"
    assert all(g["InstanceStorageConfigs"][0]["EbsVolumeConfig"]["VolumeSizeInGB"] > 0 for g in groups.values())
    assert groups["controller"]["ExecutionRole"] == {"Fn::GetAtt": ["ControllerExecutionRole", "Arn"]}
    assert groups["trn"]["ExecutionRole"] == {"Fn::GetAtt": ["ExecutionRole", "Arn"]}


def test_hyperpod_owns_slurm_conf_with_the_managed_strategy_written_out() -> None:
    """fmcluster never edits HyperPod's slurm.conf: the groups' SlurmConfig is its only input, which is AWS's
    `Managed` strategy (HyperPod "fully controls the partition-node mappings", drift fails UpdateCluster). The
    template names it rather than relying on the default (sagemaker-hyperpod-ref, Orchestrator.Slurm)."""
    for tenant in (NEURONLAB, load_tenant("hpdemo", ROOT)):
        cluster = resources(tenant, "cluster")["Cluster"]["Properties"]
        assert cluster["Orchestrator"] == {"Slurm": {"SlurmConfigStrategy": "Managed"}}, tenant.org


@pytest.mark.parametrize("name", ["controller", "login"])
def test_a_queue_may_not_take_a_reserved_hyperpod_group_name(name: str) -> None:
    with pytest.raises(ValueError, match="must be unique"):
        render_stacks(with_queue(NEURONLAB, name=name))


def test_a_hyperpod_queue_with_an_ec2_reservation_is_refused_not_dropped() -> None:
    with pytest.raises(ValueError, match="capacity_reservation_id"):
        render_stacks(with_queue(NEURONLAB, capacity_reservation_id="cr-0123456789abcdef0"))


def test_hyperpod_reads_its_lifecycle_scripts_from_the_tenant_bucket_with_its_own_grant() -> None:
    """The bucket is not sagemaker-prefixed, so the managed policy's grant does not cover it: the
    execution roles' own read grant on hyperpod/lifecycle/ does."""
    res = resources(NEURONLAB, "cluster")
    source = res["Cluster"]["Properties"]["InstanceGroups"][0]["LifeCycleConfig"]["SourceS3Uri"]
    assert flat(source) == "s3://${DataBucketName}/hyperpod/lifecycle/"
    for role in ("ExecutionRole", "ControllerExecutionRole"):
        reads = [flat(r) for st in statements(res[role]) if st["Action"] == "s3:GetObject" for r in st["Resource"]]
        assert "arn:${AWS::Partition}:s3:::${DataBucketName}/hyperpod/lifecycle/*" in reads, role


# --- IAM ------------------------------------------------------------------------------------------

def test_hyperpod_roles_trust_sagemaker_as_aws_documents_it_and_scope_interface_actions() -> None:
    """The trust AWS's HyperPod docs and samples give the execution role: SageMaker, no aws:SourceArn or
    aws:SourceAccount condition (SageMaker documents those keys for other features, not HyperPod's; a condition
    the service does not satisfy keeps it from the role and fails the cluster)."""
    res = resources(NEURONLAB, "cluster")
    for role in ("ExecutionRole", "ControllerExecutionRole"):
        (trust,) = res[role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert trust == {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"},
                         "Action": "sts:AssumeRole"}
        ec2 = [st for st in statements(res[role]) if any(str(a).startswith("ec2:") for a in cfn_list(st["Action"]))]
        on_everything = [st for st in ec2 if st["Resource"] == "*"]
        assert all(a.startswith("ec2:Describe") for st in on_everything for a in cfn_list(st["Action"]))
        create = next(st for st in ec2 if st["Action"] == "ec2:CreateNetworkInterface")
        assert [flat(r).rsplit(":", 1)[1] for r in create["Resource"]] == [
            "network-interface/*", "subnet/${PrivateSubnetId}", "security-group/${EfaSecurityGroupId}",
            "security-group/${NodeSecurityGroupId}"]
        tag = next(st for st in ec2 if st["Action"] == "ec2:CreateTags")
        assert tag["Condition"] == {"StringEquals": {"ec2:CreateAction": "CreateNetworkInterface"}}


def cfn_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@pytest.mark.parametrize(("tenant", "node_role", "controller_role"), [
    (STOCKMARK, "NodeRole", "ControllerRole"), (NEURONLAB, "ExecutionRole", "ControllerExecutionRole")])
def test_nodes_read_bootstrap_manifest_and_lifecycle_write_reports_and_read_only_their_secrets(
        tenant: Tenant, node_role: str, controller_role: str) -> None:
    res = resources(tenant, "cluster")
    bucket = "arn:${AWS::Partition}:s3:::${DataBucketName}/"
    secret = f"arn:${{AWS::Partition}}:secretsmanager:${{AWS::Region}}:${{AWS::AccountId}}:secret:fmcluster/{tenant.org}/"
    for role, controller in ((node_role, False), (controller_role, True)):
        s3 = {str(a): [flat(r) for r in cfn_list(st["Resource"])] for st in statements(res[role])
              for a in cfn_list(st["Action"]) if str(a).startswith("s3:")}
        reads = [bucket + p for p in ("fmcluster/bootstrap/*", "fmcluster/manifest/*", "hyperpod/lifecycle/*")]
        assert s3["s3:GetObject"] == reads, f"{role}: no node reads another node's report"
        # Reports and logs under the node's own role session, named by instance id (tests/test_node_iam.py evaluates it).
        assert s3["s3:PutObject"] == [bucket + "fmcluster/report/${aws:userid}/i-*" + suffix
                                      for suffix in (".json", ".log")], role
        assert set(s3) == {"s3:ListBucket", "s3:GetBucketLocation", "s3:GetObject", "s3:PutObject"}, \
            f"{role}: no delete, no access to the tenant's data prefix"
        read = next(st for st in statements(res[role]) if st["Action"] == "secretsmanager:GetSecretValue")
        # stockmark's email receiver relays through SES: its SMTP credentials are the controller's alone.
        smtp = ["smtp-password", "smtp-username"] if tenant.monitoring.smtp else []
        names = ["grafana-admin-password", "munge-key", *smtp] if controller else ["munge-key"]
        assert [flat(r) for r in read["Resource"]] == [f"{secret}{name}-??????" for name in names], role
    discovery = [st for st in statements(res[controller_role]) if st.get("Sid") == "PrometheusEc2Discovery"]
    assert discovery and discovery[0]["Resource"] == "*"
    assert not any(st.get("Sid") == "PrometheusEc2Discovery" for st in statements(res[node_role]))


def test_hyperpod_nodes_may_list_and_describe_the_nodes_of_their_own_tenants_clusters_only() -> None:
    res = resources(NEURONLAB, "cluster")
    for role in ("ExecutionRole", "ControllerExecutionRole"):
        (found,) = [st for st in statements(res[role]) if st.get("Sid") == "DiscoverClusterNodes"]
        assert found["Action"] == ["sagemaker:DescribeClusterNode", "sagemaker:ListClusterNodes"]
        assert flat(found["Resource"]) == "arn:${AWS::Partition}:sagemaker:${AWS::Region}:${AWS::AccountId}:cluster/*"
        assert found["Condition"] == {"StringEquals": {"aws:ResourceTag/fmcluster:org": NEURONLAB.org}}
    assert res["Cluster"]["Properties"]["Tags"][0] == {"Key": "fmcluster:org", "Value": NEURONLAB.org}


@pytest.mark.parametrize(("action", "resource"), [
    ("ec2:RunInstances", "*"), ("iam:PassRole", "*"), ("secretsmanager:GetSecretValue", "*"),
    ("kms:Decrypt", {"Fn::Sub": "arn:${AWS::Partition}:kms:${AWS::Region}:${AWS::AccountId}:*"}),
    ("s3:GetObject", {"Fn::Sub": "arn:${AWS::Partition}:s3:::*"}),
])
def test_checks_flag_a_wildcard_resource_on_any_action_that_can_be_scoped(action: str, resource: Any) -> None:
    stack = next(s for s in render_stacks(STOCKMARK) if s.key == "cluster")
    template = load_cfn_yaml(stack.body)
    policy = template["Resources"]["NodeRole"]["Properties"]["Policies"][0]["PolicyDocument"]
    policy["Statement"].append({"Effect": "Allow", "Action": action, "Resource": resource})
    assert any("wildcard resource" in p and action in p for p in findings(stack, template))


def test_describe_calls_that_have_no_resource_type_may_use_a_wildcard() -> None:
    assert [f.render() for s in render_stacks(STOCKMARK) for f in check_stack(s)] == []
    stack = next(s for s in render_stacks(STOCKMARK) if s.key == "cluster")
    describe = [st for st in statements(load_cfn_yaml(stack.body)["Resources"]["ControllerRole"])
                if st["Resource"] == "*"]
    assert describe and all(a.startswith(("ec2:Describe", "autoscaling:Describe")) or a == "ecr:GetAuthorizationToken"
                            for st in describe for a in cfn_list(st["Action"]))


@pytest.mark.parametrize(("key", "injected", "expected"), [
    ("cluster", {"Type": "AWS::IAM::User", "Properties": {"ManagedPolicyArns": [
        "arn:aws:iam::aws:policy/AdministratorAccess"]}}, "resource type 'AWS::IAM::User' is not one fmcluster creates"),
    ("cluster", {"Type": "AWS::IAM::AccessKey", "Properties": {"UserName": "x"}}, "'AWS::IAM::AccessKey'"),
    ("storage", {"Type": "AWS::Lambda::Function", "Properties": {}}, "'AWS::Lambda::Function'"),
    ("network", {"Type": "AWS::EC2::Instance", "Properties": {}}, "not one fmcluster creates in the network stack"),
    ("cluster", {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {"Statement": []}}},
     "an IAM role fmcluster does not define"),
])
def test_plan_refuses_any_resource_type_fmcluster_does_not_create_in_that_stack(
        key: str, injected: dict[str, Any], expected: str) -> None:
    stack = next(s for s in render_stacks(STOCKMARK) if s.key == key)
    template = load_cfn_yaml(stack.body)
    template["Resources"]["Injected"] = injected
    assert any(f"Injected: {expected}" in p or expected in p for p in findings(stack, template))


def test_checks_refuse_transforms_foreign_managed_policies_and_open_trust() -> None:
    stack = next(s for s in render_stacks(STOCKMARK) if s.key == "cluster")
    template = load_cfn_yaml(stack.body)
    template["Transform"] = "AWS::Serverless-2016-10-31"
    role = template["Resources"]["NodeRole"]["Properties"]
    role["ManagedPolicyArns"].append({"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/PowerUserAccess"})
    role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] = {"AWS": "*"}
    problems = findings(stack, template)
    assert any("unexpected top-level section 'Transform'" in p for p in problems)
    assert any("managed policy arn:${AWS::Partition}:iam::aws:policy/PowerUserAccess" in p for p in problems)
    assert any("trust policy admits {'AWS': '*'}" in p for p in problems)


# --- wiring ---------------------------------------------------------------------------------------

def test_cross_stack_values_arrive_as_typed_parameters_that_cloudformation_checks() -> None:
    storage = rendered(STOCKMARK, "storage")["Parameters"]
    cluster = rendered(STOCKMARK, "cluster")["Parameters"]
    hyper = rendered(NEURONLAB, "cluster")["Parameters"]
    assert storage["VpcId"]["Type"] == "AWS::EC2::VPC::Id"
    assert {storage["PrivateSubnetId"]["Type"], cluster["PrivateSubnetId"]["Type"], cluster["PublicSubnetId"]["Type"],
            hyper["PrivateSubnetId"]["Type"]} == {"AWS::EC2::Subnet::Id"}
    assert {p["Type"] for params in (storage, cluster, hyper) for name, p in params.items()
            if name.endswith("SecurityGroupId")} == {"AWS::EC2::SecurityGroup::Id"}
    assert cluster["DataBucketName"]["AllowedPattern"] == hyper["DataBucketName"]["AllowedPattern"]


def test_the_s3_endpoint_is_tagged_like_everything_else() -> None:
    endpoint = resources(STOCKMARK, "network")["S3GatewayEndpoint"]["Properties"]
    assert {"Key": "fmcluster:org", "Value": "stockmark"} in endpoint["Tags"]


def test_the_emulator_gaps_in_properties_and_policies_are_listed_not_hidden() -> None:
    storage, cluster = (next(s for s in render_stacks(DEMO) if s.key == k) for k in ("storage", "cluster"))
    assert emulator_ignored(storage) == ["DataBucket.LifecycleConfiguration (moto drops it)"]
    # CreationPolicy is honoured (emulator_server fix 8); a rolling update replaces nothing on the emulator.
    ignored = emulator_ignored(cluster)
    assert "QueueCpuGroup UpdatePolicy (the emulator replaces no instance on an update)" in ignored
    assert not any("CreationPolicy" in line for line in ignored)


@pytest.fixture(autouse=True)
def _no_stray_emulators(tmp_path: Path) -> Iterator[None]:
    yield
    stop_emulator("demo", tmp_path)


def test_the_nodes_admit_lustre_from_the_file_systems_as_aws_asks_of_lustre_clients() -> None:
    """FSx for Lustre's client rules: the clients' group admits TCP 988 and 1018-1023 from the file system's group
    (https://docs.aws.amazon.com/fsx/latest/LustreGuide/limit-access-security-groups.html); the nodes' group
    admitted only itself, so a Lustre server could never open a connection to a client (issue 36)."""
    res = resources(STOCKMARK, "storage")
    rules = sorted((r["Properties"]["FromPort"], r["Properties"]["ToPort"]) for r in res.values()
                   if r["Type"] == "AWS::EC2::SecurityGroupIngress"
                   and r["Properties"]["GroupId"] == {"Ref": "NodeSecurityGroupId"}
                   and r["Properties"]["SourceSecurityGroupId"] == {"Ref": "FileSystemSecurityGroup"}
                   and r["Properties"]["IpProtocol"] == "tcp")
    assert rules == [(988, 988), (1018, 1023)]


def test_the_storage_stack_adds_what_the_scheduler_hands_it_after_its_own_and_names_no_scheduler() -> None:
    """Issue 41: ParallelCluster's node policies and accounting database are its folder's
    (schedulers/parallelcluster/storage_parts.py), handed to the storage template as StorageParts by the class's
    storage_parts(); the template appends them after its own resources and outputs, takes their conditions and lint
    exceptions, refuses a part that would replace one of its own, and names no scheduler."""
    from fmcluster.schedulers.registry import scheduler_for
    from fmcluster.stacks.templates import StorageParts, storage

    pclab, stockmark = load_tenant("pclab", ROOT), load_tenant("stockmark", ROOT)
    assert scheduler_for(stockmark).storage_parts() == StorageParts()
    parts = scheduler_for(pclab).storage_parts()
    assert {"HeadNodeBootstrapPolicy", "NodeBootstrapPolicy", "AccountingDatabase"} <= set(parts.resources)
    built, bare = storage.build(pclab, parts), storage.build(pclab, StorageParts())
    assert list(built["Resources"]) == list(bare["Resources"]) + list(parts.resources)
    assert list(built["Outputs"]) == list(bare["Outputs"]) + list(parts.outputs)
    assert built["Conditions"] == parts.conditions and "Conditions" not in bare
    ignored = built["Metadata"]["fmcluster"]["lint-exceptions"]
    assert set(ignored) - set(bare["Metadata"]["fmcluster"]["lint-exceptions"]) == {"W3010"}
    with pytest.raises(ValueError, match="storage parts would replace the storage stack's own resource DataBucket"):
        storage.build(stockmark, StorageParts(resources={"DataBucket": {"Type": "AWS::S3::Bucket"}}))
    with pytest.raises(ValueError, match="own output LustreDnsName"):
        storage.build(stockmark, StorageParts(outputs={"LustreDnsName": {"Value": "x"}}))
    source = (ROOT / "src" / "fmcluster" / "stacks" / "templates" / "storage.py").read_text()
    assert "parallelcluster" not in source.lower() and "fmcluster.schedulers" not in source


def test_the_stacks_layer_is_handed_its_scheduler_and_imports_no_registry_nor_scheduler() -> None:
    """Issue 41: render_stacks and the stacks.api operations take the tenant's scheduler from their caller (the
    commands layer); no module of fmcluster.stacks imports fmcluster.schedulers, even inside a function (the image
    stack is handed its scheduler too)."""
    from test_import_graph import import_graph

    upward = {module: sorted(t for t in targets if t.startswith("fmcluster.schedulers"))
              for module, targets in import_graph().items() if module.startswith("fmcluster.stacks")}
    assert {module: found for module, found in upward.items() if found} == {}


def test_every_launch_template_s_user_data_fits_ec2_s_16_kb_with_its_references_at_their_longest() -> None:
    """EC2 refuses user data over 16 KB raw (instancedata-add-user-data.html), and each launch template carries the
    whole first-boot script with the packed S3 client: measured for every bundled AWS tenant's launch templates
    (slurm-ec2's plain script, PCS's MIME document), bucket, region and stack name at their longest; and the gate
    names a launch template whose user data could pass the limit."""
    from fmcluster.stacks.checks import USER_DATA_MAX_BYTES, user_data_max_bytes

    measured = {}
    for org in ("stockmark", "pcslab"):
        for name, res in resources(load_tenant(org, ROOT), "cluster").items():
            if res["Type"] == "AWS::EC2::LaunchTemplate":
                measured[f"{org}/{name}"] = user_data_max_bytes(res["Properties"]["LaunchTemplateData"]["UserData"])
    assert measured and all(size <= USER_DATA_MAX_BYTES for size in measured.values()), measured
    stack = next(s for s in render_stacks(load_tenant("stockmark", ROOT)) if s.key == "cluster")
    template = load_cfn_yaml(stack.body)
    data = template["Resources"]["LoginLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    data["UserData"]["Fn::Base64"]["Fn::Join"][1].append("#" * USER_DATA_MAX_BYTES)
    grown = dataclasses.replace(stack, body=cfn.dump(template))
    assert [f.resource for f in check_stack(grown) if "user data" in f.problem] == ["LoginLaunchTemplate"]
