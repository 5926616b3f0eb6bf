"""The local nodes' image: a pristine Debian 12 root file system, built from Debian's packages with mmdebstrap.

It holds what a stock Debian 12 cloud image holds for fmcluster's purposes (src/fmcluster/data/images.yml,
`debian-12-local`): systemd as init, cloud-init, python3, ssh, curl, CA certificates, iproute2, sudo — and nothing
of fmcluster's: no AWS CLI, no git, no toolchain, no Slurm. Everything else reaches a local node the way it
reaches an AWS node, through its first boot (cloud-init runs its user data; the bootstrap bundle's wheelhouse, apt
from the VPC's package source).

What is the substrate's, not Debian's genericcloud image's, is in CUSTOMIZE and cloud.cfg beside this module, and
listed in docs/local-nodes.md: cloud-init is told its datasource is EC2 (no DMI says so here) and leaves the
network alone (the substrate configures eth0); no ssh host keys, hostname or resolver of the build machine stay
in the image (cloud-init makes the keys and sets the hostname at first boot).

The image is cached under /var/cache/fmcluster/images/<name>-<digest>/ (or $FMCLUSTER_IMAGE_CACHE) and built
again only when what it is made from (suite, mirror, package list, hooks) changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fmcluster.paths import image_cache
from fmcluster.providers.local.hosts import SubstrateError

Out = Callable[[str], object]

NAME = "debian-12-local"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
#: What a Debian 12 cloud image carries that fmcluster's first boot relies on (and nothing more). python3-apt: the
#: binding Ansible's apt modules import in the system python3 the nodes' plays run their modules with (Debian's and
#: Ubuntu's cloud images ship it with unattended-upgrades).
PACKAGES = ("systemd", "systemd-sysv", "dbus", "cloud-init", "locales", "python3", "python3-apt", "openssh-server", "curl",
            "ca-certificates", "iproute2", "sudo", "procps", "netbase", "iputils-ping", "less")
#: cloud-init's configuration for the substrate (datasource EC2 through the IMDS stand-in).
CLOUD_CFG = Path(__file__).with_name("cloud.cfg")
CLOUD_CFG_TARGET = "/etc/cloud/cloud.cfg.d/90_fmcluster_local.cfg"
#: The substrate's own changes to the image (see the module's doc): nothing of the build machine stays in it.
CUSTOMIZE = (
    "rm -f \"$1\"/etc/ssh/ssh_host_*",
    "echo localhost > \"$1/etc/hostname\"",
    # cloud-init's locale module sets en_US.UTF-8 (its default) and Debian's locale-gen makes only what
    # /etc/locale.gen lists: generated here, as a cloud image ships it.
    "echo 'en_US.UTF-8 UTF-8' > \"$1/etc/locale.gen\" && chroot \"$1\" locale-gen",
    "echo '# no resolver: the VPC resolver is not stood in' > \"$1/etc/resolv.conf\"",
    f"upload {{cloud_cfg}} {CLOUD_CFG_TARGET}",  # {cloud_cfg}: CLOUD_CFG, filled in at build (not in the digest)
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
    return image_cache()


def digest() -> str:
    what = {"suite": SUITE, "mirror": MIRROR, "packages": sorted(PACKAGES), "customize": list(CUSTOMIZE),
            "cloud_cfg": CLOUD_CFG.read_text()}
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
            *[f"--customize-hook={hook.format(cloud_cfg=CLOUD_CFG)}" for hook in CUSTOMIZE], SUITE, str(building), MIRROR]
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
