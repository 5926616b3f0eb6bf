"""One place pins versions (src/fmcluster/data/versions.yml): the roles' own defaults read it rather than hold a copy,
the node toolchain is no newer than the repository's own, and the deploy hands the pins to the roles through the
manifest."""

from __future__ import annotations

import re
from importlib.metadata import version

import yaml

from conftest import ROOT
from fmcluster import versions
from fmcluster.nccl import pinned_versions

#: The roles whose defaults pin versions, each reading versions.yml into `<role>_pins`.
PINNING_ROLES = ("efa", "nvidia_driver", "neuron", "nccl_tests")
#: Lists a role keeps empty and refuses empty rather than hold a copy of (security_updates' Package-Blacklist,
#: versions.yml held_packages: tests/test_security_updates.py).
NOT_COPIED = {"security_updates_package_blacklist"}
LOOKUP = re.compile(r"^\{\{ lookup\('ansible\.builtin\.file', role_path ~ '(?P<path>[^']+)'\) \| from_yaml \}\}$")


def test_every_pinned_role_default_reads_versions_yml_and_holds_no_copy() -> None:
    """Each pin a role's default names is an expression over `<role>_pins`, which is versions.yml read from beside the
    role (a lookup Ansible evaluates on the controller: this repository, or a node's checkout of it); rendered over
    versions.yml it is the pin the manifest passes (fmcluster.versions.role_vars)."""
    seen: set[str] = set()
    for role in PINNING_ROLES:
        defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
        lookup = LOOKUP.match(defaults[f"{role}_pins"])
        assert lookup, f"roles/{role}: {role}_pins is not versions.yml's lookup: {defaults[f'{role}_pins']!r}"
        read = (ROOT / "roles" / role / lookup["path"].lstrip("/")).resolve()
        assert read == versions.VERSIONS_PATH.resolve(), f"roles/{role}: {role}_pins reads {read}"
        for name, pinned in versions.role_vars().items():
            if name not in defaults or name in NOT_COPIED:
                continue
            expression = defaults[name]
            path = re.fullmatch(rf"\{{\{{ {role}_pins\.([\w.]+) \}}\}}", str(expression))
            assert path, f"roles/{role}/defaults/main.yml: {name}={expression!r} is a copy; read it from {role}_pins"
            value: object = versions.load()
            for key in path[1].split("."):  # what Ansible's attribute lookups return: the value itself, typed
                assert isinstance(value, dict) and key in value, f"{name}: versions.yml has no {path[1]}"
                value = value[key]
            assert value == pinned, name
            seen.add(name)
    assert seen == set(versions.role_vars()) - NOT_COPIED, "pins no role default reads"
    security = yaml.safe_load((ROOT / "roles" / "security_updates" / "defaults" / "main.yml").read_text())
    for name in NOT_COPIED:
        assert security[name] == [], name


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
