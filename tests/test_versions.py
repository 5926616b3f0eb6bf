"""One place pins versions (src/fmcluster/data/versions.yml): the roles' own defaults agree with it, the node
toolchain is no newer than the repository's own, and the deploy hands the pins to the roles through the manifest."""

from __future__ import annotations

from importlib.metadata import version

import yaml

from conftest import ROOT
from fmcluster import versions
from fmcluster.nccl import pinned_versions


#: Lists a role keeps empty and refuses empty rather than hold a copy of (security_updates' Package-Blacklist,
#: versions.yml held_packages: tests/test_security_updates.py).
NOT_COPIED = {"security_updates_package_blacklist"}


def test_every_role_default_that_pins_a_version_is_the_pinned_one() -> None:
    defaults: dict[str, object] = {}
    for role in ("efa", "nvidia_driver", "neuron", "nccl_tests", "security_updates"):
        defaults.update(yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()))
    for name in NOT_COPIED:
        assert defaults[name] == [], name
    for name, pinned in versions.role_vars().items():
        if name in NOT_COPIED:
            continue
        assert defaults[name] == pinned, f"roles' default {name}={defaults[name]!r}, versions.yml says {pinned!r}"


def test_nodes_run_an_ansible_core_no_newer_than_this_repository_s() -> None:
    """The roles are linted and Molecule-tested with this repository's ansible-core; nodes run the newest one every
    image's Python installs (versions.yml says why), never a newer one than the roles are checked with."""
    node = tuple(int(p) for p in versions.load()["node_toolchain"]["ansible-core"].split(".")[:2])
    here = tuple(int(p) for p in version("ansible-core").split(".")[:2])
    assert node <= here, f"nodes get ansible-core {node}, the roles are checked with {here}"
    for name in ("ansible-runner", "boto3", "PyYAML"):
        assert versions.load()["node_toolchain"][name] == version(name), name


def test_the_nccl_environment_is_keyed_on_the_pinned_plugin() -> None:
    pins = versions.load()
    assert pinned_versions()["aws_ofi_nccl"] == pins["efa_installer"]["bundled"]["aws_ofi_nccl"]
    assert pinned_versions()["nccl"] == pins["nccl_assumed"]
