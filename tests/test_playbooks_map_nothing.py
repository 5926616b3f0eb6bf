"""Role variables are assembled once, in the manifest; the playbooks map nothing (issue 27).

A play may say which half of a role runs where (a literal), and where this node's own checkout and Python are
(Ansible's runtime variables); every other value a role reads comes from the generated inventory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from fmcluster.accelerators import queue_vars
from fmcluster.manifest import PROMETHEUS_USER, imds_vars
from fmcluster.nodes import Node

PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yml"))
#: Values a play may compute: the running node's own paths, which no manifest can know.
RUNTIME = {"{{ ansible_playbook_python }}", "{{ playbook_dir | dirname }}/src"}


def _mapped(node: Any, where: str) -> list[tuple[str, str]]:
    """(where, value) of every templated value under a play's or task's `vars:`."""
    found: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "vars" and isinstance(value, dict):
                found += [(f"{where} vars.{k}", str(v)) for k, v in value.items() if "{{" in str(v)]
            else:
                found += _mapped(value, where)
    elif isinstance(node, list):
        for item in node:
            found += _mapped(item, where)
    return found


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=lambda p: p.name)
def test_a_playbook_maps_no_role_variable(playbook: Path) -> None:
    mapped = [(where, value) for where, value in _mapped(yaml.safe_load(playbook.read_text()), playbook.name)
              if value not in RUNTIME]
    assert mapped == [], "compute these in the manifest (fmcluster.publish / fmcluster.manifest), not in the play"


def test_each_queue_gets_its_roles_and_expectations_and_cpu_queues_of_an_accelerated_cluster_get_nccl() -> None:
    cluster = ["p5.48xlarge", "trn1.32xlarge", "c5.2xlarge"]
    p5, trn1, cpu = (queue_vars(t, cluster) for t in cluster)
    assert p5["fmcluster_accelerator_roles"] == ["efa", "nvidia_driver", "nccl"]
    assert (p5["efa_expected_interfaces"], p5["nvidia_driver_expected_gpus"], p5["nvidia_driver_fabric_manager"],
            p5["neuron_expected_devices"], p5["nccl_tests_gpus_per_node"]) == (32, 8, True, 0, 8)
    assert trn1["fmcluster_accelerator_roles"] == ["efa", "neuron", "nccl"]
    assert (trn1["nvidia_driver_expected_gpus"], trn1["neuron_expected_devices"]) == (0, 16)
    # Slurm's TaskProlog is cluster-wide: the CPU queue renders the (empty) NCCL environment too.
    assert cpu["fmcluster_accelerator_roles"] == ["nccl"]
    assert queue_vars("c5.2xlarge", ["c5.2xlarge", "m5.xlarge"])["fmcluster_accelerator_roles"] == []


def _node(role: str) -> Node:
    return Node(name=f"ip-{role}", address="10.0.0.1", role=role,  # type: ignore[arg-type]
                queue="cpu" if role == "compute" else None, instance_id="i-1", instance_type="m5.xlarge")


def test_only_the_controller_lets_prometheus_reach_imds_beside_the_scheduler_s_own_daemons() -> None:
    assert imds_vars(_node("controller"), ["pcluster-admin"]) == {"imds_guard_allowed_users": ["pcluster-admin", PROMETHEUS_USER]}
    assert imds_vars(_node("login"), ["pcluster-admin"]) == {"imds_guard_allowed_users": ["pcluster-admin"]}
    assert imds_vars(_node("compute"), []) == {"imds_guard_allowed_users": []}


def test_the_role_defaults_the_playbooks_no_longer_set_are_the_ones_they_set_before() -> None:
    """What the plays once mapped from variables nothing produced (package source, container toolkit) is now the
    roles' own default: vendor sources, no mirror, no container toolkit."""
    defaults = {role: yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
                for role in ("efa", "nvidia_driver", "neuron", "shared_storage", "imds_guard")}
    assert (defaults["efa"]["efa_source"], defaults["nvidia_driver"]["nvidia_driver_source"],
            defaults["neuron"]["neuron_source"]) == ("vendor",) * 3
    assert not defaults["nvidia_driver"]["nvidia_driver_container_toolkit"]
    assert defaults["shared_storage"]["shared_storage_install_packages"] is True
    assert defaults["imds_guard"]["imds_guard_install_packages"] is True
    assert re.fullmatch(r"[a-z_]+", PROMETHEUS_USER)
