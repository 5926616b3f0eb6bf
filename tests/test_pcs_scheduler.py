"""Scheduler pcs (AWS Parallel Computing Service), the fourth scheduler: its folder and one registry line give a tenant
(bundled `pcslab`) that validates, plans offline and renders a cluster stack cfn-lint accepts, with what PCS requires
of it (src/fmcluster/schedulers/pcs/README.md, "Sources"): the cluster, a compute node group and a queue per tenant
queue, node groups in no queue for fmcluster's controller and the login nodes, instance profiles under /aws-pcs/ that
may register with this cluster only, IMDSv2-only launch templates whose MIME user data runs fmcluster's first boot,
and Slurm's ports between the PCS controller's interface and the nodes. PCS's own refusals come before anything runs."""

from __future__ import annotations

import base64
import copy
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from conftest import ROOT, venv_tool
from fmcluster import commands
from fmcluster.exits import ExitCode
from fmcluster.images import load_images
from fmcluster.model import load_tenant
from fmcluster.schedulers.pcs.image import SAMPLE_IMAGE, SLURM_VERSION, load_installers
from fmcluster.schedulers.pcs.scheduler import SLURM_BIN_DIR
from fmcluster.schedulers.pcs.template import MIME_HEAD, MIME_TAIL
from fmcluster.schedulers.registry import scheduler_for
from fmcluster.stacks.checks import check_stacks
from fmcluster.stacks.render import load_cfn_yaml, user_data_text
from scheduler_stacks import render_stacks

PCSLAB = load_tenant("pcslab", ROOT)
SPEC = yaml.safe_load((ROOT / "inventories/pcslab/group_vars/all/tenant.yml").read_text())


def cluster_template() -> dict[str, Any]:
    stack = next(s for s in render_stacks(PCSLAB) if s.key == "cluster")
    return load_cfn_yaml(stack.body)


def of_type(resources: dict[str, Any], kind: str) -> dict[str, Any]:
    return {name: res for name, res in resources.items() if res["Type"] == kind}


def test_pcslab_is_a_p5_cluster_on_pcs_whose_nodes_boot_an_image_baked_on_the_installers_base() -> None:
    scheduler = scheduler_for(PCSLAB)
    assert PCSLAB.scheduler == "pcs" and type(scheduler).__module__ == "fmcluster.schedulers.pcs.scheduler"
    assert PCSLAB.capabilities.slurm_owner == "scheduler"  # the PCS agent starts PCS's Slurm
    # the image stack bakes on the installers' base (installers.yml bases); PCS's Slurm lands where its installer puts
    # it, as on PCS's sample AMI, whose contract records that path
    assert scheduler.image("cuda") == scheduler.image("none") == load_installers().base("cuda") \
        == "dlami-base-gpu-ubuntu-22.04"
    contract = load_images()[SAMPLE_IMAGE].contract
    assert contract.slurm_installed_by == "service" and contract.slurm_bin_dir == SLURM_BIN_DIR
    assert contract.slurm_version == SLURM_VERSION
    assert scheduler.manifest_vars()["node_health_commands"]["sinfo"] == [f"{SLURM_BIN_DIR}/sinfo"]


