"""Tenant spec validation: the JSON Schema first, then the facts a schema cannot express.

Every problem names the file, the line, the key path, what is wrong and how to fix it; all problems
are collected before anything is reported, so one run shows the whole list.
"""

from __future__ import annotations

import base64
import difflib
import importlib
import ipaddress
import json
import math
import os
import posixpath
import re
import stat
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any, Iterable, TypeGuard

import jsonschema
import jsonschema.validators
import yaml

from fmcluster.capabilities import (
    CONTAINER_RUNTIMES,
    PROVIDERS,
    SCHEDULER_FOLDERS,
    SCHEDULERS,
    SECTION_SCHEMA,
    scheduler_data,
)
from fmcluster.catalog import InstanceType, load_catalog
from fmcluster.escape import escaped, neutral
from fmcluster.ldapsyntax import dn_problem, filter_problem
from fmcluster.manifest import SECRET_NAMES
from fmcluster.paths import RESERVED_ACCOUNTS_PATH, SCHEMA_PATH
from fmcluster.sshkeys import key_problem
from fmcluster.yamlpos import KeyPath, LoadedYaml

# Names are matched whole (re.fullmatch): `$` alone would also accept a trailing newline.
ORG_PATTERN = re.compile(r"[a-z](?:[a-z0-9]|-(?=[a-z0-9])){1,23}")
# A queue is a Slurm partition, a HyperPod instance group ([a-zA-Z0-9](-*[a-zA-Z0-9])*, CreateCluster API),
# the prefix of its nodes' hostnames and, CamelCased, part of CloudFormation logical ids.
QUEUE_PATTERN = re.compile(r"[a-z](?:[a-z0-9]|-(?=[a-z0-9])){0,30}")
# Names the cluster already uses: the node roles (node and HyperPod instance-group names `controller-1`,
# `login-1`, groups `controller`, `login`, `compute`) and Slurm's own words (slurm.conf(5):
# `PartitionName=DEFAULT` sets defaults for the lines after it, `Nodes=ALL` means every node).
RESERVED_QUEUE_NAMES = {
    "controller": "the controller's node and instance-group name",
    "login": "the login nodes' name and instance-group name",
    "compute": "the inventory group of every compute node",
    "default": "Slurm's PartitionName=DEFAULT, which sets defaults instead of making a partition",
    "all": "Slurm's Nodes=ALL keyword and Ansible's group of every host",
    "none": "a Slurm keyword (e.g. AllowGroups=NONE)",
}
#: QoS and team names (Slurm QoS, accounts and unix groups); user names (useradd's NAME_REGEX, lower case).
QOS_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
# The alertmanager role's catch-all receiver.
RESERVED_RECEIVER_NAMES = ("fmcluster-unrouted",)
# What no value in a spec may contain, whatever its field: each is syntax to a template engine that renders
# values (Jinja in Ansible's inventory, CloudFormation's ${} in !Sub).
TEMPLATE_SYNTAX = ("{{", "}}", "{%", "%}", "{#", "#}", "${")
#: No spec value needs more characters than this (the longest, a webhook URL, stays well below).
MAX_STRING = 2048
# Unicode categories refused in every value: controls (newline, tab, NUL, NEL...), format characters
# (zero-width, bidirectional overrides that make text read differently than it parses), surrogates, and
# the line/paragraph separators YAML and JavaScript treat as line breaks.
REFUSED_CATEGORIES = {"Cc": "a control character", "Cf": "an invisible format character",
                      "Cs": "a lone surrogate", "Zl": "a line separator", "Zp": "a paragraph separator"}

# System directories a shared file system must not be mounted over (or inside): the OS, its state, root's home
# (/root/.ssh: a shared file system there hands root's keys to whoever writes it), where the DLAMI installs the
# accelerator stack (/opt/amazon/efa, /opt/nvidia, /opt/aws), where Slurm and fmcluster itself install and keep
# their configuration (/opt/slurm/etc, /opt/fmcluster), and each scheduler's own (its row's system_dirs).
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
               "/sys", "/usr", "/var", "/root", "/opt/amazon", "/opt/aws", "/opt/nvidia", "/opt/aws-neuronx", "/snap",
               "/opt/slurm", "/opt/intel", "/opt/fmcluster",
               *sorted({path for caps in SCHEDULERS.values() for path in caps.system_dirs}))
SYSTEM_EXACT = ("/", "/opt", "/tmp", "/srv", "/mnt", "/media", "/lost+found")
PATH_PATTERN = re.compile(r"(?:/[A-Za-z0-9._-]+)+")
S3_PREFIX_PATTERN = re.compile(r"(?:[A-Za-z0-9._-]+/)*")
#: Prefixes of the tenant bucket holding what nodes execute or trust: the bootstrap bundle and scripts, the
#: manifest and node reports (fmcluster/...: publish.py, stacks/templates/common.py, the schedulers' custom actions)
#: and HyperPod's lifecycle scripts. A data repository linked over any of them would let whatever is written
#: under the Lustre path be exported over node-bootstrap.sh or on_create.sh, which every node runs as root.
#: tests/test_tenant_validation.py checks every prefix the code publishes to lies inside one of these.
CONTROL_PREFIXES = ("fmcluster/", "hyperpod/")
EMAIL_PATTERN = re.compile(r"[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}")
SNS_ARN_PATTERN = re.compile(r"arn:aws:sns:([a-z0-9-]+):([0-9]{12}):([A-Za-z0-9_-]{1,256})")
AMP_URL_PATTERN = re.compile(
    r"https://aps-workspaces\.([a-z0-9-]+)\.amazonaws\.com/workspaces/ws-[0-9a-f-]{1,64}/api/v1/remote_write")
URL_CHARACTERS = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+")
HOST_PATTERN = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")

# Addresses in the cluster subnet (AWS VPC user guide, "Subnet CIDR blocks": the first four addresses and
# the last one of every subnet are reserved).
AWS_RESERVED_PER_SUBNET = 5
# Network interfaces of FSx for Lustre and OpenZFS in the private subnet. AWS publishes no formula (a Lustre
# file system "can have more than one"); this is a margin, not a count.
FILE_SYSTEM_ADDRESSES = 16
# Which EFA interfaces take a private IPv4 address. An `efa` interface (EFA with ENA) takes one; an
# `efa-only` interface takes none (EC2 user guide, "Create and attach an EFA": "You can't assign an IP address
# to an EFA-only network interface"; AWS's P5 guidance puts `efa` on card 0 and `efa-only` on cards 1-31).
# The launch templates (stacks/templates/slurm_ec2.py) put an `efa` interface on card 0 and `efa-only` ones on
# the other cards, which take no address (AWS's P5 guidance): one address per node.
# tests/hostile/test_rendered_templates.py checks this against the rendered launch templates.
EFA_ONLY_AFTER_CARD_0 = True

# Regions where AWS offers the accelerated instance families in the catalog (public region tables).
KNOWN_REGIONS = (
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1", "sa-east-1",
    "eu-west-1", "eu-west-2", "eu-west-3", "eu-central-1", "eu-north-1", "eu-south-1", "eu-south-2",
    "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-southeast-1", "ap-southeast-2",
    "ap-southeast-3", "ap-southeast-4", "ap-south-1", "ap-south-2", "ap-east-1",
    "me-central-1", "me-south-1", "il-central-1", "af-south-1",
)

# FSx for Lustre rules (FSx for Lustre user guide: "Managing storage capacity", "Throughput capacity").
LUSTRE_THROUGHPUT = {
    "PERSISTENT_2": (125, 250, 500, 1000),
    "PERSISTENT_1": (50, 100, 200),
    "SCRATCH_2": (),
    "SCRATCH_1": (),
}
LUSTRE_STEP_GIB = {"PERSISTENT_2": 2400, "PERSISTENT_1": 2400, "SCRATCH_2": 2400, "SCRATCH_1": 3600}
LUSTRE_DRA_TYPES = ("PERSISTENT_2", "SCRATCH_2")
OPENZFS_MIN_GIB, OPENZFS_MAX_GIB = 64, 524288


@dataclass(frozen=True)
class Problem:
    file: Path
    line: int | None
    key: str
    message: str
    fix: str

    def render(self, root: Path | None = None) -> str:
        shown = self.file
        if root is not None:
            # The path as named (a link is shown as the link, never where it points), relative to the checkout.
            for mine, theirs in ((self.file.absolute(), root.absolute()), (self.file.absolute(), root.resolve())):
                if mine.is_relative_to(theirs):
                    shown = mine.relative_to(theirs)
                    break
        where = f"{shown}:{self.line}" if self.line else f"{shown}"
        key = f" {neutral(self.key)}:" if self.key else ""
        # Each part one line, escaped: a value that slipped into a message unquoted still cannot forge a line.
        return f"{neutral(str(where))}:{key} {neutral(self.message)}\n    fix: {neutral(self.fix)}"


def show(value: object, limit: int = 60) -> str:
    """A value as it may appear in a message: quoted, escaped (no raw newline can fake a line, no control or
    bidirectional character reaches the terminal), shortened. The one helper every validator message uses."""
    return escaped(value, limit)


def dotted(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        name = part if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", part) else show(part, 40)
        out += f".{name}" if out else name
    return out


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    if not isinstance(word, (str, int, float)) or len(str(word)) > 64:
        return ""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" — did you mean '{close[0]}'?" if close else ""


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """data/tenant.schema.json, with what the scheduler folders say filled in: `scheduler:`'s enum (the schedulers
    fmcluster.capabilities found, one folder each), its description (each one's `summary`), which of them take a
    capacity reservation, and each one's own section (its section.schema.json)."""
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    scheduler = schema["properties"]["tenant"]["properties"]["scheduler"]
    scheduler["enum"] = list(SCHEDULERS)
    scheduler["description"] = "; ".join(f"`{name}`: {caps.summary}" for name, caps in SCHEDULERS.items()) + "."
    reservation = schema["properties"]["tenant"]["properties"]["queues"]["items"]["properties"]["capacity_reservation_id"]
    reservation["description"] += (" Schedulers that launch into one: " + ", ".join(
        f"`{name}`" for name, caps in SCHEDULERS.items() if caps.capacity_reservations) + "; the others refuse it.")
    _add_scheduler_sections(schema)
    return schema


def _add_scheduler_sections(schema: dict[str, Any]) -> None:
    """Each scheduler's own section (capabilities.yml's own_section, its folder's section.schema.json) becomes a
    tenant property right after `scheduler:`, which decides whether it may be written; the fragment's `$defs` join
    the schema's, so its `#/$defs/...` references resolve as if it were written there."""
    tenant = schema["properties"]["tenant"]
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    sections: dict[str, Any] = {}
    for name, caps in SCHEDULERS.items():
        if caps.own_section is None:
            continue
        path = SCHEDULER_FOLDERS[name] / SECTION_SCHEMA
        section: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        for key, definition in section.pop("$defs", {}).items():
            if key in defs:
                raise ValueError(f"{path}: $defs {key!r} is defined already (data/tenant.schema.json or another "
                                 "scheduler's section): rename it")
            defs[key] = definition
        if caps.own_section in tenant["properties"] or caps.own_section in sections:
            raise ValueError(f"{path}: the tenant has a section {caps.own_section!r} already: name scheduler "
                             f"{name}'s own_section otherwise")
        sections[caps.own_section] = section
    properties: dict[str, Any] = {}
    for key, value in tenant["properties"].items():
        properties[key] = value
        if key == "scheduler":
            properties.update(sections)
    tenant["properties"] = properties


def _whole(value: Any) -> TypeGuard[int]:
    # JSON Schema calls 16.0 an integer; a node count written 16.0 is a typo, and Python keeps it a float.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_integer(checker: Any, instance: Any) -> bool:
    return _whole(instance)


def _is_number(checker: Any, instance: Any) -> bool:
    # .nan and .inf are YAML floats; no threshold or size is infinite, and NaN compares false to every bound.
    return isinstance(instance, (int, float)) and not isinstance(instance, bool) and math.isfinite(instance)


def _fullmatch_pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    if isinstance(instance, str) and not re.fullmatch(pattern, instance):
        yield jsonschema.ValidationError(f"{show(instance)} does not match {pattern!r}")


_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many({"integer": _is_integer, "number": _is_number})
SpecValidator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator, validators={"pattern": _fullmatch_pattern}, type_checker=_TYPES)


