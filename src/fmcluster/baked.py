"""Baked node images (issue 40): what an image holds, how it is named, and when it is stale.

A baked image is the writable layer a builder node leaves after the node bootstrap's install stages (git, the
toolchain from the wheelhouse) and `site.yml --tags install` (every role's tasks that install software and
nothing of the tenant's: docs/node-convergence.md). Its digest is that of what it was built from: the pristine
image's digest and the install set — the content of every task carrying the `install` tag, versions.yml's pins and
the wheelhouse's requirements. An image is used only while its digest is the current install set's; otherwise
the deploy says it is stale and boots the pristine image (`status` below).

The record (JSON, one per tenant and kind, `record_path`) says what the image is: tenant, kind, digest, the commit it
was built from, the versions, when, its size, and where it is: the baked layer's folder on the local substrate, the AMI
id on AWS (`invoke image` deploys the image stack, fmcluster.commands.image_stack). The two differ in what a stale
image leads to: locally the host boots the pristine image (a boot costs nothing); on AWS the deploy refuses
(`aws_image`): falling back would give every launch template another AMI and replace every node of that kind.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from fmcluster.paths import DATA_DIR, image_cache, repo_root

#: The tag every task that installs software carries (playbooks/site.yml --tags install runs them alone).
INSTALL_TAG = "install"
#: Modules that install software: each of their tasks carries INSTALL_TAG (tests/test_install_tag.py).
INSTALL_MODULES = frozenset(f"{prefix}{name}" for prefix in ("", "ansible.builtin.")
                            for name in ("apt", "package", "pip", "get_url", "unarchive", "dnf", "yum"))
#: Modules that make accounts: a task of theirs that fixes an id (uid, gid) carries INSTALL_TAG unless it reads the
#: tenant (tests/test_install_tag.py), so a baked image has the account before any package's scripts make it with
#: an id of their own, which the first boot would then keep as the image's.
ACCOUNT_MODULES = frozenset(f"{prefix}{name}" for prefix in ("", "ansible.builtin.") for name in ("user", "group"))
#: Variables that carry the tenant's identity, secrets, membership, host names or users: no task tagged
#: INSTALL_TAG reads one, so an image holds nothing of them (what a tenant decides to run, e.g. whether it has a
#: directory or alert receivers, may decide what is installed; who and where never).
TENANT_VARIABLES = frozenset({
    "fmcluster_org", "fmcluster_nodes", "fmcluster_membership_digest", "fmcluster_stack_outputs", "common_hosts",
    "inventory_hostname", "ansible_hostname", "slurm_node_name", "slurm_nodes", "slurm_partitions", "slurm_topology",
    "slurm_controller_hostname", "slurm_controller_address", "prometheus_scrape_configs", "prometheus_external_labels",
    "prometheus_remote_write_url", "munge_key_src", "user_accounts_users", "user_accounts_teams",
    "slurm_associations_users", "slurm_associations_accounts", "sssd_client_uri", "sssd_client_search_base",
    "sssd_client_bind_dn", "sssd_client_bind_password_file", "sssd_client_ca_cert", "grafana_admin_password_file",
    "slurm_accounting_storage_pass_file", "operator_access_keys", "imds_guard_allowed_users", "node_info_labels",
})
#: versions.yml (fmcluster.versions): the pinned stack and the node toolchain's requirements (the wheelhouse's).
VERSIONS_FILE = "src/fmcluster/data/versions.yml"
#: What a node reads to say which image it booted: written into a baked layer last (absent: the pristine image).
IMAGE_MARKER = "/usr/share/fmcluster/image.json"
#: The node kinds a baked image serves (every kind's install tasks run on the builder) and the image kinds.
NODE_KINDS = ("controller", "login", "compute")
IMAGE_KINDS = ("cpu", "gpu", "trainium")
#: The accelerator of each image kind's nodes (catalog `accelerator`).
KIND_ACCELERATOR = {"cpu": "none", "gpu": "cuda", "trainium": "neuron"}
#: The builder's name in its inventory (every node group of its kind holds it alone).
BUILDER_NAME = "fmcluster-builder"
#: What an AWS builder (the image stack's component) removes before Image Builder snapshots it: the node's state and
#: settings the fetch wrote, the build's own work, the package's munge key, the no-start policy; Image Builder's own
#: clean-up and `cloud-init clean` do the rest (machine id, host keys, instance data).
NOT_BAKED_ON_AWS = ("/var/lib/fmcluster", "/var/lib/fmcluster-image", "/etc/fmcluster", "/opt/fmcluster/bootstrap",
                    "/var/log/fmcluster", "/etc/munge/munge.key", "/usr/local/sbin/fmcluster-bootstrap",
                    "/usr/sbin/policy-rc.d", "/root/.ansible")


def image_kind(accelerator: str) -> str:
    """The image kind whose image a node of this accelerator (catalog `accelerator`) boots."""
    return next((kind for kind, acc in KIND_ACCELERATOR.items() if acc == accelerator), "cpu")


@dataclass(frozen=True)
class InstallTask:
    path: str  # relative to the repository
    name: str
    task: dict[str, Any]  # the task as written, with the `when`s of the blocks around it
    tagged: bool

    @property
    def installs(self) -> bool:
        return any(key in INSTALL_MODULES for key in self.task)

    @property
    def fixes_account_id(self) -> bool:
        return any(key in ACCOUNT_MODULES and isinstance(self.task[key], dict)
                   and ({"uid", "gid"} & set(self.task[key])) for key in self.task)


def _walk(tasks: Any, tags: frozenset[str], whens: tuple[Any, ...], path: str) -> Iterator[InstallTask]:
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        own = task.get("tags") or []
        here = tags | frozenset([own] if isinstance(own, str) else own)
        when = (*whens, task["when"]) if "when" in task else whens
        if "block" in task:
            for part in ("block", "rescue", "always"):
                yield from _walk(task.get(part), here, when, path)
            continue
        yield InstallTask(path, str(task.get("name", "")), {**task, "when": list(when)} if when else dict(task),
                          INSTALL_TAG in here)


def applied_roles(root: Path) -> frozenset[str]:
    """Roles a playbook includes with `apply: {tags: [install]}`: every task of theirs carries the tag."""
    found: set[str] = set()

    def look(node: Any) -> None:
        if isinstance(node, dict):
            include = node.get("ansible.builtin.include_role") or node.get("include_role")
            if isinstance(include, dict) and INSTALL_TAG in ((include.get("apply") or {}).get("tags") or []):
                found.add(str(include["name"]))
            for value in node.values():
                look(value)
        elif isinstance(node, list):
            for item in node:
                look(item)
    for playbook in sorted((root / "playbooks").glob("*.yml")):
        look(yaml.safe_load(playbook.read_text()))
    return frozenset(found)


def applied_files(root: Path) -> frozenset[Path]:
    """Task files a role includes with `apply: {tags: [install]}` (include_tasks: {file, apply})."""
    found: set[Path] = set()
    for path in sorted((root / "roles").glob("*/tasks/*.yml")):
        for task in _walk(yaml.safe_load(path.read_text()), frozenset(), (), str(path)):
            include = task.task.get("ansible.builtin.include_tasks") or task.task.get("include_tasks")
            if isinstance(include, dict) and INSTALL_TAG in ((include.get("apply") or {}).get("tags") or []):
                found.add(path.parent / str(include["file"]))
    return frozenset(found)


def role_tasks(root: Path | None = None) -> list[InstallTask]:
    """Every task of every role (roles/*/tasks/*.yml), with whether it carries INSTALL_TAG."""
    root = root or repo_root()
    whole, files = applied_roles(root), applied_files(root)
    found: list[InstallTask] = []
    for path in sorted((root / "roles").glob("*/tasks/*.yml")):
        start = frozenset([INSTALL_TAG]) if path.parts[-3] in whole or path in files else frozenset()
        found += _walk(yaml.safe_load(path.read_text()), start, (), str(path.relative_to(root)))
    return found


def install_set(root: Path | None = None) -> dict[str, Any]:
    """What a baked image is made of, besides its pristine image: the install tasks, the pins, the toolchain."""
    root = root or repo_root()
    tasks = [{"path": t.path, "task": t.task} for t in role_tasks(root) if t.tagged]
    pins: dict[str, Any] = yaml.safe_load((root / VERSIONS_FILE).read_text())  # the pins and the node's toolchain
    return {"tasks": tasks, "versions": pins}


def digest(pristine_digest: str, kind: str, root: Path | None = None) -> str:
    what = {"pristine": pristine_digest, "kind": kind, "install_set": install_set(root)}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]


def committed_digest(ref: str, kind: str, pristine_digest: str, source: Path | None = None) -> str:
    """`digest` of the install set as commit `ref` holds it (not the working tree's): what an image built from the
    bundle of `ref` is made of. ValueError when git cannot archive it."""
    source = source or repo_root()
    with tempfile.TemporaryDirectory(prefix="fmcluster-install-set-") as tmp:
        archive = subprocess.run(["git", "-C", str(source), "archive", "--format=tar", ref, "roles", "playbooks",
                                  VERSIONS_FILE], capture_output=True, check=False)
        if archive.returncode != 0:
            raise ValueError(f"git archive {ref[:12]} failed: {archive.stderr.decode(errors='replace').strip()}")
        archive_path = Path(tmp) / "set.tar"
        archive_path.write_bytes(archive.stdout)
        with tarfile.open(archive_path) as tar:
            tar.extractall(tmp, filter="data")
        return digest(pristine_digest, kind, Path(tmp))


def builder_nodes(manifest: Mapping[str, Any], kind: str, address: str, instance_id: str = "i-builder") -> list[Any]:
    """The builder as every node group of `kind` in the manifest's cluster: the controller and the login group (an
    image of each kind serves them: the deploy boots each node the image of its own kind), and the compute group of
    the first queue of the kind's accelerator where there is one. Its inventory then runs every role a node of that
    kind runs (fmcluster.manifest.assemble_inventory)."""
    from fmcluster.nodes import Node

    groups = manifest["groups"]
    queues: Mapping[str, Any] = groups["queues"]
    accelerator = KIND_ACCELERATOR[kind]
    nodes = [Node(BUILDER_NAME, address, "controller", None, instance_id, groups["controller"]["instance_type"])]
    queue = next((name for name, q in queues.items() if q["instance"]["accelerator"] == accelerator), None)
    if queue is not None:
        nodes.append(Node(BUILDER_NAME, address, "compute", queue, instance_id, queues[queue]["instance_type"]))
    if groups.get("login"):
        nodes.append(Node(BUILDER_NAME, address, "login", None, instance_id, groups["login"]["instance_type"]))
    return nodes


@dataclass(frozen=True)
class Record:
    """What a baked image was built from (kept beside it and per tenant)."""

    tenant: str
    kind: str
    digest: str
    pristine: str
    commit: str
    versions: dict[str, Any]
    created: str
    size_bytes: int
    layer: str  # where the image is: the baked layer's folder (local substrate), the AMI id (AWS)
    seconds: float  # the bake's

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @staticmethod
    def from_json(text: str) -> Record:
        raw = json.loads(text)
        return Record(**{k: raw[k] for k in Record.__dataclass_fields__})


@dataclass(frozen=True)
class Status:
    """Whether a tenant's baked image may be booted, and what the deploy says about it."""

    record: Record | None
    current: str  # the digest the install set has now
    usable: bool
    note: str


def status(record: Record | None, current: str, layer_present: bool) -> Status:
    """Fail closed: a record whose digest is not `current`, or whose layer is gone, is never booted."""
    if record is None:
        return Status(None, current, False, "no baked image (`invoke image` bakes one): booting the pristine image, "
                                            "first boot installs everything")
    if record.digest != current:
        return Status(record, current, False,
                      f"baked image {record.digest} ({record.kind}, commit {record.commit[:12]}, {record.created}) is "
                      f"STALE: the install set is now {current} (roles' install tasks, versions.yml or the wheelhouse "
                      "changed); booting the pristine image instead — run `invoke image` again")
    if not layer_present:
        return Status(record, current, False, f"baked image {record.digest}: its layer {record.layer} is gone; "
                                              "booting the pristine image — run `invoke image` again")
    return Status(record, current, True, f"baked image {record.digest} ({record.kind}, commit {record.commit[:12]}, "
                                         f"built {record.created}, {record.size_bytes / 2**20:.0f} MiB)")


def pins() -> dict[str, Any]:
    """The versions a record names: the node toolchain's requirements and the pinned Slurm."""
    from fmcluster import versions

    return {"node_toolchain": list(versions.node_requirements()), "slurm": versions.load().get("slurm")}


def records_dir(org: str) -> Path:
    """Where a tenant's image records are kept (and, on the local substrate, its baked layers)."""
    return image_cache() / "baked" / org


def record_path(org: str, kind: str) -> Path:
    """The tenant's record of its `kind` image (JSON, Record), on every provider."""
    return records_dir(org) / f"{kind}.json"


def previous_dir(org: str) -> Path:
    """Where a tenant's earlier records are kept while their images are (rotate): `<kind>-<image>.json`."""
    return records_dir(org) / "previous"


def write_record(record: Record) -> Path:
    """Keep `record` as its tenant's and kind's (record_path); the record it replaces moves to previous_dir while its
    image is another (rotate then says which are kept). ValueError naming the folder and the fix where this machine
    cannot write there (the default is under /var/cache: an operator who is not root sets FMCLUSTER_IMAGE_CACHE), or
    where the record it replaces cannot be read (its image would be forgotten, not removed)."""
    path = record_path(record.tenant, record.kind)
    try:
        before = read_record(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if before is not None and before.layer != record.layer:
            earlier = previous_dir(record.tenant) / f"{record.kind}-{Path(before.layer).name}.json"
            earlier.parent.mkdir(parents=True, exist_ok=True)
            earlier.write_text(before.to_json())
        path.write_text(record.to_json())
    except OSError as err:
        raise ValueError(f"cannot keep the {record.kind} image's record in {path.parent} ({err.strerror or err}): set "
                         f"FMCLUSTER_IMAGE_CACHE to a folder you can write, then run `invoke image --org={record.tenant} "
                         f"--kind={record.kind}` again (the image {record.layer} exists; it is simply not recorded)"
                         ) from err
    return path


def kept_records(org: str, kind: str) -> list[tuple[Path, Record]]:
    """Every record of the tenant's `kind` images, with its file: the current one first, then the earlier ones newest
    first. ValueError (read_record) for one that cannot be read: never taken for no image."""
    found = [(path, record) for path in sorted(previous_dir(org).glob(f"{kind}-*.json"))
             if (record := read_record(path)) is not None and record.kind == kind]
    found.sort(key=lambda pair: pair[1].created, reverse=True)
    current = read_record(record_path(org, kind))
    return ([(record_path(org, kind), current)] if current is not None else []) + found


def rotate(org: str, kind: str, keep: int, in_use: Collection[str], remove: Callable[[Record], list[str]]
           ) -> list[str]:
    """Keep the newest `keep` images of the tenant's `kind` (the current one always), and each one whose `layer` is
    `in_use` (what the deployed cluster or a running host boots); `remove` the others' images (it says what it did,
    or raises OSError/ValueError/RuntimeError: then the record stays, so the next rotation tries again), then their
    records. A record naming the image of a newer one is dropped alone (the image is the newer one's). What was done,
    said."""
    lines: list[str] = []
    seen: set[str] = set()
    for path, record in kept_records(org, kind):
        if record.layer in seen:
            path.unlink()
            continue
        seen.add(record.layer)
        if len(seen) <= keep:
            continue
        if record.layer in in_use:
            lines.append(f"kept {kind} image {record.layer} (built {record.created}) beyond the newest {keep}: the "
                         "cluster still boots it")
            continue
        try:
            done = remove(record)
        except (OSError, ValueError, RuntimeError) as err:
            lines.append(f"could not remove {kind} image {record.layer} ({err}); its record {path} stays, the next "
                         "`invoke image` tries again")
            continue
        path.unlink()
        lines.append(f"removed {kind} image {record.layer} (built {record.created}; older than the newest {keep}, "
                     "baked_images.keep)" + (f": {'; '.join(done)}" if done else ""))
    return lines


@dataclass(frozen=True)
class Price:
    """A list price (data/prices.yml) and the page that lists it."""

    usd: float
    region: str
    source: str


#: data/prices.yml: the prices costs are estimated with, each with its source.
PRICES_FILE = DATA_DIR / "prices.yml"


def snapshot_price(path: Path = PRICES_FILE) -> Price:
    """EBS snapshot storage, Standard tier, per GB-month. ValueError naming the file, key and fix."""
    key = "ebs_snapshot_standard"
    try:
        entry = (yaml.safe_load(path.read_text()) or {})[key]
        return Price(float(entry["usd_per_gb_month"]), str(entry["region"]), str(entry["source"]))
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: {key}: cannot read usd_per_gb_month, region and source ({err!r}); restore the "
                         "entry from git") from err


def kept_lines(org: str, price: Price | None = None) -> list[str]:
    """Each recorded image of the tenant, newest first per kind, with what it costs while kept: an AMI its snapshots
    (at most its volumes' size: snapshots store written blocks only) at `price`; a local layer this machine's disk."""
    price = price or snapshot_price()
    lines: list[str] = []
    total = 0.0
    for kind in IMAGE_KINDS:
        for path, record in kept_records(org, kind):
            size = f"{record.size_bytes / 2**30:.1f} GiB"
            if record.layer.startswith("ami-"):
                cost = record.size_bytes / 2**30 * price.usd
                total += cost
                where = f"{size} of EBS snapshots at most, about ${cost:.2f} a month"
            else:
                where = f"{size} on this machine's disk"
            lines.append(f"baked {kind} image {record.layer} (install set {record.digest}, commit {record.commit[:12]}, "
                         f"built {record.created}; {where}; record {path})")
    if total:
        lines.append(f"baked images' snapshots: about ${total:.2f} a month at most, at {price.region}'s "
                     f"${price.usd}/GB-month ({price.source}); deregister an AMI and delete its snapshots to stop it")
    return lines


def age(created: str, now: datetime | None = None) -> str:
    """How long ago a record's `created` was, in the largest whole unit."""
    then = datetime.fromisoformat(created)
    then = then if then.tzinfo is not None else then.replace(tzinfo=timezone.utc)  # records are written in UTC
    seconds = ((now or datetime.now(timezone.utc)) - then).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{max(int(seconds), 0)} s"


def status_lines(org: str, current: Mapping[str, str], in_use: Collection[str], now: datetime | None = None
                 ) -> list[str]:
    """`invoke status`: each kind's recorded images (id, commit, age), whether the cluster boots it, and whether it is
    the install set's `current` digest of its kind (a kind absent from `current`: the tenant has no such nodes)."""
    lines: list[str] = []
    for kind in IMAGE_KINDS:
        for rank, (_, record) in enumerate(kept_records(org, kind)):
            fresh = ("current" if record.digest == current.get(kind) else
                     f"STALE (install set now {current[kind]})" if kind in current else "no such nodes now")
            used = "the cluster boots it" if record.layer in in_use else "not booted by the cluster"
            lines.append(f"{kind}: {record.layer}{' (previous)' if rank else ''} commit {record.commit[:12]}, built "
                         f"{age(record.created, now)} ago, install set {record.digest}: {fresh}; {used}")
    return lines or ["no baked images recorded (`invoke image` bakes them)"]


def head_commit(root: Path) -> str:
    """The committed HEAD of the checkout `root`: what a deploy from it publishes, and an image baked from it records
    (fmcluster.publish.pinned_commit, which the scheduler folders and the local provider's boot path may not import).
    ValueError where it has none."""
    run = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise ValueError(f"{root} has no commit: {run.stderr.strip()}")
    return run.stdout.strip()


class BakedImageRefused(ValueError):
    """A recorded baked AMI that may not be booted (stale or gone); the message names the tenant, kind and fix."""


def aws_image(org: str, kind: str, record: Record | None, current: str, available: bool) -> str | None:
    """The AMI nodes of `kind` boot on AWS: the recorded baked image while its digest is `current` (the install set of
    the commit being deployed) and the AMI is `available`; None where none is recorded (the catalogued base image).
    Fails closed, never falling back to the base image: BakedImageRefused for a stale or missing AMI."""
    found = status(record, current, available)
    if found.record is None:
        return None
    if found.usable:
        return found.record.layer
    fix = f"rebuild it with `invoke image --org={org} --kind={kind}`, or remove {record_path(org, kind)} to boot the " \
          "catalogued base image"
    if found.record.digest != current:
        raise BakedImageRefused(
            f"tenant '{org}': its {kind} image {found.record.layer} was baked from install set {found.record.digest} "
            f"(commit {found.record.commit[:12]}, {found.record.created}); this commit's is {current} (roles' install "
            f"tasks or versions.yml changed): refused, a stale image is never booted — {fix}")
    raise BakedImageRefused(f"tenant '{org}': its {kind} image {found.record.layer} (install set {current}) is not an "
                            f"available AMI in this region any more: refused — {fix}")


def read_record(path: Path) -> Record | None:
    if not path.is_file():
        return None
    try:
        return Record.from_json(path.read_text())
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a baked image record ({err}); remove it and run `invoke image` again") from err


def installed_summary(packages: Mapping[str, str]) -> str:
    """A node's first-boot installs as its report line says them."""
    if not packages:
        return "nothing installed at first boot"
    names = sorted(packages)
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return f"{len(names)} package(s) installed at first boot: {shown}"


def installed_since(dpkg_log: str, since: datetime) -> dict[str, str]:
    """package → version of every package dpkg installed or upgraded at or after `since` (dpkg.log's `install` and
    `upgrade` actions, in the local time dpkg writes; its `status installed` lines also follow trigger runs)."""
    found: dict[str, str] = {}
    for line in dpkg_log.splitlines():
        parts = line.split()
        if len(parts) < 6 or parts[2] not in ("install", "upgrade"):
            continue
        try:
            when = datetime.strptime(f"{parts[0]} {parts[1]}", "%Y-%m-%d %H:%M:%S")
        except ValueError:
            continue
        if when >= since:
            found[parts[3].split(":")[0]] = parts[5]
    return found


def booted_image(marker: Path) -> str:
    """What a node booted, from the marker a bake writes: `baked <digest> (<kind>, commit …)`, else the pristine one."""
    try:
        raw = json.loads(marker.read_text())
        return f"baked {raw['digest']} ({raw['kind']}, commit {str(raw['commit'])[:12]})"
    except (OSError, ValueError, KeyError, TypeError):
        return "pristine (no baked image)"
