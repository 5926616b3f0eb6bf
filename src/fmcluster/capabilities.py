"""What a provider and a scheduler can do, as data: the one place a provider or scheduler *name* is looked up.

Every other module (stacks, validation, health, doctor, fleet) and every role reads a capability, never a name,
so a new provider is a new row here plus its module (fmcluster.providers), a new scheduler its folder
(fmcluster.schedulers.<name>, whose capabilities.yml is its row), not a hunt for `== "local"`. The provider and
scheduler objects publish the same rows (`capabilities`), and the manifest carries the resolved ones to the nodes
as `fmcluster_capabilities` (fmcluster.publish).

This module imports nothing of fmcluster's (it reads the schedulers' rows as files): the model, validation and the
node-side programs all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml


@dataclass(frozen=True)
class ApiCapabilities:
    """How the AWS APIs a provider's substrate answers behave: what the boto3 clients (fmcluster.stacks.aws), the
    stacks operations (fmcluster.stacks.api), the capacity pre-flight and `invoke image` adapt to. The provider
    hands it in beside its endpoint (`Provider.capabilities.apis`); nothing guesses it from whether an endpoint is
    set."""

    #: The APIs are an emulator on this machine: it creates no FSx, placement groups or data repository
    #: associations (fmcluster.stacks.result.EMULATOR_SKIPPED_TYPES), and leaves out the outputs that read them (the
    #: templates are AWS's, unchanged); plan marks those resources, deploy and status list what each stack lacks.
    emulated: bool
    #: How often a call is retried after its first try (throttling, transient errors, a dropped connection): botocore's
    #: `max_attempts` in its standard retry mode, so 8 is up to 9 tries.
    retries: int
    #: Seconds between two reads of a change set or a stack's events while waiting on it, and how long one stack
    #: operation may take (a stack waiting for its nodes' signals waits their Timeout besides: stacks.changesets).
    stack_poll_s: float
    stack_timeout_s: float
    #: What answers the capacity pre-flight in place of the account's reservations and Service Quotas, said under
    #: its lines (fmcluster.capacity); "" where the account itself answers.
    capacity_stand_in: str = ""
    #: Why no EC2 Image Builder image is built here, said for each kind the image stack holds no AMI of
    #: (`invoke image` on the image stack); "" where Image Builder builds them.
    image_builder_missing: str = ""


#: AWS's own APIs: botocore's standard retries with room for throttling, CloudFormation polled every 5 s for up to
#: 3 hours (a stack of file systems, or Image Builder's images, takes an hour or more).
AWS_APIS = ApiCapabilities(emulated=False, retries=8, stack_poll_s=5.0, stack_timeout_s=3 * 3600.0)
#: The tenant's emulator on this machine (fmcluster.providers.local.emulator): it answers at once or not at all,
#: so two retries, a tight poll and a short wait; what it stands in or lacks is said.
EMULATOR_APIS = ApiCapabilities(
    emulated=True, retries=2, stack_poll_s=0.2, stack_timeout_s=120.0,
    capacity_stand_in=("answered by the AWS emulator: moto has no capacity reservations or EC2 Service Quotas, so "
                       "fmcluster's emulator stands them in (fmcluster.providers.local.emulator_server)"),
    image_builder_missing="the emulator has no EC2 Image Builder, so nothing is built offline")


@dataclass(frozen=True)
class ProviderCapabilities:
    """What the substrate a provider runs the cluster on has, and what it lacks."""

    #: The nodes have the instance catalog's hardware (GPUs, EFA interfaces): a missing device is a fault.
    real_accelerators: bool
    #: How the AWS APIs the tenant deploys through behave (AWS's own, or an emulator's).
    apis: ApiCapabilities
    #: AWS's cluster services run here: a scheduler whose service makes its
    #: cluster needs a stand-in where they do not.
    cluster_services: bool
    #: Nodes can reach a database endpoint outside the cluster (Slurm accounting on RDS).
    external_database: bool
    #: Seconds between node health runs (Slurm's HealthCheckInterval) and between Slurm metrics rounds.
    health_interval_s: int
    metrics_interval_s: int
    #: Slurm's job credential lifetime (AuthInfo cred_expire), also how long a requeued job waits to start again.
    credential_lifetime_s: int = 120
    #: Seconds a node may take from `scontrol reboot` to slurmd registering again, before a GPU node's boot
    #: diagnostic (Slurm's ResumeTimeout adds that; past it Slurm marks the node DOWN, scontrol(1)). AWS: 1,800, the
    #: ResumeTimeout AWS's Slurm cluster tool gives a GPU instance's boot (its ComputeNodeBootstrapTimeout default).
    reboot_timeout_s: int = 1800
    #: Outbound port 25 is blocked (EC2's default, AWS knowledge center "ec2-port-25-throttle") and nothing on the
    #: controller relays mail: an email receiver needs monitoring.smtp, a relay on a submission port.
    smtp_port_25_blocked: bool = False
    #: `invoke image` bakes the tenant's node images on this substrate (issue 40: local first; AWS's EC2 Image
    #: Builder stack is a later slice).
    bakes_images: bool = False
    #: The nodes pull containers from the tenant's ECR (`<account>.dkr.ecr.<region>.amazonaws.com`), so the tenant may
    #: name more ECR registries of its account (`containers.registries`). False: from the registry the substrate
    #: runs (locally the VPC's, on the router address), the only one its nodes reach.
    ecr_registries: bool = True


@dataclass(frozen=True)
class SchedulerCapabilities:
    """How a scheduler makes and runs its cluster, as far as the rest of fmcluster needs to know."""

    #: The scheduler's name (`scheduler:` in tenant.yml).
    name: str
    #: fmcluster renders its cluster stack (its folder's template.py); False: the scheduler's own service makes the
    #: cluster, and a stand-in takes its place where the provider lacks it.
    renders_cluster_stack: bool
    #: The scheduler's own service installs Slurm, munge and the shared-storage mounts (fmcluster's roles do not):
    #: one Slurm per cluster.
    service_installs_slurm: bool
    #: The tenant section only this scheduler reads (its own settings); None: it reads none. Its JSON-schema
    #: fragment is the folder's section.schema.json, which validation.load_schema places in the tenant's schema.
    own_section: str | None
    #: Login nodes sit in the public subnet (so the private subnet need not hold their addresses).
    public_login: bool
    #: Queues may launch into EC2 capacity reservations (capacity_reservation_id).
    capacity_reservations: bool
    #: Nodes may be reached by ssh from outside the VPC (network.ssh_ingress_cidr).
    ssh_ingress: bool
    #: How the controller's repair agent (fmcluster.health.repair) reboots and replaces a compute node: `reboot`
    #: and `replace`, each an argv ({node}, {address}, {reason} filled in; a leading `scontrol` is the cluster's)
    #: and `sources`. None: fmcluster's agent does not run, the scheduler's own service repairs its nodes.
    repair: dict[str, Any] | None = None
    #: What it is, in a line: the tenant schema's description of `scheduler:` lists each (validation.load_schema).
    summary: str = ""
    #: How a Slurm job step on its nodes runs a registry image (docs/containers.md, "Which flags work where"): a key of
    #: CONTAINER_RUNTIMES. None: no container runtime fmcluster knows of, so nothing (the acceptance image) may ask for
    #: one.
    job_container_runtime: str | None = None
    #: `module:function` of its folder that makes its settings out of its own section (defaults filled in, and the
    #: section as written, for what is asked for only by writing it): Tenant.scheduler_settings. None: the model
    #: keeps no settings of it.
    section_parser: str | None = None
    #: Where its service or its image installs and keeps its own configuration on the nodes: no shared file system
    #: may be mounted over or inside them (validation.SYSTEM_DIRS, for every tenant: an image may carry them).
    system_dirs: tuple[str, ...] = ()
    #: The cluster stack fmcluster renders holds resources of an AWS cluster service that launches and registers the
    #: nodes (PCS's AWS::PCS::*), which no emulator answers: where the provider has no cluster services, the
    #: scheduler's stand-in stack takes its place, as for a service that makes its whole cluster
    #: (renders_cluster_stack false). False where the emulator answers the service's resources (HyperPod's).
    service_resources_stood_in: bool = False


#: The ways a Slurm job step runs a registry image, each with who installs it on the nodes. `slurm-oci`: Slurm's own
#: OCI support (`srun --container=<bundle>`) with rootless runc and fmcluster-container, which fmcluster's
#: slurm_containers role installs where `containers.enabled`; `pyxis`: NVIDIA's Pyxis SPANK plugin over Enroot
#: (`srun --container-image=... --container-mounts=...`), which the scheduler's own image or lifecycle provides.
CONTAINER_RUNTIMES: dict[str, str] = {
    "slurm-oci": "fmcluster",
    "pyxis": "scheduler",
}


PROVIDERS: dict[str, ProviderCapabilities] = {
    "aws": ProviderCapabilities(real_accelerators=True, apis=AWS_APIS, cluster_services=True,
                                external_database=True, health_interval_s=300, metrics_interval_s=30,
                                smtp_port_25_blocked=True),
    # Namespace hosts on this machine: no GPUs or EFA, the emulator in place of AWS, short intervals to rehearse.
    "local": ProviderCapabilities(real_accelerators=False, apis=EMULATOR_APIS, cluster_services=False,
                                  external_database=False, health_interval_s=30, metrics_interval_s=15,
                                  # A requeued job waits 30 s, not Slurm's 120: rehearsed within the tests' time.
                                  credential_lifetime_s=30, reboot_timeout_s=300, bakes_images=True,
                                  ecr_registries=False),
}

#: Each scheduler's row lives in its folder (src/fmcluster/schedulers/<name>/capabilities.yml), read as data.
SCHEDULER_ROWS = Path(__file__).resolve().parent / "schedulers"
#: A scheduler's own section's JSON-schema fragment, in its folder (with own_section).
SECTION_SCHEMA = "section.schema.json"


def _scheduler_rows() -> tuple[dict[str, SchedulerCapabilities], dict[str, Path]]:
    rows: dict[str, SchedulerCapabilities] = {}
    folders: dict[str, Path] = {}
    for path in sorted(SCHEDULER_ROWS.glob("*/capabilities.yml")):
        row = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(row, dict) and isinstance(row.get("system_dirs"), list):
            row["system_dirs"] = tuple(row["system_dirs"])
        try:
            capabilities = SchedulerCapabilities(**row)
        except TypeError as error:
            raise ValueError(f"{path}: not a scheduler's capabilities row ({error})") from error
        if capabilities.job_container_runtime is not None and capabilities.job_container_runtime not in CONTAINER_RUNTIMES:
            raise ValueError(f"{path}: job_container_runtime {capabilities.job_container_runtime!r} is none of "
                             f"{', '.join(CONTAINER_RUNTIMES)} (fmcluster.capabilities.CONTAINER_RUNTIMES)")
        if capabilities.own_section is not None and not (path.parent / SECTION_SCHEMA).is_file():
            raise ValueError(f"{path}: own_section {capabilities.own_section!r} needs its schema, "
                             f"{path.parent / SECTION_SCHEMA}")
        parser_module = (capabilities.section_parser or "").partition(":")[0]
        if capabilities.section_parser is not None and (
                capabilities.own_section is None or ":" not in capabilities.section_parser
                or not (path.parent / f"{parser_module}.py").is_file()):
            raise ValueError(f"{path}: section_parser {capabilities.section_parser!r} is not `module:function` of a "
                             "module in this folder, for its own_section")
        if capabilities.name in rows:
            raise ValueError(f"{path}: scheduler {capabilities.name!r} has a row already")
        rows[capabilities.name] = capabilities
        folders[capabilities.name] = path.parent
    return rows, folders


SCHEDULERS: dict[str, SchedulerCapabilities]
#: Each scheduler's folder (src/fmcluster/schedulers/<name>/), where the layers below the registry find what it
#: hands them as files or modules (its validation rules: fmcluster.validation.scheduler_rules) without importing it.
SCHEDULER_FOLDERS: dict[str, Path]
SCHEDULERS, SCHEDULER_FOLDERS = _scheduler_rows()

def scheduler_data(filename: str, core: dict[str, Any]) -> dict[str, Any]:
    """A core data file (src/fmcluster/data/<filename>, read as `core`) with each scheduler folder's own part of it
    added: what belongs to one scheduler (its image's catalogue entry, the accounts its image makes) lives in its
    folder as a file of the same name, holding some of the core file's sections. A section that is a mapping gains
    the folder's entries, one that is a list its items; a section the core file lacks, or an entry someone has
    already, is refused with both files named. The folders are read in SCHEDULER_FOLDERS' order."""
    merged = {key: (dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value)
              for key, value in core.items()}
    owner: dict[tuple[str, str], str] = {}
    for folder in SCHEDULER_FOLDERS.values():
        path = folder / filename
        if not path.is_file():
            continue
        part = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(part, dict):
            raise ValueError(f"{path}: not a mapping of sections of data/{filename}")
        for section, entries in part.items():
            here = merged.get(section)
            if isinstance(here, dict) and isinstance(entries, dict):
                names = [str(name) for name in entries]
            elif isinstance(here, list) and isinstance(entries, list):
                names = [str(name) for name in entries]
            else:
                raise ValueError(f"{path}: section {section!r} is not a mapping or list section of data/{filename} "
                                 "(a scheduler's folder adds entries to the core file's sections, of the same kind)")
            for name in names:
                taken = owner.get((section, name)) or (f"data/{filename}" if name in map(str, here) else None)
                if taken:
                    raise ValueError(f"{path}: {section}.{name} is in {taken} already (one place per entry)")
                owner[(section, name)] = str(path)
            if isinstance(here, dict):
                here.update(entries)
            else:
                here.extend(entries)
    return merged


SlurmOwner = Literal["fmcluster", "scheduler"]


class UnknownName(ValueError):
    """A provider or scheduler with no capabilities row: nothing may guess what it can do."""


def provider_capabilities(name: object) -> ProviderCapabilities:
    if not isinstance(name, str) or name not in PROVIDERS:
        raise UnknownName(f"provider {name!r} has no capabilities (fmcluster.capabilities.PROVIDERS); "
                          f"known: {', '.join(sorted(PROVIDERS))}")
    return PROVIDERS[name]


def scheduler_capabilities(name: object) -> SchedulerCapabilities:
    if not isinstance(name, str) or name not in SCHEDULERS:
        raise UnknownName(f"scheduler {name!r} has no capabilities (fmcluster.capabilities.SCHEDULERS); "
                          f"known: {', '.join(sorted(SCHEDULERS))}")
    return SCHEDULERS[name]


@dataclass(frozen=True)
class Capabilities:
    """One tenant's provider and scheduler capabilities, and what they decide together."""

    provider: ProviderCapabilities
    scheduler: SchedulerCapabilities

    @property
    def stand_in(self) -> bool:
        """The scheduler's service makes the cluster (or launches its nodes from our stack), but it does not run on
        this provider: a stand-in does."""
        service_made = not self.scheduler.renders_cluster_stack or self.scheduler.service_resources_stood_in
        return service_made and not self.provider.cluster_services

    @property
    def slurm_owner(self) -> SlurmOwner:
        """Who installs Slurm, munge and the shared-storage mounts on the nodes (the playbooks' one gate)."""
        return "scheduler" if self.scheduler.service_installs_slurm and not self.stand_in else "fmcluster"

    def manifest_vars(self) -> dict[str, Any]:
        """`fmcluster_capabilities`, what roles read (never a provider or scheduler name)."""
        return {"fmcluster_capabilities": {"real_accelerators": self.provider.real_accelerators,
                                           "slurm_owner": self.slurm_owner}}


def capabilities(provider: object, scheduler: object) -> Capabilities:
    return Capabilities(provider_capabilities(provider), scheduler_capabilities(scheduler))
