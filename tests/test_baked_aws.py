"""Baked node images on AWS (issue 40): the cluster stack boots the AMI `invoke image` recorded for a node kind while it
was baked from this commit's install set, refuses a stale or vanished one before any stack is touched, and boots the
catalogued base image where none is recorded.

The rule (fmcluster.baked.aws_image) and the resolver (fmcluster.stacks.render.BakedImageRef) are shown offline; the
deploy is run against the emulator with the real `aws` provider's templates (only the endpoint is the emulator's,
as in tests/test_aws_deploy_path.py): EC2's own launch templates say which AMI the nodes would boot.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import ROOT
from scheduler_stacks import render_stacks
from signalling import NodesSignal
from fmcluster import baked
from fmcluster.capabilities import EMULATOR_APIS
from fmcluster.model import Tenant, load_tenant
from fmcluster.publish import MANIFEST_KEY, pinned_commit
from fmcluster.schedulers.registry import scheduler_for
from fmcluster.stacks import api, aws
from fmcluster.stacks.render import SOURCE_ROOT, BakedImageRef, ImageRef
from fmcluster.stacks.templates import image

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def record(org: str, kind: str, digest: str, ami: str) -> baked.Record:
    return baked.Record(org, kind, digest, "pristine", COMMIT, {}, "2026-12-07T10:00:00+00:00", 0, ami, 1800.0)


def current(tenant: Tenant, kind: str) -> str:
    """This commit's install-set digest of `kind`, as the image stack records it on the AMI."""
    found = image.kind_images(tenant, scheduler_for(tenant))[kind]
    return baked.committed_digest(pinned_commit(), kind, image.pristine(found), SOURCE_ROOT)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FMCLUSTER_IMAGE_CACHE", str(tmp_path / "images"))
    return tmp_path / "images"


def keep(rec: baked.Record) -> None:
    path = baked.record_path(rec.tenant, rec.kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rec.to_json())


# --- the rule -----------------------------------------------------------------------------------------------------

def test_a_current_recorded_image_is_booted_and_no_record_means_the_catalogued_base_image() -> None:
    assert baked.aws_image("stockmark", "gpu", record("stockmark", "gpu", "abc123abc123", "ami-0baked"),
                           "abc123abc123", True) == "ami-0baked"
    assert baked.aws_image("stockmark", "gpu", None, "abc123abc123", True) is None


def test_an_image_baked_from_another_install_set_is_refused_naming_the_tenant_the_kind_and_the_fix() -> None:
    with pytest.raises(baked.BakedImageRefused) as refused:
        baked.aws_image("stockmark", "gpu", record("stockmark", "gpu", "old000old000", "ami-0baked"), "new111new111",
                        True)
    said = str(refused.value)
    assert "tenant 'stockmark'" in said and "gpu image ami-0baked" in said
    assert "install set old000old000" in said and "this commit's is new111new111" in said
    assert "`invoke image --org=stockmark --kind=gpu`" in said and "never booted" in said


def test_a_recorded_ami_that_no_longer_exists_is_refused_too() -> None:
    with pytest.raises(baked.BakedImageRefused, match="not an available AMI.*invoke image --org=stockmark --kind=cpu"):
        baked.aws_image("stockmark", "cpu", record("stockmark", "cpu", "abc123abc123", "ami-0gone"), "abc123abc123",
                        False)


def test_the_aws_and_local_records_are_one_file_per_tenant_and_kind(cache: Path) -> None:
    from fmcluster.providers.local import layers

    assert baked.record_path("stockmark", "gpu") == cache / "baked" / "stockmark" / "gpu.json"
    assert layers.record_path("demo", "cpu") == baked.record_path("demo", "cpu")


