"""The validated tenant model: what every other part of fmcluster reads, never the raw YAML.

Flow: tenant.yml → load_tenant() (schema + semantic checks, defaults from the schema) → Tenant →
CloudFormation parameters, generated inventory, role variables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fmcluster.capabilities import Capabilities, capabilities, scheduler_capabilities
from fmcluster.catalog import InstanceType, load_catalog
from fmcluster.paths import generated_dir, inventories_dir, tenant_dir, tenant_spec_path
from fmcluster.validation import (Problem, apply_defaults, dotted, org_problem, problems_in, read_ca_cert,
                                  scheduler_function)
from fmcluster.yamlpos import YamlSyntaxError, load

Provider = Literal["aws", "local"]
#: A scheduler's name: one of fmcluster.capabilities.SCHEDULERS (one folder each under src/fmcluster/schedulers/),
#: which the schema's `scheduler:` enum lists (filled in from them by validation.load_schema); no second copy here.
Scheduler = str


class TenantInvalid(Exception):
    """The spec cannot be used; `problems` holds every reason, each with its fix."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(f"{len(problems)} problem(s) in the tenant spec")
        self.problems = problems

    def render(self, root: Path | None = None) -> str:
        lines = [p.render(root) for p in self.problems]
        noun = "problem" if len(lines) == 1 else "problems"
        return "\n".join(lines) + f"\n{len(lines)} {noun}; nothing was deployed or changed."


@dataclass(frozen=True)
class Queue:
    name: str
    instance: InstanceType
    count: int
    capacity_reservation_id: str | None
    default: bool
    capacity_reservation_type: str = "default"  # default (ODCR) | capacity-block

    @property
    def accelerator(self) -> str:
        return self.instance.accelerator


@dataclass(frozen=True)
class DataRepository:
    file_system_path: str
    s3_prefix: str
    import_policy: tuple[str, ...]
    export_policy: tuple[str, ...]


@dataclass(frozen=True)
class Lustre:
    deployment_type: str
    storage_capacity_gib: int
    throughput_per_unit: int | None
    mount_point: str
    data_repository: DataRepository | None


@dataclass(frozen=True)
class OpenZfs:
    storage_capacity_gib: int
    throughput_mbps: int
    mount_point: str


@dataclass(frozen=True)
class Storage:
    s3_versioning: bool
    lustre: Lustre
    openzfs: OpenZfs | None


@dataclass(frozen=True)
class AlertReceiver:
    name: str
    type: str
    target: str


@dataclass(frozen=True)
class Smtp:
    """The SMTP relay email receivers send through (e.g. Amazon SES's SMTP endpoint); the credentials are names of
    Secrets Manager secrets under fmcluster/<org>/, which the controller's node agent reads at converge."""
    smarthost: str
    sender: str
    username_secret: str | None = None
    password_secret: str | None = None


@dataclass(frozen=True)
class Monitoring:
    prometheus_retention_days: int
    remote_write_url: str | None
    grafana: bool
    alert_receivers: tuple[AlertReceiver, ...]
    smtp: Smtp | None = None


@dataclass(frozen=True)
class Acceptance:
    enabled: bool
    min_busbw_gbps: float | None
    drain_on_failure: bool
    tests: tuple[str, ...]
    #: The image the GPU queues' nccl-tests run from (docs/acceptance.md); None: the nodes' own build.
    image: str | None = None


@dataclass(frozen=True)
class SlurmAccounting:
    """The `accounting` section: slurmdbd for fmcluster's own Slurm (a scheduler that installs its own Slurm has its
    accounting in its own section)."""

    enabled: bool
    database_endpoint: str | None  # host[:port] of the tenant's own MySQL/MariaDB (RDS); None: MariaDB on the controller
    database_user: str


@dataclass(frozen=True)
class Repair:
    """`health.repair`: the controller's repair agent and its budgets (fmcluster.health.repair)."""

    enabled: bool = True
    reboots_per_node: int = 1
    replacements_per_queue: int = 3
    window_hours: float = 24.0
    backoff_seconds: int = 60
    breaker_share: float = 0.5


@dataclass(frozen=True)
class Health:
    """The `health` section: what fmcluster may do about unhealthy nodes without asking (docs/health.md)."""

    auto_replace: bool = False
    #: The DCGM level a GPU node passes at every boot before it serves (fmcluster-health boot, check return-diag).
    return_diag_level: int = 2
    repair: Repair = field(default_factory=Repair)