def test_the_installers_and_their_bases_are_catalogued_with_a_public_source_each() -> None:
    """installers.yml: AWS's two installers (agent, Slurm) and the key their signatures are made with, each with its
    source; every base an image the installers support (its OS in their list), with a public SSM parameter for the
    image stack to resolve, that fmcluster's first boot runs on (apt, a toolchain Python)."""
    from fmcluster.schedulers.pcs.image import INSTALLERS_PATH

    raw = yaml.safe_load(INSTALLERS_PATH.read_text())
    installers = load_installers()
    assert raw["installers_page"] == "https://docs.aws.amazon.com/pcs/latest/userguide/working-with_ami_installers.html"
    assert raw["public_key"]["source"].startswith("https://") and raw["supported_os"]["source"].startswith("https://")
    assert all(entry["source"].startswith("https://") and entry["versions_page"].startswith(
        "https://docs.aws.amazon.com/pcs/") for entry in raw["installers"].values())
    assert [i.name for i in installers.ordered] == ["slurm", "agent"]
    assert all(i.url.startswith("https://aws-pcs-repo-{region}.s3.") and "{" not in i.url.replace("{region}", "")
               for i in installers.ordered)
    assert f"aws-pcs-slurm-{SLURM_VERSION}-installer" in [i.directory for i in installers.ordered]
    catalog = load_images()
    for accelerator, key in installers.bases.items():
        base = catalog[key]
        assert base.os in installers.supported_os, (accelerator, base.os)
        assert base.source == "ssm" and base.ssm_parameter and base.first_boot_gap() is None, key
    assert set(installers.refused) == {"neuron"}  # no source cited for Trainium on PCS: refused at validate


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda raw: raw["public_key"].update(fingerprint="1C24 32C1"), "public_key.fingerprint"),
    (lambda raw: raw["installers"].pop("agent"), "installers must be exactly slurm, agent"),
    (lambda raw: raw["installers"]["slurm"].update(version="1.0; rm -rf /"), "installers.slurm.version"),
    (lambda raw: raw["installers"]["agent"].update(url="http://example.com/a.tar.gz"), "installers.agent.url"),
    (lambda raw: raw["installers"]["agent"].pop("source"), "installers.agent.source is missing"),
    (lambda raw: raw.pop("bases"), "bases"),
])
def test_installers_data_it_cannot_render_is_refused_naming_the_file_and_key(
        change: Callable[[dict[str, Any]], Any], fragment: str) -> None:
    from fmcluster.schedulers.pcs.image import INSTALLERS_PATH, InstallersError, parse_installers

    raw = yaml.safe_load(INSTALLERS_PATH.read_text())
    change(raw)
    with pytest.raises(InstallersError, match="installers.yml: ") as err:
        parse_installers(raw)
    assert fragment in str(err.value)


def test_the_cluster_stack_holds_the_pcs_cluster_a_node_group_and_queue_per_queue_and_two_node_groups_in_no_queue(
) -> None:
    resources = cluster_template()["Resources"]
    cluster = resources["Cluster"]["Properties"]
    assert cluster["Scheduler"] == {"Type": "SLURM", "Version": "25.11"} and cluster["Size"] == "SMALL"
    assert cluster["Networking"] == {"SubnetIds": [{"Ref": "PrivateSubnetId"}],
                                     "SecurityGroupIds": [{"Ref": "ClusterSecurityGroup"}]}
    groups = of_type(resources, "AWS::PCS::ComputeNodeGroup")
    assert sorted(g["Properties"]["Name"] for g in groups.values()) == ["controller", "cpu", "gpu", "login"]
    gpu = groups["QueueGpuNodeGroup"]["Properties"]
    assert gpu["InstanceConfigs"] == [{"InstanceType": "p5.48xlarge"}]
    assert gpu["ScalingConfiguration"] == {"MinInstanceCount": 4, "MaxInstanceCount": 4}
    assert gpu["AmiId"] == {"Ref": "PcsGpuImageId"} and gpu["SubnetIds"] == [{"Ref": "PrivateSubnetId"}]
    assert groups["ControllerNodeGroup"]["Properties"]["AmiId"] == {"Ref": "PcsCpuImageId"}
    assert gpu["IamInstanceProfileArn"] == {"Fn::GetAtt": ["NodeInstanceProfile", "Arn"]}
    assert gpu["CustomLaunchTemplate"]["TemplateId"] == {"Ref": "QueueGpuLaunchTemplate"}
    assert groups["ControllerNodeGroup"]["Properties"]["IamInstanceProfileArn"] == {
        "Fn::GetAtt": ["ControllerInstanceProfile", "Arn"]}
    queues = of_type(resources, "AWS::PCS::Queue")
    assert {q["Properties"]["Name"]: q["Properties"]["ComputeNodeGroupConfigurations"] for q in queues.values()} == {
        "gpu": [{"ComputeNodeGroupId": {"Fn::GetAtt": ["QueueGpuNodeGroup", "Id"]}}],
        "cpu": [{"ComputeNodeGroupId": {"Fn::GetAtt": ["QueueCpuNodeGroup", "Id"]}}]}
    # The controller and login node groups serve no queue: PCS's login fleet (sackd, Slurm's clients).
    queued = {c["ComputeNodeGroupId"]["Fn::GetAtt"][0] for q in queues.values()
              for c in q["Properties"]["ComputeNodeGroupConfigurations"]}
    assert queued == {"QueueGpuNodeGroup", "QueueCpuNodeGroup"}


