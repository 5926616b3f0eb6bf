"""The Slurm PCS runs and the image every PCS node boots: one place, read by the template, the scheduler and the rules
(it imports nothing of fmcluster's, so validation may read it before any model exists).

On AWS a PCS node boots the tenant's baked image (`invoke image`): the base image installers.yml names for its
accelerator, with the PCS agent and PCS's Slurm installed by AWS's installers (`install_script`, the image stack's
first build step) and then fmcluster's own install steps. PCS's sample AMI is catalogued (data/images.yml) for what
it is, and booted by no node: AWS says it is for demonstrations, and fmcluster's first boot cannot run on it."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: The Slurm major version the cluster runs: the newest AWS::PCS::Cluster Scheduler.Version PCS accepts, the one its
#: current sample AMI and Slurm installer are built for (README.md, "Sources").
SLURM_VERSION = "25.11"
#: PCS's sample AMI for that Slurm (data/images.yml): catalogued, booted by no node (the module's docstring).
SAMPLE_IMAGE = f"pcs-sample-al2023-x86_64-slurm-{SLURM_VERSION}"
INSTALLERS_PATH = Path(__file__).with_name("installers.yml")
#: The order the image stack runs the installers in (the agent starts the daemons the Slurm installer puts there).
INSTALL_ORDER = ("slurm", "agent")
_FINGERPRINT = re.compile(r"[0-9A-F]{40}")
_VERSION = re.compile(r"latest|[0-9][0-9.]*")
_DIRECTORY = re.compile(r"[A-Za-z0-9._{}-]+")


class InstallersError(ValueError):
    """installers.yml is not what the image stack can render: the message names the file, the key and the fix."""


@dataclass(frozen=True)
class Installer:
    name: str
    url: str  # with {region}
    directory: str
    install: str
    source: str

    def script(self) -> str:
        """Download the tarball and its detached signature, verify it with the pinned key's keyring, install."""
        tarball = f"$pcs_work/{self.name}.tar.gz"
        url = self.url.replace("{region}", "${FMCLUSTER_REGION}")
        return (f'curl -fsSL --retry 3 "{url}" -o "{tarball}"\n'
                f'curl -fsSL --retry 3 "{url}.sig" -o "{tarball}.sig"\n'
                f'gpg --homedir "$pcs_gnupg" --batch --verify "{tarball}.sig" "{tarball}"\n'
                f'tar -xzf "{tarball}" -C "$pcs_work"\n'
                f'(cd "$pcs_work/{self.directory}" && {self.install})\n')


@dataclass(frozen=True)
class Installers:
    key_url: str  # with {region}
    fingerprint: str
    ordered: tuple[Installer, ...]
    bases: dict[str, str]  # accelerator -> data/images.yml key
    supported_os: tuple[str, ...]
    refused: dict[str, str]  # accelerator -> why validate refuses its queues

    def base(self, accelerator: str) -> str:
        if accelerator not in self.bases:
            raise InstallersError(f"{INSTALLERS_PATH}: bases has no entry for accelerator {accelerator!r}: add the "
                                  "catalogued image its PCS image is baked on")
        return self.bases[accelerator]

    def install_script(self) -> str:
        """The image stack's PCS step (bash, run as root under `set -euo pipefail` with FMCLUSTER_REGION set): the
        pinned key in a keyring of its own, refused unless its fingerprint is installers.yml's, then each installer,
        verified against it, installed by its documented command."""
        key_url = self.key_url.replace("{region}", "${FMCLUSTER_REGION}")
        head = ("# AWS PCS's installers (src/fmcluster/schedulers/pcs/installers.yml): each tarball verified against\n"
                "# AWS's signing key, pinned by fingerprint, before it runs.\n"
                "pcs_work=$(mktemp -d) pcs_gnupg=$(mktemp -d)\n"
                "chmod 0700 \"$pcs_gnupg\"\n"
                f'curl -fsSL --retry 3 "{key_url}" -o "$pcs_work/key.pub"\n'
                'gpg --homedir "$pcs_gnupg" --batch --import "$pcs_work/key.pub"\n'
                'pcs_fpr=$(gpg --homedir "$pcs_gnupg" --batch --with-colons --fingerprint | awk -F: \'$1 == "fpr" '
                '{print $10; exit}\')\n'
                f'if [ "$pcs_fpr" != "{self.fingerprint}" ]; then\n'
                f'  echo "fmcluster image: the PCS signing key is $pcs_fpr, not {self.fingerprint}" >&2; exit 1\n'
                "fi\n")
        return head + "".join(i.script() for i in self.ordered) + 'rm -rf "$pcs_work" "$pcs_gnupg"\n'


