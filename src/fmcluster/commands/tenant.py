"""`invoke new-tenant`: scaffold inventories/<org> from cookiecutters/tenant (fmcluster.scaffold), mapping the
task's options onto the cookiecutter's answers."""

from __future__ import annotations

import sys
from pathlib import Path

from fmcluster.exits import ExitCode
from fmcluster.model import TenantInvalid
from fmcluster.paths import repo_root
from fmcluster.scaffold import TenantExists, new_tenant as render


def new_tenant(org: str = "", instance_type: str = "", count: str = "", scheduler: str = "", region: str = "",
               provider: str = "", force: bool = False, output_dir: str = "") -> int:
    """Render the tenant (prompting when run bare in a terminal) and describe it; a refusal is said on stderr."""
    answers = {
        k: str(v)
        for k, v in {
            "instance_type": instance_type, "count": count, "scheduler": scheduler,
            "region": region, "provider": provider,
        }.items()
        if v
    }
    if region:
        answers["availability_zone"] = f"{region}a"
    interactive = not org and sys.stdin.isatty()
    if not org and not interactive:
        print("new-tenant: pass --org=NAME (or run it in a terminal to be prompted)", file=sys.stderr)
        return ExitCode.INVALID
    try:
        tenant = render(org or None, answers, interactive=interactive, force=force,
                        output_dir=Path(output_dir) if output_dir else None)
    except (TenantExists, ValueError) as err:
        print(f"new-tenant: {err}", file=sys.stderr)
        return ExitCode.INVALID
    except TenantInvalid as err:
        print(f"new-tenant: the rendered tenant is not valid:\n{err.render(repo_root())}", file=sys.stderr)
        return ExitCode.INVALID
    print(tenant.describe())
    print(f"written to {tenant.spec_path.parent.parent.parent}; next: invoke plan --org={tenant.org}")
    return ExitCode.OK