def test_the_node_roles_are_under_aws_pcs_and_may_register_with_this_cluster_only() -> None:
    resources = cluster_template()["Resources"]
    for role in ("NodeRole", "ControllerRole"):
        props = resources[role]["Properties"]
        assert props["Path"] == "/aws-pcs/"
        statements = props["Policies"][0]["PolicyDocument"]["Statement"]
        register = [s for s in statements if s["Action"] == "pcs:RegisterComputeNodeGroupInstance"]
        assert register == [{"Sid": "RegisterWithPcsCluster", "Effect": "Allow",
                             "Action": "pcs:RegisterComputeNodeGroupInstance",
                             "Resource": {"Fn::GetAtt": ["Cluster", "Arn"]}}]
        assert not [s for s in statements if str(s["Action"]).startswith("pcs:") and s is not register[0]]
    for profile in ("NodeInstanceProfile", "ControllerInstanceProfile"):
        assert resources[profile]["Properties"]["Path"] == "/aws-pcs/"


def test_slurm_s_ports_are_open_between_the_pcs_controller_interface_and_the_nodes_and_nothing_else() -> None:
    resources = cluster_template()["Resources"]
    group = resources["ClusterSecurityGroup"]["Properties"]
    node = {"Ref": "NodeSecurityGroupId"}
    assert [(r["FromPort"], r["ToPort"], r["SourceSecurityGroupId"]) for r in group["SecurityGroupIngress"]] == [
        (6817, 6817, node), (6819, 6819, node)]
    assert [(r["FromPort"], r["ToPort"], r["DestinationSecurityGroupId"]) for r in group["SecurityGroupEgress"]] == [
        (1024, 65535, node)]
    back = resources["NodesFromPcsController"]["Properties"]
    assert (back["GroupId"], back["SourceSecurityGroupId"], back["IpProtocol"], back["FromPort"]) == (
        node, {"Ref": "ClusterSecurityGroup"}, "tcp", 1024)


