"""No tenant value can change a template's structure (issue 16, CloudFormation part).

Every string field of the tenant model is set, one at a time, to values built to break out of YAML,
JSON, `Fn::Sub`, Jinja2 and shell: quotes, newlines, `${...}`, `{{ }}`, `#`, `: `. The spec's schema
would refuse most of them; the renderer must not rely on that (a field the schema forgets, a new
code path). For each, the rendered templates must parse to the same resources, parameters,
conditions and outputs as the bundled tenant's, carry the value verbatim as data, never inside an
`Fn::Sub`, and hand it to the node's shell unchanged. A field the renderer parses (a CIDR, an enum)
may instead be refused with a ValueError — never rendered into something else.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fmcluster.model import load_tenant
from fmcluster.stacks.checks import check_stack
from fmcluster.schedulers.hyperpod.lifecycle import lifecycle_environment
from fmcluster.stacks.render import load_cfn_yaml, user_data_text
from scheduler_stacks import render_stacks

HOSTILE = {
    # The attack: close the quoted scalar, add a resource.
    "yaml-breakout": 'data/"\n  Evil:\n    Type: AWS::IAM::User\n    Properties: {}\n# ',
    "sub-and-jinja": "${AWS::AccountId}${DataBucket.Arn}{{ evil }}{% raw %}${!Literal}: x # y",
    "quotes-flow": "x', \"y\": [!Ref Evil, {Type: 'AWS::IAM::AccessKey'}], '",
    "shell": "a'$(touch /tmp/fmcluster-pwned)`id`\nENV\nexport FMCLUSTER_ORG=evil; #",
}

# Every string field of the model, as a path into the Tenant dataclasses.
FIELDS: list[tuple[Any, ...]] = [
    ("org",), ("programme",), ("region",), ("availability_zone",),
    ("controller", "name"), ("login", "name"),
    ("queues", 0, "name"), ("queues", 0, "instance", "name"), ("queues", 0, "capacity_reservation_id"),
    ("queues", 0, "capacity_reservation_type"),
    ("network", "vpc_cidr"), ("network", "ssh_ingress_cidr"),
    ("storage", "lustre", "deployment_type"), ("storage", "lustre", "mount_point"),
    ("storage", "lustre", "data_repository", "file_system_path"), ("storage", "lustre", "data_repository", "s3_prefix"),
    ("storage", "lustre", "data_repository", "import_policy", 0),
    ("storage", "lustre", "data_repository", "export_policy", 0),
    ("storage", "openzfs", "mount_point"),
    ("monitoring", "remote_write_url"), ("monitoring", "alert_receivers", 0, "target"),
    ("acceptance", "tests", 0),
]
# Parsed by the renderer: a hostile value is refused, never rendered.
# (The remote-write URL: the controller's aps:RemoteWrite grant names the workspace it parses out of it.)
REFUSED = {("network", "vpc_cidr"), ("queues", 0, "capacity_reservation_type"), ("storage", "lustre", "deployment_type"),
           ("monitoring", "remote_write_url")}
# Never rendered into a template: the bodies stay byte-for-byte the same.
NOT_IN_TEMPLATES = {("region",), ("monitoring", "alert_receivers", 0, "target"), ("acceptance", "tests", 0)}
# Become part of logical ids (letters and digits only): the ids may differ, the structure may not.
NAMES_IN_IDS = {("queues", 0, "name")}
# Not in the HyperPod tenant's model (no OpenZFS, no reservation, no alert receiver, no SSH CIDR).
ABSENT = {"neuronlab": {("storage", "openzfs", "mount_point"), ("queues", 0, "capacity_reservation_id"),
                        ("monitoring", "alert_receivers", 0, "target"), ("network", "ssh_ingress_cidr")}}
# Refused on HyperPod for what it means, whatever the value: an EC2 reservation id.
REFUSED_BY_SCHEDULER = {"neuronlab": {("queues", 0, "capacity_reservation_id")}}

TENANTS = {org: load_tenant(org) for org in ("stockmark", "neuronlab")}


def replaced(node: Any, path: tuple[Any, ...], value: str) -> Any:
    """`node` with the field at `path` set to `value` (frozen dataclasses and tuples copied)."""
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = list(node)
        items[head] = value if not rest else replaced(items[head], rest, value)
        return tuple(items)
    current = getattr(node, head)
    return dataclasses.replace(node, **{head: value if not rest else replaced(current, rest, value)})


def structure(templates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per stack: the resource ids and types, and the parameter, condition and output names."""
    out = []
    for template in templates:
        out.append({
            "resources": {lid: res["Type"] for lid, res in template["Resources"].items()},
            "keys": sorted(template),
            "parameters": sorted(template.get("Parameters", {})),
            "conditions": sorted(template.get("Conditions", {})),
            "outputs": sorted(template.get("Outputs", {})),
        })
    return out


BASELINE = {org: render_stacks(tenant) for org, tenant in TENANTS.items()}
BASELINE_SHAPE = {org: structure([load_cfn_yaml(s.body) for s in stacks]) for org, stacks in BASELINE.items()}


def strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in [str(key), *strings(value)]]
    if isinstance(node, list):
        return [s for value in node for s in strings(value)]
    return []


