"""CloudFormation stacks of a tenant: render (templates/*.py, dumped to YAML), plan, deploy, destroy, status.

The deploy flow calls `fmcluster.stacks.api.deploy_stacks(tenant)`; see that module."""
