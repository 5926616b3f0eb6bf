"""Users' containers through Slurm (docs/containers.md): which registries a tenant's nodes pull from, as role variables.

Flow: the provider gives the tenant's own registry (Provider.container_registry: on AWS the account's ECR in the
region, read from the storage stack's output `ContainerRegistry`; locally the VPC's registry on the router address),
the spec may add more ECR registries of the same account (`containers.registries`, checked by fmcluster.validation
for their form), and `manifest_vars` refuses one of another account here, where the account is known (the deploy),
naming file, key and fix. The roles (roles/slurm_containers) get the list and never decide it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fmcluster.model import Tenant
from fmcluster.validation import ECR_REGISTRY


@dataclass(frozen=True)
class ContainerRegistry:
    """A registry the provider gives the tenant: `host` as image references name it (host[:port]); `insecure`: plain
    HTTP (only a substrate's own registry, never an AWS tenant's); `what`: what it is, for the deploy's notes."""

    host: str
    insecure: bool = False
    what: str = ""


class ForeignRegistry(ValueError):
    """A registry the spec names is not of the account the tenant's stacks are in."""


def ecr_account(host: str) -> str | None:
    """The account of an ECR registry host, None for any other host."""
    match = ECR_REGISTRY.fullmatch(host)
    return match.group("account") if match else None


def manifest_vars(tenant: Tenant, given: ContainerRegistry | None) -> dict[str, Any]:
    """`fmcluster_containers` (the playbooks' gate) and the slurm_containers role's registries and users.

    `given`: the provider's registry of this tenant, None where it is not known yet (an AWS tenant whose storage stack
    has no output yet: `invoke plan` offline); the role then refuses to converge rather than pull from nowhere."""
    spec = f"inventories/{tenant.org}/group_vars/all/tenant.yml"
    registries = [given.host] if given is not None else []
    account = ecr_account(given.host) if given is not None else None
    for i, host in enumerate(tenant.containers.registries):
        if account is not None and ecr_account(host) != account:
            raise ForeignRegistry(
                f"{spec}: containers.registries[{i}]: {host!r} is not a registry of the tenant's account {account} "
                f"(its ECR: {given.host if given else ''}); nodes pull only from the tenant's own registries. Fix: "
                f"push the image to {account}'s ECR and list {account}.dkr.ecr.<region>.amazonaws.com, or remove it")
        if host not in registries:
            registries.append(host)
    users = sorted(tenant.users, key=lambda u: u.name)
    return {
        "fmcluster_containers": tenant.containers.enabled,
        "slurm_containers_registries": registries,
        "slurm_containers_insecure_registries": [given.host] if given is not None and given.insecure else [],
        "slurm_containers_cache_dir": f"{tenant.storage.lustre.mount_point}/.fmcluster/containers",
        "slurm_containers_mounts": [tenant.storage.lustre.mount_point],
        "slurm_containers_users": [{"name": u.name, "uid": u.uid, "gid": u.gid, "removed": u.removed} for u in users],
    }
