"""One place pins versions (src/fmcluster/data/versions.yml): the roles' own defaults agree with it, the node
toolchain is the repository's own, and the deploy hands the pins to the roles through the manifest."""

from __future__ import annotations

from importlib.metadata import version

import yaml

from conftest import ROOT
from fmcluster import versions
from fmcluster.nccl import pinned_versions


def test_every_role_default_that_pins_a_version_is_the_pinned_one() -> None:
    defaults: dict[str, object] = {}
    for role in ("efa", "nvidia_driver", "neuron", "nccl_tests"):
        defaults.update(yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()))
    for name, pinned in versions.role_vars().items():
        assert defaults[name] == pinned, f"roles' default {name}={defaults[name]!r}, versions.yml says {pinned!r}"


def test_nodes_converge_with_the_same_toolchain_as_this_repository() -> None:
    for requirement in versions.node_requirements():
        name, pinned = requirement.split("==")
        assert version(name) == pinned, f"{name}: .venv has {version(name)}, nodes get {pinned}"


def test_the_nccl_environment_is_keyed_on_the_pinned_plugin() -> None:
    pins = versions.load()
    assert pinned_versions()["aws_ofi_nccl"] == pins["efa_installer"]["bundled"]["aws_ofi_nccl"]
    assert pinned_versions()["nccl"] == pins["nccl_assumed"]
