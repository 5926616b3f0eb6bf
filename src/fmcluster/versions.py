"""Every version fmcluster pins (src/fmcluster/data/versions.yml), and the role variables they become.

The deploy puts `role_vars()` into the manifest; a role converged on its own (Molecule, a role test) reads the same
file from its defaults (`<role>_pins`, tests/test_versions.py), so the roles hold no copy of a pin.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import yaml

from fmcluster.paths import DATA_DIR

VERSIONS_PATH = DATA_DIR / "versions.yml"


@lru_cache(maxsize=1)
def load() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(VERSIONS_PATH.read_text(encoding="utf-8"))
    return data


def node_requirements() -> tuple[str, ...]:
    """pip requirements of a node's toolchain, e.g. ("ansible-core==2.19.14", ...)."""
    return tuple(f"{name}=={version}" for name, version in load()["node_toolchain"].items())


def role_vars() -> dict[str, Any]:
    """The pins as the roles' variables."""
    v = load()
    efa, nvidia = v["efa_installer"], v["nvidia"]
    return {
        "efa_installer_version": efa["version"],
        "efa_installer_sha256": efa["sha256"],
        "efa_installer_bundled": dict(efa["bundled"]),
        "nvidia_driver_version": nvidia["driver"],
        "nvidia_driver_cuda_version": nvidia["cuda"],
        "nvidia_driver_cuda_package_version": nvidia["cuda_package"],
        "nvidia_driver_container_toolkit_version": nvidia["container_toolkit"],
        "nvidia_driver_nccl_package_version": nvidia["nccl_package"]["version"],
        "nvidia_driver_nccl_home": nvidia["nccl_package"]["home"],
        "neuron_sdk_version": v["neuron_sdk"],
        "nccl_tests_version": v["nccl_tests"],
        "security_updates_package_blacklist": [held["pattern"] for held in v["held_packages"]],
    }


def packaged_nccl_home() -> str:
    """NCCL_HOME of a node whose NCCL fmcluster installs from NVIDIA's packages (its image ships none)."""
    home: str = load()["nvidia"]["nccl_package"]["home"]
    return home
