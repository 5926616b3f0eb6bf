"""Stack-level helpers of the command layer: the closing summary of a stacks run, forgetting generated state."""

from __future__ import annotations

import shutil
from collections.abc import Callable

from fmcluster.model import Tenant
from fmcluster.paths import generated_dir
from fmcluster.stacks.result import StacksResult


def summarize(result: StacksResult, out: Callable[[str], object] = print) -> None:
    """The closing lines: what changed, what was skipped, what the emulator did not create."""
    if result.changed:
        out(f"changed: {', '.join(result.changed)}")
    if result.skipped:
        out(f"unchanged (skipped): {', '.join(result.skipped)}")
    for stack, items in result.not_created.items():
        out(f"not created by the emulator in {stack}: " + ", ".join(f"{lid} ({rtype})" for lid, rtype in items))
    if result.failure:
        out(f"FAILED: {result.failure.render()}")


def forget_generated_state(tenant: Tenant) -> None:
    """Remove what deploy generated for a cluster that no longer exists; keep the acceptance history."""
    generated = generated_dir(tenant.org)
    if not generated.is_dir():
        return
    for entry in generated.iterdir():
        if entry.name == "acceptance":
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if (generated / "acceptance").is_dir():
        print(f"kept the acceptance history in {generated / 'acceptance'}")
