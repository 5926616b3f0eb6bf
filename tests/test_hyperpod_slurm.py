"""HyperPod runs one Slurm, HyperPod's own: nothing fmcluster renders, uploads or converges installs Slurm or munge
on a HyperPod node, and the roles that work around Slurm get HyperPod's paths.

Real here: the rendered cluster template, the lifecycle files the deploy uploads (and the first-boot scripts they
run), the manifest the deploy publishes and the inventory the node agent assembles from it, the playbooks as
Ansible reads them, and Ansible's own templating deciding each role's `when` with those variables. The lifecycle's
role helper runs as a program on a resource config shaped like the one HyperPod writes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from fmcluster.paths import NODE_BOOT_DIR
from role_helpers import trusted
from fmcluster.manifest import assemble_inventory
from fmcluster.model import Tenant, load_tenant
from fmcluster.schedulers.protocol import SITE_PLAYBOOK
from fmcluster.schedulers.hyperpod.scheduler import SLURM_BIN_DIR, SLURM_CONF_DIR, HyperPod
from fmcluster.stacks.render import load_cfn_yaml
from scheduler_stacks import render_stacks
from localtenant import manifest_for, nodes_for

HYPERPOD_ORG = "neuronlab"
#: Slurm's and munge's Debian/Ubuntu packages (slurmctld, slurmd, slurm-client, slurmdbd, slurm-wlm*, munge, libpmix…
#: are not Slurm): what a second Slurm would come from.
SLURM_PACKAGE = re.compile(r"^(slurm[a-z0-9.+-]*|munge|libmunge[a-z0-9-]*)$")
#: A command installing packages in a shell script or a template.
INSTALL = re.compile(r"\b(?:apt-get|apt|dnf|yum|pip3?|python3 -m pip)\s+(?:-\S+\s+)*install\b([^\n;&|]*)")


def hyperpod() -> Tenant:
    tenant = load_tenant(HYPERPOD_ORG, ROOT)
    assert tenant.scheduler == "hyperpod"
    return tenant


# --- the roles and plays that install Slurm or munge, found in the playbooks themselves -----------------------

def load(path: Path) -> Any:
    """A playbook's or role's YAML as Ansible loads it (its templates trusted as templates, as Ansible's are)."""
    from ansible.parsing.dataloader import DataLoader

    return DataLoader().load_from_file(str(path), trusted_as_template=True)


def plays(playbook: Path) -> Iterator[dict[str, Any]]:
    for entry in load(playbook):
        if "ansible.builtin.import_playbook" in entry:
            yield from plays(playbook.parent / entry["ansible.builtin.import_playbook"])
        else:
            yield entry


def role_uses(play: Mapping[str, Any]) -> Iterator[tuple[str, list[str], dict[str, Any]]]:
    """(role, its `when` conditions, vars) for each role a play runs: `roles:` entries and include/import_role tasks."""
    for entry in play.get("roles") or []:
        entry = {"role": entry} if isinstance(entry, str) else entry
        yield entry["role"], _conditions(entry.get("when")), dict(entry.get("vars") or {})
    for task in [*(play.get("pre_tasks") or []), *(play.get("tasks") or []), *(play.get("post_tasks") or [])]:
        for key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
            if key in task:
                yield task[key]["name"], _conditions(task.get("when")), dict(task.get("vars") or {})


def _conditions(when: Any) -> list[str]:
    return [] if when is None else [str(c) for c in (when if isinstance(when, list) else [when])]


def role_tasks(role: str) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    for path in sorted((ROOT / "roles" / role / "tasks").glob("*.yml")):
        tasks += [t for t in load(path) or [] if isinstance(t, dict)]
    return tasks


def role_defaults(role: str) -> dict[str, Any]:
    path = ROOT / "roles" / role / "defaults" / "main.yml"
    return dict(load(path) or {}) if path.is_file() else {}


def templar(variables: Mapping[str, Any]) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    return Templar(loader=DataLoader(), variables=trusted(dict(variables)))


def installed_packages(role: str, variables: Mapping[str, Any]) -> set[str]:
    """The package names a role's package/apt tasks name (templated with its defaults and `variables`), whatever
    their `when`: what the role installs where it runs. A name only known from facts at run time (the Neuron
    packages a node lacks) stays its expression, which must not name Slurm or munge."""
    from ansible.errors import AnsibleUndefinedVariable

    names: set[str] = set()
    t = templar({**role_defaults(role), **variables})
    for task in role_tasks(role):
        for module in ("ansible.builtin.package", "ansible.builtin.apt"):
            if module in task and isinstance(task[module], dict) and "name" in task[module]:
                try:
                    value = t.template(task[module]["name"])
                except AnsibleUndefinedVariable:
                    value = str(task[module]["name"])
                    assert not re.search(r"slurm|munge", value), (role, value, "resolve it here to check it")
                names |= {str(v) for v in (value if isinstance(value, list) else [value])}
    return names


def slurm_installers() -> dict[str, set[str]]:
    """Role → the Slurm/munge packages it installs, for every role a play of the site playbook runs."""
    roles = {role for play in plays(ROOT / SITE_PLAYBOOK) for role, _, _ in role_uses(play)}
    found = {role: {p for p in installed_packages(role, {}) if SLURM_PACKAGE.match(p)} for role in sorted(roles)}
    return {role: packages for role, packages in found.items() if packages}


def runs(conditions: list[str], variables: Mapping[str, Any]) -> bool:
    t = templar(variables)
    return all(t.evaluate_conditional(trusted(c)) for c in conditions)


def installing_uses(inventory: Mapping[str, Any], tmp_path: Path) -> list[tuple[str, str, str]]:
    """(play, role, host) of every Slurm/munge-installing role that would run with this inventory: Ansible's own
    inventory resolves each play's host pattern and each host's variables; the play's and the role's `when`, with
    the play's vars, are templated by Ansible."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(dict(inventory)))
    loader = DataLoader()
    hosts = InventoryManager(loader=loader, sources=[str(path)])
    variables = VariableManager(loader=loader, inventory=hosts)
    installers = slurm_installers()
    found = []
    for play in plays(ROOT / SITE_PLAYBOOK):
        for host in hosts.get_hosts(play["hosts"]):
            play_vars = {**variables.get_vars(host=host), **(play.get("vars") or {})}
            if not runs(_conditions(play.get("when")), play_vars):
                continue
            found += [(str(play.get("name")), role, host.name) for role, conditions, role_vars in role_uses(play)
                      if role in installers and runs(conditions, {**play_vars, **role_vars})]
    return found


def inventory_of(tenant: Tenant) -> dict[str, Any]:
    """The inventory a node of the tenant converges with (the manifest the deploy publishes, every node up)."""
    return assemble_inventory(manifest_for(tenant), nodes_for(tenant))


# --- the tests ----------------------------------------------------------------------------------------------

def test_the_playbooks_have_slurm_and_munge_installing_roles_for_this_test_to_find() -> None:
    installers = slurm_installers()
    assert {"munge", "slurm_controller", "slurm_compute"} <= set(installers), installers
    assert "munge" in installers["munge"] and "slurmctld" in installers["slurm_controller"]


def test_no_play_installs_slurm_or_munge_on_a_hyperpod_node(tmp_path: Path) -> None:
    inventory = inventory_of(hyperpod())
    assert installing_uses(inventory, tmp_path) == [], "HyperPod ships its own Slurm and munge under /opt/slurm"


def test_fmcluster_installs_its_own_slurm_where_the_scheduler_is_slurm_ec2(tmp_path: Path) -> None:
    """The same evaluation, on a scheduler whose Slurm is fmcluster's: it finds the installing roles on the nodes
    that need them (so an empty answer above means skipped, not unseen)."""
    uses = installing_uses(inventory_of(load_tenant("stockmark", ROOT)), tmp_path)
    assert {role for _, role, _ in uses} >= {"munge", "slurm_controller", "slurm_compute", "slurm_login"}, uses
    assert len({host for _, role, host in uses if role == "munge"}) == len(nodes_for(load_tenant("stockmark", ROOT)))


def test_the_hyperpod_manifest_hands_the_roles_hyperpods_slurm() -> None:
    variables = inventory_of(hyperpod())["all"]["vars"]
    # Who installs Slurm, as the playbooks read it (the manifest's fmcluster_slurm_from; with fmcluster's
    # capabilities, fmcluster_capabilities.slurm_owner): never fmcluster on HyperPod.
    owner = (variables.get("fmcluster_capabilities") or {}).get("slurm_owner", variables.get("fmcluster_slurm_from"))
    assert owner in ("hyperpod", "scheduler"), owner
    assert variables["slurm_conf_dir"] == SLURM_CONF_DIR == "/opt/slurm/etc"
    assert variables["node_health_commands"]["scontrol"] == [f"{SLURM_BIN_DIR}/scontrol"] == ["/opt/slurm/bin/scontrol"]
    # The health program's slurm.conf on the controller is HyperPod's; compute nodes read slurmd's configless cache.
    t = templar({**role_defaults("node_health"), **variables, "node_health_node_name": "ip-10-1-0-5"})
    assert t.template(trusted(role_defaults("node_health")["node_health_slurm_conf"])) == "/var/spool/slurmd/conf-cache/slurm.conf"
    cluster = templar({**role_defaults("node_health"), **variables, "node_health_node_name": "c",
                       "node_health_scope": "cluster"})
    assert cluster.template(trusted(role_defaults("node_health")["node_health_slurm_conf"])) == "/opt/slurm/etc/slurm.conf"


def test_the_rendered_hyperpod_template_and_lifecycle_install_no_slurm_package() -> None:
    tenant = hyperpod()
    cluster = next(s for s in render_stacks(tenant) if s.key == "cluster")
    resources = load_cfn_yaml(cluster.body)["Resources"]
    assert [r["Type"] for r in resources.values() if r["Type"].startswith("AWS::EC2::")] == [], \
        "no instance or launch template of ours: HyperPod makes the instances"
    (sagemaker,) = [r for r in resources.values() if r["Type"] == "AWS::SageMaker::Cluster"]
    assert sagemaker["Properties"]["NodeRecovery"] == "Automatic", "node recovery stays HyperPod's"
    accelerated = [g for g in sagemaker["Properties"]["InstanceGroups"] if g["InstanceType"].startswith("ml.trn")]
    assert accelerated and all(g["OnStartDeepHealthChecks"] == ["InstanceStress", "InstanceConnectivity"]
                               for g in accelerated), "deep health checks stay HyperPod's"
    texts = {"cluster template": cluster.body}
    texts.update({f"lifecycle {name}": body.decode() for name, body in HyperPod(tenant).lifecycle_files("b").items()})
    texts["node-bootstrap.sh (what node-user-data.sh fetches and runs)"] = (NODE_BOOT_DIR / "node-bootstrap.sh").read_text()
    assert "lifecycle on_create.sh" in texts and "lifecycle wait_for_hyperpod_slurm.sh" in texts
    for where, text in texts.items():
        for match in INSTALL.finditer(text):
            words = [w for w in match.group(1).split() if not w.startswith("-") and "$" not in w]
            assert not [w for w in words if SLURM_PACKAGE.match(w.split("=")[0])], (where, match.group(0))
    on_create = texts["lifecycle on_create.sh"]
    assert on_create.index('bash "$here/wait_for_hyperpod_slurm.sh"') < on_create.index('exec bash "$here/node-user-data.sh"')


def test_the_install_pattern_catches_a_slurm_package_install() -> None:
    caught = [m.group(1).split() for m in INSTALL.finditer("apt-get -y install --no-install-recommends slurmd munge\n")]
    assert caught == [["--no-install-recommends", "slurmd", "munge"]]
    assert all(SLURM_PACKAGE.match(p) for p in ("slurmd", "slurmctld", "slurm-client", "munge", "slurm-wlm"))
    assert not SLURM_PACKAGE.match("git") and not SLURM_PACKAGE.match("libpmix2")


# --- the lifecycle's role helper ------------------------------------------------------------------------------

RESOURCE_CONFIG = {"ClusterConfig": {"ClusterArn": "arn:aws:sagemaker:us-east-2:123456789012:cluster/a1b2c3",
                                     "ClusterName": "fmc-neuronlab"},
                   "InstanceGroups": [
                       {"Name": "controller", "InstanceType": "ml.m5.2xlarge",
                        "Instances": [{"InstanceName": "controller-1", "CustomerIpAddress": "10.1.0.10"}]},
                       {"Name": "login", "InstanceType": "ml.m5.xlarge",
                        "Instances": [{"InstanceName": "login-1", "CustomerIpAddress": "10.1.0.11"}]},
                       {"Name": "trn", "InstanceType": "ml.trn1.32xlarge",
                        "Instances": [{"InstanceName": "trn-1", "CustomerIpAddress": "10.1.0.12"},
                                      {"InstanceName": "trn-2", "CustomerIpAddress": "10.1.0.13"}]}]}


@pytest.mark.parametrize(("addresses", "answer"), [
    (["10.1.0.10"], "controller 10.1.0.10"),
    (["172.17.0.1", "10.1.0.11"], "login 10.1.0.10"),
    (["10.1.0.13"], "compute 10.1.0.10"),
])
def test_the_lifecycle_finds_the_nodes_slurm_role_in_hyperpods_resource_config(
        tmp_path: Path, addresses: list[str], answer: str) -> None:
    config = tmp_path / "resource_config.json"
    config.write_text(json.dumps(RESOURCE_CONFIG))
    helper = ROOT / "src/fmcluster/schedulers/hyperpod/node_files" / "hyperpod_slurm_role.py"
    ran = subprocess.run([sys.executable, str(helper), str(config), *addresses], capture_output=True, text=True)
    assert (ran.returncode, ran.stdout.strip()) == (0, answer), ran.stderr


def test_the_lifecycle_refuses_a_host_hyperpods_resource_config_does_not_list(tmp_path: Path) -> None:
    config = tmp_path / "resource_config.json"
    config.write_text(json.dumps(RESOURCE_CONFIG))
    helper = ROOT / "src/fmcluster/schedulers/hyperpod/node_files" / "hyperpod_slurm_role.py"
    ran = subprocess.run([sys.executable, str(helper), str(config), "10.9.9.9"], capture_output=True, text=True)
    assert ran.returncode == 2 and ran.stdout == "" and "10.9.9.9" in ran.stderr


def test_every_group_runs_the_lifecycle_as_on_init_complete_after_hyperpod_started_its_slurm() -> None:
    """The groups carry SlurmConfig and rely on HyperPod to write slurm.conf and start Slurm: that is OnInitComplete
    ("runs after HyperPod configures the default software on the instance", CloudFormation's ClusterLifeCycleConfig);
    OnCreate is "Customer Managed mode", where the lifecycle brings Slurm up itself. Before, every group ran OnCreate,
    and the controller's script waited for a slurm.conf only HyperPod's default setup writes."""
    cluster = next(s for s in render_stacks(hyperpod()) if s.key == "cluster")
    groups = load_cfn_yaml(cluster.body)["Resources"]["Cluster"]["Properties"]["InstanceGroups"]
    assert {g["SlurmConfig"]["NodeType"] for g in groups} == {"Controller", "Login", "Compute"}
    for group in groups:
        cycle = group["LifeCycleConfig"]
        assert set(cycle) == {"SourceS3Uri", "OnInitComplete"}, group["InstanceGroupName"]
        assert cycle["OnInitComplete"] == "on_create.sh"
    files = HyperPod(hyperpod()).lifecycle_files("b")
    assert {"on_create.sh", "wait_for_hyperpod_slurm.sh", "hyperpod_slurm_role.py", "node-user-data.sh",
            "fmcluster-lifecycle.env"} <= set(files) and "start_hyperpod_slurm.sh" not in files


def test_the_lifecycle_starts_no_slurm_daemon_it_waits_for_hyperpods() -> None:
    wait = HyperPod(hyperpod()).lifecycle_files("b")["wait_for_hyperpod_slurm.sh"].decode()
    commands = [line for line in wait.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in commands if re.search(r"systemctl\s+(enable|start|restart|mask)|--conf-server", line)]
    assert "is-active --quiet slurmctld" in wait and "is-active --quiet slurmd" in wait


def run_wait(tmp_path: Path, address: str, slurm_conf: str | None, resource_config: Path | None = None,
             active: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """wait_for_hyperpod_slurm.sh run for real by bash, with `systemctl` and `hostname` stood in (they would act on
    this machine): the stand-ins record their calls, `systemctl is-active` answers for the units in `active`; the
    resource config (named by SAGEMAKER_RESOURCE_CONFIG_PATH, as HyperPod names it) and slurm.conf are files shaped
    as HyperPod writes them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    units = " ".join(active)
    (bin_dir / "systemctl").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1" = is-active ] || exit 0\n'
        f'for u in {units}; do [ "$u" = "$3" ] && exit 0; done\nexit 3\n')
    (bin_dir / "hostname").write_text(f"#!/bin/sh\necho {address} 172.17.0.1\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    config = tmp_path / "resource_config.json"
    config.write_text(json.dumps(RESOURCE_CONFIG))
    conf = tmp_path / "slurm.conf"
    if slurm_conf is not None:
        conf.write_text(slurm_conf)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SAGEMAKER_RESOURCE_CONFIG_PATH": str(resource_config or config),
           "FMCLUSTER_HYPERPOD_SLURM_CONF": str(conf), "FMCLUSTER_HYPERPOD_SLURM_WAIT_S": "0"}
    lifecycle = tmp_path / "lifecycle"
    lifecycle.mkdir(exist_ok=True)
    for name, body in HyperPod(hyperpod()).lifecycle_files("b").items():
        (lifecycle / name).write_bytes(body)
    ran = subprocess.run(["bash", str(lifecycle / "wait_for_hyperpod_slurm.sh")], capture_output=True, text=True,
                         env=env, timeout=30)
    return ran, calls.read_text().splitlines() if calls.exists() else []


def test_the_controller_goes_on_once_hyperpods_slurmctld_runs_with_a_slurm_conf_naming_it(tmp_path: Path) -> None:
    ran, calls = run_wait(tmp_path, "10.1.0.10", "ClusterName=fmc\nSlurmctldHost=ip-10-1-0-10(10.1.0.10)\n",
                          active=("slurmctld",))
    assert ran.returncode == 0, ran.stderr
    assert calls == ["is-active --quiet slurmctld"] and "slurmctld, with a slurm.conf naming 10.1.0.10 is up" in ran.stdout


def test_the_controller_takes_a_slurm_conf_naming_it_by_its_hyperpod_node_name(tmp_path: Path) -> None:
    """HyperPod's slurm.conf names nodes ip-N-N-N-N after their customer address: a SlurmctldHost given by that name
    alone names the controller too."""
    ran, _ = run_wait(tmp_path, "10.1.0.10", "ClusterName=fmc\nSlurmctldHost=ip-10-1-0-10\n", active=("slurmctld",))
    assert ran.returncode == 0, ran.stderr
    other = tmp_path / "another-controller"
    other.mkdir()
    ran, _ = run_wait(other, "10.1.0.10", "SlurmctldHost=ip-10-1-0-100(10.1.0.100)\n", active=("slurmctld",))
    assert ran.returncode == 1, "10.1.0.100 is another node"


def test_the_controller_fails_when_hyperpod_never_brings_slurm_up(tmp_path: Path) -> None:
    ran, calls = run_wait(tmp_path, "10.1.0.10", None, active=("slurmctld",))
    assert ran.returncode == 1 and "slurmctld, with a slurm.conf naming 10.1.0.10 is not up" in ran.stderr
    other = tmp_path / "stopped"
    other.mkdir()
    ran, _ = run_wait(other, "10.1.0.10", "SlurmctldHost=ip-10-1-0-10(10.1.0.10)\n")
    assert ran.returncode == 1 and "OnInitComplete" in ran.stderr


def test_a_compute_node_goes_on_once_hyperpods_configless_slurmd_runs(tmp_path: Path) -> None:
    ran, calls = run_wait(tmp_path, "10.1.0.13", None, active=("slurmd",))
    assert ran.returncode == 0, ran.stderr
    assert calls == ["is-active --quiet slurmd"]
    assert not (tmp_path / "units").exists(), "no drop-in, no unit of its own"
    down = tmp_path / "down"
    down.mkdir()
    ran, _ = run_wait(down, "10.1.0.13", None)
    assert ran.returncode == 1 and "slurmd (configless, from 10.1.0.10) is not up" in ran.stderr


def test_a_login_node_waits_for_no_daemon(tmp_path: Path) -> None:
    ran, calls = run_wait(tmp_path, "10.1.0.11", None)
    assert ran.returncode == 0 and calls == [], ran.stderr


def test_the_lifecycle_starts_nothing_on_a_host_hyperpod_does_not_list(tmp_path: Path) -> None:
    ran, calls = run_wait(tmp_path, "10.9.9.9", None)
    assert ran.returncode != 0 and calls == [] and "10.9.9.9" in ran.stderr


def test_the_lifecycle_reads_the_resource_config_hyperpod_names_in_its_environment(tmp_path: Path) -> None:
    """HyperPod names its resource config in SAGEMAKER_RESOURCE_CONFIG_PATH (AWS's on_create.sh reads it first): the
    role comes from that file, not from the default path (absent on this machine, as on a node where HyperPod put
    it elsewhere: the script took the node for no HyperPod instance, checked no Slurm and succeeded)."""
    assert not Path("/opt/ml/config/resource_config.json").exists()
    ran, calls = run_wait(tmp_path, "10.1.0.13", None, active=("slurmd",))
    assert ran.returncode == 0, ran.stderr
    assert "HyperPod Slurm role compute, controller 10.1.0.10" in ran.stdout and calls == ["is-active --quiet slurmd"]


def test_the_lifecycle_fails_when_the_resource_config_hyperpod_names_is_absent(tmp_path: Path) -> None:
    """AWS's on_create.sh exits 1 when SAGEMAKER_RESOURCE_CONFIG_PATH names no file: a node whose role is unknown
    must fail its lifecycle script (HyperPod then fails or replaces it), never come up without Slurm."""
    ran, calls = run_wait(tmp_path, "10.1.0.13", None, resource_config=tmp_path / "nowhere.json")
    assert ran.returncode == 1 and calls == []
    assert "nowhere.json" in ran.stderr and "SAGEMAKER_RESOURCE_CONFIG_PATH" in ran.stderr


# --- the mounts come with HyperPod's Slurm -------------------------------------------------------------------------

def test_hyperpod_mounts_the_storage_stacks_file_systems_on_every_group(tmp_path: Path) -> None:
    """As ParallelCluster's SharedStorage does: the scheduler that brings its own Slurm mounts the file systems
    (fmcluster's shared_storage role runs with fmcluster's Slurm only), from the storage stack's outputs."""
    tenant = hyperpod()
    cluster = next(s for s in render_stacks(tenant) if s.key == "cluster")
    template = load_cfn_yaml(cluster.body)
    for group in template["Resources"]["Cluster"]["Properties"]["InstanceGroups"]:
        assert {"Fn::If": ["MountLustre", {"FsxLustreConfig": {
            "DnsName": {"Ref": "LustreDnsName"}, "MountName": {"Ref": "LustreMountName"},
            "MountPath": tenant.storage.lustre.mount_point}}, {"Ref": "AWS::NoValue"}]} \
            in group["InstanceStorageConfigs"], group["InstanceGroupName"]
    outputs = {"storage": {"LustreDnsName": "fs-0123456789abcdef0.fsx.us-east-2.amazonaws.com",
                           "LustreMountName": "abcdefgh", "DataBucketName": "b"},
               "network": {k: "x" for k in ("PrivateSubnetId", "PublicSubnetId", "EfaSecurityGroupId",
                                            "NodeSecurityGroupId", "LoginSecurityGroupId")}}
    params, _ = cluster.resolved_parameters(outputs)
    assert (params["LustreDnsName"], params["LustreMountName"]) == ("fs-0123456789abcdef0.fsx.us-east-2.amazonaws.com",
                                                                    "abcdefgh")
    # On the emulator (no FSx, so no DNS name) the mount is left out, said in the deploy's notes.
    del outputs["storage"]["LustreDnsName"], outputs["storage"]["LustreMountName"]
    params, notes = cluster.resolved_parameters(outputs)
    assert params["LustreDnsName"] == "" and any(note.startswith("LustreDnsName:") for note in notes)
    # And the inventory the nodes get runs no shared_storage role there.
    inventory = inventory_of(tenant)
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    hosts = InventoryManager(loader=loader, sources=[str(path)])
    variables = VariableManager(loader=loader, inventory=hosts)
    mounting = [(role, host.name) for play in plays(ROOT / "playbooks" / "shared-storage.yml")
                for host in hosts.get_hosts(play["hosts"]) for role, conditions, role_vars in role_uses(play)
                if runs(conditions, {**variables.get_vars(host=host), **(play.get("vars") or {}), **role_vars})]
    assert mounting == [], "HyperPod mounts them; fmcluster's role does not mount them a second time"


def test_a_hyperpod_tenant_with_an_openzfs_home_has_hyperpod_mount_it_too() -> None:
    import dataclasses

    from fmcluster.model import OpenZfs

    tenant = hyperpod()
    with_home = dataclasses.replace(tenant, storage=dataclasses.replace(
        tenant.storage, openzfs=OpenZfs(64, 160, "/home")))
    cluster = next(s for s in render_stacks(with_home) if s.key == "cluster")
    template = load_cfn_yaml(cluster.body)
    assert template["Conditions"]["MountHome"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "HomeDnsName"}, ""]}]}
    for group in template["Resources"]["Cluster"]["Properties"]["InstanceGroups"]:
        assert {"Fn::If": ["MountHome", {"FsxOpenZfsConfig": {"DnsName": {"Ref": "HomeDnsName"}, "MountPath": "/home"}},
                           {"Ref": "AWS::NoValue"}]} in group["InstanceStorageConfigs"]
    assert "HomeDnsName" in cluster.parameters and "HomeDnsName" not in next(
        s for s in render_stacks(tenant) if s.key == "cluster").parameters


def test_discovery_status_and_replace_ask_for_the_cluster_the_template_creates() -> None:
    """One name: the manifest is published before the cluster stack exists, so discovery (and with it every node's
    identity, `invoke status/nodes/replace`) cannot wait for the ClusterName output; it names what the template names."""
    tenant = load_tenant("neuronlab", ROOT)
    stack = next(s for s in render_stacks(tenant) if s.key == "cluster")
    created = load_cfn_yaml(stack.body)["Resources"]["Cluster"]["Properties"]["ClusterName"]
    assert HyperPod(tenant).discovery({})["cluster_name"] == created
    assert manifest_for(tenant)["discovery"]["cluster_name"] == created
