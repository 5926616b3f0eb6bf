"""What a provider and a scheduler can do, as data: the one place a provider or scheduler *name* is looked up.

Every other module (stacks, validation, health, doctor, fleet) and every role reads a capability, never a name,
so a new provider or scheduler is a new row here plus its own module (fmcluster.providers / fmcluster.schedulers),
not a hunt for `== "local"`. The provider and scheduler objects publish the same rows (`capabilities`), and the
manifest carries the resolved ones to the nodes as `fmcluster_capabilities` (fmcluster.publish).

This module imports nothing of fmcluster's: the model, validation and the node-side programs all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class ProviderCapabilities:
    """What the substrate a provider runs the cluster on has, and what it lacks."""

    #: The nodes have the instance catalog's hardware (GPUs, EFA interfaces): a missing device is a fault.
    real_accelerators: bool
    #: The AWS APIs are an emulator on this machine: it creates no FSx, reservations or data repository
    #: associations, and leaves out the outputs that read them (the templates are AWS's, unchanged).
    emulated_apis: bool
    #: AWS's cluster services run here (ParallelCluster's create-cluster): a scheduler whose service makes its
    #: cluster needs a stand-in where they do not.
    cluster_services: bool
    #: Nodes can reach a database endpoint outside the cluster (Slurm accounting on RDS).
    external_database: bool
    #: Seconds between node health runs (Slurm's HealthCheckInterval) and between Slurm metrics rounds.
    health_interval_s: int
    metrics_interval_s: int


@dataclass(frozen=True)
class SchedulerCapabilities:
    """How a scheduler makes and runs its cluster, as far as the rest of fmcluster needs to know."""

    #: The cluster stack fmcluster renders (a key of fmcluster.stacks.render's builders); None: the scheduler's
    #: own service makes the cluster (ParallelCluster's create-cluster).
    cluster_stack: str | None
    #: The cluster stack that stands in for the service where the provider has no cluster services.
    stand_in_stack: str | None
    #: The scheduler's own service installs Slurm, munge and the shared-storage mounts (fmcluster's roles do not):
    #: one Slurm per cluster.
    service_installs_slurm: bool
    #: The tenant section only this scheduler reads (its own settings); None: it reads none.
    own_section: str | None
    #: Node policies the cluster's nodes get are managed policies of the storage stack (Iam/AdditionalIamPolicies).
    storage_node_policies: bool
    #: Login nodes sit in the public subnet (so the private subnet need not hold their addresses).
    public_login: bool
    #: Queues may launch into EC2 capacity reservations (capacity_reservation_id).
    capacity_reservations: bool
    #: Nodes may be reached by ssh from outside the VPC (network.ssh_ingress_cidr).
    ssh_ingress: bool


PROVIDERS: dict[str, ProviderCapabilities] = {
    "aws": ProviderCapabilities(real_accelerators=True, emulated_apis=False, cluster_services=True,
                                external_database=True, health_interval_s=300, metrics_interval_s=30),
    # Namespace hosts on this machine: no GPUs or EFA, the emulator in place of AWS, short intervals to rehearse.
    "local": ProviderCapabilities(real_accelerators=False, emulated_apis=True, cluster_services=False,
                                  external_database=False, health_interval_s=30, metrics_interval_s=15),
}

SCHEDULERS: dict[str, SchedulerCapabilities] = {
    "slurm-ec2": SchedulerCapabilities(cluster_stack="slurm_ec2", stand_in_stack=None, service_installs_slurm=False,
                                       own_section=None, storage_node_policies=False, public_login=True,
                                       capacity_reservations=True, ssh_ingress=True),
    # HyperPod's AMI ships Slurm and munge; its lifecycle starts them (fmcluster.schedulers.hyperpod).
    "hyperpod": SchedulerCapabilities(cluster_stack="hyperpod", stand_in_stack=None, service_installs_slurm=True,
                                      own_section=None, storage_node_policies=False, public_login=False,
                                      capacity_reservations=False, ssh_ingress=False),
    "parallelcluster": SchedulerCapabilities(cluster_stack=None, stand_in_stack="parallelcluster_stand_in",
                                             service_installs_slurm=True, own_section="parallelcluster",
                                             storage_node_policies=True, public_login=False,
                                             capacity_reservations=True, ssh_ingress=True),
}

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
        """The scheduler's service makes the cluster, but it does not run on this provider: a stand-in does."""
        return self.scheduler.cluster_stack is None and not self.provider.cluster_services

    @property
    def cluster_stack(self) -> str | None:
        """The cluster stack fmcluster renders (None: the scheduler's service makes the cluster)."""
        return self.scheduler.stand_in_stack if self.stand_in else self.scheduler.cluster_stack

    @property
    def slurm_owner(self) -> SlurmOwner:
        """Who installs Slurm, munge and the shared-storage mounts on the nodes (the playbooks' one gate)."""
        return "scheduler" if self.scheduler.service_installs_slurm and not self.stand_in else "fmcluster"

    def manifest_vars(self) -> dict[str, Any]:
        """`fmcluster_capabilities`, what roles read (never fmcluster_provider or fmcluster_scheduler)."""
        return {"fmcluster_capabilities": {"real_accelerators": self.provider.real_accelerators,
                                           "slurm_owner": self.slurm_owner}}


def capabilities(provider: object, scheduler: object) -> Capabilities:
    return Capabilities(provider_capabilities(provider), scheduler_capabilities(scheduler))
