"""The image stack (`fmc-<org>-image`, issue 40): EC2 Image Builder bakes each node kind's image from the roles'
install tasks, as the local bake does (fmcluster.stacks.templates.image).

Offline, with the tools that own each format: cfn-lint (the tenant's region, informational checks included) for the
template; the AWSTOE document's shape as the Image Builder user guide gives it ("Document schema and definitions":
https://docs.aws.amazon.com/imagebuilder/latest/userguide/toe-use-documents.html; AWSTOE itself, `awstoe validate`,
is a download from AWS, not a package this machine reaches), bash -n for its script; Ansible's own --list-tasks for
what its build phase runs; tests/iam_policy.py for the builder role. The rendered template is kept in
tests/golden/image_stacks/<org>/ (regenerate: FMCLUSTER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_image_stack.py).
"""

from __future__ import annotations

import json
from dataclasses import replace
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, venv_tool
from fmcluster.paths import NODE_BOOT_DIR
from fmcluster import baked
from fmcluster.manifest import assemble_inventory, inventory_yaml
from fmcluster.model import Tenant, load_tenant
from fmcluster.node.agent import MANIFEST_KEY
from fmcluster.stacks import cfn
from fmcluster.stacks.render import OutputRef, load_cfn_yaml, render_image_stack
from fmcluster.schedulers.registry import scheduler_for
from fmcluster.stacks.templates import image
from iam_policy import Request, allows, resolve

GOLDEN = ROOT / "tests" / "golden" / "image_stacks"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
#: Tenants whose nodes boot catalogued images with SSM parameters: slurm-ec2 on AWS and the local rehearsal's, and
#: PCS on AWS (its installers run first).
ORGS = ("stockmark", "demo", "pcslab")
BUCKET = "fmc-stockmark-data-123456789012"
VALUES = {"DataBucketName": BUCKET, "AWS::Region": "ap-northeast-1", "AWS::Partition": "aws",
          "AWS::AccountId": "123456789012", "SourceCommit": COMMIT, "CpuInstallDigest": "aaaaaaaaaaaa",
          "GpuInstallDigest": "bbbbbbbbbbbb", "TrainiumInstallDigest": "cccccccccccc"}


def tenant_of(org: str) -> Tenant:
    return load_tenant(org, ROOT)


def rendered(org: str) -> tuple[Tenant, Any]:
    tenant = tenant_of(org)
    digests = {kind: VALUES[image.digest_parameter(kind)] for kind in image.kind_images(tenant, scheduler_for(tenant))}
    return tenant, render_image_stack(tenant, scheduler_for(tenant), COMMIT, digests)


def document(template: dict[str, Any], kind: str) -> str:
    """The component's AWSTOE document as CloudFormation resolves its Fn::Join."""
    data = template["Resources"][f"{image.logical_name(kind)}Component"]["Properties"]["Data"]["Fn::Join"]
    return "".join(p if isinstance(p, str) else VALUES[p["Ref"]] for p in data[1])