def _schema_default(*keys: str) -> Any:
    """A default the schema gives (the one place defaults live), for a Tenant made without a spec (tests)."""
    import json

    from fmcluster.paths import SCHEMA_PATH

    node: Any = json.loads(SCHEMA_PATH.read_text())["properties"]["tenant"]
    for key in keys:
        node = node["properties"][key]
    return node["default"]


@dataclass(frozen=True)
class BakedImages:
    """The `baked_images` section: how many of each kind's baked images are kept (fmcluster.baked.rotate)."""

    keep: int = field(default_factory=lambda: int(_schema_default("baked_images", "keep")))


@dataclass(frozen=True)
class Qos:
    """One Slurm QoS of `qos:` (docs/users.md); a limit of None is no limit."""

    name: str
    priority: int = 0
    max_gpus_per_user: int | None = None
    max_cpus_per_user: int | None = None
    max_nodes_per_user: int | None = None


@dataclass(frozen=True)
class Team:
    """One team of `teams:`: a Slurm account under the org's and a unix group. `qos`: its first is the default."""

    name: str
    gid: int
    fairshare: int = 1
    qos: tuple[str, ...] = ()


@dataclass(frozen=True)
class User:
    """One person of `users:`: the same account on every node; `teams`: the first is the default Slurm account."""

    name: str
    uid: int
    teams: tuple[str, ...]
    ssh_keys: tuple[str, ...] = ()
    removed: bool = False

    @property
    def gid(self) -> int:
        """The user's private group has the user's id."""
        return self.uid


@dataclass(frozen=True)
class Directory:
    """`directory:`: the organization's LDAP directory the nodes join through SSSD (docs/users.md), instead of
    `users:`. `ca_cert_pem`: the text of the `ca_cert` file next to tenant.yml, "" for the system CA bundle."""

    uri: str
    base_dn: str
    start_tls: bool = False
    user_search_base: str | None = None
    group_search_base: str | None = None
    bind_dn: str | None = None
    bind_password_secret: str | None = None
    ca_cert_pem: str = ""
    user_filter: str | None = None
    group_filter: str | None = None


@dataclass(frozen=True)
class Containers:
    """`containers:`: users' images through Slurm (docs/containers.md). `registries`: the tenant's own registries
    beyond the provider's (ECR registries of its account in other regions)."""

    enabled: bool = True
    registries: tuple[str, ...] = ()


@dataclass(frozen=True)
class Network:
    vpc_cidr: str
    ssh_ingress_cidr: str | None


@dataclass(frozen=True)
class Tenant:
    spec_path: Path
    org: str
    programme: str
    provider: Provider
    region: str
    availability_zone: str
    scheduler: Scheduler
    controller: InstanceType
    login: InstanceType | None
    login_count: int
    queues: tuple[Queue, ...]
    network: Network
    storage: Storage
    monitoring: Monitoring
    acceptance: Acceptance
    slurm_accounting: SlurmAccounting = SlurmAccounting(True, None, "slurm")
    #: The scheduler's own section (capabilities.yml's own_section) as its folder's section_parser makes it; the
    #: folder reads it back with its own type. None: the scheduler has no section of its own.
    scheduler_settings: object | None = None
    health: Health = Health()
    qos: tuple[Qos, ...] = ()
    teams: tuple[Team, ...] = ()
    users: tuple[User, ...] = ()
    directory: Directory | None = None
    containers: Containers = Containers()
    baked_images: BakedImages = field(default_factory=BakedImages)

    @property
    def stack_prefix(self) -> str:
        """Prefix of every CloudFormation stack of this tenant."""
        return f"fmc-{self.org}"

    @property
    def capabilities(self) -> Capabilities:
        """What this tenant's provider and scheduler can do (fmcluster.capabilities): read these, not the names."""
        return capabilities(self.provider, self.scheduler)

    @property
    def tags(self) -> dict[str, str]:
        """Cost-allocation tags put on every stack and resource."""
        return {"fmcluster:org": self.org, "fmcluster:programme": self.programme}

    def describe(self) -> str:
        queues = ", ".join(f"{q.name}: {q.count}× {q.instance.name} ({q.accelerator})" for q in self.queues)
        return (f"tenant '{self.org}' is valid: provider {self.provider}, {self.scheduler} in "
                f"{self.availability_zone}; queues {queues}")

    @property
    def compute_nodes(self) -> int:
        return sum(q.count for q in self.queues)

    @property
    def default_queue(self) -> Queue:
        return next((q for q in self.queues if q.default), self.queues[0])


