"""`invoke image` where the provider has no local substrate to bake on (AWS): the image stack (issue 40).

Renders `fmc-<org>-image` (fmcluster.stacks.templates.image) for the pinned commit, writes it beside the other
rendered stacks (inventories/<org>/generated/cfn/fmc-<org>-image.yaml) and says, per node kind, the catalogued base
image, the builder's instance type, the install set's digest and the stack's output. With AWS credentials it then
deploys the stack through the deploy's own path (fmcluster.stacks.api.deploy_image_stack: security gate, change set,
the wait while Image Builder builds) and records each kind's AMI with the commit and install set it was built from
(fmcluster.baked.Record, the local substrate's record: baked.record_path). The cluster stack boots a recorded AMI
while it is current and refuses a stale one (fmcluster.stacks.render.BakedImageRef). docs/local-nodes.md, "Baked
images on AWS".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from fmcluster.exits import ExitCode
from fmcluster.model import Tenant

if TYPE_CHECKING:
    from fmcluster.capabilities import ApiCapabilities
    from fmcluster.providers import Provider

Out = Callable[[str], object]


def plan_image_stack(tenant: Tenant, kind: str | None = None, out: Out = print,
                     provider: Provider | None = None) -> int:
    """Render the image stack and, where `provider` (default: the tenant's) reaches its AWS APIs (on AWS: with
    credentials), build and record, through its endpoint, its image parameters and its APIs' capabilities."""
    from fmcluster import baked
    from fmcluster.providers import NoEndpoint
    from fmcluster.providers.registry import provider_for
    from fmcluster.publish import SOURCE_ROOT, pinned_commit, uncommitted_changes
    from fmcluster.stacks.api import write_rendered
    from fmcluster.stacks.render import render_image_stack
    from fmcluster.schedulers.registry import scheduler_for
    from fmcluster.stacks.templates import image

    try:
        kinds = image.kind_images(tenant, scheduler_for(tenant))
    except ValueError as err:
        out(f"image: {err}")
        return ExitCode.FAILED
    if kind is not None and kind not in kinds:
        out(f"image: '{tenant.org}' has no {kind} nodes; its stack builds every kind it has: {', '.join(kinds)}")
        kind = None
    ref = pinned_commit()
    # the checkout the bundle is made from, not $FMCLUSTER_ROOT (the tenants' inventories may live elsewhere)
    steps = image.scheduler_steps(scheduler_for(tenant))
    digests = {k: baked.committed_digest(ref, k, image.pristine(found, steps), SOURCE_ROOT) for k, found in kinds.items()}
    provider = provider or provider_for(tenant)
    stack = render_image_stack(tenant, scheduler_for(tenant), ref, digests, provider.image_parameter)
    path = write_rendered(tenant, [stack]) / f"{stack.name}.yaml"
    out(f"image stack {stack.name} (EC2 Image Builder), rendered to {path} ({len(stack.body)} bytes)")
    out(f"  commit {ref}{' (the working tree has uncommitted changes: they are not in it)' if uncommitted_changes() else ''}")
    for name, found in kinds.items():
        if kind is not None and name != kind:
            continue
        out(f"  {name}: on {found.name} ({found.ssm_parameter}, resolved once, then kept), built on a "
            f"{image.BUILDER_INSTANCE_TYPES[name]}; install set {digests[name]}; output {image.output_name(name)}")
    for key, value in stack.parameters.items():
        if not isinstance(value, str):
            out(f"  parameter {key}: {value.describe()}")
    try:
        endpoint = provider.endpoint(False, out)
    except NoEndpoint as err:
        out(f"image: planned only ({err}); nothing was built")
        return ExitCode.OK
    return build_images(tenant, stack, kinds, digests, ref, endpoint, provider.capabilities.apis, out)


