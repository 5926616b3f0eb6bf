"""The tenant's `parallelcluster` section, parsed: what a ParallelCluster 3 config needs beyond the rest of the spec.

Its schema is section.schema.json here; the model parses it with `parse` (capabilities.yml's section_parser) into
Tenant.scheduler_settings, and this folder's code reads it back typed with `settings_of`. Nothing of fmcluster's is
imported at run time: the model loads this module while it builds a tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fmcluster.model import Tenant


@dataclass(frozen=True)
class Accounting:
    """Slurm accounting (ParallelCluster's SlurmSettings/Database): the tenant's existing database (uri and
    password_secret_arn), or, without them, the one the storage stack creates (`created`)."""

    uri: str | None
    user_name: str
    password_secret_arn: str | None
    database_name: str | None

    @property
    def created(self) -> bool:
        """fmcluster creates the database (RDS in the storage stack) and its password secret."""
        return self.uri is None


@dataclass(frozen=True)
class ParallelClusterSettings:
    """The `parallelcluster` section: what a ParallelCluster 3 config needs beyond the rest of the spec."""

    os: str
    ssh_key_name: str | None
    accounting: Accounting | None


def parse(section: dict[str, Any], written: dict[str, Any]) -> ParallelClusterSettings:
    """`section` with the schema's defaults, `written` as tenant.yml has it ({} when absent)."""
    # Asked for only when written: `accounting: {}` asks (fmcluster creates the database); the defaults fill an
    # absent optional section with {} too, which must not.
    accounting = section.get("accounting") if "accounting" in written else None
    return ParallelClusterSettings(
        os=section["os"],
        ssh_key_name=section.get("ssh_key_name"),
        accounting=Accounting(accounting.get("uri"), accounting["user_name"], accounting.get("password_secret_arn"),
                              accounting.get("database_name")) if accounting is not None else None,
    )


def settings_of(tenant: Tenant) -> ParallelClusterSettings | None:
    """The tenant's parallelcluster settings; None for a tenant of another scheduler."""
    settings = tenant.scheduler_settings
    return settings if isinstance(settings, ParallelClusterSettings) else None
