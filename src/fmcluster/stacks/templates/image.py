"""Image stack (`fmc-<org>-image`, issue 40): the tenant's baked node images, built by EC2 Image Builder.

Per node kind of the tenant (cpu, gpu, trainium: the accelerators of its controller, login and queues), in the order
of fmcluster.baked.IMAGE_KINDS:
- a **component** whose build phase runs what a first boot runs up to the converge, then the roles' install tasks:
  the first boot's S3 client (packed, fmcluster.stacks.first_boot.s3_client_writer), node-bootstrap.sh fetched and
  checked against the deploy's index as the user data does it, `node-bootstrap.sh --fetch` (the published bundle,
  checked file by file, the packages and toolchain the bootstrap installs, the pinned commit), the builder's
  inventory from the published manifest (`python -m fmcluster.node image-inventory`: the builder in every node group
  of its kind), then `ansible-pull --tags install` of the pinned commit from that bundle; what is the node's, never
  the image's, is removed last (fmcluster.baked.NOT_BAKED_ON_AWS), and the image marker written;
- a **recipe** on the kind's catalogued base image (data/images.yml, the image the tenant's scheduler boots for the
  kind: its public SSM parameter, resolved once into the `<Kind>ParentImageId` parameter and then kept, as the
  cluster stack's AMIs are);
- an **infrastructure configuration** (the private subnet, a builder group with no ingress, IMDSv2, the builder
  instance profile, instances terminated on failure) and a **distribution configuration** (the AMI's name and tags);
- an **`AWS::ImageBuilder::Image`**, whose `ImageId` is the output `<Kind>ImageId`.

Everything built records the commit and the install set's digest (fmcluster.baked.digest of the kind's base image and
the install set as committed): tags on the image, the AMI and the recipe. Both are parameters (`SourceCommit`,
`<Kind>InstallDigest`), not rendered in, so the template is the same for every commit; component and recipe names
carry the commit because Image Builder's are immutable per name and version.

The builder role (one, for every kind): AWS's `EC2InstanceProfileForImageBuilder` and
`AmazonSSMManagedInstanceCore` (Image Builder runs the component through Systems Manager), and what the first boot's
fetch reads: the bootstrap prefix, the manifest prefix (the manifest says which software the tenant's nodes run;
the index vouches for both) and the index digest's SSM parameter. No secret, no report, no signal.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from fmcluster import baked
from fmcluster.images import Image, load_images
from fmcluster.model import Tenant
from fmcluster.stacks.cfn import GetAtt, Ref, join
from fmcluster.stacks.first_boot import s3_client_writer
from fmcluster.stacks.templates import SchedulerStacks
from fmcluster.stacks.templates.common import (
    BOOTSTRAP_PREFIX, MANIFEST_PREFIX, TEMPLATE_VERSION, assume_role, bucket_arn, bucket_name, description,
    logical_name, metadata, output, resource_tags, spec_file, subnet_id, trusted_index_statement,
)

#: The instance each kind's image is built on: the smallest current type with the kind's accelerator, so the roles'
#: accelerator installs (drivers below the pins, the Neuron runtime, nccl-tests' build) see the device they install
#: for, at a fraction of a P5's or trn1.32xlarge's price and without their capacity reservations.
BUILDER_INSTANCE_TYPES = {"cpu": "m5.2xlarge", "gpu": "g5.2xlarge", "trainium": "trn1.2xlarge"}
#: AWS managed policies of the builder's role. Image Builder's instance profile needs both (Image Builder user guide,
#: "Prerequisites": https://docs.aws.amazon.com/imagebuilder/latest/userguide/image-builder-setting-up.html).
BUILDER_MANAGED_POLICIES = ("EC2InstanceProfileForImageBuilder", "AmazonSSMManagedInstanceCore")
#: Where the builder keeps its inventory and checkout (removed before the snapshot).
WORK = "/var/lib/fmcluster-image"
VENV = "/opt/fmcluster/venv"
STATE = "/var/lib/fmcluster"
#: The hours Image Builder may take for one image (its test phase: none; the build phase runs every install task).
BUILD_TIMEOUT_MINUTES = 240
_ORG = re.compile(r"[a-z][a-z0-9-]{0,30}")


def tenant_accelerators(tenant: Tenant) -> set[str]:
    """The accelerators of the tenant's nodes (controller, login, queues): which image kinds it has."""
    accelerators: set[str] = {tenant.controller.accelerator, *(q.instance.accelerator for q in tenant.queues)}
    if tenant.login is not None:
        accelerators.add(tenant.login.accelerator)
    return accelerators


