"""The operator commands, in one package: every function here is one task of tasks.py (invoke) and of the
`fmcluster` CLI, takes plain values and returns its exit code (fmcluster.exits.ExitCode). tasks.py only wraps
them; the logic they call lives in the library modules.

- cluster: validate, plan, deploy, stacks, destroy, status, nodes-up, image, halt, slurm, acceptance, nodes, replace, usage
- diagnose: doctor, fleet (over fmcluster.doctor)
- tenant: new-tenant (over fmcluster.scaffold)
- reference: nccl-env, dashboards, schema-doc (what fmcluster knows, no tenant needed)
- acceptance_cli: `fmcluster acceptance parse` (argparse subcommands the CLI registers)
- stack_helpers: the closing summary of a stacks run, forgetting a destroyed cluster's generated state
"""

from __future__ import annotations

from fmcluster.commands.cluster import (
    acceptance, deploy, destroy, halt, image, nodes, nodes_up, plan, replace, require_tenant, slurm, stacks, status, usage,
    validate,
)
from fmcluster.commands.diagnose import doctor, fleet
from fmcluster.commands.reference import dashboards, nccl_env, schema_doc
from fmcluster.commands.tenant import new_tenant

__all__ = ["acceptance", "dashboards", "deploy", "destroy", "doctor", "fleet", "halt", "image", "nccl_env", "new_tenant", "nodes",
           "nodes_up", "plan", "replace", "require_tenant", "schema_doc", "slurm", "stacks", "status", "usage", "validate"]
