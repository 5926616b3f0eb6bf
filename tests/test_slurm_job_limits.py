"""What a job's processes inherit on a compute node: slurmd's unit as the slurm_compute role has supervised_service
write it, and slurm.conf as the slurm role writes it for an AWS tenant (stockmark: p5.48xlarge, EFA).

Every job step is a child of slurmd, so it gets slurmd's resource limits; systemd gives a service a locked-memory
limit of 8M unless its unit says otherwise (systemd-system.conf(5), DefaultLimitMEMLOCK=), and EFA/libfabric and
NCCL register far more (https://slurm.schedmd.com/faq.html#memlock). SchedMD's own slurmd.service and
ParallelCluster's set LimitMEMLOCK=infinity (and Delegate=yes, which Slurm's cgroup v2 plugin expects:
https://slurm.schedmd.com/cgroup_v2.html). Locally no job registers EFA memory, so only the rendered files can show
this. Rendered with Jinja2 as Ansible's template module does (trim_blocks), from the roles' own defaults and the
include's own vars: no ansible-playbook run.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import jinja2
import jinja2.nativetypes
import yaml

from conftest import ROOT
from fmcluster.manifest import assemble_inventory, placement_group_output_key
from fmcluster.model import load_tenant
from localtenant import manifest_for, nodes_for


def _defaults(role: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    return loaded


def _ansible_like(env: jinja2.Environment) -> jinja2.Environment:
    """The few Ansible filters and tests the templates here use."""
    env.filters["quote"] = shlex.quote
    env.filters["to_json"] = lambda value: __import__("json").dumps(value)
    env.filters["split"] = lambda value, sep=None: str(value).split(sep)
    env.filters["unique"] = lambda values: list(dict.fromkeys(values))
    env.tests["match"] = lambda value, pattern: re.match(pattern, str(value)) is not None
    return env


def slurmd_unit() -> str:
    """fmcluster-slurmd.service as a compute node gets it: the `Run slurmd` include's vars over supervised_service's
    defaults, each evaluated against the slurm and slurm_compute defaults (and a node name and controller address)."""
    tasks = yaml.safe_load((ROOT / "roles/slurm_compute/tasks/main.yml").read_text())
    include = next(t for t in tasks if t.get("ansible.builtin.include_role", {}).get("name") == "supervised_service")
    context = {**_defaults("slurm"), **_defaults("slurm_compute"), "slurm_node_name": "ip-10-0-128-4",
               "slurm_controller_address": "10.0.128.3"}
    native = _ansible_like(jinja2.nativetypes.NativeEnvironment(undefined=jinja2.StrictUndefined))

    def evaluate(value: Any) -> Any:
        if isinstance(value, str):
            return native.from_string(value).render(**context)
        if isinstance(value, list):
            return [evaluate(v) for v in value]
        return value

    variables = {**_defaults("supervised_service"), **{k: evaluate(v) for k, v in include["vars"].items()}}
    env = _ansible_like(jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined,
                                           keep_trailing_newline=True))
    return env.from_string((ROOT / "roles/supervised_service/templates/unit.service.j2").read_text()).render(
        **variables)


def service_settings(unit: str) -> dict[str, str]:
    section, found = "", {}
    for line in unit.splitlines():
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            found[key] = value
    return found


def stockmark_slurm_conf() -> str:
    """slurm.conf as stockmark's controller writes it (the slurm role's defaults under the assembled inventory)."""
    tenant = load_tenant("stockmark", ROOT)
    outputs = {placement_group_output_key(q.name): f"fmc-{tenant.org}-{q.name}-pg" for q in tenant.queues}
    manifest = manifest_for(tenant, outputs)
    inventory = assemble_inventory(manifest, nodes_for(tenant))["all"]["vars"]
    variables = {**_defaults("slurm"), **manifest["groups"]["controller"]["vars"], **inventory}
    env = _ansible_like(jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined,
                                           keep_trailing_newline=True))
    return env.from_string((ROOT / "roles/slurm/templates/slurm.conf.j2").read_text()).render(**variables)


def test_slurmd_s_unit_lets_jobs_lock_memory_as_schedmd_s_unit_does() -> None:
    unit = slurmd_unit()
    settings = service_settings(unit)
    assert settings["ExecStart"].startswith("/usr/sbin/slurmd -D -N ip-10-0-128-4 --conf-server 10.0.128.3"), unit
    assert settings.get("LimitMEMLOCK") == "infinity", unit
    assert settings.get("LimitSTACK") == "infinity", unit
    assert int(settings.get("LimitNOFILE", "0")) >= 131072, unit
    assert settings.get("Delegate") == "yes", unit


def test_other_daemons_units_set_no_extra_limits() -> None:
    """The settings are slurmd's own: supervised_service adds none by default."""
    assert _defaults("supervised_service")["supervised_service_settings"] == {}


def test_a_job_does_not_take_the_submitting_shell_s_locked_memory_limit() -> None:
    """By default Slurm hands a job the submitting shell's limits (PropagateResourceLimits=ALL): a login node's shell has
    the kernel's 8 MiB, so even an unlimited slurmd would start the job with 8 MiB (Slurm FAQ, memlock)."""
    conf = stockmark_slurm_conf()
    lines = [line for line in conf.splitlines() if line.startswith("PropagateResourceLimits")]
    assert lines == ["PropagateResourceLimitsExcept=MEMLOCK"], lines
    assert "Gres=gpu:8" in conf  # the AWS GPU shape was rendered, not a local one
