"""`invoke image` where the provider has no local substrate to bake on (AWS): the image stack's plan (issue 40).

Renders `fmc-<org>-image` (fmcluster.stacks.templates.image) for the pinned commit, writes it beside the other
rendered stacks (inventories/<org>/generated/cfn/fmc-<org>-image.yaml) and says, per node kind, the catalogued base image, the
builder's instance type, the install set's digest and what the stack's outputs would record. Deploying it (and
recording each kind's AMI with its commit and digest, and the cluster stack's launch templates booting a current one)
is not done yet: docs/node-convergence.md, "Baked images on AWS".
"""

from __future__ import annotations

from collections.abc import Callable

from fmcluster.exits import ExitCode
from fmcluster.model import Tenant


def plan_image_stack(tenant: Tenant, kind: str | None = None, out: Callable[[str], object] = print) -> int:
    from fmcluster import baked
    from fmcluster.publish import pinned_commit, uncommitted_changes
    from fmcluster.stacks.api import write_rendered
    from fmcluster.stacks.aws import has_credentials
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
    digests = {k: baked.committed_digest(ref, k, image.pristine(found)) for k, found in kinds.items()}
    stack = render_image_stack(tenant, scheduler_for(tenant), ref, digests)
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
    if has_credentials(tenant.region):
        out("image: deploying the image stack is not implemented yet (issue 40): `aws cloudformation deploy` of the "
            "rendered template with the parameters above builds the images; the cluster stack does not boot them yet")
        return ExitCode.FAILED
    out("image: planned only (no AWS credentials); nothing was built")
    return ExitCode.OK
