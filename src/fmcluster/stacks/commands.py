"""`invoke plan|stacks|destroy|status`: the stacks operations with their exit codes and prompts."""

from __future__ import annotations

import sys
from collections.abc import Callable

from fmcluster.model import Tenant
from fmcluster.stacks.api import deploy_stacks, destroy_stacks, plan_stacks, stacks_status
from fmcluster.stacks.result import StacksResult

EXIT_FAILED = 1
EXIT_CANCELLED = 3


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


def plan(tenant: Tenant, show_templates: bool = False) -> int:
    result = plan_stacks(tenant, show_templates=show_templates)
    code = 0 if result.ok and not result.notes else EXIT_FAILED  # notes: security findings
    if tenant.scheduler == "parallelcluster":  # no cluster stack: ParallelCluster's cluster config instead
        from fmcluster.parallelcluster import commands as parallelcluster

        code = parallelcluster.plan(tenant) or code
    return code


def stacks(tenant: Tenant) -> int:
    result = deploy_stacks(tenant)
    summarize(result)
    return 0 if result.ok else EXIT_FAILED


def destroy(tenant: Tenant, yes: bool = False) -> int:
    def confirm(question: str) -> bool:
        if not sys.stdin.isatty():
            print(f"{question} Not a terminal: nothing deleted; pass --yes to confirm.")
            return False
        return input(f"{question} Type '{tenant.org}' to confirm: ").strip() == tenant.org

    result = destroy_stacks(tenant, confirm=None if yes else confirm)
    if "cancelled" in result.notes:
        return EXIT_CANCELLED
    if tenant.provider == "local":
        # The local "instances" are this machine's namespace nodes: they go with the cluster stack.
        from fmcluster.localnodes import nodes_down

        nodes_down(tenant)
        _forget_generated_state(tenant)
    return 0 if result.ok else EXIT_FAILED


def _forget_generated_state(tenant: Tenant) -> None:
    """Remove what deploy generated for nodes that no longer exist; keep the acceptance history."""
    import shutil

    from fmcluster.paths import generated_dir

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


def status(tenant: Tenant) -> int:
    result = stacks_status(tenant)
    return 0 if result.ok else EXIT_FAILED
