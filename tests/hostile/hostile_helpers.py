"""Shared by the hostile-input tests: writing a spec, validating it in-process, and rendering everything a
tenant value reaches (CloudFormation, the generated inventory, slurm.conf, Prometheus, Alertmanager) so a
test can tell whether a value changed a template's structure or only its data."""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from fmcluster import commands
from fmcluster.manifest import assemble_inventory, placement_group_output_key
from fmcluster.model import Tenant, load_tenant
from localtenant import manifest_for, nodes_for
from scheduler_stacks import render_stacks

ROOT = Path(__file__).resolve().parents[2]
SPEC_REL = "inventories/acme/group_vars/all/tenant.yml"
BASES = {org: yaml.safe_load((ROOT / f"inventories/{org}/group_vars/all/tenant.yml").read_text())
         for org in ("demo", "stockmark", "neuronlab")}
# Strings that change a document's structure when pasted into it unescaped: quotes, newlines, comments,
# YAML's `: `, flow brackets, Jinja and CloudFormation interpolation, slurm.conf's separators.
HOSTILE = ['"', "'", "\n", "\r\n", ": ", " #", "#", "${AWS::AccountId}", "{{ 7*7 }}", "{% raw %}", "[", "]",
           "{", "}", ",", "&a", "*a", "!Ref x", "|", ">", "\\", " ", "=", "\u2028", "\x00", "\x1b[31m", "`id`",
           "$(id)", ";", "%", "\t"]


def write_tenant(root: Path, content: str | bytes, org: str = "acme") -> Path:
    spec = root / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return spec


def base_doc(base: str = "demo") -> dict[str, Any]:
    doc = copy.deepcopy(BASES[base])
    doc["tenant"]["org"] = "acme"
    return doc


def spec_text(change: Callable[[dict[str, Any]], Any] | None = None, base: str = "demo") -> str:
    doc = base_doc(base)
    if change is not None:
        change(doc["tenant"])
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=False)


def set_path(tenant: dict[str, Any], path: str, value: Any) -> None:
    node: Any = tenant
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    last = parts[-1]
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value


