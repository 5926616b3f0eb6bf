"""The cluster manifest and the inventory every node converges with.

Data flows one way: tenant spec → validated Tenant → (+ stack outputs, the pinned commit) → **manifest**
(`build_manifest`, computed once on the deploy machine and published to s3://<bucket>/fmcluster/manifest/)
→ (+ the nodes that exist, read from the AWS APIs: fmcluster.nodes) → **inventory** (`assemble_inventory`,
the same function on the deploy machine and on every node) → role variables. Roles never read the tenant.

The manifest holds everything about the cluster that does not depend on which instances exist: role
variables, the instance catalog entries and Slurm resources of each group, the names of the secrets, the
storage to mount. Membership (who the controller is, the Slurm node lines, partitions, Prometheus targets)
is derived from the live node list each time a node converges, so a node that joins later, or replaces
another, needs nothing from the deploy machine. This module imports only the standard library and PyYAML:
it runs on the nodes' own toolchain.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from fmcluster.nodes import Node, NodeTags, sort_nodes

FORMAT = 1
#: Where a node keeps the secrets its bootstrap read from Secrets Manager (root only, never in the inventory).
NODE_SECRETS_DIR = "/etc/fmcluster/secrets"
#: Secret names under fmcluster/<org>/ in AWS Secrets Manager (the deploy creates them), and the roles whose
#: nodes read each (their IAM roles allow exactly that: the munge key everywhere, the rest on the controller).
SECRET_ROLES = {"munge-key": ("controller", "login", "compute"), "grafana-admin-password": ("controller",)}
SECRET_NAMES = tuple(SECRET_ROLES)
#: The deploy's index of what it published for the nodes (object key → SHA-256), in the manifest's prefix; nodes trust
#: it only when its SHA-256 is the value of the SSM parameter index_parameter(org), which the deploy alone writes
#: (fmcluster.publish; docs/stacks.md, "What a node runs").
INDEX_KEY = "fmcluster/manifest/index.json"


#: The SSM parameter holding the SHA-256 of the tenant's index (INDEX_KEY): the deploy writes it, nodes read it
#: (and their IAM policy names it: fmcluster.stacks.templates.common fills the same template with the org).
INDEX_PARAMETER = "/fmcluster/{org}/bootstrap-index-sha256"
#: Where the tenant's secrets are named in Secrets Manager: what its nodes may read and the deploy lists.
SECRET_PREFIX = "fmcluster/{org}/"


def index_parameter(org: str) -> str:
    return INDEX_PARAMETER.format(org=org)


class DigestMismatch(RuntimeError):
    """A published object is not what the deploy's trusted index says: it is never used."""


def check_digest(key: str, expected: str, body: bytes, source: str = "") -> None:
    """Raise DigestMismatch unless `body`'s SHA-256 is `expected` (from `source`, named in the refusal)."""
    got = hashlib.sha256(body).hexdigest()
    if not expected or got != expected:
        raise DigestMismatch(f"object {key} digest mismatch: expected sha256 {expected or '(none)'}{source}, got {got};"
                             " it was not used. Re-run invoke deploy (it publishes again what differs)")


def trusted_objects(index: bytes, trusted_sha256: str, parameter: str) -> dict[str, str]:
    """The index's key → SHA-256 entries, once the index is the one the SSM parameter names (DigestMismatch else)."""
    check_digest(INDEX_KEY, trusted_sha256, index, f" (SSM parameter {parameter})")
    objects = json.loads(index).get("objects", {})
    return {str(k): str(v) for k, v in objects.items()} if isinstance(objects, dict) else {}
def secret_prefix(org: str) -> str:
    return SECRET_PREFIX.format(org=org)


def secret_id(org: str, name: str) -> str:
    return secret_prefix(org) + name


def digest(document: Any) -> str:
    """Content digest of a JSON-able document (manifest, membership): what nodes compare to decide a re-converge."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def membership_digest(nodes: Sequence[Node]) -> str:
    return digest([n.as_dict() for n in sort_nodes(nodes)])


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^a-zA-Z0-9]", name) if part)


def placement_group_output_key(queue: str) -> str:
    """Stack output naming a queue's cluster placement group (e.g. queue `gpu` → `GpuPlacementGroup`)."""
    return f"{_camel(queue)}PlacementGroup"