def _build(spec_path: Path, raw: dict[str, Any]) -> Tenant:
    doc = apply_defaults(raw)["tenant"]
    catalog = load_catalog()
    storage, lustre = doc["storage"], doc["storage"]["lustre"]
    dra = lustre.get("data_repository")
    zfs = storage.get("openzfs")
    login = doc.get("login")
    monitoring, acceptance, network = doc["monitoring"], doc["acceptance"], doc["network"]
    slurm_acct = doc["accounting"]
    is_scratch = lustre["deployment_type"].startswith("SCRATCH")
    # A team naming no QoS gets `normal` when the tenant declares one (validation refuses the rest).
    default_qos = ["normal"] if any(q["name"] == "normal" for q in doc["qos"]) else []
    return Tenant(
        spec_path=spec_path,
        org=doc["org"],
        programme=doc["programme"],
        provider=doc["provider"],
        region=doc["region"],
        availability_zone=doc["availability_zone"],
        scheduler=doc["scheduler"],
        controller=catalog[doc["controller"]["instance_type"]],
        login=catalog[login["instance_type"]] if login and login["count"] > 0 else None,
        login_count=login["count"] if login else 0,
        queues=tuple(
            Queue(q["name"], catalog[q["instance_type"]], q["count"], q.get("capacity_reservation_id"), q["default"],
                  q["capacity_reservation_type"])
            for q in doc["queues"]
        ),
        network=Network(network["vpc_cidr"], network.get("ssh_ingress_cidr")),
        storage=Storage(
            s3_versioning=storage["s3"]["versioning"],
            lustre=Lustre(
                deployment_type=lustre["deployment_type"],
                storage_capacity_gib=lustre["storage_capacity_gib"],
                throughput_per_unit=None if is_scratch else lustre["throughput_per_unit"],
                mount_point=lustre["mount_point"],
                data_repository=DataRepository(
                    dra["file_system_path"], dra["s3_prefix"], tuple(dra["import_policy"]), tuple(dra["export_policy"])
                ) if dra else None,
            ),
            openzfs=OpenZfs(zfs["storage_capacity_gib"], zfs["throughput_mbps"], zfs["mount_point"]) if zfs else None,
        ),
        monitoring=Monitoring(
            prometheus_retention_days=monitoring["prometheus_retention_days"],
            remote_write_url=monitoring.get("remote_write_url"),
            grafana=monitoring["grafana"],
            alert_receivers=tuple(AlertReceiver(r["name"], r["type"], r["target"]) for r in monitoring["alert_receivers"]),
            smtp=Smtp(smtp["smarthost"], smtp["from"], smtp.get("username_secret"), smtp.get("password_secret"))
            if (smtp := monitoring.get("smtp")) else None,
        ),
        acceptance=Acceptance(
            enabled=acceptance["enabled"],
            min_busbw_gbps=acceptance.get("min_busbw_gbps"),
            drain_on_failure=acceptance["drain_on_failure"],
            tests=tuple(acceptance["tests"]),
            image=acceptance.get("image"),
        ),
        slurm_accounting=SlurmAccounting(slurm_acct["enabled"], slurm_acct.get("database_endpoint"),
                                         slurm_acct["database_user"]),
        scheduler_settings=_scheduler_settings(raw, doc),
        health=Health(auto_replace=doc["health"]["auto_replace"], return_diag_level=doc["health"]["return_diag_level"],
                      repair=Repair(**doc["health"]["repair"])),
        qos=tuple(Qos(q["name"], q["priority"], q.get("max_gpus_per_user"), q.get("max_cpus_per_user"),
                      q.get("max_nodes_per_user")) for q in doc["qos"]),
        teams=tuple(Team(team["name"], team["gid"], team["fairshare"], tuple(team.get("qos", default_qos)))
                    for team in doc["teams"]),
        users=tuple(User(u["name"], u["uid"], tuple(u["teams"]), tuple(u["ssh_keys"]), u["removed"])
                    for u in doc["users"]),
        directory=_directory(spec_path, doc.get("directory")),
        containers=Containers(doc["containers"]["enabled"], tuple(doc["containers"]["registries"])),
        baked_images=BakedImages(doc["baked_images"]["keep"]),
    )