def setter(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda t: set_path(t, path, value)


def validate(root: Path, monkeypatch: pytest.MonkeyPatch, org: str = "acme") -> tuple[int, str]:
    """`invoke validate` in-process. Any exception escaping it is a traceback a user would have seen."""
    monkeypatch.setenv("FMCLUSTER_ROOT", str(root))
    lines: list[str] = []
    code = commands.validate(org, out=lines.append)
    return code, "\n".join(lines)


def assert_refused(code: int, output: str, key: str | None, fragments: tuple[str, ...] = (), line: bool = True) -> None:
    """Refused the way a person can act on: exit 2, the file (and line), the key, a fix, nothing deployed."""
    assert code == 2, output
    assert "Traceback" not in output
    where = re.search(re.escape(SPEC_REL) + r"(:\d+)?:", output)
    assert where, f"no file named in\n{output}"
    if line:
        assert re.search(re.escape(SPEC_REL) + r":\d+:", output), f"no line number in\n{output}"
    if key:
        assert f" {key}" in output or f"{key}:" in output, f"key {key!r} not in\n{output}"
    assert "\n    fix: " in output, output
    assert "nothing was deployed or changed" in output
    for fragment in fragments:
        assert fragment in output, f"{fragment!r} not in\n{output}"
    for problem in output.split("\n    fix: ")[1:]:
        assert problem.split("\n")[0].strip(), f"an empty fix in\n{output}"


# --- rendering everything a tenant value reaches -----------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _env(folder: Path) -> jinja2.Environment:
    """Jinja as Ansible's template module configures it (trim_blocks), with the filters the templates use."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    env.filters["combine"] = lambda base, *more: functools.reduce(lambda a, b: {**a, **b}, more, dict(base))
    env.filters["to_nice_yaml"] = lambda data, indent=4, sort_keys=True: yaml.dump(
        data, indent=indent, sort_keys=sort_keys, default_flow_style=False, allow_unicode=True)
    env.filters["split"] = lambda s, sep=None: s.split(sep)
    return env


class _CfnCLoader(yaml.CSafeLoader):
    """CloudFormation's short tags on libyaml (the rendered stacks are parsed many times here)."""


def _cfn_tag(loader: Any, suffix: str, node: Any) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {"Ref" if suffix == "Ref" else f"Fn::{suffix}": value}


_CfnCLoader.add_multi_constructor("!", _cfn_tag)


def load_cfn(text: str) -> Any:
    return yaml.load(text, Loader=_CfnCLoader)  # noqa: S506 - a SafeLoader


def slurm_conf_structure(text: str) -> list[list[str]]:
    """slurm.conf as Slurm reads it: one setting line per line, `#` starts a comment, words `Key=Value`."""
    lines = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            lines.append([word.split("=", 1)[0] for word in line.split()])
    return lines


def render_all(tenant: Tenant) -> dict[str, Any]:
    """Every rendered artefact a tenant value reaches, parsed the way its consumer parses it."""
    out: dict[str, Any] = {}
    for stack in render_stacks(tenant):
        out[f"cfn/{stack.key}"] = load_cfn(stack.body)
    outputs = {placement_group_output_key(q.name): f"fmc-{tenant.org}-{q.name}-pg" for q in tenant.queues}
    inventory = assemble_inventory(manifest_for(tenant, outputs), nodes_for(tenant))
    out["inventory"] = yaml.load(yaml.dump(inventory, Dumper=yaml.CSafeDumper), Loader=yaml.CSafeLoader)
    variables = yaml.safe_load((ROOT / "roles/slurm/defaults/main.yml").read_text())
    variables.update(inventory["all"]["vars"], slurm_use_cgroup=True, slurm_controller_hostname="controller-1")
    slurm = _env(ROOT / "roles/slurm/templates")
    for name in ("slurm.conf", "gres.conf", "topology.conf"):
        text = slurm.get_template(f"{name}.j2").render(**variables)
        out[f"slurm/{name}"] = {"structure": slurm_conf_structure(text), "text": text}
    all_vars = inventory["all"]["vars"]
    am = yaml.safe_load((ROOT / "roles/alertmanager/defaults/main.yml").read_text())
    am.update({k: v for k, v in all_vars.items() if k.startswith("alertmanager_")})
    out["alertmanager"] = yaml.safe_load(_env(ROOT / "roles/alertmanager/templates").get_template(
        "alertmanager.yml.j2").render(**am))
    prom = yaml.safe_load((ROOT / "roles/prometheus/defaults/main.yml").read_text())
    prom.update({k: v for k, v in all_vars.items() if k.startswith("prometheus_")})
    prom.update(inventory_hostname="controller-1", prometheus_external_labels={"cluster": tenant.org},
                prometheus_rules_dir="/etc/prometheus/rules", prometheus_alertmanager_targets=["127.0.0.1:9093"],
                prometheus_api_host="127.0.0.1")
    out["prometheus"] = yaml.safe_load(_env(ROOT / "roles/prometheus/templates").get_template(
        "prometheus.yml.j2").render(**prom))
    return out


def shape(value: Any) -> Any:
    """The structure of parsed data with names and values left out: what a value must never change."""
    if isinstance(value, dict):
        return ("map", sorted((repr(shape(v)) for v in value.values())))
    if isinstance(value, list):
        return ("seq", [shape(v) for v in value])
    return type(value).__name__


def occurrences(value: Any, text: str) -> int:
    """How often `text` appears in the parsed data's keys and scalars (a dash may read '_': inventory group
    names spell queue `gpu-a` as `queue_gpu_a`)."""
    pattern = re.compile(re.escape(text).replace("\\-", "[-_]"))
    return _count(value, pattern)


def _count(value: Any, pattern: re.Pattern[str]) -> int:
    if isinstance(value, dict):
        return sum(_count(k, pattern) + _count(v, pattern) for k, v in value.items())
    if isinstance(value, list):
        return sum(_count(v, pattern) for v in value)
    return len(pattern.findall(value)) if isinstance(value, str) else 0


def assert_same_structure(root: Path, values: list[tuple[str, str]], plain_text: str, hostile_text: str) -> None:
    """The spec holding the hostile values renders to the same structure as the one holding the plain values,
    and each hostile value lands exactly where its plain value did, whole, as data."""
    renders = {}
    for label, text in (("plain", plain_text), ("hostile", hostile_text)):
        write_tenant(root, text)
        renders[label] = render_all(load_tenant("acme", root))
    for artefact, plain_render in renders["plain"].items():
        hostile_render = renders["hostile"][artefact]
        assert shape(hostile_render) == shape(plain_render), f"{artefact}: the structure changed"
        for plain, hostile in values:
            assert occurrences(hostile_render, hostile) == occurrences(plain_render, plain), \
                f"{artefact}: {hostile!r} does not land where {plain!r} did"