@pytest.mark.parametrize("org", ORGS)
def test_cfn_lint_finds_nothing_in_the_image_stack(org: str, tmp_path: Path) -> None:
    tenant, stack = rendered(org)
    path = tmp_path / "image.yaml"
    path.write_text(stack.body)
    run = subprocess.run([venv_tool("cfn-lint"), "--regions", tenant.region, "--include-checks", "I", "--", str(path)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("org", ORGS)
def test_the_rendered_image_stack_is_the_recorded_one(org: str) -> None:
    _, stack = rendered(org)
    files = {"image.yaml": stack.body,
             "image.parameters.json": json.dumps(stack.parameters, indent=1, sort_keys=True, default=str) + "\n"}
    folder = GOLDEN / org
    if os.environ.get("FMCLUSTER_UPDATE_GOLDEN") == "1":
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    assert {name: (folder / name).read_text() for name in files} == files, \
        f"regenerate tests/golden/image_stacks/{org}/ (see the module doc) and review the diff"


def test_one_image_per_kind_the_tenant_boots_on_its_catalogued_base() -> None:
    tenant, stack = rendered("stockmark")
    template = load_cfn_yaml(stack.body)
    # stockmark: m5 controller and login (cpu), a p5 queue (gpu); both boot the DLAMI base GPU AMI (data/images.yml)
    assert list(image.kind_images(tenant, scheduler_for(tenant))) == ["cpu", "gpu"]
    types = {name: r["Type"] for name, r in template["Resources"].items()}
    for kind in ("Cpu", "Gpu"):
        assert {types[f"{kind}{part}"] for part in ("Component", "Recipe", "Infrastructure", "Distribution", "Image")} \
            == {f"AWS::ImageBuilder::{t}" for t in ("Component", "ImageRecipe", "InfrastructureConfiguration",
                                                     "DistributionConfiguration", "Image")}
        recipe = template["Resources"][f"{kind}Recipe"]["Properties"]
        assert recipe["ParentImage"] == {"Ref": f"{kind}ParentImageId"}
        assert template["Parameters"][f"{kind}ParentImageId"]["Type"] == "AWS::EC2::Image::Id"
        assert template["Outputs"][f"{kind}ImageId"]["Value"] == {"Fn::GetAtt": [f"{kind}Image", "ImageId"]}
        image_tags = template["Resources"][f"{kind}Image"]["Properties"]["Tags"]
        ami_tags = template["Resources"][f"{kind}Distribution"]["Properties"]["Distributions"][0][
            "AmiDistributionConfiguration"]["AmiTags"]
        for tags in (image_tags, ami_tags):
            assert tags["fmcluster:commit"] == {"Ref": "SourceCommit"}
            assert tags["fmcluster:install-digest"] == {"Ref": f"{kind}InstallDigest"}
            assert tags["fmcluster:kind"] == kind.lower()
    assert "Trainium" + "Image" not in template["Resources"]
    # the parent is pinned from the catalogued SSM parameter, as the cluster stack's AMIs are
    catalogued = image.kind_images(tenant, scheduler_for(tenant))["gpu"].ssm_parameter
    assert stack.parameters["GpuParentImageId"].ssm_path == catalogued
    assert stack.parameters["DataBucketName"] == OutputRef("storage", "DataBucketName")
    assert stack.parameters["SourceCommit"] == COMMIT and stack.parameters["GpuInstallDigest"] == "bbbbbbbbbbbb"


def test_a_scheduler_whose_service_chooses_the_image_gets_no_image_stack() -> None:
    with pytest.raises(ValueError, match="its service chooses"):
        image.kind_images(tenant_of("pclab"), scheduler_for(tenant_of("pclab")))


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_the_component_is_an_awstoe_document_whose_build_runs_the_first_boot_fetch_then_the_install_tag(
        kind: str, tmp_path: Path) -> None:
    _, stack = rendered("stockmark")
    text = document(load_cfn_yaml(stack.body), kind)
    assert len(text) <= 16000  # AWS::ImageBuilder::Component Data's maxLength (cfn-lint's schema)
    assert "{{" not in text  # AWSTOE would read it as a variable
    doc = yaml.safe_load(text)
    assert set(doc) == {"name", "description", "schemaVersion", "phases"} and doc["schemaVersion"] == 1.0
    [phase] = doc["phases"]
    assert phase["name"] == "build"
    [step] = phase["steps"]
    assert step["action"] == "ExecuteBash" and set(step["inputs"]) == {"commands"}
    [script] = step["inputs"]["commands"]
    (tmp_path / "build.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "build.sh")]).returncode == 0
    lines = script.splitlines()
    # the first boot's own fetch: the packed client, node-bootstrap.sh checked against the deploy's index, then the
    # bootstrap's fetch mode (bundle, packages, toolchain, commit) — the same lines as src/fmcluster/node/boot/node-user-data.sh
    first_boot = (NODE_BOOT_DIR / "node-user-data.sh").read_text()
    assert '"$bin_dir/fmcluster-s3" verify "/fmcluster/$FMCLUSTER_ORG/bootstrap-index-sha256"' in first_boot
    assert any(line.startswith('"$bin_dir/fmcluster-s3" verify "/fmcluster/$FMCLUSTER_ORG/bootstrap-index-sha256"')
               for line in lines)
    assert '"$bin_dir/fmcluster-bootstrap" --fetch' in lines
    assert f"FMCLUSTER_BUCKET={BUCKET}" in script and f"commit={COMMIT} kind={kind}" in script
    # the builder's inventory of its kind, then ansible-pull of the pinned commit from the bundle's repository
    pull = " ".join(line.rstrip("\\") for line in lines[next(i for i, x in enumerate(lines) if "ansible-pull" in x):][:3])
    assert "--url /var/lib/fmcluster/repo.git" in pull and '--checkout "$commit"' in pull
    assert f"--tags {baked.INSTALL_TAG}" in pull and f"--limit {baked.BUILDER_NAME}" in pull
    assert '"$FMCLUSTER_PLAYBOOK"' in pull
    assert 'image-inventory --kind "$kind"' in script
    # the node's state goes, the marker a node reads (fmcluster.baked.booted_image) is written
    assert baked.IMAGE_MARKER in script and "/etc/munge/munge.key" in script


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_a_pcs_image_installs_aws_s_pcs_installers_verified_against_the_pinned_key_before_fmcluster_s_steps(
        kind: str, tmp_path: Path) -> None:
    """pcslab's component (its scheduler hands the step in: ClusterTemplate.image_steps): AWS's signing key, refused
    unless its fingerprint is installers.yml's; each installer's tarball and detached signature, verified, then its
    documented install command, Slurm's before the agent's; all of it before fmcluster's first-boot fetch. The
    digest's base names the step, so a changed installer makes the image stale."""
    from fmcluster.schedulers.pcs.image import load_installers

    tenant, stack = rendered("pcslab")
    installers = load_installers()
    text = document(load_cfn_yaml(stack.body), kind)
    assert len(text) <= 16000 and "{{" not in text
    [script] = yaml.safe_load(text)["phases"][0]["steps"][0]["inputs"]["commands"]
    (tmp_path / "build.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "build.sh")]).returncode == 0
    lines = script.splitlines()

    def at(fragment: str) -> int:
        return next(i for i, line in enumerate(lines) if fragment in line)

    assert f'if [ "$pcs_fpr" != "{installers.fingerprint}" ]; then' in lines
    assert at("--import") < at("pcs_fpr=") < at("$pcs_fpr\" !=") < at("--verify")
    for installer in installers.ordered:
        url = installer.url.replace("{region}", "${FMCLUSTER_REGION}")
        get, sig = at(f'"{url}" -o "$pcs_work/{installer.name}.tar.gz"'), at(f'"{url}.sig" -o')
        verify = at(f'--verify "$pcs_work/{installer.name}.tar.gz.sig" "$pcs_work/{installer.name}.tar.gz"')
        run = at(f'cd "$pcs_work/{installer.directory}"')
        assert get < sig < verify < run < at('"$bin_dir/fmcluster-s3" get'), installer.name
        assert lines[run].endswith(f"&& {installer.install})")
    assert at("aws-pcs-slurm-") < at("aws-pcs-agent-v1-")
    found = image.kind_images(tenant, scheduler_for(tenant))[kind]
    assert image.pristine(found, image.scheduler_steps(scheduler_for(tenant))).startswith(f"{found.key}@")
    assert image.pristine(found, "other") != image.pristine(found, image.scheduler_steps(scheduler_for(tenant)))
    # slurm-ec2's images run no scheduler step: their digests are what they were
    stockmark = tenant_of("stockmark")
    assert image.scheduler_steps(scheduler_for(stockmark)) == ""


def builder_inventory(tenant: Tenant, kind: str, tmp_path: Path) -> Path:
    """The inventory `python -m fmcluster.node image-inventory` writes, from the manifest a deploy publishes."""
    from fmcluster.images import booted_image
    from fmcluster.providers.registry import provider_for
    from fmcluster.publish import build_manifest
    from fmcluster.schedulers.registry import scheduler_for

    provider, scheduler = provider_for(tenant), scheduler_for(tenant)
    manifest = build_manifest(tenant, COMMIT, {}, provider.queue_resources, scheduler.manifest_vars(),
                              provider.manifest_vars(), scheduler.discovery({}),
                              booted_image(scheduler.image, provider.node_image))
    manifest = json.loads(json.dumps(manifest, default=str))  # as the node reads it (JSON)
    nodes = baked.builder_nodes(manifest, kind, "10.0.0.10")
    path = tmp_path / f"{kind}.yml"
    path.write_text(inventory_yaml(assemble_inventory(manifest, nodes), "# test\n"))
    return path


GPU_TASKS = {"NVIDIA driver, Fabric Manager, CUDA", "EFA stack", "Build nccl-tests where an NVIDIA GPU is present",
             "slurm_compute : Install slurmd"}


@pytest.mark.parametrize(("kind", "wanted", "absent"), [
    ("gpu", GPU_TASKS | {"munge : Install munge", "slurm_controller : Install slurmctld"}, set()),
    ("cpu", {"munge : Install munge", "slurm_controller : Install slurmctld", "slurm_login : Install the Slurm clients"},
     GPU_TASKS),
])
def test_the_builder_runs_the_install_tasks_of_its_kind_s_roles(kind: str, wanted: set[str], absent: set[str],
                                                               tmp_path: Path) -> None:
    """Ansible's own answer (--list-tasks): the tasks the builder of that kind runs with --tags install, every one
    tagged install (or always: the roles' argument checks)."""
    tenant = tenant_of("stockmark")
    hosts = builder_inventory(tenant, kind, tmp_path)
    groups = yaml.safe_load(hosts.read_text())
    assert baked.BUILDER_NAME in groups["all"]["children"]["controller"]["hosts"]

    def listed(what: str) -> dict[str, list[str]]:
        """play → its lines, as ansible-playbook --list-<what> prints them."""
        run = subprocess.run([venv_tool("ansible-playbook"), "-i", str(hosts), "--limit", baked.BUILDER_NAME,
                              "--tags", baked.INSTALL_TAG, f"--list-{what}", "playbooks/site.yml"],
                             cwd=ROOT, capture_output=True, text=True, env={**os.environ, "ANSIBLE_FORCE_COLOR": "0"})
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        plays: dict[str, list[str]] = {}
        for line in run.stdout.splitlines():
            if line.lstrip().startswith("play #"):
                play = line.split(":")[0].strip()
                plays[play] = []
            elif line.strip() and plays:
                plays[play].append(line.strip())
        return plays

    mine = {play for play, lines in listed("hosts").items() if baked.BUILDER_NAME in lines}
    tasks = {line.split("\t")[0]: line.split("TAGS: ")[-1] for play, lines in listed("tasks").items() if play in mine
             for line in lines if "\tTAGS: " in line}
    assert wanted <= set(tasks), sorted(wanted - set(tasks))
    assert not absent & set(tasks), sorted(absent & set(tasks))
    assert {name: tags for name, tags in tasks.items() if tags not in ("[install]", "[always]")} == {}


def test_a_cpu_image_has_no_compute_role_where_no_queue_is_cpu() -> None:
    manifest = {"groups": {"controller": {"instance_type": "m5.8xlarge"}, "login": None, "queues": {
        "gpu": {"instance_type": "p5.48xlarge", "instance": {"accelerator": "cuda"}}}}}
    assert [(n.role, n.queue) for n in baked.builder_nodes(manifest, "cpu", "10.0.0.10")] == [("controller", None)]
    assert [(n.role, n.queue) for n in baked.builder_nodes(manifest, "gpu", "10.0.0.10")] == \
        [("controller", None), ("compute", "gpu")]


def builder_policies(org: str) -> list[dict[str, Any]]:
    _, stack = rendered(org)
    role = load_cfn_yaml(stack.body)["Resources"]["BuilderRole"]["Properties"]
    return [resolve(p["PolicyDocument"], VALUES) for p in role["Policies"]]


def test_the_builder_role_reads_what_the_first_boot_fetch_reads_and_nothing_else() -> None:
    policies = builder_policies("stockmark")
    arn = f"arn:aws:s3:::{BUCKET}"
    for key in ("fmcluster/bootstrap/node-bootstrap.sh", "fmcluster/bootstrap/repo.bundle",
                "fmcluster/manifest/index.json", MANIFEST_KEY):
        assert allows(policies, Request("s3:GetObject", f"{arn}/{key}")), key
    assert allows(policies, Request("s3:ListBucket", arn, {"s3:prefix": "fmcluster/bootstrap/"}))
    index = "arn:aws:ssm:ap-northeast-1:123456789012:parameter/fmcluster/stockmark/bootstrap-index-sha256"
    assert allows(policies, Request("ssm:GetParameter", index))
    refused = [Request("s3:GetObject", f"{arn}/hyperpod/lifecycle/on_create.sh"),
               Request("s3:GetObject", f"{arn}/fmcluster/report/AROA:i-1/i-1.json"),
               Request("s3:GetObject", f"{arn}/datasets/train.bin"),
               Request("s3:PutObject", f"{arn}/fmcluster/bootstrap/node-bootstrap.sh"),
               Request("s3:ListBucket", arn, {"s3:prefix": ""}),
               Request("ssm:PutParameter", index),
               Request("secretsmanager:GetSecretValue",
                       "arn:aws:secretsmanager:ap-northeast-1:123456789012:secret:fmcluster/stockmark/munge-key-abcdef"),
               Request("cloudformation:SignalResource", "arn:aws:cloudformation:ap-northeast-1:123456789012:stack/x/y")]
    assert [r for r in refused if allows(policies, r)] == []
    _, stack = rendered("stockmark")
    role = load_cfn_yaml(stack.body)["Resources"]["BuilderRole"]["Properties"]
    assert [resolve(a, VALUES) for a in role["ManagedPolicyArns"]] == [
        "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder", "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"]
    infra = load_cfn_yaml(stack.body)["Resources"]["GpuInfrastructure"]["Properties"]
    assert infra["InstanceMetadataOptions"]["HttpTokens"] == "required" and infra["TerminateInstanceOnFailure"] is True
    group = load_cfn_yaml(stack.body)["Resources"]["BuilderSecurityGroup"]["Properties"]
    assert "SecurityGroupIngress" not in group


def test_invoke_image_on_aws_without_credentials_plans_the_image_stack_and_builds_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With credentials it deploys the stack and records the AMIs: tests/test_baked_aws.py, on the emulator."""
    from fmcluster.commands import image_stack
    from fmcluster.stacks import api, aws

    written: list[str] = []

    def write(tenant: Tenant, stacks: list[Any], root: Path | None = None) -> Path:
        written.extend(s.body for s in stacks)
        return tmp_path

    monkeypatch.setattr(api, "write_rendered", write)
    monkeypatch.setattr(aws, "has_credentials", lambda region: False)
    lines: list[str] = []
    assert image_stack.plan_image_stack(tenant_of("stockmark"), out=lines.append) == 0
    assert len(written) == 1 and "AWS::ImageBuilder::Image" in written[0]
    said = "\n".join(lines)
    assert "cpu: on AWS Deep Learning Base" in said and "gpu: on AWS Deep Learning Base" in said
    assert "nothing was built" in said


@pytest.mark.parametrize("org", ORGS)
def test_the_image_stack_passes_the_deploy_s_security_gate_and_only_the_builder_holds_image_builder_s_policy(
        org: str) -> None:
    from fmcluster.stacks.checks import check_stacks

    _, stack = rendered(org)
    assert [f.render() for f in check_stacks([stack])] == []
    template = load_cfn_yaml(stack.body)
    template["Resources"]["NodeRole"] = {**template["Resources"]["BuilderRole"]}  # the same policy on another role
    moved = replace(stack, body=cfn.dump(template))
    assert [f.resource for f in check_stacks([moved])] == ["NodeRole"]
