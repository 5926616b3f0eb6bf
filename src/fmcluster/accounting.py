"""The accounting part of the manifest: tenant → role variables of slurm_accounting and the slurm role's
accounting switch. slurmdbd runs on the controller (the slurm role's slurm_accounting_host defaults to it); its
database is MariaDB on the controller (its EBS volume on AWS, the host's own filesystem locally) or the
MySQL-compatible endpoint the tenant names (RDS), whose password the node agent reads from Secrets Manager."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fmcluster import users
from fmcluster.manifest import NODE_SECRETS_DIR, SECRET_ROLES, secret_id

if TYPE_CHECKING:
    from fmcluster.model import Tenant

#: The secret (under fmcluster/<org>/) holding the external database's password; the tenant creates it.
SECRET = "slurmdbd-storage-password"


def manifest_vars(tenant: Tenant) -> dict[str, Any]:
    accounting = tenant.slurm_accounting
    if not accounting.enabled:
        return {"slurm_accounting": False}
    values: dict[str, Any] = {"slurm_accounting": True, "slurm_accounting_storage_user": accounting.database_user}
    if accounting.database_endpoint:
        host, _, port = accounting.database_endpoint.partition(":")
        values.update({
            "slurm_accounting_database": "external",
            "slurm_accounting_storage_host": host,
            "slurm_accounting_storage_port": int(port or 3306),
            # The endpoint's password exists already (the tenant created the database): never generate one.
            "slurm_accounting_storage_pass_file": f"{NODE_SECRETS_DIR}/{SECRET}",
            "slurm_accounting_storage_pass_generate": False,
            "slurm_accounting_storage_pass_secret": secret_id(tenant.org, SECRET),
        })
    return values


def manifest_secrets(tenant: Tenant) -> dict[str, tuple[str, ...]]:
    """Secrets the node agent reads for accounting (name → roles): the external database's password only."""
    accounting = tenant.slurm_accounting
    return {SECRET: ("controller",)} if accounting.enabled and accounting.database_endpoint else {}


def smtp_secrets(tenant: Tenant) -> dict[str, tuple[str, ...]]:
    """Secrets the node agent reads for monitoring.smtp's relay (name → roles): only the controller's, where
    Alertmanager runs (fmcluster.monitoring.smtp_vars names their files)."""
    smtp = tenant.monitoring.smtp
    if smtp is None:
        return {}
    return {name: ("controller",) for name in (smtp.username_secret, smtp.password_secret) if name}


def secret_roles(tenant: Tenant) -> dict[str, tuple[str, ...]]:
    """Every secret the tenant's nodes read (name → roles of the nodes that read it): the manifest lists these,
    and each node role's IAM policy grants exactly its own."""
    merged: dict[str, tuple[str, ...]] = {}
    for part in (SECRET_ROLES, manifest_secrets(tenant), users.manifest_secrets(tenant),
                 smtp_secrets(tenant)):
        for name, roles in part.items():  # one secret named twice: read wherever either reads it
            merged[name] = tuple(dict.fromkeys((*merged.get(name, ()), *roles)))
    return merged
