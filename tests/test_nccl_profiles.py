"""The NCCL/libfabric environment is computed per instance type and keyed on the aws-ofi-nccl plugin version."""

from __future__ import annotations

from typing import Any

import pytest

from fmcluster import nccl
from fmcluster.catalog import load_catalog
from fmcluster.nccl import UnknownProfile, nccl_environment, nccl_settings, parse_version, pinned_versions, queue_vars

GPU_TYPES = ["p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p4d.24xlarge", "p4de.24xlarge"]
NEURON_TYPES = ["trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge"]
# Variables the aws-ofi-nccl cheatsheet (doc/efa-env-var.md) says never to set, or to leave at their defaults.
NEVER = {"RDMAV_FORK_SAFE", "FI_EFA_FORK_SAFE", "FI_EFA_ENABLE_SHM_TRANSFER", "NCCL_MIN_CHANNELS", "NCCL_BUFFSIZE",
         "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "FI_EFA_USE_HUGE_PAGE"}
# Variables only plugin <= 1.6 (or libfabric < 1.18) stacks need: stale, hence wrong, on current stacks.
STALE_ON_CURRENT = {"FI_EFA_USE_DEVICE_RDMA", "FI_PROVIDER", "NCCL_PROTO"}
PLUGIN_VERSIONS = ["1.4.0", "1.5.0", "1.6.0", "1.6.1", "1.7.0", "1.7.3", "1.9.1", "1.16.3", "1.20.0"]


@pytest.mark.parametrize("instance_type", GPU_TYPES)
def test_current_stack_needs_only_the_socket_interface_on_gpu_instances(instance_type: str) -> None:
    assert nccl_environment(instance_type, pinned_versions()["aws_ofi_nccl"]) == {"NCCL_SOCKET_IFNAME": "^docker,lo,veth"}


@pytest.mark.parametrize("instance_type", GPU_TYPES + NEURON_TYPES)
@pytest.mark.parametrize("plugin", ["1.7.0", "1.9.1", "1.16.3", "1.20.0"])
def test_stale_variables_are_not_emitted_for_plugin_1_7_with_libfabric_1_18(instance_type: str, plugin: str) -> None:
    env = nccl_environment(instance_type, plugin, libfabric_version="1.18.0")
    assert not STALE_ON_CURRENT & env.keys()


@pytest.mark.parametrize("instance_type", GPU_TYPES + NEURON_TYPES + ["c5n.18xlarge"])
@pytest.mark.parametrize("plugin", PLUGIN_VERSIONS)
def test_variables_the_cheatsheet_retires_are_never_emitted(instance_type: str, plugin: str) -> None:
    for libfabric in ("1.16.0", "1.18.0", "2.4.0amzn5.0"):
        env = nccl_environment(instance_type, plugin, libfabric_version=libfabric)
        assert not NEVER & env.keys()
        assert not [name for name in env if name.startswith("RDMAV_")]


@pytest.mark.parametrize("instance_type", ["p5.48xlarge", "p4d.24xlarge"])
def test_plugin_1_6_on_p4_and_p5_needs_device_rdma_only(instance_type: str) -> None:
    env = nccl_environment(instance_type, "1.6.1")
    assert env == {"FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_SOCKET_IFNAME": "^docker,lo,veth"}


@pytest.mark.parametrize("instance_type", ["p5.48xlarge", "p4d.24xlarge"])
def test_plugin_1_5_or_older_on_p4_and_p5_needs_provider_rdma_and_simple_protocol(instance_type: str) -> None:
    env = nccl_environment(instance_type, "1.5.0")
    assert env == {
        "FI_EFA_USE_DEVICE_RDMA": "1", "FI_PROVIDER": "efa", "NCCL_PROTO": "simple",
        "NCCL_SOCKET_IFNAME": "^docker,lo,veth",
    }


def test_plugin_1_7_with_libfabric_older_than_1_18_still_needs_device_rdma() -> None:
    assert nccl_environment("p5.48xlarge", "1.7.3", libfabric_version="1.17.1")["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert "FI_EFA_USE_DEVICE_RDMA" not in nccl_environment("p5.48xlarge", "1.7.3", libfabric_version="1.18.0")


@pytest.mark.parametrize(
    ("instance_type", "nccl_version", "named"),
    [
        ("p5.48xlarge", "2.19.3", True), ("p5en.48xlarge", "2.20.5", True),
        ("p5.48xlarge", "2.21.5", False), ("p5.48xlarge", "2.27.7", False), ("p5.48xlarge", "2.18.5", False),
        ("p4d.24xlarge", "2.20.5", False),
    ],
)
def test_tuner_is_named_only_where_nccl_does_not_find_it_itself(instance_type: str, nccl_version: str, named: bool) -> None:
    env = nccl_environment(instance_type, "1.9.1", nccl_version=nccl_version)
    assert ("NCCL_TUNER_PLUGIN" in env) is named


@pytest.mark.parametrize("instance_type", NEURON_TYPES)
@pytest.mark.parametrize("plugin", PLUGIN_VERSIONS)
def test_neuron_instances_get_no_nccl_variables(instance_type: str, plugin: str) -> None:
    assert nccl_environment(instance_type, plugin) == {}


@pytest.mark.parametrize("instance_type", ["c5.2xlarge", "m5.xlarge", "c5n.18xlarge"])
def test_instances_without_an_accelerator_get_nothing(instance_type: str) -> None:
    assert nccl_environment(instance_type, "1.5.0") == {}


def test_unknown_instance_type_is_refused_with_the_known_ones() -> None:
    with pytest.raises(KeyError, match="p5.48xlarge"):
        nccl_environment("p9.96xlarge", "1.20.0")


def test_accelerated_family_without_a_profile_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    profiles: dict[str, Any] = dict(nccl.load_profiles())
    profiles["families"] = {k: v for k, v in profiles["families"].items() if k != "p5"}
    monkeypatch.setattr(nccl, "load_profiles", lambda: profiles)
    with pytest.raises(UnknownProfile, match="family p5"):
        nccl_environment("p5.48xlarge", "1.20.0")


def test_every_catalog_type_with_an_accelerator_or_efa_has_a_profile() -> None:
    for name, instance in load_catalog().items():
        if instance.accelerator != "none" or instance.has_efa:
            assert instance.family in nccl.load_profiles()["families"], name


def test_every_setting_names_a_public_source() -> None:
    profiles = nccl.load_profiles()
    assert all("https://" in text for text in profiles["sources"].values())
    for rule in profiles["rules"]:
        for setting in rule["env"].values():
            assert setting["source"] in profiles["sources"]
    settings = nccl_settings("p5.48xlarge", "1.5.0")
    assert {s.name: s.source.split()[0] for s in settings} == {
        "FI_EFA_USE_DEVICE_RDMA": "aws/aws-ofi-nccl", "FI_PROVIDER": "aws/aws-ofi-nccl", "NCCL_PROTO": "aws/aws-ofi-nccl",
        "NCCL_SOCKET_IFNAME": "aws-samples/awsome-distributed-training",
    }


def test_pinned_versions_meet_the_p5_minimums() -> None:
    pinned = pinned_versions()
    assert parse_version(pinned["aws_ofi_nccl"]) >= (1, 7, 2)  # p5 minimum in doc/efa-env-var.md
    assert parse_version(pinned["libfabric"]) >= (1, 18)


def test_queue_vars_carry_the_environment_the_nccl_role_renders() -> None:
    assert queue_vars("p4d.24xlarge") == {
        "nccl_environment": {"NCCL_SOCKET_IFNAME": "^docker,lo,veth"},
        "nccl_plugin_version": pinned_versions()["aws_ofi_nccl"],
        "nccl_instance_type": "p4d.24xlarge",
    }


@pytest.mark.parametrize(("text", "version"), [("1.20.0", (1, 20, 0)), ("v1.16.3", (1, 16, 3)),
                                               ("2.4.0amzn5.0", (2, 4, 0)), ("2.27.7-1", (2, 27, 7))])
def test_versions_compare_numerically_and_ignore_vendor_suffixes(text: str, version: tuple[int, ...]) -> None:
    assert parse_version(text) == version
    assert parse_version("1.10.0") > parse_version("1.9.1")


def test_slurm_task_prolog_is_set_only_for_clusters_with_an_accelerated_or_efa_queue() -> None:
    prolog = "/etc/slurm/fmcluster-task-prolog.sh"  # one value: where the nccl role writes it is where Slurm looks
    both = {"slurm_task_prolog": prolog, "nccl_task_prolog_path": prolog}
    assert nccl.cluster_vars(["c5.2xlarge", "p5.48xlarge"]) == both
    assert nccl.cluster_vars(["trn1.32xlarge"]) == both
    assert nccl.cluster_vars(["c5.2xlarge", "m5.xlarge"]) == {}


def test_invoke_nccl_env_shows_each_value_with_its_source(repo_root: Any) -> None:
    import subprocess

    from conftest import venv_tool

    out = subprocess.run([venv_tool("invoke"), "nccl-env", "--instance-type=p4d.24xlarge", "--plugin-version=1.6.1"],
                         cwd=repo_root, capture_output=True, text=True, check=True).stdout
    assert "FI_EFA_USE_DEVICE_RDMA=1" in out and "doc/efa-env-var.md" in out
    current = subprocess.run([venv_tool("invoke"), "nccl-env", "--instance-type=trn1.32xlarge"],
                             cwd=repo_root, capture_output=True, text=True, check=True).stdout
    assert "nothing to set" in current