def test_a_record_that_cannot_be_kept_says_where_and_how_to_keep_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("FMCLUSTER_IMAGE_CACHE", str(tmp_path / "file" / "images"))  # under a file: no folder there
    with pytest.raises(ValueError, match="set FMCLUSTER_IMAGE_CACHE to a folder you can write.*"
                                         "invoke image --org=stockmark --kind=gpu.*ami-0baked exists"):
        baked.write_record(record("stockmark", "gpu", "abc123abc123", "ami-0baked"))
    monkeypatch.setenv("FMCLUSTER_IMAGE_CACHE", str(tmp_path / "images"))
    path = baked.write_record(record("stockmark", "gpu", "abc123abc123", "ami-0baked"))
    assert baked.read_record(path) == record("stockmark", "gpu", "abc123abc123", "ami-0baked")


# --- the resolver -------------------------------------------------------------------------------------------------

def test_each_aws_slurm_ec2_ami_parameter_is_a_baked_ref_of_its_kind_over_the_catalogued_image() -> None:
    tenant = load_tenant("stockmark")
    cluster = render_stacks(tenant)[-1]
    refs = {name: v for name, v in cluster.parameters.items() if isinstance(v, BakedImageRef)}
    assert {name: ref.kind for name, ref in refs.items()} == {"CpuImageId": "cpu", "GpuImageId": "gpu"}
    # the controller (an m5: cpu) is created once: its AMI parameter keeps its pin once the stack holds one
    assert {name: ref.kept for name, ref in refs.items()} == {"CpuImageId": True, "GpuImageId": False}
    kinds = image.kind_images(tenant, scheduler_for(tenant))
    for ref in refs.values():
        assert isinstance(ref.base, ImageRef) and ref.base.ssm_path == kinds[ref.kind].ssm_parameter
        # the digest the deploy compares is over the base the image stack bakes on
        assert ref.pristine == image.pristine(kinds[ref.kind])


def test_a_provider_that_bakes_its_own_images_has_no_baked_ami_parameter() -> None:
    cluster = render_stacks(load_tenant("demo"))[-1]  # provider local: its hosts boot the baked layer
    assert not [v for v in cluster.parameters.values() if isinstance(v, BakedImageRef)]
    assert isinstance(cluster.parameters["CpuImageId"], ImageRef)


def test_offline_the_plan_says_which_image_each_kind_boots_and_refuses_a_stale_one(cache: Path) -> None:
    tenant = load_tenant("stockmark")
    stacks = render_stacks(tenant)
    chosen, refusals, lines = api.baked_images(tenant, stacks, None)
    assert chosen == {"CpuImageId": None, "GpuImageId": None} and refusals == []
    assert "GpuImageId: no gpu image baked (`invoke image --org=stockmark --kind=gpu` bakes one)" in lines[0] + lines[1]
    keep(record("stockmark", "gpu", current(tenant, "gpu"), "ami-0baked"))
    keep(record("stockmark", "cpu", "old000old000", "ami-0stale"))
    chosen, refusals, lines = api.baked_images(tenant, stacks, None)
    assert chosen == {"GpuImageId": "ami-0baked"}
    assert [r for r in refusals if "its cpu image ami-0stale" in r and "--kind=cpu" in r] == refusals and refusals
    assert any("the baked gpu image ami-0baked" in line and "not checked offline" in line for line in lines)


# --- against the emulator -----------------------------------------------------------------------------------------

@pytest.fixture
def emulated(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Tenant, str]]:
    """stockmark, provider aws, its endpoint the emulator's (no DLAMI parameter there: the base image is moto's)."""
    from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator

    root = tmp_path / "root"
    shutil.copytree(ROOT / "inventories" / "stockmark", root / "inventories" / "stockmark",
                    ignore=shutil.ignore_patterns("generated", "hosts.yml"))
    monkeypatch.setenv("FMCLUSTER_ROOT", str(root))
    emulator = ensure_emulator("stockmark", root)
    try:
        yield load_tenant("stockmark"), emulator.endpoint
    finally:
        stop_emulator("stockmark", root)


def emulated_aws(endpoint: str, image_parameter: Callable[[str], str] = lambda path: path) -> Any:
    """The aws provider as `invoke image` meets it, its endpoint the emulator's (and so its APIs the emulator's)."""
    from fmcluster.capabilities import PROVIDERS

    return SimpleNamespace(endpoint=lambda start, out: endpoint, image_parameter=image_parameter,
                           capabilities=replace(PROVIDERS["aws"], apis=EMULATOR_APIS))


