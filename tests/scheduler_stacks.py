"""The stacks functions as the commands layer calls them, with the tenant's scheduler handed in.

fmcluster.stacks looks no scheduler up (issue 41: nothing below imports the registry): `render_stacks` and the
`stacks.api` operations take the tenant's scheduler from their caller. The tests that render or deploy a bundled
tenant's stacks call these, which hand in `scheduler_for(tenant)` as fmcluster.commands does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fmcluster.model import Tenant
from fmcluster.schedulers.registry import scheduler_for
from fmcluster.stacks import api, render
from fmcluster.stacks.render import RenderedStack
from fmcluster.stacks.result import StacksResult


def render_stacks(tenant: Tenant, image_parameter: Callable[[str], str] = lambda path: path) -> list[RenderedStack]:
    return render.render_stacks(tenant, scheduler_for(tenant), image_parameter)


def deploy_stacks(tenant: Tenant, endpoint: str | None, **options: Any) -> StacksResult:
    return api.deploy_stacks(tenant, endpoint, scheduler=scheduler_for(tenant), **options)


def plan_stacks(tenant: Tenant, endpoint: str | None, **options: Any) -> StacksResult:
    return api.plan_stacks(tenant, endpoint, scheduler=scheduler_for(tenant), **options)


def destroy_stacks(tenant: Tenant, endpoint: str | None, **options: Any) -> StacksResult:
    return api.destroy_stacks(tenant, endpoint, scheduler=scheduler_for(tenant), **options)


def stacks_status(tenant: Tenant, endpoint: str | None, **options: Any) -> StacksResult:
    return api.stacks_status(tenant, endpoint, scheduler=scheduler_for(tenant), **options)
