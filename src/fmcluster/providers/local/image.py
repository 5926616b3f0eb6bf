"""The local nodes' image: a pristine Debian 12 root file system, built from Debian's packages with mmdebstrap.

It holds what a stock Debian 12 cloud image holds for fmcluster's purposes (src/fmcluster/data/images.yml,
`debian-12-local`): python3, ssh, curl, CA certificates, iproute2, sudo — and nothing of fmcluster's: no AWS
CLI, no git, no toolchain, no Slurm. Everything else reaches a local node the way it reaches an AWS node, through
its first boot (its user data, the bootstrap bundle's wheelhouse, apt from the VPC's package source).

Two things are the substrate's, not the image's, and are said so: the hosts have no init system (fmcluster's
supervised_service runs the daemons), so `policy-rc.d` tells dpkg not to start daemons on install; and the ssh
host keys are not in the image (each host makes its own at first boot, as cloud-init does).

The image is cached under /var/cache/fmcluster/images/<name>-<digest>/ (or $FMCLUSTER_IMAGE_CACHE) and built
again only when what it is made from (suite, mirror, package list, hooks) changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fmcluster.providers.local.hosts import SubstrateError

Out = Callable[[str], object]

NAME = "debian-12-local"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
#: What a Debian 12 cloud image carries that fmcluster's first boot relies on (and nothing more).
PACKAGES = ("python3", "openssh-server", "curl", "ca-certificates", "iproute2", "sudo", "procps", "netbase",
            "iputils-ping", "less")
#: The substrate's own changes to the image (see the module's doc).
CUSTOMIZE = (
    "printf '#!/bin/sh\\n# fmcluster local substrate: no init system here; supervised_service runs daemons\\nexit 101\\n'"
    " > \"$1/usr/sbin/policy-rc.d\" && chmod 0755 \"$1/usr/sbin/policy-rc.d\"",
    "rm -f \"$1\"/etc/ssh/ssh_host_*",
)
COMPLETE = ".fmcluster-image.json"


@dataclass(frozen=True)
class Image:
    rootfs: Path
    built: bool  # by this call
    seconds: float

    @property
    def note(self) -> str:
        how = f"built in {self.seconds:.0f}s" if self.built else "cached"
        return (f"image {NAME}: Debian 12 ({SUITE}) root file system from Debian's packages by mmdebstrap, {how} "
                f"({self.rootfs}); packages: {', '.join(PACKAGES)}")


def cache_root() -> Path:
    return Path(os.environ.get("FMCLUSTER_IMAGE_CACHE", "/var/cache/fmcluster/images"))


def digest() -> str:
    what = {"suite": SUITE, "mirror": MIRROR, "packages": sorted(PACKAGES), "customize": list(CUSTOMIZE)}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]


def image_dir() -> Path:
    return cache_root() / f"{NAME}-{digest()}"


def ensure_image(out: Out = print) -> Image:
    """The image's root file system, built if it is not cached."""
    folder = image_dir()
    rootfs = folder / "rootfs"
    if (folder / COMPLETE).is_file() and rootfs.is_dir():
        return Image(rootfs, False, 0.0)
    # Tenants deployed at the same time (the test tiers run side by side) wait for one build instead of each
    # removing the other's half-built folder.
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / f".{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / COMPLETE).is_file() and rootfs.is_dir():
            return Image(rootfs, False, 0.0)
        return _build(folder, rootfs, out)


def _build(folder: Path, rootfs: Path, out: Out) -> Image:
    if not shutil.which("mmdebstrap"):
        raise SubstrateError("mmdebstrap is missing; run scripts/bootstrap.sh (it installs Debian's mmdebstrap)")
    out(f"  building the local image {NAME} with mmdebstrap (once; cached in {folder})")
    started = time.monotonic()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    building = folder / "rootfs.partial"
    argv = ["mmdebstrap", "--mode=root", "--variant=minbase", f"--include={','.join(PACKAGES)}",
            *[f"--customize-hook={hook}" for hook in CUSTOMIZE], SUITE, str(building), MIRROR]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise SubstrateError(f"mmdebstrap could not build the local image {NAME} (exit {done.returncode}):\n{tail}")
    building.rename(rootfs)
    seconds = time.monotonic() - started
    (folder / COMPLETE).write_text(json.dumps({"name": NAME, "suite": SUITE, "packages": list(PACKAGES),
                                               "seconds": round(seconds, 1)}) + "\n")
    return Image(rootfs, True, seconds)
