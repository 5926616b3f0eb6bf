"""What `invoke validate` and `invoke plan` add for a parallelcluster tenant.

    validate(tenant, out) -> exit code   render (placeholders for the stack outputs) and load it through
                                          ParallelCluster's schema; refusals are problems of the tenant file
    plan(tenant, out, root) -> exit code  the same with the outputs the stacks last wrote (if any), and
                                          inventories/<org>/generated/cluster-config.yaml written

Exit codes (fmcluster.exits.ExitCode): 0 accepted; 2 (INVALID) ParallelCluster refuses a tenant value; 1 (FAILED) the check
could not run (no tool environment, the checker failed) — never a pass without the check (fail closed).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fmcluster.exits import ExitCode
from fmcluster.model import Tenant
from fmcluster.schedulers.parallelcluster.config import render_cluster_config, write_cluster_config
from fmcluster.schedulers.parallelcluster.rendered import ClusterConfig
from fmcluster.schedulers.parallelcluster.schema import SchemaReport, ToolMissing, check_configs, tenant_problems
from fmcluster.paths import repo_root

Out = Callable[[str], object]

#: What only `pcluster create-cluster --dryrun true` can check, because it needs AWS (said after each check).
NEEDS_AWS = ("whether the reservations really are what the tenant says (type, zone, size, kind), the instance "
             "types' offering in the zone, and that the subnets, security groups, key pair, IAM policies, FSx file "
             "systems and bootstrap object exist as named")


def report_check(cfg: ClusterConfig, report: SchemaReport, out: Out) -> int:
    """Print one config's report; the exit code it earns."""
    root = repo_root()
    try:
        shown: Path = cfg.spec_path.resolve().relative_to(root.resolve())
    except ValueError:
        shown = cfg.spec_path
    for finding in report.warnings:
        out(f"  ParallelCluster {finding.level.lower()} ({finding.validator}) at {finding.where}: {finding.message}")
    problems = tenant_problems(cfg, report)
    if problems or not report.ok:
        for problem in problems:
            out(problem.render(root))
        out(f"{len(problems)} problem(s) ParallelCluster {report.pcluster_version} refuses in {shown}; "
            "nothing was deployed or changed.")
        return ExitCode.INVALID
    out(f"ParallelCluster {report.pcluster_version}'s schema loads the cluster config of {cfg.cluster_name} as "
        f"{report.loaded_as}; every validator it registers ran, with the EC2/FSx answers fmcluster holds (instance "
        "catalog, tenant, rendered network and storage stacks; fmcluster.schedulers.parallelcluster.offline_aws), and found "
        "no error.")
    if report.needs_aws:
        asked = sorted({f"{n.validator} ({n.call})" for n in report.needs_aws})
        out(f"  {len(asked)} validator call(s) only AWS answers, run by `pcluster create-cluster --dryrun true` at "
            f"deploy: {', '.join(asked)}.")
    out(f"  checked on AWS only: {NEEDS_AWS}; the capacity pre-flight (`invoke plan`/`deploy` with AWS "
        "credentials) asks EC2 for the reservations and Service Quotas before any stack changes.")
    return 0


def check_rendered(cfg: ClusterConfig, out: Out) -> int:
    """One rendered config through ParallelCluster's schema (validate, plan and deploy alike)."""
    try:
        (report,) = check_configs([cfg])
    except (ToolMissing, RuntimeError, OSError) as err:
        out(f"ParallelCluster's schema check did not run: {err}")
        out("the cluster config is NOT validated; nothing was deployed or changed.")
        return ExitCode.FAILED
    return report_check(cfg, report, out)


def validate(tenant: Tenant, out: Out = print) -> int:
    """The tenant's cluster config (stack outputs as placeholders) through ParallelCluster's own schema."""
    return check_rendered(render_cluster_config(tenant), out)


def plan(tenant: Tenant, out: Out = print, root: Path | None = None) -> int:
    """Render generated/cluster-config.yaml from the tenant and the outputs the stacks last wrote, and check it."""
    from fmcluster.stacks.outputs import read_stack_outputs

    from fmcluster.schedulers.parallelcluster.custom_ami import baked_amis

    outputs = read_stack_outputs(tenant.org, root)
    chosen, refusals, said = baked_amis(tenant, None)  # offline: whether each AMI still exists is the deploy's check
    cfg = render_cluster_config(tenant, outputs, chosen)
    path = write_cluster_config(cfg, root)
    out(f"[cluster] {cfg.cluster_name}  (AWS ParallelCluster 3; fmcluster.schedulers.parallelcluster.config)")
    for line in said:
        out(f"  image: {line}")
    for line in refusals:
        out(f"  REFUSED: {line}")
    out(f"  rendered the cluster config to {path}")
    if cfg.placeholders:
        out(f"  placeholders for stack outputs not known yet ({'no stacks deployed' if not outputs else 'not in the outputs'}): "
            + ", ".join(cfg.placeholders))
    out(f"  on deploy: pcluster create-cluster -n {cfg.cluster_name} --dryrun true, then for real "
        "(update-cluster once it exists)")
    checked = check_rendered(cfg, out)
    return checked or (1 if refusals else 0)
