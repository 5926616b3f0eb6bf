"""How an operator (and the deploy's acceptance and monitoring checks) reaches the nodes: ssh with the
tenant's own key, imported into EC2 as the key pair `fmcluster-<org>` that the launch templates name.

The private key is generated on the deploy machine once, into .secrets/<org>/ssh/ (git-ignored, 0700) and
never leaves it; EC2 gets the public half. On provider local the substrate puts the key pair in each host's
authorized_keys at first boot, as cloud-init does on an instance.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fmcluster.model import Tenant
from fmcluster.paths import UnsafePath, real_dir, secrets_dir

Out = Callable[[str], object]


@dataclass(frozen=True)
class KeyPair:
    name: str
    private_key: Path
    created: bool


def key_pair_name(org: str) -> str:
    return f"fmcluster-{org}"


def operator_key(org: str) -> Path:
    """The tenant's private ssh key on this machine (made on first use; the public half beside it)."""
    key = secrets_dir(org) / "ssh" / "id_ed25519"
    # Real folders and no link at the key: a `.secrets/<org> -> elsewhere` link would move the key (and the
    # chmod below) to wherever it points.
    real_dir(key.parent, secrets_dir(org).parent)
    if key.is_symlink() or Path(f"{key}.pub").is_symlink():
        raise UnsafePath(f"{key} (or its .pub) is a symbolic link; the operator key is kept only as a real file "
                         f"(remove the link: `rm {key} {key}.pub`)")
    for folder in (key.parent.parent.parent, key.parent.parent, key.parent):  # .secrets, .secrets/<org>, ssh
        folder.chmod(0o700)
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"fmcluster-{org}", "-f", str(key)],
                       check=True, capture_output=True)
    return key


def operator_public_key(org: str) -> str:
    """The operator key's public half, one OpenSSH line (the manifest carries it to every node: public material)."""
    return Path(f"{operator_key(org)}.pub").read_text(encoding="utf-8").strip()


def ensure_key_pair(tenant: Tenant, ec2: Any, out: Out = print) -> KeyPair:
    """Import the operator's public key as the EC2 key pair the launch templates name (once)."""
    key = operator_key(tenant.org)
    name = key_pair_name(tenant.org)
    existing = ec2.describe_key_pairs(Filters=[{"Name": "key-name", "Values": [name]}])["KeyPairs"]
    if existing:
        return KeyPair(name, key, False)
    ec2.import_key_pair(KeyName=name, PublicKeyMaterial=Path(f"{key}.pub").read_bytes(),
                        TagSpecifications=[{"ResourceType": "key-pair",
                                            "Tags": [{"Key": k, "Value": v} for k, v in tenant.tags.items()]}])
    out(f"  imported key pair {name} (public half of {key})")
    return KeyPair(name, key, True)
