"""Schedulers: one folder each, owning everything that differs between them.

    schedulers/<name>/scheduler.py      the class (the protocol: fmcluster.schedulers.protocol.Scheduler)
    schedulers/<name>/capabilities.yml  what the rest of fmcluster may know of it (fmcluster.capabilities)
    schedulers/<name>/template.py       its cluster stack, when fmcluster renders one (a ClusterTemplate)
    schedulers/<name>/README.md         what it is, what it makes, where its docs are
    schedulers/<name>/rules.py          its own validation rules, when it has any: check_tenant(tenant, add),
                                        found through its folder (fmcluster.validation.scheduler_rules)
    schedulers/<name>/section.schema.json  its own tenant section (capabilities.yml's own_section), placed in the
                                        tenant schema by fmcluster.validation.load_schema; section_parser names the
                                        function of the folder that makes Tenant.scheduler_settings of it
    schedulers/registry.py              one line per scheduler: which class serves `scheduler: <name>`

Nothing is imported here, so a module may import a scheduler's rules or template without loading every scheduler.
"""