#: The inventory group of the nodes whose Slurm, munge and shared mounts fmcluster's roles install
#: (capability slurm_owner: fmcluster); every node when it applies, none otherwise.
FMCLUSTER_SLURM_GROUP = "fmcluster_slurm"


#: The account Prometheus runs as on the controller (the prometheus role's default; tests/test_monitoring_inventory_vars.py
#: keeps them equal): it discovers nodes and remote-writes with the instance role, so the IMDS rule lets it through.
PROMETHEUS_USER = "prometheus"


def queue_group(queue: str) -> str:
    return f"queue_{queue.replace('-', '_')}"


def assemble_inventory(manifest: Mapping[str, Any], nodes: Sequence[Node],
                       extra_vars: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The inventory document (hosts.yml) for `nodes` of the manifest's cluster.

    Groups: `controller`, `login` (the controller when there is no login node), `compute` with one
    `queue_<name>` child per queue; per group `fmcluster_instance_type`/`fmcluster_instance` (catalog entry).
    `all` vars: the manifest's role variables plus everything derived from membership."""
    nodes = sort_nodes(nodes)
    groups = manifest["groups"]
    queues: dict[str, Any] = groups["queues"]
    controllers = [n for n in nodes if n.role == "controller"]
    logins = [n for n in nodes if n.role == "login"]
    compute = [n for n in nodes if n.role == "compute" and n.queue in queues]
    slurm_nodes = [{"name": n.name, "address": n.address, "partition": n.queue, **queues[str(n.queue)]["resources"]}
                   for n in compute]
    partitions = [{"name": name, "nodes": [n.name for n in compute if n.queue == name], "default": bool(q["default"])}
                  for name, q in queues.items()]
    outputs: Mapping[str, str] = manifest.get("stack_outputs", {})
    topology = []
    for name in queues:
        placement_group = outputs.get(placement_group_output_key(name))
        members = [n.name for n in compute if n.queue == name]
        if placement_group and members:
            topology.append({"name": placement_group, "nodes": members})
    all_vars: dict[str, Any] = {**manifest["vars"]}
    all_vars.update({
        "fmcluster_manifest_digest": digest(manifest),
        "fmcluster_membership_digest": membership_digest(nodes),
        "fmcluster_nodes": [n.as_dict() for n in nodes],
        "fmcluster_stack_outputs": dict(sorted(outputs.items())),
        "common_hosts": [{"name": n.name, "address": n.address} for n in nodes],
        "slurm_nodes": slurm_nodes,
        "slurm_partitions": [p for p in partitions if p["nodes"]],
        "slurm_topology": topology,
    })
    if controllers:
        all_vars["slurm_controller_hostname"] = controllers[0].name
        all_vars["slurm_controller_address"] = controllers[0].address
    all_vars.update(extra_vars or {})
    all_vars["prometheus_scrape_configs"] = scrape_configs(all_vars, nodes)

    org = str(all_vars.get("fmcluster_org", ""))
    scheduler_users = [str(u) for u in all_vars.get("imds_guard_scheduler_users") or []]

    def group(members: Sequence[Node], spec: Mapping[str, Any], queue: str | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = ({"hosts": {n.name: {**_host_vars(n), **exporter_vars(n, spec, org),
                                                   **imds_vars(n, scheduler_users)} for n in members}}
                               if members else {})
        doc["vars"] = {"fmcluster_instance_type": spec["instance_type"], "fmcluster_instance": spec["instance"],
                       # The queue's own name: its label everywhere (node_info, Prometheus targets), never
                       # recovered from the group name (queue_group folds `-` into `_`).
                       **({"fmcluster_queue": queue} if queue is not None else {}),
                       **spec.get("vars", {})}
        return doc

    login_spec = groups.get("login") or groups["controller"]
    children: dict[str, Any] = {
        "controller": group(controllers, groups["controller"]),
        "login": group(logins or controllers, login_spec),
        "compute": {"children": {queue_group(name): group([n for n in compute if n.queue == name], q, name)
                                 for name, q in queues.items()}},
    }
    # The playbooks' one scheduler gate: plays of fmcluster's Slurm, munge and mounts target this group (always
    # declared, so a play on it matches no node rather than warning of an unknown pattern).
    children[FMCLUSTER_SLURM_GROUP] = ({"children": {"controller": {}, "login": {}, "compute": {}}}
                                       if slurm_owner(manifest["vars"]) == "fmcluster" else {})
    return {"all": {"vars": all_vars, "children": children}}


#: What the controller and login nodes run when only the membership changed (see membership_playbook).
MEMBERSHIP_PLAYBOOK = "playbooks/membership.yml"


def membership_playbook(manifest: Mapping[str, Any]) -> str | None:
    """The playbook a membership-only change runs on the controller and login nodes, or None for a full converge.

    Targeted only when nothing but /etc/hosts and Slurm's node list follows the node list: Prometheus finds the
    nodes itself (`ec2` discovery). With `inventory` discovery its targets are written by a converge too."""
    discovery = manifest.get("vars", {}).get("prometheus_node_discovery") or {}
    return MEMBERSHIP_PLAYBOOK if discovery.get("kind") == "ec2" else None


def slurm_owner(variables: Mapping[str, Any]) -> str:
    """Who installs Slurm on the nodes (fmcluster.capabilities), from the manifest's vars; fails closed."""
    owner = (variables.get("fmcluster_capabilities") or {}).get("slurm_owner")
    if owner not in ("fmcluster", "scheduler"):
        raise ValueError(f"the manifest's vars.fmcluster_capabilities.slurm_owner is {owner!r}, not fmcluster or "
                         "scheduler: publish the manifest again with this fmcluster (invoke deploy)")
    return str(owner)


def scrape_configs(variables: Mapping[str, Any], nodes: Sequence[Node]) -> list[dict[str, Any]]:
    """Prometheus's scrape jobs for the exporters, finding the nodes the way the scheduler's nodes are found.

    `ec2`: EC2 service discovery (against the same endpoint the node uses), so a node that joins or leaves is
    scraped or dropped without any converge; `inventory`: the nodes listed now (the controller re-converges
    when they change). Either way the labels are the same: node, role, queue, instance_type."""
    discovery = variables.get("prometheus_node_discovery", {"kind": "inventory"})
    kind = discovery.get("kind")
    if kind not in ("ec2", "inventory"):
        raise ValueError(f"prometheus_node_discovery.kind is {kind!r}: Prometheus finds nodes by ec2 or inventory "
                         "(the scheduler's manifest_vars)")
    configs: list[dict[str, Any]] = []
    for job in variables.get("prometheus_scrape_jobs", []):
        types = list(job.get("instance_types") or [])
        if kind == "ec2":
            sd: dict[str, Any] = {
                "region": discovery["region"], "port": job["port"],
                "refresh_interval": variables.get("prometheus_sd_refresh_interval", "30s"),
                "filters": [{"name": f"tag:{discovery['tag']}", "values": [discovery["value"]]},
                            {"name": "instance-state-name", "values": ["running"]},
                            *([{"name": "instance-type", "values": types}] if types else [])],
            }
            endpoint = variables.get("fmcluster_aws_endpoint_url")
            if endpoint:
                sd["endpoint"] = endpoint
            configs.append({"job_name": job["job"], "ec2_sd_configs": [sd], "relabel_configs": [
                {"source_labels": ["__meta_ec2_private_ip"], "target_label": "__address__",
                 "replacement": f"${{1}}:{job['port']}"},
                {"source_labels": ["__meta_ec2_private_dns_name"], "regex": r"([^.]+)\..*", "target_label": "node"},
                *node_relabels(NodeTags.from_manifest(discovery.get("node_tags"))),
                {"source_labels": ["__meta_ec2_instance_type"], "target_label": "instance_type"},
            ]})
        else:
            targets = [n for n in nodes if not types or n.instance_type in types]
            configs.append({"job_name": job["job"], "static_configs": [
                {"targets": [f"{n.address}:{job['port']}"],
                 "labels": {"node": n.name, "role": n.role, "queue": n.queue or "", "instance_type": n.instance_type}}
                for n in targets]})
    return configs


def _meta_tag(key: str) -> str:
    """Prometheus's EC2 discovery label of a tag: every character outside [A-Za-z0-9_] becomes `_`."""
    return "__meta_ec2_tag_" + re.sub(r"[^A-Za-z0-9_]", "_", key)


def node_relabels(node_tags: NodeTags) -> list[dict[str, Any]]:
    """`role` and `queue` labels from the cluster's own tags, the roles named as fmcluster names them."""
    rules: list[dict[str, Any]] = [
        {"source_labels": [_meta_tag(node_tags.role)], "regex": re.escape(value), "target_label": "role",
         "replacement": role} for value, role in node_tags.roles.items()]
    rules.append({"source_labels": [_meta_tag(node_tags.queue)], "target_label": "queue"})
    return rules


def _host_vars(node: Node) -> dict[str, Any]:
    return {"ansible_host": node.address, "fmcluster_address": node.address, "fmcluster_instance_id": node.instance_id}


def imds_vars(node: Node, scheduler_users: Sequence[str]) -> dict[str, Any]:
    """Who besides root may reach IMDS on this node (roles/imds_guard): the scheduler's own daemon accounts that use
    the instance role (its manifest_vars: imds_guard_scheduler_users), and on the controller Prometheus (EC2
    discovery, remote write). Per host, not per group: a controller that is also the login node stays a controller."""
    return {"imds_guard_allowed_users": [*scheduler_users, *([PROMETHEUS_USER] if node.role == "controller" else [])]}


def exporter_vars(node: Node, spec: Mapping[str, Any], org: str) -> dict[str, Any]:
    """The exporters' variables of one node, here once (playbooks/monitoring.yml maps nothing): they listen on its
    cluster address, and node_exporter's node_info and expectations come from its role, queue and catalog entry."""
    instance: Mapping[str, Any] = spec.get("instance") or {}
    return {
        "node_exporter_listen_address": node.address,
        "dcgm_exporter_listen_address": node.address,
        "efa_exporter_listen_address": node.address,
        "node_exporter_node_info": {"cluster": org, "role": node.role, "queue": node.queue or "",
                                    "instance_type": str(spec.get("instance_type", ""))},
        "node_exporter_accelerator": str(instance.get("accelerator", "none")),
        "node_exporter_expected_accelerators": int(instance.get("accelerators_per_node", 0) or 0),
        "node_exporter_expected_efa_interfaces": int(instance.get("efa_interfaces", 0) or 0),
    }


# Ansible templates every string it reads from an inventory; a value holding Jinja markers is written with the
# `!unsafe` tag so it reaches the roles as written (Ansible's YAML loader keeps such a value literal).
_JINJA_MARKERS = ("{{", "{%", "{#")


class _InventoryDumper(yaml.SafeDumper):
    pass


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if any(marker in value for marker in _JINJA_MARKERS):
        return dumper.represent_scalar("!unsafe", value, style="'")
    return dumper.represent_str(value)


_InventoryDumper.add_representer(str, _represent_str)


class InventoryLoader(yaml.SafeLoader):
    """Reads an inventory inventory_yaml wrote: `!unsafe` values are plain strings."""


def _construct_unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    assert isinstance(node, yaml.ScalarNode)  # inventory_yaml tags strings only
    return loader.construct_scalar(node)


InventoryLoader.add_constructor("!unsafe", _construct_unsafe)


def inventory_yaml(document: Mapping[str, Any], header: str) -> str:
    return header + yaml.dump(dict(document), Dumper=_InventoryDumper, sort_keys=False, default_flow_style=False,
                              width=120)


def load_inventory_yaml(text: str) -> Any:
    return yaml.load(text, Loader=InventoryLoader)  # noqa: S506 - a SafeLoader subclass