@lru_cache(maxsize=1)
def _validator() -> Any:
    return SpecValidator(load_schema())


def _subschema(schema: dict[str, Any], path: KeyPath) -> dict[str, Any]:
    """The schema node describing `path` (best effort; empty when unknown)."""
    node = schema
    for part in path:
        if "$ref" in node:
            node = _resolve(schema, node["$ref"])
        if isinstance(part, int):
            node = node.get("items", {})
        else:
            node = node.get("properties", {}).get(part, {})
    if "$ref" in node:
        node = {**_resolve(schema, node["$ref"]), **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _resolve(schema: dict[str, Any], ref: str) -> dict[str, Any]:
    node: Any = schema
    for part in ref.lstrip("#/").split("/"):
        node = node[part]
    return dict(node)


class _Collector:
    def __init__(self, loaded: LoadedYaml) -> None:
        self.loaded = loaded
        self.problems: list[Problem] = []

    def add(self, path: KeyPath, message: str, fix: str) -> None:
        self.problems.append(
            Problem(self.loaded.path, self.loaded.line_of(path), dotted(path), message, fix)
        )


_TYPE_WORDS = {"integer": "a whole number", "number": "a number", "string": "text", "boolean": "true or false",
               "array": "a list", "object": "a mapping"}


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a true/false value"
    if isinstance(value, float) and not math.isfinite(value):
        return "not a finite number"
    return {int: "a whole number", float: "a decimal number", str: "text", list: "a list", dict: "a mapping",
            type(None): "empty (null)"}.get(type(value), f"a {type(value).__name__}")


def _range_fix(here: dict[str, Any]) -> str:
    low = here.get("minimum", here.get("exclusiveMinimum"))
    high = here.get("maximum", here.get("exclusiveMaximum"))
    what = "a whole number" if here.get("type") == "integer" else "a number"
    above = "above" if "exclusiveMinimum" in here else "from"
    if low is not None and high is not None:
        return f"use {what} {above} {low} {'to' if above == 'from' else 'and up to'} {high}"
    if low is not None:
        return f"use {what} {'above' if above == 'above' else 'of at least'} {low}"
    return f"use {what} of at most {high}"


def _schema_problems(loaded: LoadedYaml, out: _Collector) -> None:
    schema = load_schema()
    for error in sorted(_validator().iter_errors(loaded.data), key=lambda e: list(map(str, e.absolute_path))):
        path: KeyPath = tuple(error.absolute_path)
        here = _subschema(schema, path)
        described = here.get("description", "")
        value = error.instance
        if error.validator == "additionalProperties":
            allowed = sorted(here.get("properties", {}))
            for extra in sorted(set(value) - set(allowed)):
                out.add(
                    (*path, extra),
                    f"unknown key {show(extra)}{did_you_mean(extra, allowed)}",
                    f"remove it or use one of: {', '.join(allowed)}",
                )
        elif error.validator == "required":
            missing = re.findall(r"'([^']+)' is a required property", error.message)
            key = missing[0] if missing else "?"
            wanted = _subschema(schema, (*path, key)).get("description", "see the tenant spec reference in README.md")
            out.add(path, f"missing required key '{key}'", f"add `{key}:` — {wanted}")
        elif error.validator == "enum":
            choices = [str(c) for c in error.validator_value]
            out.add(path, f"{show(value)} is not allowed{did_you_mean(value, choices)}",
                    f"use one of: {', '.join(choices)}")
        elif error.validator == "type":
            expected = error.validator_value
            wanted_words = _TYPE_WORDS.get(expected, expected)
            if "enum" in here:
                fix = f"use one of: {', '.join(map(str, here['enum']))}"
            elif expected == "integer" and isinstance(value, float) and value.is_integer():
                fix = f"write {int(value)}, without the decimal point"
            elif expected == "object":
                fix = f"write its keys indented under it. {described}".strip()
            elif expected == "array":
                fix = f"write a list: one `- item` line per entry. {described}".strip()
            else:
                fix = f"write {wanted_words}. {described}".strip()
            shown = "the value" if value is None else show(value)
            out.add(path, f"{shown} is {_kind(value)}, expected {wanted_words}", fix)
        elif error.validator == "const":
            out.add(path, f"{show(value)} is not supported", f"set it to {error.validator_value!r}")
        elif error.validator == "pattern":
            out.add(path, f"{show(value)} has the wrong form", described or f"match {error.validator_value}")
        elif error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            out.add(path, f"{show(value)} is out of range", f"{_range_fix(here)}. {described}".strip())
        elif error.validator in ("minItems", "maxItems"):
            bound = "at least" if error.validator == "minItems" else "at most"
            out.add(path, f"the list has {len(value)} entries" if value else "the list is empty (should be non-empty)",
                    f"give {bound} {error.validator_value}. {described}".strip())
        elif error.validator in ("maxLength", "minLength"):
            bound = "at most" if error.validator == "maxLength" else "at least"
            out.add(path, f"{show(value)} is {len(value)} characters long",
                    f"use {bound} {error.validator_value} characters. {described}".strip())
        elif error.validator == "uniqueItems":
            out.add(path, "the list repeats an entry", "list each entry once")
        else:
            out.add(path, error.message[:200], described or "see the tenant spec reference in README.md")


def _string_problems(data: Any, here: KeyPath, out: _Collector) -> None:
    """Checks on every text value, whatever its field: nothing a template or a terminal would read as syntax."""
    if isinstance(data, dict):
        for key, value in data.items():
            _string_problems(value, (*here, key), out)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _string_problems(value, (*here, i), out)
    elif isinstance(data, str):
        if len(data) > MAX_STRING:
            out.add(here, f"the value is {len(data)} characters long", f"no spec value needs more than {MAX_STRING}")
            return
        for char in data:
            category = unicodedata.category(char)
            if category in REFUSED_CATEGORIES:
                what = REFUSED_CATEGORIES.get(category, "a line break")
                out.add(here, f"{show(data)} contains {what} (U+{ord(char):04X})",
                        "write the value on one line, with printable characters only")
                return
        for syntax in TEMPLATE_SYNTAX:
            if syntax in data:
                out.add(here, f"{show(data)} contains `{syntax}`, which templates would evaluate",
                        "values are data: remove the template syntax")
                return


def _get(data: Any, *keys: str | int) -> Any:
    for key in keys:
        if isinstance(key, int):
            if not isinstance(data, list) or key >= len(data):
                return None
        elif not isinstance(data, dict):
            return None
        data = data[key] if isinstance(key, int) else data.get(key)
    return data


def _check_instance(out: _Collector, path: KeyPath, name: Any, catalog: dict[str, InstanceType]) -> InstanceType | None:
    if not isinstance(name, str):
        return None
    if name.startswith("ml.") and name[3:] in catalog:
        out.add(path, f"{show(name)} is a SageMaker name",
                f"write the EC2 name '{name[3:]}'; HyperPod's 'ml.' prefix is added for you")
        return None
    if name not in catalog:
        out.add(
            path,
            f"{show(name)} is not in the instance catalog{did_you_mean(name, catalog)}",
            f"use one of: {', '.join(sorted(catalog))} (or add it to src/fmcluster/data/instances.yml with its public specs)",
        )
        return None
    return catalog[name]


#: Names the org may not take: it becomes the org's Slurm account (dashes as `_`), under which every team's
#: account is made and from which the associations planner removes what the spec no longer lists.
SLURM_RESERVED_ACCOUNTS = {
    "root": "'root' is Slurm's root account (sacctmgr's top of every account tree): the org's account would be it, "
            "and the associations planner would remove accounts and users under it that the spec does not list",
}


def org_problem(org: object) -> tuple[str, str] | None:
    """(message, fix) when `org` cannot name a tenant: it becomes a folder, stack, bucket and host name part,
    so it is a plain name, never a path. Every command taking --org checks it before touching a file."""
    if isinstance(org, str) and org in SLURM_RESERVED_ACCOUNTS:
        return SLURM_RESERVED_ACCOUNTS[org], "name the organization otherwise, e.g. 'acme-ai'"
    if isinstance(org, str) and ORG_PATTERN.fullmatch(org):
        return None
    return (f"{show(org)} is not a tenant name",
            "use 2-24 lower-case letters, digits and single dashes, starting with a letter, e.g. 'stockmark'")


def camel(name: str) -> str:
    """The CamelCase form queue names take in CloudFormation logical ids and stack outputs (`gpu-1` → `Gpu1`),
    as fmcluster.stacks.render.logical_name and fmcluster.inventory._camel build it."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", name) if part)


def addresses_per_node(instance: InstanceType) -> int:
    """Private IPv4 addresses one node of this type takes in its subnet (see EFA_ONLY_AFTER_CARD_0)."""
    if not instance.has_efa or EFA_ONLY_AFTER_CARD_0:
        return 1
    return instance.efa_interfaces


def _semantic_problems(loaded: LoadedYaml, out: _Collector) -> None:
    tenant = _get(loaded.data, "tenant")
    if not isinstance(tenant, dict):
        return
    catalog = load_catalog()
    t: KeyPath = ("tenant",)

    org = tenant.get("org")
    if isinstance(org, str):
        if not ORG_PATTERN.fullmatch(org):
            out.add((*t, "org"), f"{show(org)} is not safe for stack, bucket and host names",
                    "use 2-24 lower-case letters, digits and single dashes, starting with a letter, e.g. 'stockmark'")
        if org in SLURM_RESERVED_ACCOUNTS:
            out.add((*t, "org"), SLURM_RESERVED_ACCOUNTS[org], "name the organization otherwise, e.g. 'acme-ai'")
        folder = _tenant_folder(loaded.path)
        if folder is not None and folder != org:
            out.add((*t, "org"), f"{show(org)} differs from the tenant folder 'inventories/{folder}'",
                    f"set org: {folder}" + (f", or rename the folder to inventories/{org}" if not org_problem(org) else ""))

    region, az = tenant.get("region"), tenant.get("availability_zone")
    if isinstance(region, str) and region not in KNOWN_REGIONS:
        out.add((*t, "region"), f"{show(region)} is not a known AWS region{did_you_mean(region, KNOWN_REGIONS)}",
                f"use one of: {', '.join(KNOWN_REGIONS)}")
    if isinstance(region, str) and isinstance(az, str) and not re.fullmatch(re.escape(region) + r"[a-z]", az):
        out.add((*t, "availability_zone"), f"{show(az)} is not an availability zone of region {show(region)}",
                f"use the region followed by a zone letter, e.g. '{region if region in KNOWN_REGIONS else 'us-east-1'}a'")

    scheduler = SCHEDULERS.get(str(tenant.get("scheduler")))  # None: the schema names it
    rules = scheduler_rules(tenant.get("scheduler"))
    if rules is not None:
        rules.check_tenant(tenant, out.add)
    _check_foreign_sections(out, tenant, t)

    controller = _check_instance(out, (*t, "controller", "instance_type"), _get(tenant, "controller", "instance_type"), catalog)
    login = _check_instance(out, (*t, "login", "instance_type"), _get(tenant, "login", "instance_type"), catalog)

    # Options a scheduler would silently ignore (HyperPod: reservations, ssh ingress) are refused, never dropped.
    reservations = scheduler is None or scheduler.capacity_reservations
    ssh_ingress = scheduler is None or scheduler.ssh_ingress
    queues = tenant.get("queues")
    compute: list[tuple[InstanceType, int]] = []
    if isinstance(queues, list):
        seen: dict[str, int] = {}
        camels: dict[str, tuple[int, str]] = {}
        reserved_by: dict[str, tuple[int, dict[str, Any]]] = {}
        defaults = 0
        for i, queue in enumerate(queues):
            if not isinstance(queue, dict):
                continue
            q: KeyPath = (*t, "queues", i)
            name = queue.get("name")
            if isinstance(name, str):
                _check_queue_name(out, q, i, name, seen, camels)
            count = queue.get("count")
            itype = _check_instance(out, (*q, "instance_type"), queue.get("instance_type"), catalog)
            if _whole(count):
                if count < 1:
                    out.add((*q, "count"), f"count is {count}; a queue needs at least 1 node",
                            "set count: 1 or more, or remove the queue")
                elif itype is not None:
                    compute.append((itype, count))
            wanted = queue.get("accelerator")
            if itype is not None and isinstance(wanted, str) and wanted != itype.accelerator:
                hint = {"neuron": "Trainium (trn*) instance types run the Neuron stack",
                        "cuda": "NVIDIA GPU instance types (p4d, p5*) run the CUDA stack",
                        "none": "CPU instance types have no accelerator stack"}[itype.accelerator]
                out.add((*q, "accelerator"),
                        f"{show(wanted)} does not match {itype.name}, which is {itype.accelerator}",
                        f"remove the key (it is derived from the catalog) or set it to '{itype.accelerator}'; {hint}")
            efa = queue.get("efa")
            if itype is not None and isinstance(efa, bool) and efa != itype.has_efa:
                out.add((*q, "efa"),
                        f"{itype.name} has {itype.efa_interfaces} EFA interfaces" if itype.has_efa
                        else f"{itype.name} has no EFA interface",
                        f"remove the key (it is derived from the catalog) or set it to {str(itype.has_efa).lower()}; "
                        "EFA instance types: " + ", ".join(sorted(n for n, i in catalog.items() if i.has_efa)))
            if queue.get("default") is True:
                defaults += 1
                if defaults > 1:
                    out.add((*q, "default"), "more than one queue is marked default", "mark at most one queue `default: true`")
            if not reservations and "capacity_reservation_id" in queue:
                out.add((*q, "capacity_reservation_id"),
                        "HyperPod instance groups do not launch into EC2 capacity reservations; the reservation would be ignored",
                        "remove it (HyperPod reserves capacity with SageMaker training plans), or use scheduler: slurm-ec2")
            _check_shared_reservation(out, q, i, queue, reserved_by)

    if not ssh_ingress and isinstance(_get(tenant, "network", "ssh_ingress_cidr"), str):
        out.add((*t, "network", "ssh_ingress_cidr"),
                "HyperPod nodes are not reachable by ssh from outside the VPC; the range would only create an unused "
                "security group", "remove it and reach the nodes through SSM (aws ssm start-session), "
                "or use scheduler: slurm-ec2 for public login nodes")
    login_count = _get(tenant, "login", "count")
    logins = (login, login_count if _whole(login_count) else 1) if login is not None else None
    ssh = _get(tenant, "network", "ssh_ingress_cidr")
    if ssh_ingress and isinstance(ssh, str) and not isinstance(tenant.get("login"), dict):
        out.add((*t, "network", "ssh_ingress_cidr"), "ssh_ingress_cidr admits ssh to the login nodes, and the tenant "
                "has no `login:` section: there is no login node to reach",
                "remove ssh_ingress_cidr (reach the controller through SSM: aws ssm start-session), or add a login "
                "node (login: {instance_type: m5.2xlarge, count: 1})")
    elif ssh_ingress and isinstance(ssh, str) and login_count == 0:
        out.add((*t, "login", "count"), "login.count is 0, and network.ssh_ingress_cidr admits ssh to the login "
                "nodes: there is no login node to reach", "set login.count: 1 or more, or remove "
                "network.ssh_ingress_cidr (reach the controller through SSM: aws ssm start-session)")
    _check_network(out, tenant, t, controller, logins, compute)
    _check_storage(out, tenant, t)
    _check_monitoring(out, tenant, t)
    _check_accounting(out, tenant, t)
    _check_containers(out, tenant, t)
    _check_acceptance_image(out, tenant, t, catalog)
    _check_people(out, tenant, t)
    _check_directory(out, tenant, t, loaded.path)


def _check_shared_reservation(out: _Collector, q: KeyPath, i: int, queue: dict[str, Any],
                              reserved_by: dict[str, tuple[int, dict[str, Any]]]) -> None:
    """An EC2 capacity reservation (ODCR or Capacity Block) is for one instance type and is one kind: queues
    sharing one must agree on both, or the second queue's instances can never launch into it."""
    rid = queue.get("capacity_reservation_id")
    if not isinstance(rid, str):
        return
    first = reserved_by.setdefault(rid, (i, queue))
    if first[0] == i:
        return
    other = first[1]
    if queue.get("instance_type") != other.get("instance_type"):
        out.add((*q, "capacity_reservation_id"), f"{show(rid)} is also the reservation of queues[{first[0]}], which is "
                f"{show(other.get('instance_type'))}, not {show(queue.get('instance_type'))}: a capacity reservation "
                "holds instances of one type", "give each queue a reservation of its own instance type, or remove "
                "capacity_reservation_id from this queue")
    elif queue.get("capacity_reservation_type", "default") != other.get("capacity_reservation_type", "default"):
        out.add((*q, "capacity_reservation_type"), f"{show(rid)} is also the reservation of queues[{first[0]}], "
                "declared there as another kind: one reservation is either an On-Demand Capacity Reservation or a "
                "Capacity Block", "give both queues the same capacity_reservation_type")


def _check_queue_name(out: _Collector, q: KeyPath, i: int, name: str, seen: dict[str, int],
                      camels: dict[str, tuple[int, str]]) -> None:
    if not QUEUE_PATTERN.fullmatch(name):
        out.add((*q, "name"), f"{show(name)} is not a valid partition name",
                "use 1-31 lower-case letters, digits and single dashes, starting with a letter and not ending "
                "with a dash, e.g. 'gpu' or 'h100-a'")
        return
    if name in RESERVED_QUEUE_NAMES:
        out.add((*q, "name"), f"'{name}' is reserved: it is {RESERVED_QUEUE_NAMES[name]}",
                f"choose another name, e.g. '{name}-q' or 'gpu' (reserved: {', '.join(RESERVED_QUEUE_NAMES)})")
        return
    if name in seen:
        out.add((*q, "name"), f"queue name '{name}' is used twice (also queues[{seen[name]}])",
                "give every queue its own name")
        return
    seen[name] = i
    # Names that differ only in dashes become the same resource names: `gpu-1` and `gpu1` are both `Gpu1`
    # in logical ids and stack outputs. Compared without dashes, which also keeps case-folding systems apart.
    key = name.replace("-", "")
    if key in camels:
        other_i, other = camels[key]
        out.add((*q, "name"), f"'{name}' collides with queues[{other_i}] '{other}': both become "
                f"'{camel(name)}'" + (f"/'{camel(other)}'" if camel(other) != camel(name) else "") +
                " in CloudFormation logical ids and stack outputs",
                "give the queues names that differ in more than dashes")
    camels.setdefault(key, (i, name))


def _tenant_folder(spec: Path) -> str | None:
    # The path as given, never resolved: a tenant is the folder it is named by (model._linked refuses links).
    parts = spec.absolute().parts
    if len(parts) >= 5 and parts[-5] == "inventories" and parts[-3:-1] == ("group_vars", "all"):
        return parts[-4]
    return None


def _ipv4(out: _Collector, path: KeyPath, text: str, example: str) -> ipaddress.IPv4Network | None:
    """`text` as an IPv4 CIDR block written in full (address/prefix, host bits zero), else a problem."""
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        out.add(path, f"{show(text)} is not a CIDR block", f"write it like {example}")
        return None
    if not isinstance(net, ipaddress.IPv4Network):
        out.add(path, f"{show(text)} is an IPv6 range; this field takes IPv4", f"write an IPv4 block like {example}")
        return None
    if "/" not in text:
        out.add(path, f"{show(text)} has no prefix length", f"write it as {net.with_prefixlen}")
        return None
    if str(net) != text:
        out.add(path, f"{show(text)} is not a CIDR block (host bits set, or not in canonical form)",
                f"write {net.with_prefixlen}")
        return None
    return net


RFC1918 = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


def _rfc1918(net: ipaddress.IPv4Network) -> bool:
    return any(net.subnet_of(block) for block in RFC1918)


def _subnet_capacity(prefix: int) -> int:
    return int(2 ** (32 - prefix)) - AWS_RESERVED_PER_SUBNET


def _check_network(out: _Collector, tenant: dict[str, Any], t: KeyPath, controller: InstanceType | None,
                   logins: tuple[InstanceType, int] | None, compute: list[tuple[InstanceType, int]]) -> None:
    network = tenant.get("network")
    network = network if isinstance(network, dict) else {}
    n: KeyPath = (*t, "network")
    ssh = network.get("ssh_ingress_cidr")
    if isinstance(ssh, str) and (net := _ipv4(out, (*n, "ssh_ingress_cidr"), ssh, "203.0.113.0/24")):
        fix = "use your office or VPN range, e.g. 203.0.113.0/24, or remove the key to use SSM only"
        if net.prefixlen < 8:
            share = "the whole internet" if net.prefixlen == 0 else f"1/{2 ** net.prefixlen} of the internet"
            out.add((*n, "ssh_ingress_cidr"), f"{ssh} opens ssh to {share}", fix)
        elif not net.is_private and net.prefixlen < 16:
            out.add((*n, "ssh_ingress_cidr"),
                    f"{ssh} opens ssh to {net.num_addresses:,} public addresses (wider than a /16)", fix)
        elif net.is_multicast or net.is_loopback or net.is_link_local or net.is_reserved or net.is_unspecified:
            out.add((*n, "ssh_ingress_cidr"), f"{ssh} is not a range ssh clients can come from", fix)
    vpc_text = network.get("vpc_cidr", "10.0.0.0/16")
    if not isinstance(vpc_text, str) or not (vpc := _ipv4(out, (*n, "vpc_cidr"), vpc_text, "10.0.0.0/16")):
        return
    if not (16 <= vpc.prefixlen <= 24) or not _rfc1918(vpc):
        out.add((*n, "vpc_cidr"), f"'{vpc_text}' must be a private (RFC 1918) range between /16 and /24",
                "use e.g. 10.0.0.0/16")
        return
    # The network stack's subnets (fmcluster.stacks.render._subnets): private = the upper half, public = the first
    # /24 (or first quarter) of the lower half. Nodes, file systems and HyperPod groups sit in the private one.
    scheduler = SCHEDULERS.get(str(tenant.get("scheduler")))
    public_login = isinstance(ssh, str) and scheduler is not None and scheduler.public_login
    parts = [(f"{count} × {itype.name} × {addresses_per_node(itype)}", count * addresses_per_node(itype))
             for itype, count in compute]
    if controller is not None:
        parts.append((f"controller × {addresses_per_node(controller)}", addresses_per_node(controller)))
    if logins is not None and not public_login:
        parts.append((f"{logins[1]} login × {addresses_per_node(logins[0])}", logins[1] * addresses_per_node(logins[0])))
    parts.append(("file systems", FILE_SYSTEM_ADDRESSES))
    needed = sum(amount for _, amount in parts)
    private_prefix = vpc.prefixlen + 1
    if needed > _subnet_capacity(private_prefix):
        fits = next((p for p in range(private_prefix, 15, -1) if _subnet_capacity(p) >= needed), None)
        fix = (f"use a /{fits - 1} VPC or larger, e.g. 10.0.0.0/{fits - 1}" if fits
               else "split the nodes over fewer, larger queues or ask for a multi-subnet layout")
        out.add((*n, "vpc_cidr"),
                f"the private subnet of {vpc_text} (/{private_prefix}: {_subnet_capacity(private_prefix)} usable "
                f"addresses) is too small for {needed} ({' + '.join(label for label, _ in parts)})", fix)
    if public_login and logins is not None:
        public_needed = logins[1] * addresses_per_node(logins[0]) + 1  # + the NAT gateway
        public_prefix = max(24, vpc.prefixlen + 2)
        if public_needed > _subnet_capacity(public_prefix):
            out.add((*t, "login", "count"), f"{logins[1]} public login nodes do not fit the public subnet "
                    f"(/{public_prefix}: {_subnet_capacity(public_prefix)} usable addresses)",
                    "use fewer login nodes")


def _check_path(out: _Collector, path: KeyPath, value: str, example: str) -> bool:
    """An absolute, normalised path of plain characters (no spaces, quotes, `.` or `..` parts, trailing `/`)."""
    if not PATH_PATTERN.fullmatch(value) or posixpath.normpath(value) != value or \
            any(part in (".", "..") for part in value.split("/")) or len(value) > 255:
        out.add(path, f"{show(value)} is not an absolute, normalised path",
                f"write it like {example}: starting with /, parts of letters, digits, '.', '_' or '-', "
                "no '..', no trailing '/', at most 255 characters")
        return False
    return True


def _check_mount(out: _Collector, path: KeyPath, mount: Any) -> str | None:
    if mount == "/":
        out.add(path, "'/' is the root file system", "mount it at a directory of its own, e.g. /fsx or /shared")
        return None
    if not isinstance(mount, str) or not _check_path(out, path, mount, "/fsx"):
        return None
    inside = next((d for d in SYSTEM_DIRS if mount == d or mount.startswith(d + "/")), None)
    if inside or mount in SYSTEM_EXACT:
        out.add(path, f"'{mount}' is a system directory" + (f" (inside {inside})" if inside and inside != mount else ""),
                "mount it at a directory of its own, e.g. /fsx or /shared")
        return None
    return mount


def _check_storage(out: _Collector, tenant: dict[str, Any], t: KeyPath) -> None:
    lustre = _get(tenant, "storage", "lustre")
    s: KeyPath = (*t, "storage", "lustre")
    lustre_mount = None
    if isinstance(lustre, dict):
        kind = lustre.get("deployment_type", "PERSISTENT_2")
        kind = kind if isinstance(kind, str) else "?"  # a list or mapping here is the schema's to report
        capacity = lustre.get("storage_capacity_gib")
        if kind in LUSTRE_STEP_GIB and _whole(capacity):
            step = LUSTRE_STEP_GIB[kind]
            if capacity < 1200:
                out.add((*s, "storage_capacity_gib"), f"{capacity} GiB is below the FSx for Lustre minimum of 1200 GiB",
                        "use 1200, 2400, or a larger multiple of " + str(step))
            elif capacity not in (1200, 2400) and capacity % step:
                lower = capacity - capacity % step
                out.add((*s, "storage_capacity_gib"),
                        f"{capacity} GiB is not a valid {kind} size (1200, 2400, then steps of {step})",
                        f"use {max(lower, 2400)} or {lower + step}")
        if kind in LUSTRE_THROUGHPUT:
            allowed = LUSTRE_THROUGHPUT[kind]
            throughput = lustre.get("throughput_per_unit")
            if allowed and _whole(throughput) and throughput not in allowed:
                out.add((*s, "throughput_per_unit"), f"{throughput} MB/s/TiB is not offered for {kind}",
                        f"use one of: {', '.join(map(str, allowed))}")
            if not allowed and "throughput_per_unit" in lustre:
                out.add((*s, "throughput_per_unit"), f"{kind} file systems have a fixed throughput",
                        "remove throughput_per_unit, or use a PERSISTENT deployment type")
        if "data_repository" in lustre and kind not in LUSTRE_DRA_TYPES:
            out.add((*s, "data_repository"), f"a data repository association needs {' or '.join(LUSTRE_DRA_TYPES)}, not {neutral(kind)}",
                    "set deployment_type: PERSISTENT_2 or remove data_repository")
        fs_path = _get(lustre, "data_repository", "file_system_path")
        if fs_path == "/":
            out.add((*s, "data_repository", "file_system_path"), "'/' would link the whole file system to the bucket",
                    "link a sub-path, e.g. /data, so the rest of the file system stays scratch space")
        elif isinstance(fs_path, str):
            _check_path(out, (*s, "data_repository", "file_system_path"), fs_path, "/data")
        prefix = _get(lustre, "data_repository", "s3_prefix")
        if isinstance(prefix, str) and (not S3_PREFIX_PATTERN.fullmatch(prefix) or len(prefix) > 512 or
                                        any(part in (".", "..") for part in prefix.split("/"))):
            out.add((*s, "data_repository", "s3_prefix"), f"{show(prefix)} is not a usable S3 prefix",
                    "write folder names of letters, digits, '.', '_' or '-', each followed by '/', e.g. data/ "
                    "or datasets/v1/; no '..', no leading '/'")
        elif isinstance(prefix, str) and (control := control_prefix_overlap(prefix)) is not None:
            where = ("the whole bucket, which holds" if prefix == "" else "" if prefix == control else
                     "inside" if prefix.startswith(control) else "a folder that holds")
            out.add((*s, "data_repository", "s3_prefix"),
                    f"{show(prefix)} is {where + ' ' if where else ''}fmcluster's control prefix '{control}' (the node bootstrap, manifest, "
                    "reports and HyperPod lifecycle scripts nodes run as root): the file system would export over them",
                    "link a data folder of its own, e.g. data/ or datasets/v1/ (not under "
                    + " or ".join(CONTROL_PREFIXES) + ")")
        lustre_mount = _check_mount(out, (*s, "mount_point"), lustre.get("mount_point", "/fsx"))
    zfs = _get(tenant, "storage", "openzfs")
    if isinstance(zfs, dict):
        z: KeyPath = (*t, "storage", "openzfs")
        capacity = zfs.get("storage_capacity_gib")
        if _whole(capacity) and not OPENZFS_MIN_GIB <= capacity <= OPENZFS_MAX_GIB:
            out.add((*z, "storage_capacity_gib"), f"{capacity} GiB is outside FSx for OpenZFS limits",
                    f"use {OPENZFS_MIN_GIB} to {OPENZFS_MAX_GIB} GiB")
        zfs_mount = _check_mount(out, (*z, "mount_point"), zfs.get("mount_point", "/home"))
        if zfs_mount and lustre_mount:
            if zfs_mount == lustre_mount:
                out.add((*z, "mount_point"), f"'{lustre_mount}' is already the Lustre mount point",
                        "mount them at different paths")
            elif zfs_mount.startswith(lustre_mount + "/") or lustre_mount.startswith(zfs_mount + "/"):
                out.add((*z, "mount_point"), f"'{zfs_mount}' and the Lustre mount point '{lustre_mount}' are nested",
                        "mount them side by side (e.g. /fsx and /home): nested mounts depend on mount order")


def control_prefix_overlap(prefix: str) -> str | None:
    """The control prefix an S3 prefix equals, contains or lies inside ('' contains them all), else None."""
    return next((c for c in CONTROL_PREFIXES if c.startswith(prefix) or prefix.startswith(c)), None)


def https_url_problem(url: str) -> str | None:
    """Why `url` is not a plain https URL (no credentials, RFC 3986 characters only), or None."""
    if len(url) > MAX_STRING or not URL_CHARACTERS.fullmatch(url):
        return "has characters a URL cannot hold (spaces, quotes, braces...)"
    if re.search(r"%(?![0-9A-Fa-f]{2})", url):
        return "has a '%' that is not a percent-escape"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https":
        return "is not an https URL"
    if "@" in parts.netloc:
        return "carries credentials in the URL"
    try:
        port = parts.port
    except ValueError:
        return "has an invalid port"
    host = parts.hostname or ""
    if not host or not HOST_PATTERN.fullmatch(host) or port == 0:
        return "has no valid host name"
    return None


#: Ports the cluster's own services listen on (the roles' defaults: prometheus_port, alertmanager_port and its
#: cluster port, grafana_port, the exporters', Slurm's daemons', the accounting database's). A receiver URL at one
#: of them is aimed at the cluster itself (POST /-/quit, Grafana's admin API...), whatever name it uses.
#: tests/hostile/test_hostile_round3.py checks them against roles/*/defaults/main.yml.
CLUSTER_PORTS = {9090: "Prometheus", 9093: "Alertmanager", 9094: "Alertmanager's cluster port", 3000: "Grafana",
                 9100: "the node exporter", 9109: "the EFA exporter", 9400: "the DCGM exporter",
                 6817: "slurmctld", 6818: "slurmd", 6819: "slurmdbd", 6820: "slurmrestd", 3306: "the accounting database"}
#: DNS names that always resolve inside the host or the VPC (RFC 6761 localhost; RFC 6762 .local; AWS's VPC
#: resolver: *.internal, e.g. instance-data.ec2.internal = the instance metadata service; RFC 8375 home.arpa).
INTERNAL_SUFFIXES = ("localhost", "local", "localdomain", "internal", "home.arpa", "arpa")
#: 169.254.169.254 (and fd00:ec2::254): the instance metadata service, whose credentials are the node role's.
IMDS = (ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"))


class NotAnAddress(ValueError):
    """A host that ends in a number (so URL parsers read it as an IPv4 address) but is no valid one."""


def numeric_host(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host names when it is numeric in any form a URL parser or inet_aton accepts (WHATWG URL
    "IPv4 parser"): dotted or not, each part decimal, octal (0-prefixed) or hex (0x): 169.254.169.254, 2852039166,
    0251.0376.0251.0376, 0xa9fea9fe, 169.254.43518; or an IPv6 literal. None for a name; NotAnAddress for a
    host that ends in a number without being a valid address (parsers disagree on those)."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if not labels or not re.fullmatch(r"0[xX][0-9A-Fa-f]*|[0-9]+", labels[-1]):
        return None  # the last label is not a number: a DNS name (WHATWG "ends in a number")
    numbers = []
    for label in labels:
        try:
            if re.fullmatch(r"0[xX][0-9A-Fa-f]*", label):
                numbers.append(int(label[2:] or "0", 16))
            elif re.fullmatch(r"0[0-7]+", label):
                numbers.append(int(label, 8))
            elif re.fullmatch(r"[0-9]+", label):
                numbers.append(int(label, 10))
            else:
                raise NotAnAddress(host)
        except ValueError:
            raise NotAnAddress(host) from None
    if len(numbers) > 4 or any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        raise NotAnAddress(host)
    value = numbers[-1]
    for i, n in enumerate(numbers[:-1]):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


#: EC2's public DNS names (ec2-203-0-113-5.compute-1.amazonaws.com, ec2-...REGION.compute.amazonaws.com): inside a
#: VPC they resolve to the instance's private address.
EC2_PUBLIC_NAMES = (".compute.amazonaws.com", ".compute-1.amazonaws.com")


def embedded_address(name: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a DNS name spells in its labels, as wildcard DNS services read it: four decimal labels in a
    row (169.254.169.254.nip.io), one label of four dash-separated numbers (169-254-169-254.sslip.io,
    ip-10-0-0-1), or one label of 8 hex digits (a9fea9fe.nip.io); None when it spells none."""
    labels = name.split(".")
    for i in range(len(labels) - 3):
        if all(re.fullmatch(r"[0-9]{1,3}", label) for label in labels[i:i + 4]):
            try:
                return ipaddress.IPv4Address(".".join(labels[i:i + 4]))
            except ValueError:
                pass
    for label in labels:
        dashed = re.search(r"(?:^|-)([0-9]{1,3}(?:-[0-9]{1,3}){3})(?:-|$)", label)
        if dashed:
            try:
                return ipaddress.IPv4Address(dashed.group(1).replace("-", "."))
            except ValueError:
                pass
        if re.fullmatch(r"[0-9a-f]{8}", label):
            return ipaddress.IPv4Address(int(label, 16))
    return None


def receiver_host_problem(url: str) -> str | None:
    """Why an alert receiver's URL points inside the host, the VPC or the cluster, or None: any numeric host
    (what it decodes to is named), a name without a dot (resolved through the nodes' /etc/hosts: controller-1,
    localhost...), a name under a host- or VPC-internal suffix, a port of the cluster's own services."""
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        address = numeric_host(host)
    except NotAnAddress:
        return f"names its host by a number that is no valid address ({show(host)}), which URL parsers read differently"
    if address is not None:
        if address in IMDS:
            what = "the instance metadata service (its credentials are the node's)"
        elif address.is_loopback or address.is_unspecified:
            what = "this host (loopback)"
        elif address.is_link_local:
            what = "a link-local address (the instance metadata service's range)"
        elif any(address in net for net in (*RFC1918, ipaddress.ip_network("fc00::/7"), ipaddress.ip_network("100.64.0.0/10"))):
            what = "a private address (the VPC's or another internal network's)"
        else:
            what = "an IP address, not a name the webhook's TLS certificate can prove"
        shown = "" if host == str(address) else f" = {address}"
        return f"names its host by number ({host}{shown}), which is {what}"
    name = host.rstrip(".")
    if "." not in name:
        return f"names host {show(name)}, which has no domain: the nodes resolve it through /etc/hosts (the cluster's own nodes, localhost)"
    suffix = next((s for s in INTERNAL_SUFFIXES if name == s or name.endswith("." + s)), None)
    if suffix is not None:
        return f"names host {show(name)}, under .{suffix}, which resolves inside the host or the VPC"
    if name.endswith(EC2_PUBLIC_NAMES):
        return f"names host {show(name)}, an EC2 instance's public name, which resolves to its private address inside the VPC"
    embedded = embedded_address(name)
    if embedded is not None and not embedded.is_global:
        return (f"names host {show(name)}, which spells the address {embedded} (wildcard DNS services such as nip.io "
                "resolve such names to it)")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port in CLUSTER_PORTS:
        return f"names port {port}, where the cluster's own {CLUSTER_PORTS[port]} listens"
    return None


def _check_monitoring(out: _Collector, tenant: dict[str, Any], t: KeyPath) -> None:
    m: KeyPath = (*t, "monitoring")
    region = tenant.get("region")
    url = _get(tenant, "monitoring", "remote_write_url")
    if isinstance(url, str):
        match = AMP_URL_PATTERN.fullmatch(url)
        where = region if region in KNOWN_REGIONS else "REGION"
        example = f"https://aps-workspaces.{where}.amazonaws.com/workspaces/ws-ID/api/v1/remote_write"
        if not match:
            out.add((*m, "remote_write_url"), f"{show(url)} is not an Amazon Managed Prometheus remote-write URL",
                    f"copy the workspace's remote-write endpoint: {example}")
        elif isinstance(region, str) and match.group(1) != region:
            out.add((*m, "remote_write_url"), f"the workspace is in {match.group(1)}, the tenant in {region}",
                    f"use a workspace in {region} (remote write is signed for the tenant's region)")
    receivers = _get(tenant, "monitoring", "alert_receivers")
    _check_smtp(out, tenant, m, receivers if isinstance(receivers, list) else [])
    if not isinstance(receivers, list):
        return
    names: set[str] = set()
    for i, receiver in enumerate(receivers):
        if not isinstance(receiver, dict):
            continue
        r: KeyPath = (*m, "alert_receivers", i)
        name, kind, target = receiver.get("name"), receiver.get("type"), receiver.get("target")
        if isinstance(name, str):
            if name in names:
                out.add((*r, "name"), f"receiver name {show(name)} is used twice", "give every receiver its own name")
            if name in RESERVED_RECEIVER_NAMES:
                out.add((*r, "name"), f"'{name}' is the alertmanager role's own catch-all receiver",
                        "choose another name, e.g. 'oncall'")
            names.add(name)
        if not isinstance(target, str):
            continue
        if kind == "email" and (len(target) > 254 or not EMAIL_PATTERN.fullmatch(target) or ".." in target
                                or target.startswith(".") or ".@" in target):
            out.add((*r, "target"), f"{show(target)} is not an e-mail address",
                    "write it like ops@example.org (letters, digits and . _ % + - before the @)")
        if kind in ("slack", "webhook") and (why := https_url_problem(target)):
            out.add((*r, "target"), f"{show(target)} {why}", "use the https:// webhook URL, e.g. https://hooks.example.org/alerts")
        elif kind in ("slack", "webhook") and (why := receiver_host_problem(target)):
            out.add((*r, "target"), f"{show(target)} {why}: Alertmanager on the controller would send alerts (and "
                    "follow redirects) there, from inside the cluster", "use the public https:// URL of the webhook "
                    "service, by its DNS name, e.g. https://hooks.example.org/alerts")
        if kind == "sns":
            arn = SNS_ARN_PATTERN.fullmatch(target)
            if not arn:
                out.add((*r, "target"), f"{show(target)} is not an SNS topic ARN",
                        "write it like arn:aws:sns:ap-northeast-1:123456789012:alerts (topic: letters, digits, _ and -)")
            elif arn.group(1) not in KNOWN_REGIONS:
                out.add((*r, "target"), f"'{arn.group(1)}' in the topic ARN is not a known AWS region"
                        f"{did_you_mean(arn.group(1), KNOWN_REGIONS)}", f"use one of: {', '.join(KNOWN_REGIONS)}")


#: Amazon SES's SMTP endpoints (email-smtp.REGION.amazonaws.com) and the ports they listen on (SES developer guide,
#: "Connecting to an Amazon SES SMTP endpoint": STARTTLS on 25, 587 and 2587, TLS wrapper on 465 and 2465).
SES_SMTP_HOST = re.compile(r"email-smtp(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com")
SES_SMTP_PORTS = (465, 587, 2587)


def _check_smtp(out: _Collector, tenant: dict[str, Any], m: KeyPath, receivers: list[Any]) -> None:
    """monitoring.smtp: the relay email receivers send through. On AWS an email receiver needs one (EC2 blocks
    outbound port 25, and no role installs a mail server on the controller)."""
    smtp = _get(tenant, "monitoring", "smtp")
    region = tenant.get("region")
    where = region if region in KNOWN_REGIONS else "REGION"
    provider = PROVIDERS.get(str(tenant.get("provider")))  # None: the schema names it
    on_aws = provider is not None and provider.smtp_port_25_blocked
    emails = [i for i, r in enumerate(receivers) if isinstance(r, dict) and r.get("type") == "email"]
    if smtp is None:
        if emails and on_aws:
            out.add((*m, "alert_receivers", emails[0], "type"),
                    "an email receiver cannot deliver: EC2 blocks outbound port 25 and nothing on the controller "
                    "relays mail",
                    f"set monitoring.smtp to Amazon SES's SMTP endpoint, e.g. smtp: {{smarthost: "
                    f"email-smtp.{where}.amazonaws.com:587, from: alerts@example.org, username_secret: smtp-username, "
                    "password_secret: smtp-password} (SES SMTP credentials in those secrets under fmcluster/<org>/), "
                    "or use an sns, slack or webhook receiver")
        return
    if not isinstance(smtp, dict):
        return
    s: KeyPath = (*m, "smtp")
    smarthost = smtp.get("smarthost")
    if isinstance(smarthost, str) and smarthost.count(":") == 1:
        host, _, port_text = smarthost.partition(":")
        port = int(port_text) if port_text.isdigit() else 0
        ses = SES_SMTP_HOST.fullmatch(host.lower())
        if not 1 <= port <= 65535:
            out.add((*s, "smarthost"), f"port {port_text} is not a TCP port",
                    f"use the relay's submission port, e.g. email-smtp.{where}.amazonaws.com:587")
        elif port == 25 and on_aws:
            out.add((*s, "smarthost"), f"{show(smarthost)} uses port 25, which EC2 blocks outbound by default",
                    f"use the relay's submission port: 587 (STARTTLS) or 465 (TLS), e.g. "
                    f"email-smtp.{where}.amazonaws.com:587")
        elif ses and port not in SES_SMTP_PORTS:
            out.add((*s, "smarthost"), f"Amazon SES's SMTP endpoint does not take submissions on port {port} here",
                    f"use {host}:587 (STARTTLS), :2587 (STARTTLS) or :465 (TLS)")
        if ses and isinstance(region, str) and ses.group(1) != region:
            out.add((*s, "smarthost"), f"the SES endpoint is in {ses.group(1)}, the tenant in {region}",
                    f"use email-smtp.{region}.amazonaws.com:587, with an identity verified and SMTP credentials "
                    f"made in {region}")
    sender = smtp.get("from")
    if isinstance(sender, str) and (len(sender) > 254 or not EMAIL_PATTERN.fullmatch(sender) or ".." in sender
                                    or sender.startswith(".") or ".@" in sender):
        out.add((*s, "from"), f"{show(sender)} is not an e-mail address",
                "write the sender like alerts@example.org (with SES: an identity verified in the tenant's region)")
    user, password = smtp.get("username_secret"), smtp.get("password_secret")
    _credential_pair(out, s, ("username_secret", user), ("password_secret", password),
                     "add password_secret: the name of the secret under fmcluster/<org>/ that holds the SMTP password "
                     "(e.g. smtp-password), or remove username_secret for a relay that takes mail without login",
                     "add username_secret: the name of the secret under fmcluster/<org>/ that holds the SMTP user name "
                     "(e.g. smtp-username)")
    if isinstance(user, str) and user == password:
        out.add((*s, "password_secret"), f"{show(password)} is also username_secret: one secret cannot hold both",
                "name two secrets, e.g. username_secret: smtp-username and password_secret: smtp-password")
    if on_aws and user is None and password is None and isinstance(smarthost, str) and \
            SES_SMTP_HOST.fullmatch(smarthost.partition(":")[0].lower()):
        out.add(s, "Amazon SES's SMTP endpoint takes mail only from an authenticated sender",
                "add username_secret and password_secret: names of secrets under fmcluster/<org>/ holding SES SMTP "
                "credentials (e.g. smtp-username, smtp-password)")
    _secret_names(out, s, (("username_secret", user), ("password_secret", password)), "smtp-password")


def _credential_pair(out: _Collector, path: KeyPath, who: tuple[str, Any], secret: tuple[str, Any],
                     add_secret: str, add_who: str) -> None:
    """One login given as two keys (monitoring.smtp's user and password secrets, directory's bind_dn and its password
    secret): both or neither, each refusal naming the key that is there and how to add the other."""
    (who_key, who_value), (secret_key, secret_value) = who, secret
    if who_value is not None and secret_value is None:
        out.add((*path, who_key), f"{who_key} is given without {secret_key}", add_secret)
    if secret_value is not None and who_value is None:
        out.add((*path, secret_key), f"{secret_key} is given without {who_key} (whose password is it?)", add_who)


def _secret_names(out: _Collector, path: KeyPath, named: tuple[tuple[str, Any], ...], example: str) -> None:
    """Secret names the node agent writes into the nodes' secrets folder: none may be a file fmcluster keeps there."""
    for key, value in named:
        if isinstance(value, str) and (clash := agent_file_clash(value)) is not None:
            out.add((*path, key), f"{show(value)} {clash}",
                    f"name the secret otherwise, e.g. {example} (fmcluster's own files there: "
                    f"{', '.join(AGENT_SECRET_FILES)}, and each one's .tmp)")


#: An ECR registry host (ECR's registry URL, https://docs.aws.amazon.com/AmazonECR/latest/userguide/Registries.html):
#: the 12-digit account and the region; China's partition ends in .amazonaws.com.cn.
ECR_REGISTRY = re.compile(r"(?P<account>[0-9]{12})\.dkr\.ecr\.(?P<region>[a-z]{2}(-[a-z]+)+-[0-9])\.amazonaws\.com(\.cn)?")


def _check_containers(out: _Collector, tenant: dict[str, Any], t: KeyPath) -> None:
    """`containers.registries`: only ECR registries of one account (the deploy checks it is the tenant's: the account
    is not known offline), and only where the provider's nodes pull from ECR (capability ecr_registries)."""
    registries = _get(tenant, "containers", "registries")
    if not isinstance(registries, list):
        return
    provider = PROVIDERS.get(str(tenant.get("provider")))  # None: the schema names it
    accounts: dict[str, int] = {}
    for i, host in enumerate(registries):
        if not isinstance(host, str):
            continue
        key = (*t, "containers", "registries", i)
        if provider is not None and not provider.ecr_registries:
            out.add(key, f"{show(host)}: provider {tenant.get('provider')}'s nodes reach only the VPC's container "
                    "registry (on the router address), which the provider gives", "remove containers.registries and "
                    "push images to the VPC's registry (docs/containers.md, 'The registry')")
            continue
        match = ECR_REGISTRY.fullmatch(host)
        if match is None:
            out.add(key, f"{show(host)} is not an ECR registry of the tenant's account: nodes pull only from the "
                    "tenant's own registries, never a public or another organization's one",
                    "push the image to your account's ECR and list it as ACCOUNT.dkr.ecr.REGION.amazonaws.com, "
                    "e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com (no scheme, port or path), or remove it")
            continue
        if match.group("region") not in KNOWN_REGIONS:
            out.add(key, f"{show(host)} names {show(match.group('region'))}, not a known AWS region"
                    f"{did_you_mean(match.group('region'), KNOWN_REGIONS)}", f"use one of: {', '.join(KNOWN_REGIONS)}")
        first = accounts.setdefault(match.group("account"), i)
        if len(accounts) > 1 and first == i:
            out.add(key, f"{show(host)} is of account {match.group('account')}, another than containers.registries"
                    f"[0]'s: a tenant's registries are its own account's", "list only your account's ECR registries")


#: An image reference as the node tool fmcluster-container takes it (roles/slurm_containers/files/fmcluster-container,
#: `_REFERENCE`; tests/test_container_tool.py holds the two equal): Docker's reference grammar narrowed to an explicit
#: registry host[:port], lower-case path components, a tag of at most 128 letters, digits, `_ . -`, a sha256 digest.
IMAGE_REFERENCE = re.compile(
    r"(?P<registry>[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*(?::[0-9]{1,5})?)"
    r"/(?P<repository>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[a-f0-9]{64}))?")
IMAGE_REFERENCE_MAX = 255
#: What a refused acceptance image is fixed with (docs/acceptance.md, "From a container image").
_IMAGE_FIX = ("build the image from awsome-distributed-training's micro-benchmarks/nccl-tests/nccl-tests.Dockerfile, "
              "push it to your account's ECR and name it as REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST], e.g. "
              "123456789012.dkr.ecr.{region}.amazonaws.com/nccl-tests:cuda12.9-efa1.47; or remove acceptance.image "
              "(the nodes' own nccl-tests build runs)")


def _check_acceptance_image(out: _Collector, tenant: dict[str, Any], t: KeyPath,
                            catalog: dict[str, InstanceType]) -> None:
    """`acceptance.image`: an image reference (the node tool's grammar) in one of the tenant's own registries (the
    account's ECR in `region`, or one listed in containers.registries; the deploy checks the account, unknown offline),
    on a tenant whose GPU queues run nccl-tests and whose scheduler's nodes run images (capability
    job_container_runtime; slurm-oci needs fmcluster's slurm_containers role: containers.enabled)."""
    image = _get(tenant, "acceptance", "image")
    if not isinstance(image, str):
        return
    key = (*t, "acceptance", "image")
    region = tenant.get("region") if tenant.get("region") in KNOWN_REGIONS else "us-east-1"
    fix = _IMAGE_FIX.format(region=region)
    found = IMAGE_REFERENCE.fullmatch(image) if len(image) <= IMAGE_REFERENCE_MAX else None
    if found is None:
        out.add(key, f"{show(image)} is not an image reference REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST] (at most "
                f"{IMAGE_REFERENCE_MAX} characters, lower-case path, a tag of letters, digits, '_', '.', '-', a sha256 "
                "digest; no shell characters, no default registry)", fix)
        return
    provider = PROVIDERS.get(str(tenant.get("provider")))  # None: the schema names it
    if provider is not None and not provider.real_accelerators:
        out.add(key, f"provider {tenant.get('provider')}'s nodes have no GPUs, and the acceptance image runs "
                "nccl-tests on GPU queues (CPU queues run fmcluster's bench, from the image the deploy pushes to the "
                "provider's registry wherever the nodes run images: docs/acceptance.md)",
                "remove acceptance.image, or set it on a provider aws tenant")
        return
    queues = tenant.get("queues")
    kinds = {catalog[q["instance_type"]].accelerator for q in (queues if isinstance(queues, list) else [])
             if isinstance(q, dict) and q.get("instance_type") in catalog}
    if kinds and "cuda" not in kinds:
        out.add(key, f"no queue has NVIDIA GPUs ({', '.join(sorted(kinds))}): the acceptance image runs nccl-tests, "
                "which only GPU queues run (Trainium queues run nccom-test from their image, CPU queues the CPU bench)",
                "remove acceptance.image")
        return
    scheduler = SCHEDULERS.get(str(tenant.get("scheduler")))  # None: the schema names it
    if scheduler is not None and scheduler.job_container_runtime is None:
        out.add(key, f"scheduler {scheduler.name}'s nodes run no container runtime fmcluster knows of "
                "(its capabilities.yml names no job_container_runtime)", "remove acceptance.image")
        return
    if (scheduler is not None and CONTAINER_RUNTIMES.get(str(scheduler.job_container_runtime)) == "fmcluster"
            and _get(tenant, "containers", "enabled") is False):
        out.add(key, f"scheduler {scheduler.name} runs images through fmcluster's slurm_containers role "
                f"({scheduler.job_container_runtime}), and containers.enabled is false", "set containers.enabled: true, "
                "or remove acceptance.image")
        return
    registry = found.group("registry")
    given = _get(tenant, "containers", "registries")
    listed = [h for h in given if isinstance(h, str)] if isinstance(given, list) else []
    ecr = ECR_REGISTRY.fullmatch(registry)
    own = ("the tenant's own registries (its account's ECR in region "
           f"{tenant.get('region')}{', or ' + ', '.join(listed) if listed else ''})")
    if ecr is None:
        out.add(key, f"registry {show(registry)} of {show(image)} is not one of {own}: the nodes pull only from "
                "the tenant's own registries, never a public or another organization's one", fix)
    elif registry not in listed and ecr.group("region") != tenant.get("region"):
        out.add(key, f"registry {show(registry)} is ECR in {ecr.group('region')}, not in the tenant's region "
                f"{tenant.get('region')}, and containers.registries does not list it", "list it under "
                f"containers.registries (an ECR registry of your account), or push the image to ECR in "
                f"{tenant.get('region')}")
    else:
        accounts = {m.group("account") for h in listed if (m := ECR_REGISTRY.fullmatch(h))}
        if accounts and ecr.group("account") not in accounts:
            out.add(key, f"registry {show(registry)} is of account {ecr.group('account')}, and "
                    f"containers.registries of account {', '.join(sorted(accounts))}: a tenant's registries are its "
                    "own account's", fix)


#: Database accounts slurmdbd may not connect as: the server's administrators (MySQL and MariaDB's root, Amazon
#: RDS's own rdsadmin/rdsrepladmin/rdsproxyadmin; MariaDB 10.4+ also makes `mysql`). With one, slurmdbd (and whoever reads its password file) holds
#: every right on every database of the server, and on the controller's MariaDB the slurm_accounting role would
#: reset the administrator's password.
DATABASE_ADMINS = ("root", "mysql", "rdsadmin", "rdsrepladmin", "rdsproxyadmin")


def scheduler_rules(name: object) -> ModuleType | None:
    """Scheduler `name`'s own validation rules, found through its folder: the `rules` module there
    (src/fmcluster/schedulers/<folder>/rules.py), which provides `check_tenant(tenant, add)` and may name
    `DATABASE_USERS`, the key paths of its section that hold a database user. None where the scheduler has no
    rules.py (or no folder: the schema names it). Validation never imports a scheduler by name, nor the registry."""
    folder = SCHEDULER_FOLDERS.get(name) if isinstance(name, str) else None
    if folder is None or not (folder / "rules.py").is_file():
        return None
    return importlib.import_module(f"fmcluster.schedulers.{folder.name}.rules")


def scheduler_function(name: str, ref: str) -> Callable[..., Any]:
    """The function `module:function` (a capabilities.yml entry, e.g. section_parser) of scheduler `name`'s
    folder, imported through the folder as scheduler_rules does: the model never names a scheduler's module."""
    module, _, function = ref.partition(":")
    found: Callable[..., Any] = getattr(
        importlib.import_module(f"fmcluster.schedulers.{SCHEDULER_FOLDERS[name].name}.{module}"), function)
    return found


def _check_foreign_sections(out: _Collector, tenant: dict[str, Any], t: KeyPath) -> None:
    """A scheduler's own section (capabilities.yml's own_section) belongs to that scheduler only: under any other
    it would be ignored."""
    own = SCHEDULERS.get(str(tenant.get("scheduler")))  # None: the schema names it
    for name, other in SCHEDULERS.items():
        if other.own_section is not None and other is not own and other.own_section in tenant:
            out.add((*t, other.own_section), f"only scheduler {name} reads this section, not {tenant.get('scheduler')!r}",
                    f"remove the section, or set scheduler: {name}")


def _check_accounting(out: _Collector, tenant: dict[str, Any], t: KeyPath) -> None:
    endpoint = _get(tenant, "accounting", "database_endpoint")
    provider = PROVIDERS.get(str(tenant.get("provider")))  # None: the schema names it
    if isinstance(endpoint, str) and provider is not None and not provider.external_database:
        out.add((*t, "accounting", "database_endpoint"), "provider local cannot reach a database endpoint: its "
                "accounting database is MariaDB on the controller node", "remove database_endpoint for a local tenant")
    rules = scheduler_rules(tenant.get("scheduler"))
    own_users: tuple[KeyPath, ...] = getattr(rules, "DATABASE_USERS", ())
    for path in (("accounting", "database_user"), *own_users):
        user = _get(tenant, *path)
        if isinstance(user, str) and user.lower() in DATABASE_ADMINS:
            out.add((*t, *path), f"{show(user)} is the database server's administrator: slurmdbd would hold every "
                    "right on every database of the server (and its password would sit on the controller)",
                    "use an account of slurmdbd's own with rights on its database only, e.g. slurm")


@lru_cache(maxsize=1)
def reserved_accounts() -> tuple[dict[str, str], dict[int, str]]:
    """(name → where the system already has it, id → the daemon that has it) from data/reserved_accounts.yml."""
    data = reserved_data()
    names = {name: source for source, listed in data.items() if source not in _ID_SECTIONS for name in listed}
    return names, {uid: name for name, uid in data["fixed_ids"].items()}


@lru_cache(maxsize=1)
def reserved_data() -> dict[str, Any]:
    """data/reserved_accounts.yml, with the names each scheduler's folder adds (its reserved_accounts.yml)."""
    return scheduler_data(RESERVED_ACCOUNTS_PATH.name, yaml.safe_load(RESERVED_ACCOUNTS_PATH.read_text(encoding="utf-8")))


def image_ids() -> dict[int, str]:
    """id → whose it is on the images (the default user's 1000), from data/reserved_accounts.yml."""
    return {int(uid): str(whose) for uid, whose in reserved_data()["image_ids"].items()}


def reserved_source(name: str) -> str:
    """Where a reserved name comes from, as a message says it."""
    section = reserved_accounts()[0][name]
    listed = reserved_data()[section]
    detail = f" ({listed[name]})" if isinstance(listed, dict) else ""
    return _RESERVED_SOURCES[section] + detail


_ID_SECTIONS = ("fixed_ids", "image_ids")
_RESERVED_SOURCES = {"base_passwd": "an account or group of every Debian and Ubuntu system (base-passwd)",
                     "debian_ubuntu_images": "an account or group the Debian and Ubuntu images already have",
                     "gpu_and_aws_images": "an account the GPU and AWS images already have",
                     "cluster_daemons": "a daemon account of the cluster or of fmcluster itself"}
MIN_ID, MAX_ID = 1000, 59999


def _named(items: Any) -> list[tuple[int, dict[str, Any]]]:
    return [(i, item) for i, item in enumerate(items)] if isinstance(items, list) else []


def _check_people(out: _Collector, tenant: dict[str, Any], t: KeyPath) -> None:
    """qos, teams and users (docs/users.md): names, ids and references that a schema cannot relate."""
    qos_list = [(i, q) for i, q in _named(tenant.get("qos")) if isinstance(q, dict)]
    teams = [(i, team) for i, team in _named(tenant.get("teams")) if isinstance(team, dict)]
    users = [(i, user) for i, user in _named(tenant.get("users")) if isinstance(user, dict)]
    reserved, fixed = reserved_accounts()
    on_images = image_ids()
    accounting_off = _get(tenant, "accounting", "enabled") is False
    for section, given in (("teams", teams), ("qos", qos_list)):
        if given and accounting_off:
            out.add((*t, section), f"{section} are Slurm accounting objects, and accounting.enabled is false: "
                    "Slurm accounts, associations and QoS live in slurmdbd's database",
                    f"set accounting.enabled: true (or remove `{section}:` and the users' teams)")

    def check_name(path: KeyPath, index: int, name: Any, what: str, seen: dict[str, int], section: str) -> None:
        if not isinstance(name, str):
            return
        if name in reserved:
            out.add(path, f"'{name}' is reserved: it is {reserved_source(name)}",
                    f"choose another {what} name, e.g. '{name}1' or a person's login (the list: "
                    "src/fmcluster/data/reserved_accounts.yml and the schedulers' own)")
        elif name in seen:
            out.add(path, f"{what} name {show(name)} is used twice (also {section}[{seen[name]}])",
                    f"give every {what} its own name")
        else:
            seen[name] = index

    qos_names: dict[str, int] = {}
    for i, q in qos_list:
        check_name((*t, "qos", i, "name"), i, q.get("name"), "QoS", qos_names, "qos")

    # Unix ids: a team's group and each user's uid and private group (gid = uid) share one space.
    ids: dict[int, str] = {}

    def check_id(path: KeyPath, value: Any, owner: str) -> None:
        if not _whole(value):
            return
        if value in fixed:
            out.add(path, f"{value} is the fixed id of the {fixed[value]} daemon account on every node",
                    f"use an id from {MIN_ID} to {MAX_ID} that no other user or team has")
        elif value in on_images:
            out.add(path, f"{value} is the id of {on_images[value]} on every node",
                    f"use an id from {MIN_ID + 1} to {MAX_ID} that no other user or team has, e.g. 20001")
        elif not MIN_ID <= value <= MAX_ID:
            return  # the schema's range check says so
        elif value in ids:
            out.add(path, f"id {value} is already {ids[value]}",
                    "give every user a uid and every team a gid of its own: a user's private group has gid = uid, "
                    "so a uid may not equal a team's gid either")
        else:
            ids[value] = owner

    org = tenant.get("org")
    org_account = org.replace("-", "_") if isinstance(org, str) else None
    normal = "normal" in qos_names
    team_names: dict[str, int] = {}
    for i, team in teams:
        tp: KeyPath = (*t, "teams", i)
        name = team.get("name")
        if name == org_account:
            out.add((*tp, "name"), f"'{name}' is the organization's own Slurm account (teams are accounts under it)",
                    "name the team after what it does, e.g. 'llm' or 'vision'")
        else:
            check_name((*tp, "name"), i, name, "team", team_names, "teams")
        check_id((*tp, "gid"), team.get("gid"), f"the gid of teams[{i}]")
        wanted = team.get("qos")
        if wanted is None and qos_list and not normal:
            out.add(tp, "the team names no QoS, and `qos:` declares none named normal to default to",
                    f"add `qos: [{', '.join(sorted(qos_names)[:2]) or 'NAME'}]` to the team (its first QoS is its default)")
        for j, ref in _named(wanted):
            if isinstance(ref, str) and ref not in qos_names:
                out.add((*tp, "qos", j), f"{show(ref)} is not a QoS of `qos:`{did_you_mean(ref, qos_names)}",
                        f"use one of: {', '.join(sorted(qos_names))}" if qos_names else
                        f"declare it under `qos:` first (e.g. `qos: [{{name: {ref if QOS_NAME.fullmatch(ref) else 'normal'}}}]`)")

    user_names: dict[str, int] = {}
    key_owners: dict[tuple[str, bytes], tuple[int, int, Any]] = {}
    for i, user in users:
        up: KeyPath = (*t, "users", i)
        name = user.get("name")
        if isinstance(name, str) and name in team_names:
            out.add((*up, "name"), f"{show(name)} is also the name of teams[{team_names[name]}]: each becomes a unix group "
                    "on every node (the user's private group and the team's)", "give the user and the team different names")
        else:
            check_name((*up, "name"), i, name, "user", user_names, "users")
        check_id((*up, "uid"), user.get("uid"), f"the uid of users[{i}]")
        for j, ref in _named(user.get("teams")):
            if isinstance(ref, str) and ref not in team_names:
                out.add((*up, "teams", j), f"{show(ref)} is not a team of `teams:`{did_you_mean(ref, team_names)}",
                        f"use one of: {', '.join(sorted(team_names))}" if team_names else
                        "declare the team under `teams:` first, with its name and gid")
        for j, key in _named(user.get("ssh_keys")):
            if isinstance(key, str) and (why := key_problem(key)) is not None:
                out.add((*up, "ssh_keys", j), f"{why[0]}", why[1])
            elif isinstance(key, str):
                # The key itself (type and decoded data: base64 has more than one spelling of some blobs), whatever
                # its comment: one key pair logs in as one person.
                kind, encoded = key.split()[:2]
                identity = (kind, base64.b64decode(encoded))
                owner = key_owners.setdefault(identity, (i, j, name))
                if owner[0] != i:
                    out.add((*up, "ssh_keys", j), f"the same key as users[{owner[0]}].ssh_keys[{owner[1]}] "
                            f"({show(owner[2])}): whoever holds its private key would log in as both",
                            "give every person a key pair of their own (ssh-keygen -t ed25519 on their machine)")


#: Secrets fmcluster itself keeps under fmcluster/<org>/ (the manifest's, and accounting's external database's).
OWN_SECRETS = (*SECRET_NAMES, "slurmdbd-storage-password")
#: Files in the nodes' secrets folder (manifest.NODE_SECRETS_DIR) that are fmcluster's own: each secret the node
#: agent writes there, and the slurm_accounting role's password file (roles/slurm_accounting/defaults/main.yml).
#: The agent writes each secret through a temporary file beside it (node/agent.py: `NAME` with its suffix replaced
#: by .tmp, or `.NAME.tmp`, which no secret name can be): a name that is, or is written through, the temporary
#: file of one of these is refused as well.
AGENT_SECRET_FILES = (*OWN_SECRETS, "slurmdbd-storage.pass")
MAX_CA_CERT_BYTES = 65536
PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----\r?\n([A-Za-z0-9+/=\r\n]+)-----END \1-----")


def _temporary(name: str) -> str:
    return str(PurePosixPath(name).with_suffix(".tmp"))


def agent_file_clash(name: str) -> str | None:
    """Why a secret `name` would collide with a file fmcluster keeps in the nodes' secrets folder, or None. Compared
    without case (a case-insensitive copy of the folder must not merge them either)."""
    mine = {f.lower(): f for f in AGENT_SECRET_FILES}
    temporaries = {_temporary(f).lower(): f for f in AGENT_SECRET_FILES}
    lowered, its_temporary = name.lower(), _temporary(name).lower()
    if lowered in mine:
        return f"is {'' if mine[lowered] == name else 'the name of '}a secret fmcluster keeps for itself ({mine[lowered]})"
    if lowered in temporaries:
        return f"is the temporary file the node agent writes {temporaries[lowered]} through"
    if its_temporary in temporaries:
        return (f"would be written through {_temporary(name)!r}, the temporary file of fmcluster's own "
                f"{temporaries[its_temporary]}")
    if its_temporary in mine:
        return f"would be written through {_temporary(name)!r}, which is fmcluster's own {mine[its_temporary]}"
    return None


class CaCertProblem(ValueError):
    """Why a directory's ca_cert cannot be read as a PEM bundle of CA certificates."""


def read_ca_cert(folder: Path, relative: str) -> str:
    """The text of `relative` under `folder` (the tenant spec's folder), read without following a link anywhere on
    the way, its size checked before a byte is read, and every block a DER-encoded X.509 certificate. Raises
    CaCertProblem. validation checks it, model reads it: one reader."""
    parts = PurePosixPath(relative).parts
    if PurePosixPath(relative).is_absolute() or any(p in (".", "..") for p in parts) or not parts:
        raise CaCertProblem("is not a path inside the tenant's folder")
    here = folder
    for part in parts[:-1]:
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except OSError:
            raise CaCertProblem(f"is not a regular file in the tenant's folder ({part}/ does not exist)") from None
        if stat.S_ISLNK(mode):
            raise CaCertProblem(f"is reached through {part}/, a symbolic link: it must lie in the tenant's own folder")
        if not stat.S_ISDIR(mode):
            raise CaCertProblem(f"is not a regular file in the tenant's folder ({part} is not a folder)")
    try:
        fd = os.open(here / parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise CaCertProblem("is a symbolic link: it must be a plain file in the tenant's own folder"
                            if (here / parts[-1]).is_symlink() else
                            f"is not a regular file in the tenant's folder ({err.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise CaCertProblem("is not a regular file in the tenant's folder")
        if info.st_size > MAX_CA_CERT_BYTES:  # before reading: a sparse file may be terabytes of nothing
            raise CaCertProblem(f"is {info.st_size} bytes long (a CA bundle is at most {MAX_CA_CERT_BYTES})")
        data = handle.read(MAX_CA_CERT_BYTES + 1)
    if len(data) > MAX_CA_CERT_BYTES:
        raise CaCertProblem(f"is more than {MAX_CA_CERT_BYTES} bytes long (a CA bundle is at most that)")
    if (why := _pem_problem(data)) is not None:
        raise CaCertProblem(why)
    return data.decode("ascii")


def _pem_problem(data: bytes) -> str | None:
    """Why the bytes are not a PEM bundle of CA certificates, or None."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return "is not PEM text (ASCII)"
    blocks = PEM_BLOCK.findall(text)
    if any("PRIVATE" in kind for kind, _ in blocks) or "PRIVATE KEY-----" in text:
        return "contains a private key"
    certificates = [body for kind, body in blocks if kind == "CERTIFICATE"]
    if not certificates or len(certificates) != len(blocks):
        return "holds no PEM certificate (-----BEGIN CERTIFICATE-----), or blocks other than certificates"
    for n, body in enumerate(certificates, 1):
        try:
            der = base64.b64decode("".join(body.split()), validate=True)
        except ValueError:
            return "has a certificate whose base64 does not decode"
        if (why := der_certificate_problem(der)) is not None:
            return f"has a CERTIFICATE block (the {_ordinal(n)}) that is not a DER X.509 certificate: {why}"
    return None


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


def _der(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the DER element at `at` (X.690 8.1, definite lengths only,
    minimal length encoding). Raises ValueError."""
    if at + 2 > len(data):
        raise ValueError("it ends inside an element")
    tag, first = data[at], data[at + 1]
    if tag & 0x1F == 0x1F:
        raise ValueError("it uses a multi-byte tag")
    at += 2
    if first < 0x80:
        length = first
    elif first == 0x80:
        raise ValueError("it uses an indefinite length (BER, not DER)")
    else:
        size = first & 0x7F
        if size > 4 or at + size > len(data):
            raise ValueError("it has an impossible length")
        length = int.from_bytes(data[at:at + size], "big")
        if length < 0x80 or data[at] == 0:
            raise ValueError("it has a length that is not minimally encoded (BER, not DER)")
        at += size
    if at + length > len(data):
        raise ValueError("an element is longer than the data")
    return tag, at, at + length


def der_certificate_problem(der: bytes) -> str | None:
    """Why `der` is not the DER of an X.509 certificate (RFC 5280 4.1: SEQUENCE { tbsCertificate SEQUENCE,
    signatureAlgorithm SEQUENCE, signatureValue BIT STRING }, nothing after it), or None. The structure, not the
    signature: the nodes' TLS library checks the rest."""
    try:
        tag, start, end = _der(der, 0)
        if tag != 0x30:
            return "it does not start with a SEQUENCE"
        if end != len(der):
            return "it has bytes after the certificate"
        wanted = (0x30, 0x30, 0x03)
        at = start
        for n, expected in enumerate(wanted):
            tag, inner, at = _der(der, at)
            if tag != expected:
                return f"its element {n + 1} is not a {'SEQUENCE' if expected == 0x30 else 'BIT STRING'}"
            if n == 0:
                version_or_serial, _, _ = _der(der, inner)
                if version_or_serial not in (0xA0, 0x02):
                    return "its tbsCertificate starts with neither a version nor a serial number"
        if at != end:
            return "it has more than three elements"
    except ValueError as err:
        return str(err)
    return None


def _check_directory(out: _Collector, tenant: dict[str, Any], t: KeyPath, spec: Path) -> None:
    """`directory:` (docs/users.md): what the schema cannot say about the LDAP connection."""
    directory = tenant.get("directory")
    if not isinstance(directory, dict):
        return
    d: KeyPath = (*t, "directory")
    if isinstance(tenant.get("users"), list) and tenant["users"]:
        out.add((*t, "users"), "`users:` and `directory:` are both given: with a directory, the people, their uids "
                "and groups come from it, and fmcluster makes no local account",
                "remove `users:` (add the people to the directory, in the groups named as their teams), or remove "
                "`directory:`")
    uri, start_tls = directory.get("uri"), directory.get("start_tls", False)
    if isinstance(uri, str) and uri.startswith("ldap://") and start_tls is not True:
        out.add((*d, "uri"), f"{show(uri)} is plain LDAP: the bind password and the directory's answers would "
                "cross the network in clear", "use ldaps://, or set start_tls: true if the server offers StartTLS")
    if isinstance(uri, str) and uri.startswith("ldaps://") and start_tls is True:
        out.add((*d, "start_tls"), "start_tls is true on an ldaps:// connection, which is TLS from the start",
                "remove start_tls (or use ldap:// with start_tls: true)")
    port = uri.rpartition(":")[2] if isinstance(uri, str) and uri.count(":") == 2 else None
    if port is not None and port.isdigit() and not 1 <= int(port) <= 65535:
        out.add((*d, "uri"), f"port {port} is not a TCP port", "use a port from 1 to 65535 (ldaps: 636, ldap: 389)")
    bind_dn, secret = directory.get("bind_dn"), directory.get("bind_password_secret")
    _credential_pair(out, d, ("bind_dn", bind_dn), ("bind_password_secret", secret),
                     "add bind_password_secret: the name of the secret under fmcluster/<org>/ that holds its password "
                     "(e.g. ldap-bind-password), or remove bind_dn to bind anonymously",
                     "add bind_dn, e.g. cn=fmcluster-reader,dc=example,dc=org, or remove bind_password_secret")
    _secret_names(out, d, (("bind_password_secret", secret),), "ldap-bind-password")
    for key in ("base_dn", "user_search_base", "group_search_base", "bind_dn"):
        value = directory.get(key)
        if isinstance(value, str) and (why := dn_problem(value)) is not None:
            out.add((*d, key), f"{show(value)} is not a distinguished name: it {why}",
                    "write a DN of attribute=value pairs separated by commas, e.g. ou=people,dc=example,dc=org "
                    "(no '?': scope and filters are not part of it; filters go in user_filter/group_filter)")
    for key in ("user_filter", "group_filter"):
        value = directory.get(key)
        if isinstance(value, str) and (why := filter_problem(value)) is not None:
            out.add((*d, key), f"{show(value)} is not one LDAP filter: it {why}",
                    "write one LDAP filter (RFC 4515), e.g. (&(objectClass=posixAccount)(memberOf=cn=hpc,dc=example,dc=org))")
    ca_cert = directory.get("ca_cert")
    if isinstance(ca_cert, str):
        try:
            read_ca_cert(spec.parent, ca_cert)
        except CaCertProblem as why:
            out.add((*d, "ca_cert"), f"{show(ca_cert)} (next to {spec.name}) {why}",
                    f"put the directory's CA certificate(s) as PEM in a plain file {spec.parent / ca_cert} (no link "
                    "on the way), or remove ca_cert to use the nodes' system CA bundle")


def problems_in(loaded: LoadedYaml) -> list[Problem]:
    """All problems of one loaded spec document, schema and semantic, in file order."""
    out = _Collector(loaded)
    if loaded.data is None:
        out.add((), "the file is empty", "write a tenant spec; `invoke new-tenant --org=NAME` renders a valid one")
        return out.problems
    if not isinstance(loaded.data, dict):
        out.add((), f"the document is {_kind(loaded.data)}, not a mapping",
                "start the file with `tenant:` and the keys under it")
        return out.problems
    _string_problems(loaded.data, (), out)
    # A value refused as text (control character, template syntax) is not checked again for its form.
    as_text = len(out.problems)
    refused = {p.key for p in out.problems}
    _schema_problems(loaded, out)
    _semantic_problems(loaded, out)
    unique: dict[tuple[str, str], Problem] = {}
    for i, problem in enumerate(out.problems):
        if i >= as_text and problem.key in refused:
            continue
        unique.setdefault((problem.key, problem.message), problem)
    return sorted(unique.values(), key=lambda p: (p.line or 0, p.key))


def apply_defaults(document: Any, schema: dict[str, Any] | None = None) -> Any:
    """Fill the schema's defaults into a valid document, so defaults live only in the schema."""
    root = load_schema()
    schema = root if schema is None else schema
    if "$ref" in schema:
        schema = _resolve(root, schema["$ref"])
    if isinstance(document, dict):
        filled = dict(document)
        for key, sub in schema.get("properties", {}).items():
            if key not in filled and "default" in sub:
                filled[key] = json.loads(json.dumps(sub["default"]))
            elif key not in filled and sub.get("type") == "object" and not sub.get("required"):
                filled[key] = {}  # an optional section: its own keys' defaults still apply
            if key in filled:
                filled[key] = apply_defaults(filled[key], sub)
        return filled
    if isinstance(document, list) and "items" in schema:
        return [apply_defaults(item, schema["items"]) for item in document]
    return document
