"""`invoke new-tenant`: render cookiecutters/tenant into inventories/<org>, then validate it."""

from __future__ import annotations

import shutil
from pathlib import Path

from cookiecutter.main import cookiecutter

from fmcluster.model import Tenant, load_spec
from fmcluster.paths import inventories_dir, repo_root
from fmcluster.validation import ORG_PATTERN


class TenantExists(Exception):
    pass


def template_dir(root: Path | None = None) -> Path:
    return (root or repo_root()) / "cookiecutters" / "tenant"


def new_tenant(
    org: str | None,
    answers: dict[str, str],
    *,
    interactive: bool = False,
    force: bool = False,
    output_dir: Path | None = None,
) -> Tenant:
    """Render a tenant and return it validated. Refuses to overwrite an existing tenant unless force."""
    target_root = output_dir or inventories_dir()
    if org is not None:
        if not ORG_PATTERN.match(org):
            raise ValueError(f"--org '{org}' is not a safe name: use 2-24 lower-case letters, digits and dashes")
        answers = {"org": org, **answers}
        existing = target_root / org
        if existing.exists() and not force:
            raise TenantExists(f"{existing} already exists; pass --force to overwrite it")
        if existing.exists() and force:
            shutil.rmtree(existing)
    target_root.mkdir(parents=True, exist_ok=True)
    rendered = Path(
        cookiecutter(
            str(template_dir()),
            no_input=not interactive,
            extra_context=answers,
            output_dir=str(target_root),
            overwrite_if_exists=force,
        )
    )
    return load_spec(rendered / "group_vars" / "all" / "tenant.yml")