def baked_ami(ec2: Any, name: str) -> str:
    """An AMI as Image Builder leaves one: made from an instance of the base image (moto has no Image Builder)."""
    base = ec2.describe_images()["Images"][0]["ImageId"]
    instance = ec2.run_instances(ImageId=base, MinCount=1, MaxCount=1, InstanceType="m5.large")["Instances"][0]
    return str(ec2.create_image(InstanceId=instance["InstanceId"], Name=name)["ImageId"])


def launch_template_images(ec2: Any) -> dict[str, str]:
    found = {}
    for template in ec2.describe_launch_templates()["LaunchTemplates"]:
        version = ec2.describe_launch_template_versions(LaunchTemplateId=template["LaunchTemplateId"],
                                                        Versions=["$Latest"])["LaunchTemplateVersions"][0]
        found[template["LaunchTemplateName"]] = version["LaunchTemplateData"]["ImageId"]
    return found


def deploy(tenant: Tenant, endpoint: str, lines: list[str]) -> api.StacksResult:
    from fmcluster.providers.local import EMULATOR_IMAGE_PARAMETER

    return api.deploy_stacks(tenant, endpoint, scheduler=scheduler_for(tenant), apis=EMULATOR_APIS, out=lines.append,
                             image_parameter=lambda path: EMULATOR_IMAGE_PARAMETER,
                             while_waiting=NodesSignal(tenant.region, endpoint))


@pytest.mark.slow  # a whole stockmark deploy on the emulator (~1 min on 2 cores)
def test_the_launch_templates_boot_the_current_baked_ami_and_a_stale_one_stops_the_deploy_before_any_stack(
        emulated: tuple[Tenant, str]) -> None:
    tenant, endpoint = emulated
    ec2 = aws.client("ec2", tenant.region, endpoint)
    cf = aws.client("cloudformation", tenant.region, endpoint)
    gpu = baked_ami(ec2, "fmc-stockmark-gpu")
    # stale first: refused before the network stack, said with the tenant, kind and fix
    keep(record("stockmark", "gpu", "old000old000", gpu))
    lines: list[str] = []
    result = deploy(tenant, endpoint, lines)
    assert not result.ok and {s.action for s in result.stacks} == {"not-attempted"}
    assert cf.describe_stacks()["Stacks"] == []
    assert any("REFUSED: tenant 'stockmark': its gpu image" in line and "--kind=gpu" in line for line in lines)
    # baked from this commit's install set: the GPU queue's launch template boots it, the CPU nodes the base image
    keep(record("stockmark", "gpu", current(tenant, "gpu"), gpu))
    lines = []
    result = deploy(tenant, endpoint, lines)
    assert result.ok, (result.failure, lines[-20:])
    images = launch_template_images(ec2)
    gpu_templates = {name: ami for name, ami in images.items() if "gpu" in name.lower()}
    others = {ami for name, ami in images.items() if name not in gpu_templates}
    assert gpu_templates and set(gpu_templates.values()) == {gpu}, images
    assert others and gpu not in others, images
    assert any(f"GpuImageId: the baked gpu image {gpu}" in line for line in lines)
    assert any("CpuImageId: no cpu image baked" in line for line in lines)
    # a cpu image baked later: the controller instance reads CpuImageId and is created once, so the pin stays
    cluster = "fmc-stockmark-cluster"
    pinned_cpu = next(p["ParameterValue"] for p in cf.describe_stacks(StackName=cluster)["Stacks"][0]["Parameters"]
                      if p["ParameterKey"] == "CpuImageId")
    keep(record("stockmark", "cpu", current(tenant, "cpu"), baked_ami(ec2, "fmc-stockmark-cpu")))
    lines = []
    assert deploy(tenant, endpoint, lines).ok
    assert any(f"CpuImageId: keeps {pinned_cpu}: the controller instance reads it" in line for line in lines), lines
    assert next(p["ParameterValue"] for p in cf.describe_stacks(StackName=cluster)["Stacks"][0]["Parameters"]
                if p["ParameterKey"] == "CpuImageId") == pinned_cpu
    # the AMI deregistered behind our back: refused, not booted
    ec2.deregister_image(ImageId=gpu)
    lines = []
    assert not deploy(tenant, endpoint, lines).ok
    assert any("not an available AMI" in line for line in lines)