def _scheduler_settings(raw: dict[str, Any], doc: dict[str, Any]) -> object | None:
    own = scheduler_capabilities(doc["scheduler"])
    section = doc.get(own.own_section) if own.own_section is not None else None
    if own.section_parser is None or section is None:
        return None
    written = raw.get("tenant", {}).get(own.own_section)
    settings: object = scheduler_function(doc["scheduler"], own.section_parser)(
        section, written if isinstance(written, dict) else {})
    return settings


def _directory(spec_path: Path, given: dict[str, Any] | None) -> Directory | None:
    if given is None:
        return None
    ca_cert = given.get("ca_cert")
    return Directory(
        uri=given["uri"], base_dn=given["base_dn"], start_tls=given["start_tls"],
        user_search_base=given.get("user_search_base"), group_search_base=given.get("group_search_base"),
        bind_dn=given.get("bind_dn"), bind_password_secret=given.get("bind_password_secret"),
        # Validation has read it already: a PEM certificate in the tenant's folder.
        ca_cert_pem=read_ca_cert(spec_path.parent, ca_cert) if ca_cert else "",
        user_filter=given.get("user_filter"), group_filter=given.get("group_filter"))


def load_spec(spec_path: Path) -> Tenant:
    """Validate and load one spec file. Raises TenantInvalid with every problem found."""
    if not spec_path.exists():
        raise TenantInvalid([Problem(spec_path, None, "", "the tenant spec file does not exist",
                                     "create it with `invoke new-tenant --org=NAME`")])
    if not spec_path.is_file():
        raise TenantInvalid([Problem(spec_path, None, "", "the tenant spec is not a regular file",
                                     "make it a plain file (a fifo, device or directory is never read)")])
    try:
        loaded = load(spec_path)
    except YamlSyntaxError as err:
        raise TenantInvalid([Problem(spec_path, err.line, dotted(err.key_path), f"YAML syntax error: {err.detail}",
                                     err.fix)]) from None
    problems = problems_in(loaded)
    if problems:
        raise TenantInvalid(problems)
    return _build(spec_path, loaded.data)


def _linked(org: str, root: Path | None) -> Problem | None:
    """A problem when the tenant's folder, group_vars, group_vars/all, tenant.yml or generated/ is a symbolic link,
    or the spec resolves outside inventories/<org>: the folder name is the tenant's identity, so
    `inventories/acme -> stockmark` must not act on stockmark (nor `generated -> /elsewhere` write elsewhere)."""
    folder = tenant_dir(org, root)
    fix = (f"make it a real folder or file (a copy, not a link): {org}'s identity comes from the folder name "
           f"inventories/{org}")
    for here in (folder, folder / "group_vars", folder / "group_vars" / "all", tenant_spec_path(org, root),
                 generated_dir(org, root)):
        if here.is_symlink():
            return Problem(here, None, "", "is a symbolic link; fmcluster never acts on a tenant through a link", fix)
    spec = tenant_spec_path(org, root)
    try:
        inside = spec.resolve().is_relative_to(folder.resolve()) if spec.exists() else True
    except (OSError, RuntimeError):  # a loop further up the path
        inside = False
    if not inside:
        return Problem(spec, None, "", f"resolves outside inventories/{org}", fix)
    return None


def load_tenant(org: str, root: Path | None = None) -> Tenant:
    """The validated tenant `org` from inventories/<org>/group_vars/all/tenant.yml.

    `org` comes from the command line: it is checked to be a name before it becomes part of any path."""
    bad_name = org_problem(org)
    if bad_name is not None:
        raise TenantInvalid([Problem(Path("--org"), None, "", *bad_name)])
    spec_path = tenant_spec_path(org, root)
    linked = _linked(org, root)
    if linked is not None:
        raise TenantInvalid([linked])
    if not spec_path.parent.parent.parent.is_dir():
        known = sorted(p.name for p in inventories_dir(root).iterdir() if (p / "group_vars").is_dir()) \
            if inventories_dir(root).is_dir() else []
        raise TenantInvalid([Problem(spec_path.parent.parent.parent, None, "",
                                     f"there is no tenant '{org}'",
                                     f"use one of: {', '.join(known) or '(none yet)'}, or create it with `invoke new-tenant --org={org}`")])
    return load_spec(spec_path)