def build_images(tenant: Tenant, stack: Any, kinds: dict[str, Any], digests: dict[str, str], ref: str,
                 endpoint: str | None, apis: ApiCapabilities, out: Out) -> int:
    """Deploy the rendered image stack, then record each kind's AMI (its output) with `ref` and its digest."""
    from fmcluster import baked
    from fmcluster.stacks import aws
    from fmcluster.schedulers.registry import scheduler_for
    from fmcluster.stacks.api import deploy_image_stack
    from fmcluster.stacks.templates import image

    steps = image.scheduler_steps(scheduler_for(tenant))  # as plan_image_stack's digests name the base
    refused = published_elsewhere(tenant, ref, endpoint, apis)
    if refused:
        out(f"image: {refused}; nothing built, nothing recorded")
        return ExitCode.FAILED
    out("image: Image Builder takes an hour or more per kind; the stack's create or update waits for it")
    started = time.monotonic()
    outcome = deploy_image_stack(tenant, endpoint, stack, out, apis)
    if outcome.failure is not None or outcome.action in ("failed", "not-attempted"):
        for note in outcome.notes:
            out(f"  {note}")
        out("image: nothing recorded; the cluster keeps booting what it boots")
        return ExitCode.FAILED
    seconds = round(time.monotonic() - started, 1)
    ec2 = aws.client("ec2", tenant.region, endpoint, apis)
    recorded: list[str] = []
    for name, found in kinds.items():
        ami = outcome.outputs.get(image.output_name(name))
        if not ami:
            why = apis.image_builder_missing or f"{stack.name} holds no image"
            out(f"  {name}: no AMI (output {image.output_name(name)} absent: {why}); nothing recorded")
            continue
        record = baked.Record(tenant.org, name, digests[name], image.pristine(found, steps), ref, baked.pins(),
                              datetime.now(timezone.utc).isoformat(timespec="seconds"), _ami_bytes(ec2, ami), ami,
                              seconds)
        try:
            path = baked.write_record(record)
        except ValueError as err:
            out(f"  {name}: {err}")
            continue
        recorded.append(name)
        out(f"  {name}: {ami} (install set {digests[name]}, commit {ref[:12]}) recorded in {path}; the cluster's "
            f"{name} nodes boot it from the next `invoke deploy --org={tenant.org}` while that commit's install set is "
            f"{digests[name]}")
    rotate_images(tenant, recorded, ec2, aws.client("cloudformation", tenant.region, endpoint, apis), out)
    return ExitCode.OK if len(recorded) == len(kinds) else ExitCode.FAILED


def rotate_images(tenant: Tenant, kinds: list[str], ec2: Any, cf: Any, out: Out) -> None:
    """After a new image of each of `kinds` is recorded: keep the newest baked_images.keep of each, and every AMI the
    cluster boots; deregister the others with their snapshots (fmcluster.baked.rotate, stacks.api.deregister_image)."""
    from fmcluster import baked
    from fmcluster.stacks.api import amis_in_use, deregister_image

    from botocore.exceptions import BotoCoreError, ClientError

    if not kinds:
        return

    def remove(record: baked.Record) -> list[str]:
        if not record.layer.startswith("ami-"):
            raise ValueError(f"{record.layer} is not an AMI id")
        try:
            return deregister_image(ec2, record.layer)
        except (ClientError, BotoCoreError) as err:
            raise RuntimeError(str(err)) from err

    try:
        in_use = amis_in_use(tenant, cf, ec2)
    except (ClientError, BotoCoreError) as err:  # what the cluster boots unknown: nothing is removed
        out(f"  earlier images kept: cannot tell which AMIs the cluster boots ({err})")
        return
    for kind in kinds:
        for line in baked.rotate(tenant.org, kind, tenant.baked_images.keep, in_use, remove):
            out(f"  {line}")


