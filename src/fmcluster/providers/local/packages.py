"""The local VPC's package source: a caching proxy of Debian's archive (apt-cacher-ng) on the VPC router address.

On AWS a node's apt reaches the distribution's archive through the VPC's NAT gateway (or the tenant's own
mirror). Here the tenant's VPC is a bridge with no route out, so the substrate puts a package source where a
VPC-local mirror would be: apt-cacher-ng, from Debian's packages, listening on the private subnet's router
address. A node's apt is pointed at it at first boot the way cloud-init's `apt: proxy:` does it (a file in
/etc/apt/apt.conf.d/), the packages themselves and their signatures are Debian's, unchanged (apt checks the
archive's signed InRelease as it would anywhere). The cache lives under /var/cache/fmcluster/apt/<org>/ and
is kept across deploys, so a second cluster's nodes install from the cache.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from fmcluster.providers.local.daemons import answers, read_state, runs, start, stop
from fmcluster.providers.local.hosts import substrate_root
from fmcluster.providers.local.image import MIRROR

PROGRAM = "apt-cacher-ng"
PORT = 3142
START_TIMEOUT_S = 20.0
#: Where a node's apt is told to find the package source (cloud-init writes the same kind of file).
APT_CONF_PATH = "/etc/apt/apt.conf.d/90fmcluster-vpc-package-source"


@dataclass(frozen=True)
class PackageSource:
    address: str
    port: int
    pid: int
    started: bool

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/"

    def apt_conf(self) -> str:
        return ("// written at first boot by the fmcluster local substrate (as cloud-init's `apt: proxy:` does): the\n"
                "// VPC's package source, a caching proxy of Debian's archive on the VPC router address\n"
                f'Acquire::http::Proxy "{self.url}";\n')

    @property
    def note(self) -> str:
        how = "started" if self.started else "running"
        return (f"package source: apt-cacher-ng (Debian's archive, cached in {cache_root()}) {how} on "
                f"{self.address}:{self.port}, the VPC router address (on AWS: the archive through the NAT)")


def cache_root() -> Path:
    return Path(os.environ.get("FMCLUSTER_APT_CACHE", "/var/cache/fmcluster/apt"))


def _state_path(org: str) -> Path:
    return substrate_root(org) / "package-source.json"


def ensure_package_source(org: str, address: str, cache: str = "") -> PackageSource:
    """The tenant's package source on `address` (the VPC router address), started unless it runs; its cache is
    cache_root()/<cache, by default the org's>."""
    state = _state_path(org)
    known = read_state(state)
    pid = int(known.get("pid", 0))
    if known.get("address") == address and runs(pid, PROGRAM, f"BindAddress={address}") and answers(address, PORT):
        return PackageSource(address, PORT, pid, False)
    if runs(pid, PROGRAM, f"BindAddress={known.get('address', '')}"):
        stop_package_source(org)
    cache_dir = cache_root() / (cache or org)
    logs = substrate_root(org) / "package-source"
    for folder in (cache_dir, logs):
        folder.mkdir(parents=True, exist_ok=True)
    argv = [PROGRAM, "-c", "/etc/apt-cacher-ng", "ForeGround=1", f"BindAddress={address}", f"Port={PORT}",
            f"CacheDir={cache_dir}", f"LogDir={logs}", f"PidFile={logs}/pid", f"SocketPath={logs}/socket",
            "ExThreshold=4",
            # Debian's archive as the one backend: the package's own list is empty until debconf fills it in,
            # and apt-cacher-ng then answers every request "503 Host not found".
            f"Remap-debrep=file:deb_mirror*.gz /debian ; {MIRROR}/"]
    pid = start(argv, logs / "console.log", address, PORT, START_TIMEOUT_S,
                "the package source (apt-cacher-ng)")
    state.write_text(json.dumps({"pid": pid, "address": address, "port": PORT}) + "\n")
    return PackageSource(address, PORT, pid, True)


def stop_package_source(org: str, timeout_s: float = 10.0) -> bool:
    """Stop the tenant's package source if it runs (its cache is kept). True if one was stopped."""
    state = _state_path(org)
    known = read_state(state)
    state.unlink(missing_ok=True)
    pid = int(known.get("pid", 0))
    if not runs(pid, PROGRAM, f"BindAddress={known.get('address', '')}"):
        return False
    stop(pid, timeout_s)
    return True
