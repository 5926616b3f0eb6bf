"""Which lower layers a local host boots: the tenant's baked image over the pristine one while it is current
(issue 40; fmcluster.providers.local.bake makes it, fmcluster.baked says when it is stale).

Kept apart from the builder so the provider's boot path imports nothing of the deploy's (publish, registries).
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Iterable
from pathlib import Path

from fmcluster import baked
from fmcluster.paths import PACKAGE_DIR
from fmcluster.providers.local import image
from fmcluster.providers.local.hosts import Host, SubstrateError

#: The checkout whose committed HEAD the nodes converge to (fmcluster.publish.SOURCE_ROOT).
SOURCE_ROOT = PACKAGE_DIR.parent.parent


def baked_root(org: str) -> Path:
    return baked.records_dir(org)


def record_path(org: str, kind: str) -> Path:
    """The tenant's record of its `kind` image (JSON, fmcluster.baked.Record)."""
    return baked.record_path(org, kind)


def layer_dir(org: str, kind: str, digest: str) -> Path:
    return baked_root(org) / f"{kind}-{digest}"


@functools.lru_cache(maxsize=8)
def install_digest(ref: str, kind: str) -> str:
    """The digest a baked image of commit `ref` has: its install set as committed (not the working tree's)."""
    try:
        return baked.committed_digest(ref, kind, image.digest(), SOURCE_ROOT)
    except ValueError as err:
        raise SubstrateError(str(err)) from err


def status(org: str, kind: str, ref: str) -> baked.Status:
    record = baked.read_record(record_path(org, kind))
    present = record is not None and (Path(record.layer) / ".complete").is_file()
    return baked.status(record, install_digest(ref, kind), present)


def lowerdir(org: str, kind: str, ref: str, pristine: Path) -> tuple[str, baked.Status]:
    """The lower layers a host of `kind` boots: the baked layer over the pristine image while it is current, else
    the pristine image alone (never a stale image: fmcluster.baked.status)."""
    found = status(org, kind, ref)
    if found.usable and found.record is not None:
        return f"{Path(found.record.layer) / 'rootfs'}:{pristine}", found
    return str(pristine), found


def layers_in_use(hosts: Iterable[Host]) -> set[str]:
    """The baked layers (their folders, as records name them) the tenant's hosts boot: each host's `image` is its
    overlay's lower layers, `<layer>/rootfs:<pristine>` for a baked one (lowerdir)."""
    return {str(Path(part).parent) for host in hosts for part in str(host.spec.get("image", "")).split(":")
            if Path(part).name == "rootfs" and Path(part).parent.parent == baked_root(host.org)}


def remove_layer(org: str, record: baked.Record) -> list[str]:
    """Remove a baked layer of the tenant's: only a folder of its own under baked_root (a record naming anything
    else is refused, never followed)."""
    layer = Path(record.layer)
    if layer.parent != baked_root(org) or not layer.name.startswith(f"{record.kind}-"):
        raise ValueError(f"{layer} is not a {record.kind} layer of '{org}' under {baked_root(org)}")
    if layer.is_dir():
        shutil.rmtree(layer)
        return [f"removed {layer} ({record.size_bytes / 2**20:.0f} MiB)"]
    return [f"{layer} was already gone"]


def rotate_layers(org: str, kind: str, keep: int, hosts: Iterable[Host]) -> list[str]:
    """Keep the newest `keep` baked layers of `kind` and each one a host boots; remove the rest (fmcluster.baked.rotate)."""
    return baked.rotate(org, kind, keep, layers_in_use(hosts), lambda record: remove_layer(org, record))


def head_commit() -> str:
    """The committed HEAD the deploy publishes (fmcluster.publish.pinned_commit, which this module may not import)."""
    try:
        return baked.head_commit(SOURCE_ROOT)
    except ValueError as err:
        raise SubstrateError(str(err)) from err
