"""Tenant spec validation: the JSON Schema first, then the facts a schema cannot express.

Every problem names the file, the line, the key path, what is wrong and how to fix it; all problems
are collected before anything is reported, so one run shows the whole list.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import jsonschema

from fmcluster.catalog import InstanceType, load_catalog
from fmcluster.paths import SCHEMA_PATH
from fmcluster.yamlpos import KeyPath, LoadedYaml

ORG_PATTERN = re.compile(r"^[a-z](?:[a-z0-9]|-(?=[a-z0-9])){1,23}$")
QUEUE_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,30}$")

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
            try:
                shown = self.file.resolve().relative_to(root.resolve())
            except ValueError:
                pass
        where = f"{shown}:{self.line}" if self.line else f"{shown}"
        key = f" {self.key}:" if self.key else ""
        return f"{where}:{key} {self.message}\n    fix: {self.fix}"


def dotted(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" — did you mean '{close[0]}'?" if close else ""


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return schema


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


def _schema_problems(loaded: LoadedYaml, out: _Collector) -> None:
    schema = load_schema()
    validator = jsonschema.Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(loaded.data), key=lambda e: list(map(str, e.absolute_path))):
        path: KeyPath = tuple(error.absolute_path)
        here = _subschema(schema, path)
        described = here.get("description", "")
        if error.validator == "additionalProperties":
            allowed = sorted(here.get("properties", {}))
            for extra in sorted(set(error.instance) - set(allowed)):
                out.add(
                    (*path, extra),
                    f"unknown key '{extra}'{did_you_mean(extra, allowed)}",
                    f"remove it or use one of: {', '.join(allowed)}",
                )
        elif error.validator == "required":
            missing = re.findall(r"'([^']+)' is a required property", error.message)
            key = missing[0] if missing else "?"
            wanted = _subschema(schema, (*path, key)).get("description", "see the tenant spec reference in README.md")
            out.add(path, f"missing required key '{key}'", f"add `{key}:` — {wanted}")
        elif error.validator == "enum":
            choices = [str(c) for c in error.validator_value]
            out.add(
                path,
                f"{error.instance!r} is not allowed{did_you_mean(error.instance, choices)}",
                f"use one of: {', '.join(choices)}",
            )
        elif error.validator == "type":
            expected = error.validator_value
            out.add(
                path,
                f"{error.instance!r} is a {type(error.instance).__name__}, expected {expected}",
                f"write a value of type {expected}. {described}".strip(),
            )
        elif error.validator == "const":
            out.add(path, f"{error.instance!r} is not supported", f"set it to {error.validator_value!r}")
        elif error.validator == "pattern":
            out.add(path, f"{error.instance!r} has the wrong form", described or f"match {error.validator_value}")
        elif error.validator in ("minimum", "maximum", "exclusiveMinimum", "minItems"):
            out.add(path, error.message, described or "see the tenant spec reference in README.md")
        else:
            out.add(path, error.message, described or "see the tenant spec reference in README.md")


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
    if name.startswith("ml."):
        out.add(path, f"'{name}' is a SageMaker name", f"write the EC2 name '{name[3:]}'; HyperPod's 'ml.' prefix is added for you")
        return None
    if name not in catalog:
        out.add(
            path,
            f"'{name}' is not in the instance catalog{did_you_mean(name, catalog)}",
            f"use one of: {', '.join(sorted(catalog))} (or add it to src/fmcluster/data/instances.yml with its public specs)",
        )
        return None
    return catalog[name]


def _semantic_problems(loaded: LoadedYaml, out: _Collector) -> None:
    tenant = _get(loaded.data, "tenant")
    if not isinstance(tenant, dict):
        return
    catalog = load_catalog()
    t: KeyPath = ("tenant",)

    org = tenant.get("org")
    if isinstance(org, str):
        if not ORG_PATTERN.match(org):
            out.add((*t, "org"), f"'{org}' is not safe for stack, bucket and host names",
                    "use 2-24 lower-case letters, digits and single dashes, starting with a letter, e.g. 'stockmark'")
        folder = _tenant_folder(loaded.path)
        if folder is not None and folder != org:
            out.add((*t, "org"), f"'{org}' differs from the tenant folder 'inventories/{folder}'",
                    f"set org: {folder}, or rename the folder to inventories/{org}")

    region, az = tenant.get("region"), tenant.get("availability_zone")
    if isinstance(region, str) and region not in KNOWN_REGIONS:
        out.add((*t, "region"), f"'{region}' is not a known AWS region{did_you_mean(region, KNOWN_REGIONS)}",
                f"use one of: {', '.join(KNOWN_REGIONS)}")
    if isinstance(region, str) and isinstance(az, str) and not re.fullmatch(re.escape(region) + r"[a-z]", az):
        out.add((*t, "availability_zone"), f"'{az}' is not an availability zone of region '{region}'",
                f"use '{region}' followed by a zone letter, e.g. '{region}a'")

    scheduler = tenant.get("scheduler")
    if scheduler == "parallelcluster":
        out.add((*t, "scheduler"), "'parallelcluster' is reserved and not supported yet",
                "use 'slurm-ec2' (self-managed Slurm, the same shape ParallelCluster builds) or 'hyperpod'")

    _check_instance(out, (*t, "controller", "instance_type"), _get(tenant, "controller", "instance_type"), catalog)
    _check_instance(out, (*t, "login", "instance_type"), _get(tenant, "login", "instance_type"), catalog)

    queues = tenant.get("queues")
    total_nodes = 0
    if isinstance(queues, list):
        seen: dict[str, int] = {}
        defaults = 0
        for i, queue in enumerate(queues):
            if not isinstance(queue, dict):
                continue
            q: KeyPath = (*t, "queues", i)
            name = queue.get("name")
            if isinstance(name, str):
                if not QUEUE_PATTERN.match(name):
                    out.add((*q, "name"), f"'{name}' is not a valid partition name",
                            "use lower-case letters, digits and dashes, starting with a letter, at most 31 characters")
                if name in seen:
                    out.add((*q, "name"), f"queue name '{name}' is used twice (also queues[{seen[name]}])",
                            "give every queue its own name")
                seen.setdefault(name, i)
            count = queue.get("count")
            if isinstance(count, int) and not isinstance(count, bool):
                if count < 1:
                    out.add((*q, "count"), f"count is {count}; a queue needs at least 1 node",
                            "set count: 1 or more, or remove the queue")
                else:
                    total_nodes += count
            itype = _check_instance(out, (*q, "instance_type"), queue.get("instance_type"), catalog)
            wanted = queue.get("accelerator")
            if itype is not None and isinstance(wanted, str) and wanted != itype.accelerator:
                hint = {"neuron": "Trainium (trn*) instance types run the Neuron stack",
                        "cuda": "NVIDIA GPU instance types (p4d, p5*) run the CUDA stack",
                        "none": "CPU instance types have no accelerator stack"}[itype.accelerator]
                out.add((*q, "accelerator"),
                        f"'{wanted}' does not match {itype.name}, which is {itype.accelerator}",
                        f"remove the key (it is derived from the catalog) or set it to '{itype.accelerator}'; {hint}")
            if queue.get("default") is True:
                defaults += 1
                if defaults > 1:
                    out.add((*q, "default"), "more than one queue is marked default", "mark at most one queue `default: true`")

    _check_network(out, tenant, t, total_nodes)
    _check_storage(out, tenant, t)
    _check_monitoring(out, tenant, t)
    _check_accounting(out, tenant, t)


def _tenant_folder(spec: Path) -> str | None:
    parts = spec.resolve().parts
    if len(parts) >= 5 and parts[-5] == "inventories" and parts[-3:-1] == ("group_vars", "all"):
        return parts[-4]
    return None


def _check_network(out: _Collector, tenant: dict[str, Any], t: KeyPath, total_nodes: int) -> None:
    network = tenant.get("network")
    if not isinstance(network, dict):
        return
    n: KeyPath = (*t, "network")
    vpc = network.get("vpc_cidr")
    if isinstance(vpc, str):
        try:
            net = ipaddress.ip_network(vpc)
            if not (16 <= net.prefixlen <= 24) or not net.is_private:
                out.add((*n, "vpc_cidr"), f"'{vpc}' must be a private range between /16 and /24",
                        "use e.g. 10.0.0.0/16")
        except ValueError:
            out.add((*n, "vpc_cidr"), f"'{vpc}' is not a CIDR block", "write it like 10.0.0.0/16 (host bits zero)")
    ssh = network.get("ssh_ingress_cidr")
    if isinstance(ssh, str):
        try:
            net = ipaddress.ip_network(ssh)
            if net.prefixlen == 0:
                out.add((*n, "ssh_ingress_cidr"), "0.0.0.0/0 opens ssh to the whole internet",
                        "use your office or VPN range, e.g. 203.0.113.0/24, or remove the key to use SSM only")
        except ValueError:
            out.add((*n, "ssh_ingress_cidr"), f"'{ssh}' is not a CIDR block", "write it like 203.0.113.0/24")
    local = network.get("local_subnet")
    if isinstance(local, str):
        try:
            net = ipaddress.ip_network(local)
            needed = total_nodes + 4  # gateway, controller, login, a spare
            if not net.is_private or net.num_addresses - 2 < needed:
                out.add((*n, "local_subnet"), f"'{local}' must be a private range with room for {needed} hosts",
                        "use e.g. 10.77.0.0/24")
        except ValueError:
            out.add((*n, "local_subnet"), f"'{local}' is not a CIDR block", "write it like 10.77.0.0/24")


def _check_storage(out: _Collector, tenant: dict[str, Any], t: KeyPath) -> None:
    lustre = _get(tenant, "storage", "lustre")
    s: KeyPath = (*t, "storage", "lustre")
    if isinstance(lustre, dict):
        kind = lustre.get("deployment_type", "PERSISTENT_2")
        capacity = lustre.get("storage_capacity_gib")
        if kind in LUSTRE_STEP_GIB and isinstance(capacity, int) and not isinstance(capacity, bool):
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
            if allowed and throughput is not None and throughput not in allowed:
                out.add((*s, "throughput_per_unit"), f"{throughput} MB/s/TiB is not offered for {kind}",
                        f"use one of: {', '.join(map(str, allowed))}")
            if not allowed and "throughput_per_unit" in lustre:
                out.add((*s, "throughput_per_unit"), f"{kind} file systems have a fixed throughput",
                        "remove throughput_per_unit, or use a PERSISTENT deployment type")
        if "data_repository" in lustre and kind not in LUSTRE_DRA_TYPES:
            out.add((*s, "data_repository"), f"a data repository association needs {' or '.join(LUSTRE_DRA_TYPES)}, not {kind}",
                    "set deployment_type: PERSISTENT_2 or remove data_repository")
        fs_path = _get(lustre, "data_repository", "file_system_path")
        if isinstance(fs_path, str) and (not fs_path.startswith("/") or fs_path == "/"):
            out.add((*s, "data_repository", "file_system_path"), f"'{fs_path}' must be an absolute sub-path of the file system",
                    "use e.g. /data")
        _check_mount(out, (*s, "mount_point"), lustre.get("mount_point"))
    zfs = _get(tenant, "storage", "openzfs")
    if isinstance(zfs, dict):
        z: KeyPath = (*t, "storage", "openzfs")
        capacity = zfs.get("storage_capacity_gib")
        if isinstance(capacity, int) and not OPENZFS_MIN_GIB <= capacity <= OPENZFS_MAX_GIB:
            out.add((*z, "storage_capacity_gib"), f"{capacity} GiB is outside FSx for OpenZFS limits",
                    f"use {OPENZFS_MIN_GIB} to {OPENZFS_MAX_GIB} GiB")
        _check_mount(out, (*z, "mount_point"), zfs.get("mount_point"))
        lustre_mount = lustre.get("mount_point", "/fsx") if isinstance(lustre, dict) else None
        if zfs.get("mount_point", "/home") == lustre_mount:
            out.add((*z, "mount_point"), f"'{lustre_mount}' is already the Lustre mount point", "mount them at different paths")


def _check_mount(out: _Collector, path: KeyPath, mount: Any) -> None:
    if isinstance(mount, str) and (not mount.startswith("/") or mount in ("/", "/etc", "/usr", "/var", "/boot")):
        out.add(path, f"'{mount}' is not a usable mount point", "use an absolute path of its own, e.g. /fsx")


def _check_monitoring(out: _Collector, tenant: dict[str, Any], t: KeyPath) -> None:
    receivers = _get(tenant, "monitoring", "alert_receivers")
    if not isinstance(receivers, list):
        return
    names: set[str] = set()
    for i, receiver in enumerate(receivers):
        if not isinstance(receiver, dict):
            continue
        r: KeyPath = (*t, "monitoring", "alert_receivers", i)
        name, kind, target = receiver.get("name"), receiver.get("type"), receiver.get("target")
        if isinstance(name, str):
            if name in names:
                out.add((*r, "name"), f"receiver name '{name}' is used twice", "give every receiver its own name")
            names.add(name)
        if not isinstance(target, str):
            continue
        if kind == "email" and not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", target):
            out.add((*r, "target"), f"'{target}' is not an e-mail address", "write it like ops@example.org")
        if kind in ("slack", "webhook") and not target.startswith("https://"):
            out.add((*r, "target"), f"'{target}' is not an https URL", "use the https:// webhook URL")
        if kind == "sns" and not target.startswith("arn:aws:sns:"):
            out.add((*r, "target"), f"'{target}' is not an SNS topic ARN", "write it like arn:aws:sns:REGION:ACCOUNT:TOPIC")


def _check_accounting(out: _Collector, tenant: dict[str, Any], t: KeyPath) -> None:
    endpoint = _get(tenant, "accounting", "database_endpoint")
    if isinstance(endpoint, str) and tenant.get("provider") == "local":
        out.add((*t, "accounting", "database_endpoint"), "provider local cannot reach a database endpoint: its "
                "accounting database is MariaDB on the controller node", "remove database_endpoint for a local tenant")


def problems_in(loaded: LoadedYaml) -> list[Problem]:
    """All problems of one loaded spec document, schema and semantic, in file order."""
    out = _Collector(loaded)
    if loaded.data is None:
        out.add((), "the file is empty", "write a tenant spec; `invoke new-tenant --org=NAME` renders a valid one")
        return out.problems
    if not isinstance(loaded.data, dict):
        out.add((), f"the document is a {type(loaded.data).__name__}, not a mapping",
                "start the file with `tenant:` and the keys under it")
        return out.problems
    _schema_problems(loaded, out)
    _semantic_problems(loaded, out)
    unique: dict[tuple[str, str], Problem] = {}
    for problem in out.problems:
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
