"""Which baked AMI each node group of a ParallelCluster tenant boots (`CustomAmi`, issue 40): the recorded image of
its kind while current (fmcluster.baked.aws_image), decided before the cluster config is rendered
(fmcluster.schedulers.parallelcluster.config `baked_amis`). Imports nothing of the deploy's (publish, stacks.api),
which import the scheduler registry."""

from __future__ import annotations

from typing import Any

from fmcluster import baked
from fmcluster.capabilities import provider_capabilities
from fmcluster.images import load_images
from fmcluster.model import Tenant
from fmcluster.paths import source_root
from fmcluster.schedulers.parallelcluster.rules import DEFAULT_OS, official_image
from fmcluster.schedulers.parallelcluster.settings import settings_of
from fmcluster.stacks.aws import ami_available
from fmcluster.stacks.templates.image import pristine, tenant_accelerators


def baked_amis(tenant: Tenant, ec2: Any | None) -> tuple[dict[str, str], list[str], list[str]]:
    """Image kind → the baked AMI its node groups boot (`CustomAmi`), the refusals and what to say: a recorded image
    while it is current (baked on ParallelCluster's official image of the kind from this commit's install set) and,
    `ec2` given, available; a stale or vanished one refused (fmcluster.baked.aws_image: never booted, never swapped
    for the official AMI silently). A provider that bakes its own images (the local substrate's layers) has no AMI."""
    chosen: dict[str, str] = {}
    refusals: list[str] = []
    lines: list[str] = []
    if provider_capabilities(tenant.provider).bakes_images:
        return chosen, refusals, lines
    settings = settings_of(tenant)
    official = load_images()[official_image(settings.os if settings else DEFAULT_OS)]  # every node's (Image/Os)
    ref = ""
    for kind in sorted({baked.image_kind(acc) for acc in tenant_accelerators(tenant)}):
        record = baked.read_record(baked.record_path(tenant.org, kind))
        if record is None:
            continue
        ref = ref or baked.head_commit(source_root())  # only where a record is there to compare
        current = baked.committed_digest(ref, kind, pristine(official), source_root())
        try:
            ami = baked.aws_image(tenant.org, kind, record, current, ec2 is None or ami_available(ec2, record.layer))
        except baked.BakedImageRefused as err:
            refusals.append(str(err))
            continue
        if ami is not None:
            chosen[kind] = ami
            lines.append(f"{kind} nodes: CustomAmi {ami}, the baked {kind} image (install set {record.digest}, commit "
                         f"{record.commit[:12]})" + ("; not checked offline that it still exists" if ec2 is None else ""))
    return chosen, refusals, lines
