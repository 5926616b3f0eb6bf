"""The CloudFormation templates, one module per stack, each `build(tenant, ...) -> dict`.

They are Python data on purpose (see fmcluster.stacks.cfn): tenant values are leaves, never text a
parser reads again, so no value can add or change a resource. `fmcluster.stacks.render` dumps them;
`invoke plan` writes the dumped YAML to inventories/<org>/generated/cfn/ for review.
"""