def deploy_network_and_storage(tenant: Tenant, endpoint: str) -> None:
    """The tenant's network and storage stacks, whose outputs the image stack takes (no cluster: no node boots)."""
    from fmcluster.stacks.changesets import apply_stack

    cf = aws.client("cloudformation", tenant.region, endpoint)
    outputs: dict[str, dict[str, str]] = {}
    for stack in render_stacks(tenant)[:2]:
        params, _ = stack.resolved_parameters(outputs, None, None, lambda: api.deployer_principal(tenant, endpoint))
        outcome = apply_stack(cf, stack, params, tenant.tags, execute=True, apis=EMULATOR_APIS, out=lambda line: None)
        assert outcome.failure is None, outcome.failure
        outputs[stack.key] = outcome.outputs


@pytest.mark.slow  # the emulator, the network and storage stacks, then the image stack (~30 s on 2 cores)
def test_invoke_image_on_aws_deploys_the_image_stack_on_the_tenant_s_stacks_and_records_only_what_was_built(
        emulated: tuple[Tenant, str]) -> None:
    from fmcluster.commands.image_stack import plan_image_stack
    from fmcluster.exits import ExitCode
    from fmcluster.providers.local import EMULATOR_IMAGE_PARAMETER

    tenant, endpoint = emulated
    cf = aws.client("cloudformation", tenant.region, endpoint)

    def image(lines: list[str]) -> int:
        return plan_image_stack(tenant, out=lines.append,
                                provider=emulated_aws(endpoint, lambda path: EMULATOR_IMAGE_PARAMETER))

    # before the tenant's stacks: nothing to build in, said with the fix
    lines: list[str] = []
    assert image(lines) == ExitCode.FAILED
    assert any("run `invoke deploy --org=stockmark` first" in line for line in lines), lines
    assert cf.describe_stacks()["Stacks"] == []
    # on them: the stack is created through the deploy's path (its builders' group, role and instance profile exist),
    # and what moto cannot build (EC2 Image Builder) is said, not recorded
    deploy_network_and_storage(tenant, endpoint)
    # the builders fetch what the deploy published: nothing, then another commit's, is refused before any build
    lines = []
    assert image(lines) == ExitCode.FAILED
    assert any("nothing is published in s3://" in line and "run `invoke deploy --org=stockmark` from commit" in line
               for line in lines), lines
    s3 = aws.client("s3", tenant.region, endpoint)
    bucket = next(o["OutputValue"] for o in cf.describe_stacks(StackName="fmc-stockmark-storage")["Stacks"][0][
        "Outputs"] if o["OutputKey"] == "DataBucketName")
    s3.put_object(Bucket=bucket, Key=MANIFEST_KEY, Body=json.dumps({"ref": "f" * 40}).encode())
    lines = []
    assert image(lines) == ExitCode.FAILED
    assert any(f"holds the bundle of commit ffffffffffff, not {pinned_commit()[:12]}" in line for line in lines), lines
    assert [s["StackName"] for s in cf.describe_stacks()["Stacks"]] == ["fmc-stockmark-network", "fmc-stockmark-storage"]
    # this commit's, as `invoke deploy` publishes it (the manifest names its commit)
    s3.put_object(Bucket=bucket, Key=MANIFEST_KEY, Body=json.dumps({"ref": pinned_commit()}).encode())
    lines = []
    assert image(lines) == ExitCode.FAILED
    [created] = cf.describe_stacks(StackName="fmc-stockmark-image")["Stacks"]
    assert created["StackStatus"] == "CREATE_COMPLETE"
    parameters = {p["ParameterKey"]: p["ParameterValue"] for p in created["Parameters"]}
    assert parameters["SourceCommit"] == pinned_commit() and parameters["GpuInstallDigest"] == current(tenant, "gpu")
    held = {r["LogicalResourceId"] for r in cf.list_stack_resources(StackName="fmc-stockmark-image")[
        "StackResourceSummaries"]}
    assert {"BuilderRole", "BuilderInstanceProfile", "BuilderSecurityGroup"} <= held and "GpuImage" not in held
    said = "\n".join(lines)
    assert "gpu: no AMI (output GpuImageId absent: the emulator has no EC2 Image Builder" in said
    assert not baked.record_path("stockmark", "gpu").exists() and not baked.record_path("stockmark", "cpu").exists()
    # destroy takes the image stack first (its builders' group is in the network stack's VPC)
    lines = []
    result = api.destroy_stacks(tenant, endpoint, scheduler=scheduler_for(tenant), apis=EMULATOR_APIS, confirm=None,
                                out=lines.append)
    assert result.ok, (result.failure, lines)
    assert [s.name for s in result.stacks if s.action == "deleted"] == [
        "fmc-stockmark-image", "fmc-stockmark-storage", "fmc-stockmark-network"]
    assert cf.describe_stacks()["Stacks"] == [] or {
        s["StackStatus"] for s in cf.describe_stacks()["Stacks"]} == {"DELETE_COMPLETE"}