def _text(raw: dict[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise InstallersError(f"{INSTALLERS_PATH}: {where}{key} is missing or not text: give it (with its source)")
    return value


def parse_installers(raw: Any) -> Installers:
    """installers.yml as the image stack uses it; InstallersError naming the key and the fix where it cannot."""
    if not isinstance(raw, dict):
        raise InstallersError(f"{INSTALLERS_PATH}: not a mapping")
    key = raw.get("public_key") or {}
    fingerprint = _text(key, "fingerprint", "public_key.")
    if not _FINGERPRINT.fullmatch(fingerprint):
        raise InstallersError(f"{INSTALLERS_PATH}: public_key.fingerprint {fingerprint!r} is not 40 upper-case hex "
                              "digits (gpg --with-colons prints it so): write it without spaces")
    _text(key, "source", "public_key.")
    found = raw.get("installers") or {}
    if set(found) != set(INSTALL_ORDER):
        raise InstallersError(f"{INSTALLERS_PATH}: installers must be exactly {', '.join(INSTALL_ORDER)} (has "
                              f"{', '.join(map(str, found)) or 'none'})")
    ordered = []
    for name in INSTALL_ORDER:
        entry = found[name]
        where = f"installers.{name}."
        version = _text(entry, "version", where)
        if not _VERSION.fullmatch(version):
            raise InstallersError(f"{INSTALLERS_PATH}: {where}version {version!r}: 'latest' or a release number")
        directory = _text(entry, "directory", where)
        if not _DIRECTORY.fullmatch(directory):
            raise InstallersError(f"{INSTALLERS_PATH}: {where}directory {directory!r}: one folder name")
        url = _text(entry, "url", where)
        if not url.startswith("https://") or not url.endswith(".tar.gz"):
            raise InstallersError(f"{INSTALLERS_PATH}: {where}url {url!r}: an https:// URL of a .tar.gz")
        _text(entry, "source", where)
        fill = {"{slurm}": SLURM_VERSION, "{version}": version}
        for placeholder, value in fill.items():
            url, directory = url.replace(placeholder, value), directory.replace(placeholder, value)
        ordered.append(Installer(name, url, directory, shlex.join(shlex.split(_text(entry, "install", where))),
                                 str(entry["source"])))
    bases = raw.get("bases")
    if not isinstance(bases, dict) or not bases:
        raise InstallersError(f"{INSTALLERS_PATH}: bases (accelerator → data/images.yml key) is missing")
    supported = (raw.get("supported_os") or {}).get("values") or []
    _text(raw.get("supported_os") or {}, "source", "supported_os.")
    refused = raw.get("refused_accelerators") or {}
    if not isinstance(refused, dict) or not all(isinstance(why, str) and why for why in refused.values()):
        raise InstallersError(f"{INSTALLERS_PATH}: refused_accelerators: accelerator → why, in words")
    return Installers(_text(key, "url", "public_key."), fingerprint, tuple(ordered),
                      {str(k): str(v) for k, v in bases.items()}, tuple(map(str, supported)),
                      {str(k): str(v) for k, v in refused.items()})


def load_installers() -> Installers:
    return parse_installers(yaml.safe_load(INSTALLERS_PATH.read_text(encoding="utf-8")))