def kind_images(tenant: Tenant, scheduler: SchedulerStacks) -> dict[str, Image]:
    """Each image kind the tenant's nodes boot → the catalogued image its recipe starts from: the image the tenant's
    scheduler (handed in by the caller) boots for the kind's accelerator. A scheduler whose nodes boot an image its
    service chooses has no catalogued parent to bake on here: refused, naming it."""
    catalog = load_images()
    accelerators = tenant_accelerators(tenant)
    found: dict[str, Image] = {}
    for kind in baked.IMAGE_KINDS:
        if baked.KIND_ACCELERATOR[kind] not in accelerators:
            continue
        image = catalog[scheduler.image(baked.KIND_ACCELERATOR[kind])]
        if image.source != "ssm" or not image.ssm_parameter:
            raise ValueError(f"scheduler {tenant.scheduler!r}: its {kind} nodes boot {image.key} ({image.name}), which "
                             f"its service chooses (data/images.yml source {image.source!r}): the image stack builds "
                             "only on a catalogued image with a public SSM parameter")
        found[kind] = image
    return found


def scheduler_steps(scheduler: SchedulerStacks) -> str:
    """What the tenant's scheduler (handed in) has the component run before fmcluster's install steps
    (ClusterTemplate.image_steps: PCS's installers); empty for most."""
    cluster = scheduler.cluster_template
    return cluster.image_steps() if cluster is not None else ""


def pristine(image: Image, steps: str = "") -> str:
    """What a baked AWS image's digest names as its base: the catalogued image and its SSM parameter (the AMI it
    resolves to is pinned in the stack's parameter and recorded beside the digest), and the digest of the scheduler's
    own steps where it has some (scheduler_steps: a changed installer makes the image stale)."""
    base = f"{image.key}@{image.ssm_parameter}"
    return f"{base}+steps-{hashlib.sha256(steps.encode()).hexdigest()[:12]}" if steps else base


def parent_parameter(kind: str) -> str:
    return f"{logical_name(kind)}ParentImageId"


def digest_parameter(kind: str) -> str:
    return f"{logical_name(kind)}InstallDigest"


def output_name(kind: str) -> str:
    return f"{logical_name(kind)}ImageId"