def sub_templates(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [str(node["Fn::Sub"])] if "Fn::Sub" in node else []
        return found + [s for value in node.values() for s in sub_templates(value)]
    if isinstance(node, list):
        return [s for value in node for s in sub_templates(value)]
    return []


def same_shape(hostile: list[dict[str, Any]], baseline: list[dict[str, Any]], ids_may_differ: bool) -> None:
    for got, want in zip(hostile, baseline, strict=True):
        assert (got["keys"], got["parameters"], got["conditions"]) == (want["keys"], want["parameters"],
                                                                       want["conditions"])
        if ids_may_differ:
            assert Counter(got["resources"].values()) == Counter(want["resources"].values())
            assert len(got["outputs"]) == len(want["outputs"])
            assert all(lid.isalnum() for lid in [*got["resources"], *got["outputs"]])
        else:
            assert got["resources"] == want["resources"]
            assert got["outputs"] == want["outputs"]


CASES = [(org, path, kind) for org in TENANTS for path in FIELDS for kind in HOSTILE
         if path not in ABSENT.get(org, set())]


@pytest.mark.parametrize(("org", "path", "kind"), CASES,
                         ids=[f"{org}-{'.'.join(map(str, path))}-{kind}" for org, path, kind in CASES])
def test_a_hostile_value_in_any_string_field_is_data_and_never_structure(org: str, path: tuple[Any, ...],
                                                                         kind: str) -> None:
    value = HOSTILE[kind]
    tenant = replaced(TENANTS[org], path, value)
    if path in REFUSED or path in REFUSED_BY_SCHEDULER.get(org, set()):
        with pytest.raises(ValueError):
            render_stacks(tenant)
        return
    stacks = render_stacks(tenant)
    if path in NOT_IN_TEMPLATES:
        assert [s.body for s in stacks] == [s.body for s in BASELINE[org]]
        return
    parsed = [load_cfn_yaml(s.body) for s in stacks]
    same_shape(structure(parsed), BASELINE_SHAPE[org], ids_may_differ=path in NAMES_IN_IDS)
    assert any(value in text for t in parsed for text in strings(t)) or any(value in s.name for s in stacks), \
        "the value arrives verbatim, as data"
    assert not any(value in sub for t in parsed for sub in sub_templates(t)), "never inside an Fn::Sub"
    for stack in stacks:  # the security gate still reads every resource (it never crashes on data)
        check_stack(stack)


def test_the_critical_case_a_hostile_s3_prefix_adds_no_iam_user_and_is_the_dra_path() -> None:
    value = HOSTILE["yaml-breakout"]
    tenant = replaced(TENANTS["stockmark"], ("storage", "lustre", "data_repository", "s3_prefix"), value)
    storage = load_cfn_yaml(next(s for s in render_stacks(tenant) if s.key == "storage").body)
    assert "AWS::IAM::User" not in {r["Type"] for r in storage["Resources"].values()}
    path = storage["Resources"]["LustreDataRepositoryAssociation"]["Properties"]["DataRepositoryPath"]
    assert path == {"Fn::Join": ["", [{"Fn::Sub": "s3://${DataBucket}/"}, value]]}


def exported(script: str, names: list[str]) -> list[str]:
    """Run the user data's export block in bash and read the variables back (a quoted value may span
    lines, so the block is taken whole, from the first export to the next command)."""
    start, end = script.index("export FMCLUSTER_BUCKET="), script.index("\n# fmcluster first boot")
    exports = script[start:end]
    probe = exports + "\n" + "".join(f'printf "%s\\0" "${name}"\n' for name in names)
    run = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True, timeout=10)
    return run.stdout.split("\0")[:-1]


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_the_node_shell_receives_hostile_names_unchanged_and_runs_nothing_else(kind: str) -> None:
    value = HOSTILE[kind]
    tenant = replaced(replaced(TENANTS["stockmark"], ("org",), value), ("queues", 0, "name"), value)
    cluster = load_cfn_yaml(next(s for s in render_stacks(tenant) if s.key == "cluster").body)
    (group,) = [lid for lid in cluster["Resources"] if lid.startswith("Queue") and lid.endswith("LaunchTemplate")]
    script = user_data_text(cluster["Resources"][group]["Properties"]["LaunchTemplateData"]["UserData"])
    assert exported(script, ["FMCLUSTER_ORG", "FMCLUSTER_QUEUE"]) == [value, value]
    env = lifecycle_environment(tenant, "fmc-bucket", "fmc-stack")
    run = subprocess.run(["bash", "-c", 'set -a; . /dev/stdin; printf "%s" "$FMCLUSTER_ORG"'], input=env,
                         capture_output=True, text=True, check=True, timeout=10)
    assert run.stdout == value


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=1, max_size=40), st.sampled_from([
    ("storage", "lustre", "data_repository", "s3_prefix"), ("storage", "lustre", "mount_point"),
    ("org",), ("queues", 0, "capacity_reservation_id"), ("network", "ssh_ingress_cidr")]))
def test_any_text_in_a_string_field_renders_to_the_same_structure(value: str, path: tuple[Any, ...]) -> None:
    stacks = render_stacks(replaced(TENANTS["stockmark"], path, value))
    same_shape(structure([load_cfn_yaml(s.body) for s in stacks]), BASELINE_SHAPE["stockmark"], ids_may_differ=False)