def test_every_launch_template_requires_imdsv2_and_runs_fmcluster_s_first_boot_as_a_mime_shell_script_part() -> None:
    templates = of_type(cluster_template()["Resources"], "AWS::EC2::LaunchTemplate")
    assert len(templates) == 4
    for name, res in templates.items():
        data = res["Properties"]["LaunchTemplateData"]
        assert data["MetadataOptions"]["HttpTokens"] == "required", name
        assert all(m["Ebs"]["Encrypted"] for m in data["BlockDeviceMappings"])
        text = user_data_text(data["UserData"])
        assert text.startswith('Content-Type: multipart/mixed; boundary="==FMCLUSTER=="\nMIME-Version: 1.0\n\n')
        assert 'Content-Type: text/x-shellscript; charset="us-ascii"\n\n#!/bin/bash\n' in text
        assert text.endswith("\n--==FMCLUSTER==--\n")
        assert "export FMCLUSTER_ORG=pcslab\n" in text and "fmcluster first boot" in text
        assert len(base64.b64encode(text.encode())) < 16384  # EC2's user data limit, PCS's part added later
    gpu = templates["QueueGpuLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    assert len(gpu["NetworkInterfaces"]) == 32 and "SubnetId" not in gpu["NetworkInterfaces"][0]
    assert "export FMCLUSTER_QUEUE=gpu\n" in user_data_text(gpu["UserData"])


@pytest.mark.parametrize("org", ["pcslab", "pcsdemo"])  # PCS's stack on AWS; locally its stand-in's
def test_cfn_lint_and_fmcluster_s_security_checks_accept_the_pcs_tenant_s_stacks(tmp_path: Path, org: str) -> None:
    tenant = load_tenant(org, ROOT)
    stacks = render_stacks(tenant)
    assert not check_stacks(stacks)
    files = []
    for stack in stacks:
        path = tmp_path / f"{stack.key}.yaml"
        path.write_text(stack.body)
        files.append(str(path))
    run = subprocess.run([venv_tool("cfn-lint"), "--regions", tenant.region, "--include-checks", "I", "--", *files],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.fixture
def image_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An image cache of this test's own (FMCLUSTER_IMAGE_CACHE), empty: no tenant has a baked image."""
    monkeypatch.setenv("FMCLUSTER_IMAGE_CACHE", str(tmp_path / "images"))
    return tmp_path / "images"


def test_validate_and_plan_run_offline_for_pcslab_and_plan_says_the_deploy_refuses_it_until_invoke_image(
        image_records: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """pcslab validates and plans (every stack rendered); its nodes boot only a baked image (PCS's agent and Slurm
    are on no catalogued base), and none is recorded: plan says the fix and exits 2, as the deploy refuses it."""
    lines: list[str] = []
    assert commands.validate("pcslab", out=lines.append) == 0, lines
    capsys.readouterr()
    assert commands.plan("pcslab") == ExitCode.INVALID
    shown = capsys.readouterr().out
    assert "rendered 3 templates" in shown
    for kind in ("cpu", "gpu"):
        assert f"REFUSED: tenant 'pcslab': its {kind} nodes boot only a baked image" in shown
    assert "Fix: run `invoke image --org=pcslab` first" in shown and "Python 3.9" not in shown


def record(org: str, kind: str, digest: str) -> Any:
    from fmcluster import baked

    return baked.Record(org, kind, digest, "base", "0" * 40, {}, "2026-12-07T00:00:00+00:00", 1, "ami-0123456789abcdef0",
                        1.0)


def test_the_deploy_refuses_pcslab_before_it_creates_anything_until_its_images_are_baked_and_current(
        image_records: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before anything is created, the deploy's first step refuses each node kind with no baked image recorded (the
    fix: `invoke image --org=pcslab`), then one baked from another install set (stale); current records pass.
    pcsdemo's nodes boot the local image through the stand-in: no refusal."""
    from fmcluster import baked
    from fmcluster.deploy import Deploy
    from fmcluster.stacks import api

    lines: list[str] = []
    deploy = Deploy(PCSLAB, out=lines.append)
    assert [name for name, _ in deploy.steps()][0] == "validate"
    outcome = deploy.validate()
    assert outcome.status == "failed" and "nothing was created or changed" in outcome.summary, outcome
    assert len(outcome.details) == 2 and all("`invoke image --org=pcslab` first" in d for d in outcome.details)
    monkeypatch.setattr(api, "_current_digest", lambda kind, pristine: f"{kind}-current"[:12].ljust(12, "0"))
    baked.write_record(record("pcslab", "cpu", "cpu-current0"))
    baked.write_record(record("pcslab", "gpu", "gpu-old00000"))
    outcome = Deploy(PCSLAB, out=lines.append).validate()
    assert outcome.status == "failed" and len(outcome.details) == 1 and "STALE" not in outcome.details[0]
    assert "its gpu image ami-0123456789abcdef0 was baked from install set gpu-old00000" in outcome.details[0]
    baked.write_record(record("pcslab", "gpu", "gpu-current0"))
    assert Deploy(PCSLAB, out=lines.append).validate().status == "ok"
    assert Deploy(load_tenant("pcsdemo", ROOT), out=lines.append).validate().status == "ok"


def test_another_image_fmcluster_s_first_boot_cannot_run_on_stays_refused_before_the_baked_gate(
        image_records: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """h15's refusal still stands for any image without apt or a toolchain Python: were PCS's base its sample AMI
    again, the deploy would say so (and not ask for a bake on an image the bake cannot run on either)."""
    from fmcluster.deploy import Deploy
    from fmcluster.schedulers.pcs import scheduler as pcs_scheduler

    monkeypatch.setattr(pcs_scheduler.Pcs, "image", lambda self, accelerator: SAMPLE_IMAGE)
    outcome = Deploy(PCSLAB, out=[].append).validate()
    assert outcome.status == "failed" and len(outcome.details) == 1
    assert SAMPLE_IMAGE in outcome.details[0] and "Python 3.9" in outcome.details[0]


Change = Callable[[dict[str, Any]], None]


def validate_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Change) -> tuple[int, str]:
    doc = copy.deepcopy(SPEC)
    doc["tenant"]["org"] = "acme"
    change(doc["tenant"])
    spec = tmp_path / "inventories/acme/group_vars/all/tenant.yml"
    spec.parent.mkdir(parents=True)
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    lines: list[str] = []
    return commands.validate("acme", out=lines.append), "\n".join(lines)


REFUSED: list[tuple[str, Change, str, list[str]]] = [
    ("pcs-queue-name", lambda t: t["queues"][0].update(name="gpu-h100-pretraining-large"), "tenant.queues[0].name",
     ["[pcs-queue-name]", "26 characters", "at most 25", "shorten it"]),
    ("pcs-image-neuron", lambda t: t["queues"][0].update(instance_type="trn1.32xlarge"),
     "tenant.queues[0].instance_type", ["[pcs-image-neuron]", "no source cited yet that AWS PCS", "scheduler hyperpod"]),
    ("pcs-cluster-size", lambda t: t["queues"][1].update(count=2045), "tenant.queues",
     ["[pcs-cluster-size]", "2051 nodes", "at most 2048"]),
    ("pcs-accounting", lambda t: t.update(accounting={"database_endpoint": "db.example.org:3306"}),
     "tenant.accounting.database_endpoint", ["[pcs-accounting]", "remove accounting.database_endpoint"]),
]


@pytest.mark.parametrize("change,key,fragments", [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_what_pcs_refuses_is_refused_by_validate_naming_the_key_and_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Change, key: str, fragments: list[str]) -> None:
    code, text = validate_changed(tmp_path, monkeypatch, change)
    assert code != 0, text
    line = next((line for line in text.splitlines() if key in line and fragments[0] in line), None)
    assert line is not None, text
    assert "tenant.yml" in line
    for fragment in fragments[1:]:
        assert fragment in text, text


def test_new_tenant_scaffolds_a_pcs_tenant_that_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.scaffold import new_tenant

    tenant = new_tenant("acme", {"scheduler": "pcs", "instance_type": "p5.48xlarge", "count": "2",
                                 "region": "us-east-1", "availability_zone": "us-east-1a"}, output_dir=tmp_path)
    assert tenant.scheduler == "pcs"
    template = load_cfn_yaml(next(s for s in render_stacks(tenant) if s.key == "cluster").body)
    groups = of_type(template["Resources"], "AWS::PCS::ComputeNodeGroup")
    assert groups["QueueGpuNodeGroup"]["Properties"]["ScalingConfiguration"]["MaxInstanceCount"] == 2


class FakeEc2:
    """describe_images as EC2 answers it: the images of the owner whose name matches, recorded."""

    def __init__(self, images: list[dict[str, str]]) -> None:
        self.images = images
        self.asked: list[dict[str, Any]] = []

    def describe_images(self, **params: Any) -> dict[str, Any]:
        self.asked.append(params)
        return {"Images": self.images}


def test_an_image_named_by_owner_and_name_resolves_to_the_newest_available_one() -> None:
    """NamedImageRef (an image with no public SSM parameter, as PCS's sample AMIs are): the newest available image of
    that owner and name, never a same-named image of another owner."""
    from fmcluster.stacks import api
    from fmcluster.stacks.render import NamedImageRef

    ref = NamedImageRef("amazon", "aws-pcs-sample_ami-al2023-x86_64-slurm-25.11*")
    ec2 = FakeEc2([{"ImageId": "ami-0000000000000old1", "CreationDate": "2026-09-01T00:00:00.000Z"},
                   {"ImageId": "ami-0000000000000new2", "CreationDate": "2026-11-20T00:00:00.000Z"}])
    assert api.newest_named_image(ec2, ref) == "ami-0000000000000new2"
    assert ec2.asked == [{"Owners": ["amazon"], "Filters": [
        {"Name": "name", "Values": ["aws-pcs-sample_ami-al2023-x86_64-slurm-25.11*"]},
        {"Name": "state", "Values": ["available"]}]}]
    with pytest.raises(RuntimeError, match="no available image named .*aws-pcs-sample_ami.* of owner 'amazon'"):
        api.newest_named_image(FakeEc2([]), ref)


def test_each_node_kind_boots_its_baked_image_parameter_which_never_falls_back_to_the_base() -> None:
    """One AMI parameter per image kind, each a baked-image reference that a missing record refuses (never the
    base, which has no PCS agent), whose base is the installers' base image of that kind."""
    from fmcluster.images import load_images
    from fmcluster.stacks.render import BakedImageRef, ImageRef

    stack = next(s for s in render_stacks(PCSLAB) if s.key == "cluster")
    base = load_images()[load_installers().base("cuda")].ssm_parameter
    for name, kind in (("PcsCpuImageId", "cpu"), ("PcsGpuImageId", "gpu")):
        ref = stack.parameters[name]
        assert isinstance(ref, BakedImageRef) and ref.kind == kind and ref.required and not ref.kept
        assert ref.base == ImageRef(str(base)) and "+steps-" in ref.pristine
        assert "refused (`invoke image` first)" in ref.describe()
        assert load_cfn_yaml(stack.body)["Parameters"][name]["Type"] == "AWS::EC2::Image::Id"
    assert "PcsTrainiumImageId" not in stack.parameters


# --- provider local: the stand-in for the PCS service ----------------------------------------------

PCSDEMO = load_tenant("pcsdemo", ROOT)


def test_pcsdemo_is_stood_in_locally_with_fmcluster_s_slurm_at_its_own_paths() -> None:
    """No PCS offline: the stand-in's stack takes the cluster stack's place, fmcluster's roles install Slurm, and the
    manifest gives the roles none of PCS's Slurm paths; on AWS the same tenant is PCS's."""
    import dataclasses

    from fmcluster.schedulers.pcs.stand_in import STAND_IN_TEMPLATE, STOOD_IN
    from fmcluster.stacks.render import cluster_template as chosen

    scheduler = scheduler_for(PCSDEMO)
    assert (PCSDEMO.capabilities.stand_in, PCSDEMO.capabilities.slurm_owner) == (True, "fmcluster")
    assert chosen(PCSDEMO, scheduler) is STAND_IN_TEMPLATE
    on_aws = dataclasses.replace(PCSDEMO, provider="aws")
    assert chosen(on_aws, scheduler_for(on_aws)) is scheduler_for(on_aws).cluster_template
    assert not {"slurm_conf_dir", "node_health_commands"} & set(scheduler.manifest_vars())
    assert scheduler.manifest_vars()["prometheus_node_discovery"]["tag"] == "fmcluster:org"
    outcome = scheduler.make_cluster({}, print)
    assert outcome.status == "ok" and STOOD_IN in outcome.details and "stood in locally" in STOOD_IN
    assert scheduler.status_lines() == [f"PCS: local stand-in (its stack is listed above). {STOOD_IN}"]


def test_the_stand_in_s_instances_carry_pcs_s_launch_template_tags_and_run_the_same_first_boot() -> None:
    """Each stand-in node is tagged as PCS's launch template tags it (what discovery reads) and its user data is the
    shell part of PCS's MIME user data, naming no signal resource; no group waits for signals, none is repaired by
    fmcluster's controller."""
    stacks = render_stacks(PCSDEMO)
    assert [s.key for s in stacks] == ["network", "storage", "cluster"]
    resources = load_cfn_yaml(stacks[2].body)["Resources"]
    on_aws = load_cfn_yaml(next(s for s in render_stacks(PCSLAB) if s.key == "cluster").body)["Resources"]
    assert not of_type(resources, "AWS::PCS::Cluster") and not of_type(resources, "AWS::PCS::ComputeNodeGroup")
    expected = {"ControllerLaunchTemplate": ("controller", None), "LoginLaunchTemplate": ("login", None),
                "QueueCpuLaunchTemplate": ("compute", "cpu")}
    pcs_user_data = user_data_text(on_aws["QueueCpuLaunchTemplate"]["Properties"]["LaunchTemplateData"]["UserData"])
    for logical, (role, queue) in expected.items():
        data = resources[logical]["Properties"]["LaunchTemplateData"]
        (instance_tags,) = [t["Tags"] for t in data["TagSpecifications"] if t["ResourceType"] == "instance"]
        tags = {t["Key"]: t["Value"] for t in instance_tags}
        assert tags["fmcluster:org"] == "pcsdemo" and tags["fmcluster:role"] == role
        assert tags.get("fmcluster:queue") == queue
        assert not [key for key in tags if key.startswith("aws:")], "AWS's own tags cannot be set by a template"
        script = user_data_text(data["UserData"])
        assert "export FMCLUSTER_SIGNAL_RESOURCE=''\n" in script
        if role == "compute":
            # The whole user data is the shell part of PCS's (pcslab's queue cpu: another org, the same queue).
            assert pcs_user_data.startswith(MIME_HEAD) and pcs_user_data.endswith(MIME_TAIL)
            shell_part = pcs_user_data.removeprefix(MIME_HEAD).removesuffix(MIME_TAIL)
            assert script.replace("pcsdemo", "ORG") == shell_part.replace("pcslab", "ORG")
    for group in ("LoginGroup", "QueueCpuGroup"):
        assert "CreationPolicy" not in resources[group], "no PCS node signals its stack"
    statements = resources["ControllerRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    assert not [s for s in statements if s.get("Sid", "").startswith("Repair")], "PCS replaces its own nodes"
    assert not check_stacks(stacks)


def test_validate_and_plan_run_offline_for_pcsdemo_and_say_what_is_stood_in(
        capsys: pytest.CaptureFixture[str]) -> None:
    lines: list[str] = []
    assert commands.validate("pcsdemo", out=lines.append) == 0, lines
    assert commands.plan("pcsdemo") == 0
    assert "PCS: local stand-in" in capsys.readouterr().out
