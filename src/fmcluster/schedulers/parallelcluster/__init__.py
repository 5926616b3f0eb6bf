"""Scheduler `parallelcluster`: the tenant becomes an AWS ParallelCluster 3 cluster.

The network and storage stacks stay fmcluster's; the cluster is a ParallelCluster 3 cluster config
rendered from the validated tenant and those stacks' outputs, checked by ParallelCluster's own schema
(the aws-parallelcluster package, in its own tool environment) and operated with its `pcluster` CLI.

    section.schema.json                        the tenant's `parallelcluster:` section (validation.load_schema)
    settings.parse / settings.settings_of      that section parsed (Tenant.scheduler_settings) and read back typed
    rules.check_tenant(doc, add)               fmcluster's own offline refusals (found by validation.py here)
    config.render_cluster_config(tenant, outputs) -> ClusterConfig   the config dict, its provenance, placeholders
    config.write_cluster_config(tenant, cfg) -> Path                 inventories/<org>/generated/cluster-config.yaml
    schema.check_configs([cfg, ...]) -> [SchemaReport, ...]          ParallelCluster's schema, one subprocess
    schema.tenant_problems(tenant, cfg, report) -> [Problem, ...]    its findings mapped to the tenant file
    commands.validate(tenant) / commands.plan(tenant)                what `invoke validate` / `invoke plan` add
    operations.*                                                     pcluster create/update/wait/delete/describe
    scheduler.ParallelCluster                                        the scheduler (fmcluster.schedulers.registry)
    stand_in.STAND_IN_TEMPLATE                                       the cluster stack offline (provider local)
    capabilities.yml                                                 its capabilities row (fmcluster.capabilities)

Nothing is imported here, so validation.py can use `rules` without importing the model (no import cycle).
See README.md here and docs/parallelcluster.md.
"""