@pytest.mark.slow  # the emulator (~25 s on 2 cores)
def test_what_invoke_image_records_from_the_stack_s_outputs_is_what_the_deploy_then_boots(
        emulated: tuple[Tenant, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The one step the emulator cannot run (Image Builder making the AMIs) stood in by the stack's answer: its
    outputs name two AMIs EC2 holds; the records written then satisfy the deploy's staleness rule as they are."""
    from fmcluster.commands.image_stack import plan_image_stack
    from fmcluster.exits import ExitCode
    from fmcluster.stacks.result import StackOutcome

    tenant, endpoint = emulated
    ec2 = aws.client("ec2", tenant.region, endpoint)
    amis = {"CpuImageId": baked_ami(ec2, "fmc-stockmark-cpu"), "GpuImageId": baked_ami(ec2, "fmc-stockmark-gpu")}
    monkeypatch.setattr(api, "deploy_image_stack", lambda tenant, endpoint, stack, out, apis: StackOutcome(
        "image", stack.name, "created", "CREATE_COMPLETE", outputs={**amis, "SourceCommit": pinned_commit()}))
    lines: list[str] = []
    assert plan_image_stack(tenant, out=lines.append, provider=emulated_aws(endpoint)) == ExitCode.OK, lines
    gpu = baked.read_record(baked.record_path("stockmark", "gpu"))
    assert gpu is not None and gpu.layer == amis["GpuImageId"] and gpu.commit == pinned_commit()
    assert gpu.digest == current(tenant, "gpu") and gpu.tenant == "stockmark" and gpu.kind == "gpu"
    assert any(f"gpu: {amis['GpuImageId']} (install set {gpu.digest}" in line for line in lines)
    chosen, refusals, _ = api.baked_images(tenant, render_stacks(tenant), ec2)
    assert refusals == [] and chosen == amis
    # destroy keeps them (deleting Image Builder's image leaves its AMI) and says what each costs and how to drop it
    lines = []
    result = api.destroy_stacks(tenant, endpoint, scheduler=scheduler_for(tenant), apis=EMULATOR_APIS, confirm=None,
                                out=lines.append)
    kept = [n for n in result.notes if n.startswith(("kept: baked cpu", "kept: baked gpu"))]
    assert [n.split()[4] for n in kept] == [amis["CpuImageId"], amis["GpuImageId"]], result.notes
    price = baked.snapshot_price()
    for note, kind in zip(kept, ("cpu", "gpu")):  # moto's AMIs have one 15 GiB volume
        assert f"15.0 GiB of EBS snapshots at most, about ${15 * price.usd:.2f} a month" in note, note
        assert f"record {baked.record_path('stockmark', kind)}" in note
    assert f"kept: baked images' snapshots: about ${30 * price.usd:.2f} a month at most, at {price.region}'s " \
           f"${price.usd}/GB-month ({price.source})" in result.notes[-2], result.notes
    assert f"aws ec2 deregister-image --image-id AMI --region {tenant.region}" in result.notes[-1]


@pytest.mark.slow  # the emulator (~25 s on 2 cores)
def test_a_new_image_deregisters_the_older_amis_and_their_snapshots_but_never_one_the_cluster_boots(
        emulated: tuple[Tenant, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`invoke image` three times with baked_images.keep 1 (its outputs stood in, as above): each new AMI deregisters
    the one before with its snapshots (DescribeImages, DeregisterImage, DeleteSnapshot), except one an instance of the
    tenant's runs from."""
    import dataclasses

    from fmcluster.commands.image_stack import plan_image_stack
    from fmcluster.exits import ExitCode
    from fmcluster.model import BakedImages
    from fmcluster.stacks.result import StackOutcome

    tenant, endpoint = emulated
    tenant = dataclasses.replace(tenant, baked_images=BakedImages(keep=1))
    ec2 = aws.client("ec2", tenant.region, endpoint, EMULATOR_APIS)
    rounds = [{kind: baked_ami(ec2, f"fmc-stockmark-{kind}-{n}") for kind in ("cpu", "gpu")} for n in range(3)]
    snapshots = {ami: [m["Ebs"]["SnapshotId"] for m in ec2.describe_images(ImageIds=[ami])["Images"][0][
        "BlockDeviceMappings"]] for amis in rounds for ami in amis.values()}
    assert all(snapshots.values())

    def bake(amis: dict[str, str]) -> list[str]:
        monkeypatch.setattr(api, "deploy_image_stack", lambda tenant, endpoint, stack, out, apis: StackOutcome(
            "image", stack.name, "created", "CREATE_COMPLETE",
            outputs={image.output_name(k): ami for k, ami in amis.items()}))
        lines: list[str] = []
        assert plan_image_stack(tenant, out=lines.append, provider=emulated_aws(endpoint)) == ExitCode.OK, lines
        return lines

    def exists(ami: str) -> bool:
        return api.ami_available(ec2, ami)

    def snapshot_exists(snapshot: str) -> bool:
        return bool(ec2.describe_snapshots(Filters=[{"Name": "snapshot-id", "Values": [snapshot]}])["Snapshots"])

    bake(rounds[0])
    # a node of the tenant runs from round 0's GPU image (as a queue's instances do until replaced)
    ec2.run_instances(ImageId=rounds[0]["gpu"], MinCount=1, MaxCount=1, InstanceType="m5.large",
                      TagSpecifications=[{"ResourceType": "instance",
                                          "Tags": [{"Key": "fmcluster:org", "Value": "stockmark"}]}])
    lines = bake(rounds[1])
    assert not exists(rounds[0]["cpu"]) and not any(map(snapshot_exists, snapshots[rounds[0]["cpu"]]))
    assert exists(rounds[0]["gpu"]) and all(map(snapshot_exists, snapshots[rounds[0]["gpu"]]))
    assert any(f"removed cpu image {rounds[0]['cpu']}" in line and f"deregistered {rounds[0]['cpu']}" in line
               and f"deleted {snapshots[rounds[0]['cpu']][0]}" in line for line in lines), lines
    assert any(f"kept gpu image {rounds[0]['gpu']}" in line and "the cluster still boots it" in line for line in lines)
    # that node gone, the next image removes it too; the current one is always kept
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for r in ec2.describe_instances(Filters=[
        {"Name": "tag:fmcluster:org", "Values": ["stockmark"]}])["Reservations"] for i in r["Instances"]])
    bake(rounds[2])
    assert [exists(ami) for amis in rounds for ami in amis.values()] == [False, False, False, False, True, True]
    assert [r.layer for _, r in baked.kept_records("stockmark", "gpu")] == [rounds[2]["gpu"]]
