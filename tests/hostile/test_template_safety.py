"""The templates a tenant value reaches keep their structure whatever the value, even one validation would
have refused: Prometheus and Alertmanager write every value as a JSON scalar, the node_exporter textfile
escapes label values, the tenant scaffold writes answers as JSON scalars, and the slurm role refuses what
slurm.conf cannot quote. (The validated path is covered by test_hostile_specs.py.)"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cookiecutter.main import cookiecutter

from conftest import HOST_PYTHON, venv_tool
from hostile_helpers import HOSTILE, ROOT, _env, shape
from fmcluster.manifest import assemble_inventory, placement_group_output_key
from fmcluster.model import load_tenant
from localtenant import manifest_for, nodes_for

# Each hostile fragment inside an otherwise ordinary value, so the value is text around the fragment.
VALUES = [f"a{h}b" for h in HOSTILE if h not in ("\x00",)] + ["", " ", "-", "null", "~", "true", "0x1F", "1e3",
                                                               "- x", "? x", "*", "&", "!", "@", "`"]


def _role_vars(role: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((ROOT / f"roles/{role}/defaults/main.yml").read_text())
    return values


def _alertmanager(receivers: list[dict[str, str]], **overrides: Any) -> Any:
    values = _role_vars("alertmanager")
    values.update(alertmanager_receivers=receivers, alertmanager_smtp_from="am@example.org", **overrides)
    return yaml.safe_load(_env(ROOT / "roles/alertmanager/templates").get_template("alertmanager.yml.j2").render(**values))


def _prometheus(**overrides: Any) -> Any:
    values = _role_vars("prometheus")
    values.update(inventory_hostname="controller-1", prometheus_rules_dir="/etc/p/rules",
                  prometheus_alertmanager_targets=["127.0.0.1:9093"],
                  prometheus_external_labels={"cluster": "demo"}, prometheus_remote_write_url="https://x.example.org/w",
                  prometheus_remote_write_region="us-east-1")
    values.update(overrides)
    return yaml.safe_load(_env(ROOT / "roles/prometheus/templates").get_template("prometheus.yml.j2").render(**values))


RECEIVERS = [{"name": "m", "type": "email", "target": "a@example.org"},
             {"name": "s", "type": "slack", "target": "https://hooks.slack.com/x"},
             {"name": "p", "type": "sns", "target": "arn:aws:sns:us-east-1:123456789012:t"},
             {"name": "w", "type": "webhook", "target": "https://h.example.org/x"}]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_alertmanager_receivers_stay_data_whatever_their_names_and_targets(value: str) -> None:
    plain = _alertmanager(RECEIVERS)
    hostile_receivers = [dict(r, name=f"{r['name']}{value}", target=f"{r['target']}{value}") for r in RECEIVERS]
    hostile = _alertmanager(hostile_receivers, alertmanager_group_wait=f"30s{value}")
    assert shape(hostile) == shape(plain)
    names = [r["name"] for r in hostile["receivers"][1:]]
    assert names == [r["name"] for r in hostile_receivers]
    assert hostile["receivers"][1]["email_configs"][0]["to"] == hostile_receivers[0]["target"]
    assert hostile["receivers"][4]["webhook_configs"][0]["url"] == hostile_receivers[3]["target"]
    assert hostile["route"]["group_wait"] == f"30s{value}"


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_prometheus_configuration_stays_data_whatever_its_values(value: str) -> None:
    plain = _prometheus(prometheus_scrape_configs=[{"job_name": "node", "static_configs": [
        {"targets": ["10.0.0.1:9100"], "labels": {"node": "n"}}]}])
    hostile = _prometheus(prometheus_external_labels={f"cluster{value}": f"demo{value}"},
                          prometheus_remote_write_url=f"https://x.example.org/w{value}",
                          prometheus_remote_write_region=f"us-east-1{value}", prometheus_scrape_interval=f"15s{value}",
                          inventory_hostname=f"controller-1{value}",
                          prometheus_scrape_configs=[{"job_name": f"node{value}", "static_configs": [
                              {"targets": [f"10.0.0.1:9100{value}"], "labels": {"node": f"n{value}"}}]}])
    assert shape(hostile) == shape(plain)
    assert hostile["global"]["external_labels"] == {f"cluster{value}": f"demo{value}"}
    assert hostile["remote_write"][0]["url"] == f"https://x.example.org/w{value}"
    assert hostile["global"]["scrape_interval"] == f"15s{value}"
    assert hostile["scrape_configs"][1]["job_name"] == f"node{value}"
    assert hostile["scrape_configs"][1]["static_configs"][0]["labels"] == {"node": f"n{value}"}


def _textfile(labels: dict[str, str], mount: str) -> str:
    env = _env(ROOT / "roles/node_exporter/templates")
    return env.get_template("fmcluster.prom.j2").render(
        node_exporter_node_info=labels, node_exporter_accelerator="cuda", node_exporter_expected_accelerators=8,
        node_exporter_expected_efa_interfaces=32, node_exporter_expected_mounts=[{"mountpoint": mount, "fstype": "lustre"}])


SAMPLE = re.compile(r'^([a-z_]+)(\{(?:[a-z_]+="(?:[^"\\\n]|\\[\\"n])*",?)*\})? [0-9]+$')


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), text)


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_node_exporter_label_values_are_escaped_as_the_text_format_requires(value: str) -> None:
    text = _textfile({"org": f"demo{value}", "queue": "cpu"}, f"/fsx{value}")
    samples = [line for line in text.split("\n") if line and not line.startswith("#")]  # the format splits on \\n only
    assert len(samples) == 4
    assert all(SAMPLE.match(line) for line in samples), text
    mount = re.search(r'mountpoint="((?:[^"\\]|\\.)*)"', text)
    assert mount and _unescape(mount.group(1)) == f"/fsx{value}"


COOKIECUTTER_ANSWERS = ("org", "programme", "region", "availability_zone", "queue_name", "instance_type",
                        "controller_instance_type", "login_instance_type")


# Braces never reach cookiecutter (fmcluster.scaffold refuses them: cookiecutter evaluates answers as Jinja,
# which also turns a carriage return into a newline before our template sees the value).
@pytest.mark.parametrize("value", [v for v in VALUES if not set(v) & set("{}\r")], ids=repr)
def test_the_tenant_scaffold_writes_every_answer_as_a_yaml_scalar(tmp_path: Path, value: str) -> None:
    """Rendered by cookiecutter itself (bypassing fmcluster.scaffold's checks): the spec's keys do not move
    and every answer reads back exactly."""
    answers = {key: f"{key}{value}" for key in COOKIECUTTER_ANSWERS}
    answers["count"] = f"2{value}"
    out = tmp_path / "out"
    folder = Path(cookiecutter(str(ROOT / "cookiecutters/tenant"), no_input=True, output_dir=str(out),
                               extra_context={**answers, "org": "acme"}, accept_hooks=False,
                               default_config={"replay_dir": str(tmp_path / "replay")}))
    spec = yaml.safe_load((folder / "group_vars/all/tenant.yml").read_text())["tenant"]
    plain = yaml.safe_load((ROOT / "inventories/demo/group_vars/all/tenant.yml").read_text())["tenant"]
    # The demo's own network and people (qos, teams, users) are its own; a new tenant names its own later.
    assert list(spec) == [k for k in plain if k not in ("network", "qos", "teams", "users")]
    assert spec["programme"] == answers["programme"] and spec["region"] == answers["region"]
    assert spec["queues"][0]["name"] == answers["queue_name"]
    assert spec["queues"][0]["count"] == (2 if value == "" else answers["count"])
    assert spec["controller"]["instance_type"] == answers["controller_instance_type"]


def test_the_generated_inventory_round_trips_whatever_its_values() -> None:
    """hosts.yml is written by yaml.safe_dump from a Python structure, never from a text template."""
    tenant = load_tenant("stockmark")
    document = assemble_inventory(manifest_for(tenant, {placement_group_output_key("gpu"): "pg\n: x # {{ y }}"}),
                                  nodes_for(tenant))
    assert yaml.safe_load(yaml.safe_dump(document, sort_keys=False)) == document


# --- slurm.conf has no quoting: the slurm role refuses what it cannot hold ------------------------------------

SLURM_FIELDS = {
    "slurm_cluster_name": "demo", "slurm_controller_address": "10.0.1.1", "slurm_state_dir": "/var/spool/slurmctld",
    "slurm_task_prolog": "/opt/p.sh", "slurm_user": "slurm",
}
SLURM_BAD = ["x y", "x\n", "x#y", "x\nSlurmUser=root", "x=y", "", "x\ty"]


def _slurm_check_task() -> dict[str, Any]:
    tasks = yaml.safe_load((ROOT / "roles/slurm/tasks/main.yml").read_text())
    return next(t for t in tasks if t["name"].startswith("Check that every name"))


def _slurm_vars(org: str) -> dict[str, Any]:
    tenant = load_tenant(org)
    outputs = {placement_group_output_key(q.name): f"fmc-{org}-{q.name}-pg" for q in tenant.queues}
    values: dict[str, Any] = yaml.safe_load((ROOT / "roles/slurm/defaults/main.yml").read_text())
    values.update(assemble_inventory(manifest_for(tenant, outputs), nodes_for(tenant))["all"]["vars"],
                  slurm_controller_hostname="controller-1")
    values.pop("slurm_use_cgroup")
    return values


@pytest.mark.slow
def test_the_slurm_role_refuses_values_slurm_conf_cannot_hold(tmp_path: Path) -> None:
    """One ansible-playbook run: the bundled tenants' values pass the role's check; every bad value in every
    field fails it (each in its own task, failures ignored and then counted)."""
    check = _slurm_check_task()
    tasks: list[dict[str, Any]] = [dict(check, name="stockmark passes")]
    # Every bad value in the cluster name; two in each other field (each task costs a fraction of a second).
    bad_cases: list[tuple[str, Any]] = [("slurm_cluster_name", bad) for bad in SLURM_BAD]
    bad_cases += [(field, bad) for i, field in enumerate(list(SLURM_FIELDS)[1:])
                  for bad in (SLURM_BAD[i % 5], SLURM_BAD[(i + 1) % 5])]
    bad_cases += [("slurm_nodes", [{"name": "cpu-1 Feature=x", "address": "10.0.0.1"}]),
                  ("slurm_nodes", [{"name": "cpu-1", "address": "10.0.0.1 Weight=0"}]),
                  ("slurm_partitions", [{"name": "p\nPartitionName=evil", "nodes": []}]),
                  ("slurm_topology", [{"name": "pg#", "nodes": []}]),
                  ("slurm_extra_config", {"SchedulerParameters": "a b"}),
                  ("slurm_extra_config", {"X\nSlurmUser": "root"})]
    for i, (field, bad) in enumerate(bad_cases):
        tasks.append(dict(check, name=f"bad {i}", vars={field: bad}, ignore_errors=True, register=f"bad_{i}"))
    tasks.append({"name": "every bad value failed", "ansible.builtin.assert": {
        "that": [f"bad_{i} is failed" for i in range(len(bad_cases))], "quiet": True}})
    play = [{"hosts": "localhost", "gather_facts": False, "vars_files": [str(tmp_path / "stockmark.json")],
             "tasks": tasks},
            {"hosts": "localhost", "gather_facts": False, "vars_files": [str(tmp_path / "demo.json")],
             "tasks": [dict(check, name="demo passes")]}]
    for org in ("stockmark", "demo"):
        (tmp_path / f"{org}.json").write_text(json.dumps(_slurm_vars(org)))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    result = subprocess.run([venv_tool("ansible-playbook"), "-c", "local", "-i", "localhost,",
                             "-e", f"ansible_python_interpreter={HOST_PYTHON}", str(tmp_path / "play.yml")],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"ignored={len(bad_cases)}" in result.stdout