def published_elsewhere(tenant: Tenant, ref: str, endpoint: str | None, apis: ApiCapabilities) -> str | None:
    """Why the builders could not build `ref`, or None: they fetch the bundle and manifest the last deploy published
    to the tenant's bucket, and the component stops on another commit (fmcluster.stacks.templates.image) — after an
    instance has been started. Read before any stack is touched. No bucket yet: None (the image stack's deploy says
    to deploy first)."""
    import json

    from botocore.exceptions import ClientError

    from fmcluster.publish import MANIFEST_KEY
    from fmcluster.stacks import aws
    from fmcluster.stacks.changesets import stack_outputs, stack_status

    cf = aws.client("cloudformation", tenant.region, endpoint, apis)
    bucket = stack_outputs(stack_status(cf, f"{tenant.stack_prefix}-storage")).get("DataBucketName")
    if not bucket:
        return None
    fix = f"run `invoke deploy --org={tenant.org}` from commit {ref[:12]} first, then `invoke image` again"
    try:
        body = aws.client("s3", tenant.region, endpoint, apis).get_object(Bucket=bucket, Key=MANIFEST_KEY)["Body"].read()
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return f"nothing is published in s3://{bucket}/ for the builders to fetch: {fix}"
        raise
    published = str(json.loads(body).get("ref", ""))
    if published != ref:
        return f"s3://{bucket}/ holds the bundle of commit {published[:12] or '?'}, not {ref[:12]}: {fix}"
    return None


def _ami_bytes(ec2: Any, ami: str) -> int:
    """The AMI's volumes, as EC2 describes them (GiB each): what each kept image costs in snapshots at most."""
    images = ec2.describe_images(ImageIds=[ami])["Images"]
    return sum(int(m.get("Ebs", {}).get("VolumeSize", 0)) for i in images for m in i.get("BlockDeviceMappings") or []
               ) * 2**30


def image_status(tenant: Tenant, endpoint: str | None, reachable: bool) -> list[str]:
    """`invoke status`: each kind's recorded baked images (fmcluster.baked.status_lines), whether the cluster boots
    each (`reachable`: the provider's APIs can be asked; else said unknown) and whether each is current against the
    install set of the commit a deploy would publish. An unreadable record is said, never skipped."""
    from botocore.exceptions import BotoCoreError, ClientError

    from fmcluster import baked
    from fmcluster.capabilities import provider_capabilities
    from fmcluster.publish import SOURCE_ROOT, pinned_commit
    from fmcluster.schedulers.registry import scheduler_for
    from fmcluster.stacks import aws
    from fmcluster.stacks.api import amis_in_use
    from fmcluster.stacks.templates import image

    notes: list[str] = []
    in_use: set[str] = set()
    try:
        recorded = {kind for kind in baked.IMAGE_KINDS if baked.kept_records(tenant.org, kind)}
        if not recorded:  # nothing to compare: the install set's digests (a git archive each) are not computed
            return [f"baked images of '{tenant.org}': {baked.status_lines(tenant.org, {}, set())[0]}"]
        ref = pinned_commit()
        kinds = {baked.image_kind(acc) for acc in image.tenant_accelerators(tenant)} & recorded
        if provider_capabilities(tenant.provider).bakes_images:  # the local substrate's layers
            from fmcluster.providers.local import layers
            from fmcluster.providers.local.hosts import load_hosts

            current = {kind: layers.install_digest(ref, kind) for kind in kinds}
            in_use = layers.layers_in_use(load_hosts(tenant.org))
        else:  # each kind's digest over the image the scheduler boots it on, as its bake names it
            from fmcluster.images import load_images

            catalog, scheduler = load_images(), scheduler_for(tenant)
            current = {kind: baked.committed_digest(
                ref, kind, image.pristine(catalog[scheduler.image(baked.KIND_ACCELERATOR[kind])]), SOURCE_ROOT)
                for kind in kinds}
            if reachable:
                apis = provider_capabilities(tenant.provider).apis
                in_use = amis_in_use(tenant, aws.client("cloudformation", tenant.region, endpoint, apis),
                                     aws.client("ec2", tenant.region, endpoint, apis))
            else:
                notes.append("(AWS's APIs are not reachable: which AMI the cluster boots is not known)")
        return [f"baked images of '{tenant.org}' (keep {tenant.baked_images.keep} per kind):"] + [
            f"  {line}" for line in baked.status_lines(tenant.org, current, in_use) + notes]
    except (ValueError, RuntimeError, ClientError, BotoCoreError) as err:
        return [f"baked images of '{tenant.org}': cannot say ({err})"]