def build_script(org: str, kind: str, steps: str = "") -> list[Any]:
    """The component's build phase, as Fn::Join parts (the bucket, region, commit and digest are references);
    `steps` (scheduler_steps) run first, before fmcluster's own."""
    if not _ORG.fullmatch(org):
        raise ValueError(f"org {org!r}: not an org name (validation refuses it earlier)")
    head = ["set -euo pipefail\n",
            "export FMCLUSTER_BUCKET=", Ref("DataBucketName"), " FMCLUSTER_REGION=", Ref("AWS::Region"),
            f" FMCLUSTER_ORG={org}\n",
            "export AWS_DEFAULT_REGION=$FMCLUSTER_REGION\n",
            "commit=", Ref("SourceCommit"), f" kind={kind} digest=", Ref(digest_parameter(kind)), "\n"]
    body = f"""bin_dir=/usr/local/sbin
# No service a package installs starts while the image is made (invoke-rc.d's policy, Debian Policy 9.3.3).
printf '#!/bin/sh\\nexit 101\\n' >/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d
{steps}# The first boot's own S3 client and fetch (src/fmcluster/node/boot/node-user-data.sh): node-bootstrap.sh as the deploy published it.
{s3_client_writer('"$bin_dir/fmcluster-s3"')}boot={BOOTSTRAP_PREFIX}node-bootstrap.sh
"$bin_dir/fmcluster-s3" get "s3://$FMCLUSTER_BUCKET/$boot" "$bin_dir/fmcluster-bootstrap.new"
"$bin_dir/fmcluster-s3" verify "/fmcluster/$FMCLUSTER_ORG/bootstrap-index-sha256" \\
  "s3://$FMCLUSTER_BUCKET/{MANIFEST_PREFIX}index.json" "$boot" "$bin_dir/fmcluster-bootstrap.new"
chmod 0755 "$bin_dir/fmcluster-bootstrap.new" && mv -f "$bin_dir/fmcluster-bootstrap.new" "$bin_dir/fmcluster-bootstrap"
# The bundle (checked file by file), the packages and toolchain the bootstrap installs, the pinned commit.
"$bin_dir/fmcluster-bootstrap" --fetch
. /opt/fmcluster/bootstrap/converge.env
if [ "$FMCLUSTER_REF" != "$commit" ]; then
  echo "fmcluster image: the bucket's bundle is commit $FMCLUSTER_REF, not $commit: publish it first" >&2; exit 1
fi
install -d -m 0700 {WORK}
set -a; . /etc/fmcluster/node.env; set +a
PYTHONPATH={STATE}/agent/src {VENV}/bin/python -m fmcluster.node image-inventory --kind "$kind" --out {WORK}/hosts.yml
# The roles' install tasks of the pinned commit, pulled from the bundle's repository (what a node's agent pulls).
ANSIBLE_INVENTORY={WORK}/hosts.yml PATH={VENV}/bin:$PATH {VENV}/bin/ansible-pull --url {STATE}/repo.git \\
  --checkout "$commit" --directory {WORK}/pull --full --clean --limit {baked.BUILDER_NAME} --tags {baked.INSTALL_TAG} \\
  -e ansible_connection=local -e ansible_python_interpreter={VENV}/bin/python "$FMCLUSTER_PLAYBOOK"
install -d -m 0755 {baked.IMAGE_MARKER.rsplit('/', 1)[0]}
printf '{{"kind": "%s", "digest": "%s", "commit": "%s"}}\\n' "$kind" "$digest" "$commit" >{baked.IMAGE_MARKER}
# What is the node's or the build's, never the image's.
rm -rf {' '.join(baked.NOT_BAKED_ON_AWS)}
apt-get clean
cloud-init clean --logs
"""
    return head + [body]


def component_document(org: str, kind: str, steps: str = "") -> Any:
    """The AWSTOE document (YAML): one build phase, one ExecuteBash step running build_script as a literal block."""
    parts: list[Any] = [
        f"name: fmcluster-{kind}-install\n"
        f"description: fmcluster {kind} node image - the roles' install tasks (generated by "
        "fmcluster.stacks.templates.image)\n"
        "schemaVersion: 1.0\n"
        "phases:\n"
        "  - name: build\n"
        "    steps:\n"
        "      - name: InstallFromRoles\n"
        "        action: ExecuteBash\n"
        f"        timeoutSeconds: {BUILD_TIMEOUT_MINUTES * 60 - 600}\n"
        "        inputs:\n"
        "          commands:\n"
        "            - |\n"]
    indent = " " * 14
    at_line_start = True
    for part in build_script(org, kind, steps):
        if not isinstance(part, str):
            parts.append(part)
            at_line_start = False
            continue
        lines = part.split("\n")
        out = []
        for i, line in enumerate(lines):
            if i > 0:
                out.append("\n")
                at_line_start = True
            if line:
                out.append((indent if at_line_start else "") + line)
                at_line_start = False
        parts.append("".join(out))
    return join(parts)


