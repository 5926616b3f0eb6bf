"""Which provider serves a tenant: the one place that maps `provider:` to its class.

Apart from the package (fmcluster.providers: the protocol and the types every provider shares), so that the
providers import those without importing the registry that imports them.
"""

from __future__ import annotations

from fmcluster.model import Tenant
from fmcluster.providers import Provider
from fmcluster.providers.aws import AwsProvider
from fmcluster.providers.local import LocalProvider


def provider_for(tenant: Tenant) -> Provider:
    if tenant.provider == "local":
        return LocalProvider(tenant)
    return AwsProvider(tenant)
