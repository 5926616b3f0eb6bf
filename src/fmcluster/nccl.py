"""The NCCL/libfabric environment of a node, from data/nccl_profiles.yml and the instance catalog.

Settings are keyed on the aws-ofi-nccl plugin version (and libfabric/NCCL versions where the source says so):
with current stacks almost nothing is emitted, and variables that only old stacks need are never emitted for new
ones. The generated inventory passes the result to the `nccl` role as `nccl_environment`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from fmcluster.catalog import load_catalog
from fmcluster.escape import escaped
from fmcluster.paths import DATA_DIR

NCCL_PROFILES_PATH = DATA_DIR / "nccl_profiles.yml"
_VERSION_BOUNDS = {
    "plugin_min": ("plugin", True), "plugin_below": ("plugin", False),
    "libfabric_min": ("libfabric", True), "libfabric_below": ("libfabric", False),
    "nccl_min": ("nccl", True), "nccl_below": ("nccl", False),
}
_KNOWN_CONDITIONS = {"collectives", "device_rdma", "families", *_VERSION_BOUNDS}


class UnknownProfile(ValueError):
    """The instance type has an accelerator or EFA but its family has no entry in nccl_profiles.yml."""


@dataclass(frozen=True)
class EnvSetting:
    name: str
    value: str
    source: str  # the public source, as cited in nccl_profiles.yml
    rule: str  # the rule that emitted it


#: A whole version: digits and dots, an optional leading v, an optional vendor suffix of letters, digits, dots and
#: dashes ('2.4.0amzn5.0', '1.14.0-aws'). Matched whole: a prefix match would accept '1.2.3\nNCCL_EVIL=1'.
VERSION = re.compile(r"[vV]?([0-9]{1,9}(?:\.[0-9]{1,9}){0,5})(?:[A-Za-z][A-Za-z0-9.-]{0,30}|-[A-Za-z0-9.-]{1,30})?")


def parse_version(text: str) -> tuple[int, ...]:
    """'1.20.0' -> (1, 20, 0); vendor suffixes are ignored ('2.4.0amzn5.0' -> (2, 4, 0), 'v1.16.3' -> (1, 16, 3))."""
    match = VERSION.fullmatch(text)
    if not match:
        raise ValueError(f"not a version: {escaped(text)} (write it like 1.14.0)")
    return tuple(int(part) for part in match.group(1).split("."))


@lru_cache(maxsize=4)
def load_profiles(path: Path = NCCL_PROFILES_PATH) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    for rule in raw["rules"]:
        unknown = set(rule["when"]) - _KNOWN_CONDITIONS
        if unknown:
            raise ValueError(f"{path}: rule {rule['name']!r} has unknown conditions {sorted(unknown)}")
        for name, setting in rule["env"].items():
            if setting["source"] not in raw["sources"]:
                raise ValueError(f"{path}: {name} in rule {rule['name']!r} cites unknown source {setting['source']!r}")
    return raw


def pinned_versions() -> dict[str, str]:
    """Plugin and libfabric versions of the pinned EFA installer, and the NCCL version the profiles assume
    (src/fmcluster/data/versions.yml, the one place versions are pinned)."""
    from fmcluster import versions

    pins = versions.load()
    bundled = pins["efa_installer"]["bundled"]
    return {
        "efa_installer": str(pins["efa_installer"]["version"]),
        "aws_ofi_nccl": str(bundled["aws_ofi_nccl"]),
        "libfabric": str(bundled["libfabric"]),
        "nccl": str(pins["nccl_assumed"]),
    }


def _applies(when: dict[str, Any], family: str, traits: dict[str, Any], versions: dict[str, tuple[int, ...]]) -> bool:
    if "collectives" in when and traits["collectives"] not in when["collectives"]:
        return False
    if "device_rdma" in when and bool(traits["device_rdma"]) != bool(when["device_rdma"]):
        return False
    if "families" in when and family not in when["families"]:
        return False
    for key, (component, is_min) in _VERSION_BOUNDS.items():
        if key in when:
            bound = parse_version(str(when[key]))
            have = versions[component]
            if (is_min and have < bound) or (not is_min and have >= bound):
                return False
    return True


def nccl_settings(
    instance_type: str,
    plugin_version: str,
    *,
    libfabric_version: str | None = None,
    nccl_version: str | None = None,
) -> list[EnvSetting]:
    """Every variable the node needs, with the rule and public source behind it, sorted by name."""
    catalog = load_catalog()
    if instance_type not in catalog:
        raise KeyError(f"unknown instance type {instance_type!r}; known: {', '.join(sorted(catalog))}")
    instance = catalog[instance_type]
    profiles = load_profiles()
    traits = profiles["families"].get(instance.family)
    if traits is None:
        if instance.accelerator == "none" and not instance.has_efa:
            return []
        raise UnknownProfile(
            f"{instance_type} (family {instance.family}, accelerator {instance.accelerator}, "
            f"{instance.efa_interfaces} EFA) has no entry under `families` in {NCCL_PROFILES_PATH.name}; add one"
        )
    pinned = pinned_versions()
    versions = {
        "plugin": parse_version(plugin_version),
        "libfabric": parse_version(libfabric_version or pinned["libfabric"]),
        "nccl": parse_version(nccl_version or pinned["nccl"]),
    }
    chosen: dict[str, EnvSetting] = {}
    for rule in profiles["rules"]:
        if _applies(rule["when"], instance.family, traits, versions):
            for name, setting in rule["env"].items():
                chosen[name] = EnvSetting(name, str(setting["value"]), profiles["sources"][setting["source"]], rule["name"])
    return [chosen[name] for name in sorted(chosen)]


def nccl_environment(
    instance_type: str,
    plugin_version: str,
    *,
    libfabric_version: str | None = None,
    nccl_version: str | None = None,
) -> dict[str, str]:
    """NAME -> value for `instance_type` with aws-ofi-nccl `plugin_version` (libfabric/NCCL default to the pins)."""
    settings = nccl_settings(
        instance_type, plugin_version, libfabric_version=libfabric_version, nccl_version=nccl_version
    )
    return {setting.name: setting.value for setting in settings}


def queue_vars(instance_type: str) -> dict[str, Any]:
    """Group vars for one queue of the generated inventory: what the `nccl` role needs, at the pinned stack."""
    pinned = pinned_versions()
    return {
        "nccl_environment": nccl_environment(instance_type, pinned["aws_ofi_nccl"]),
        "nccl_plugin_version": pinned["aws_ofi_nccl"],
        "nccl_instance_type": instance_type,
    }


#: Where the nccl role writes the Slurm TaskProlog, and where slurm.conf's TaskProlog points (one value, set here).
TASK_PROLOG_PATH = "/etc/slurm/fmcluster-task-prolog.sh"


def cluster_vars(instance_types: Sequence[str]) -> dict[str, Any]:
    """`all` vars for the generated inventory: the Slurm TaskProlog path when some queue needs an NCCL environment.

    Slurm's TaskProlog is cluster-wide, so playbooks/accelerators.yml renders the script on every compute node of
    such a cluster (empty where nothing is needed); a cluster of plain CPU queues gets no TaskProlog at all.
    """
    if cluster_needs_fabric(instance_types):
        return {"slurm_task_prolog": TASK_PROLOG_PATH, "nccl_task_prolog_path": TASK_PROLOG_PATH}
    return {}


def cluster_needs_fabric(instance_types: Sequence[str]) -> bool:
    """Some queue of the cluster has an accelerator or EFA: every compute node renders the (cluster-wide) TaskProlog."""
    catalog = load_catalog()
    return any(catalog[t].needs_fabric for t in instance_types)


def describe(instance_type: str, plugin_version: str | None = None) -> str:
    """Human-readable environment for `instance_type` (default: the pinned plugin), each value with its source."""
    pinned = pinned_versions()
    plugin = plugin_version or pinned["aws_ofi_nccl"]
    settings = nccl_settings(instance_type, plugin)
    lines = [f"{instance_type}: aws-ofi-nccl {plugin}, libfabric {pinned['libfabric']}, NCCL {pinned['nccl']} (assumed)"]
    if not settings:
        lines.append("  nothing to set: the plugin configures libfabric itself")
    for setting in settings:
        lines.append(f"  {setting.name}={setting.value}\n      rule: {setting.rule}\n      source: {setting.source}")
    return "\n".join(lines)