def build(tenant: Tenant, scheduler: SchedulerStacks) -> dict[str, Any]:
    kinds = kind_images(tenant, scheduler)
    steps = scheduler_steps(scheduler)
    prefix = tenant.stack_prefix
    tag_map = {**tenant.tags}

    def map_tags(name: str, kind: str | None = None) -> dict[str, Any]:
        extra: dict[str, Any] = {"Name": f"{prefix}-{name}", "fmcluster:commit": Ref("SourceCommit")}
        if kind is not None:
            extra |= {"fmcluster:kind": kind, "fmcluster:install-digest": Ref(digest_parameter(kind))}
        return {**tag_map, **extra}

    read = [f"{BOOTSTRAP_PREFIX}*", f"{MANIFEST_PREFIX}*"]
    parameters: dict[str, Any] = {
        "VpcId": {"Type": "AWS::EC2::VPC::Id", "Description": "The tenant's VPC (network stack output VpcId)"},
        "PrivateSubnetId": subnet_id("The builders' subnet: the private one, out through the NAT gateway (network "
                                     "stack output PrivateSubnetId)"),
        "DataBucketName": bucket_name("The tenant bucket holding the published bootstrap bundle and manifest "
                                      "(storage stack output DataBucketName)"),
        "SourceCommit": {"Type": "String", "AllowedPattern": "^[0-9a-f]{40}$",
                         "Description": "The commit the images are built from: the bundle the deploy published"},
    }
    resources: dict[str, Any] = {
        "BuilderSecurityGroup": {"Type": "AWS::EC2::SecurityGroup", "Properties": {
            "GroupDescription": "fmcluster image builders: no ingress; out to S3, Systems Manager and the package "
                                "archives",
            "VpcId": Ref("VpcId"),
            "SecurityGroupEgress": [{"CidrIp": "0.0.0.0/0", "IpProtocol": "tcp", "FromPort": 443, "ToPort": 443,
                                     "Description": "HTTPS: S3, Systems Manager, Image Builder, package archives"},
                                    {"CidrIp": "0.0.0.0/0", "IpProtocol": "tcp", "FromPort": 80, "ToPort": 80,
                                     "Description": "HTTP: the distribution's package archive (apt checks signatures)"}],
            "Tags": resource_tags(tenant, "image-builder")}},
        "BuilderRole": {"Type": "AWS::IAM::Role", "Properties": {
            "Description": "fmcluster image builder: Image Builder's instance policies and the first boot's reads",
            "AssumeRolePolicyDocument": assume_role("ec2.amazonaws.com"),
            "ManagedPolicyArns": [join(["arn:", Ref("AWS::Partition"), f":iam::aws:policy/{name}"])
                                  for name in BUILDER_MANAGED_POLICIES],
            "Policies": [{"PolicyName": "fmcluster-image-builder", "PolicyDocument": {
                "Version": "2012-10-17", "Statement": [
                    {"Sid": "ListBootstrapAndManifest", "Effect": "Allow", "Action": "s3:ListBucket",
                     "Resource": bucket_arn(), "Condition": {"StringLike": {"s3:prefix": read}}},
                    {"Sid": "ReadBootstrapAndManifest", "Effect": "Allow", "Action": "s3:GetObject",
                     "Resource": [bucket_arn("/" + prefix_) for prefix_ in read]},
                    trusted_index_statement(tenant.org)]}}],
            "Tags": resource_tags(tenant, "image-builder")}},
        "BuilderInstanceProfile": {"Type": "AWS::IAM::InstanceProfile", "Properties": {
            "Roles": [Ref("BuilderRole")]}},
    }
    outputs: dict[str, Any] = {
        "SourceCommit": output("The commit the images were built from", Ref("SourceCommit"))}
    for kind, image in kinds.items():
        name = logical_name(kind)
        parameters[parent_parameter(kind)] = {
            "Type": "AWS::EC2::Image::Id",
            "Description": f"The {kind} image's base: {image.name}, resolved once from {image.ssm_parameter}, then kept"}
        parameters[digest_parameter(kind)] = {
            "Type": "String", "AllowedPattern": "^[0-9a-f]{12}$",
            "Description": f"The {kind} install set's digest (fmcluster.baked.digest), recorded on the image"}
        named = join([f"{prefix}-{kind}-", Ref("SourceCommit")])
        resources[f"{name}Component"] = {"Type": "AWS::ImageBuilder::Component", "Properties": {
            "Name": named, "Version": "1.0.0", "Platform": "Linux",
            "Description": f"fmcluster {kind} nodes: the roles' install tasks of the pinned commit",
            "Data": component_document(tenant.org, kind, steps), "Tags": map_tags(f"{kind}-component", kind)}}
        resources[f"{name}Recipe"] = {"Type": "AWS::ImageBuilder::ImageRecipe", "Properties": {
            "Name": named, "Version": "1.0.0", "ParentImage": Ref(parent_parameter(kind)),
            "Description": f"fmcluster {kind} node image on {image.name}",
            "Components": [{"ComponentArn": Ref(f"{name}Component")}],
            "WorkingDirectory": "/var/tmp",
            "Tags": map_tags(f"{kind}-recipe", kind)}}
        resources[f"{name}Infrastructure"] = {"Type": "AWS::ImageBuilder::InfrastructureConfiguration", "Properties": {
            "Name": f"{prefix}-{kind}-builder", "Description": f"Where fmcluster's {kind} image is built",
            "InstanceProfileName": Ref("BuilderInstanceProfile"),
            "InstanceTypes": [BUILDER_INSTANCE_TYPES[kind]],
            "SubnetId": Ref("PrivateSubnetId"), "SecurityGroupIds": [Ref("BuilderSecurityGroup")],
            "InstanceMetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2},
            "TerminateInstanceOnFailure": True,
            "ResourceTags": map_tags(f"{kind}-builder", kind), "Tags": map_tags(f"{kind}-builder", kind)}}
        resources[f"{name}Distribution"] = {"Type": "AWS::ImageBuilder::DistributionConfiguration", "Properties": {
            "Name": f"{prefix}-{kind}", "Description": f"fmcluster {kind} node image in the tenant's region",
            "Distributions": [{"Region": Ref("AWS::Region"), "AmiDistributionConfiguration": {
                "Name": f"{prefix}-{kind}-{{{{ imagebuilder:buildDate }}}}",
                "Description": f"fmcluster {kind} node image (fmcluster:commit, fmcluster:install-digest)",
                "AmiTags": map_tags(f"{kind}-image", kind)}}],
            "Tags": map_tags(f"{kind}-distribution", kind)}}
        resources[f"{name}Image"] = {"Type": "AWS::ImageBuilder::Image", "Properties": {
            "ImageRecipeArn": Ref(f"{name}Recipe"),
            "InfrastructureConfigurationArn": Ref(f"{name}Infrastructure"),
            "DistributionConfigurationArn": Ref(f"{name}Distribution"),
            "ImageTestsConfiguration": {"ImageTestsEnabled": False},
            "EnhancedImageMetadataEnabled": True,
            "Tags": map_tags(f"{kind}-image", kind)}}
        outputs[output_name(kind)] = output(f"The baked {kind} node image (AMI id)", GetAtt(f"{name}Image", "ImageId"))
        outputs[f"{name}InstallDigest"] = output(f"The {kind} image's install-set digest",
                                                  Ref(digest_parameter(kind)))
    return {
        "AWSTemplateFormatVersion": TEMPLATE_VERSION,
        "Description": description(
            f"fmcluster image stack for '{tenant.org}' (generated from {spec_file(tenant)}; EC2 Image Builder: one "
            f"image per node kind, {', '.join(kinds)}, from the roles' install tasks)"),
        "Metadata": metadata(),
        "Parameters": parameters,
        "Resources": resources,
        "Outputs": outputs,
    }
