"""The manifest's contract: every variable it hands the nodes is produced once and read by something.

Its `vars` (the inventory's `all` vars) and each node kind's group vars are merged from a dozen producers
(fmcluster.publish.build_manifest through merge_vars), which refuses a key two of them give. Every key is declared
by some role's meta/argument_specs.yml, or is one of the few that Python or a playbook reads instead (READERS, each
with its reader), so a variable nothing reads cannot ship unnoticed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fmcluster import role_defaults
from fmcluster.images import booted_image
from fmcluster.manifest import assemble_inventory
from fmcluster.model import load_tenant
from fmcluster.providers.registry import provider_for
from fmcluster.publish import build_manifest, merge_vars
from fmcluster.schedulers.registry import scheduler_for
from localtenant import manifest_for, nodes_for

ROOT = Path(__file__).resolve().parent.parent
#: Every tenant spec in the repository (inventories/*, and the Molecule scenarios' own): org → the root it is under.
BUNDLED = {spec.parents[2].name: spec.parents[4] for pattern in ("inventories", "molecule/*/inventories")
           for spec in sorted(ROOT.glob(f"{pattern}/*/group_vars/all/tenant.yml"))}

#: Manifest keys no role declares, each with the files that read it (the test checks each names the key).
READERS: dict[str, tuple[str, ...]] = {
    # fmcluster.manifest.assemble_inventory runs on the deploy machine and in the node agent (fmcluster.node.agent)
    "fmcluster_org": ("src/fmcluster/manifest.py", "roles/slurm_metrics/defaults/main.yml"),
    "fmcluster_capabilities": ("src/fmcluster/manifest.py", "playbooks/accelerators.yml",
                               "roles/efa/defaults/main.yml"),
    "imds_guard_scheduler_users": ("src/fmcluster/manifest.py",),
    "prometheus_node_discovery": ("src/fmcluster/manifest.py",),
    "prometheus_scrape_jobs": ("src/fmcluster/manifest.py",),
    "prometheus_sd_refresh_interval": ("src/fmcluster/manifest.py",),
    "fmcluster_containers": ("playbooks/slurm-cluster.yml",),
    # group vars
    "fmcluster_accelerator_roles": ("playbooks/accelerators.yml",),
    "fmcluster_image": ("roles/dcgm_exporter/defaults/main.yml",),
    # Ansible's own: the interpreter of the node's modules (the image's contract); the agent runs the plays with it
    "ansible_python_interpreter": ("src/fmcluster/node/agent.py",),
}
#: Keys both in `vars` and in a queue's group vars on purpose (Ansible's group vars win on that queue's nodes).
PER_QUEUE_OVERRIDES = {
    # all: the largest CUDA queue's ranks, for the submit node; each queue: its own, for the build on its nodes
    # (fmcluster.publish.acceptance_vars)
    "nccl_tests_gpus_per_node",
}


def declared_by_roles() -> set[str]:
    declared: set[str] = set()
    for spec in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        for entry in (role_defaults.load_spec(spec).get("argument_specs") or {}).values():
            declared |= set((entry or {}).get("options") or {})
    return declared


def group_vars(manifest: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    groups = manifest["groups"]
    yield "controller", groups["controller"]["vars"]
    if groups["login"]:
        yield "login", groups["login"]["vars"]
    for name, queue in groups["queues"].items():
        yield f"queue {name}", queue["vars"]


def test_a_key_from_two_producers_is_refused_naming_it_and_both() -> None:
    assert merge_vars(("a", {"x": 1}), ("b", {"y": 2})) == {"x": 1, "y": 2}
    with pytest.raises(ValueError, match=r"'x' is produced by both a and b") as refused:
        merge_vars(("a", {"x": 1}), ("b", {"y": 2, "x": 1}))  # even the same value: one producer per key
    assert "drop it from one" in str(refused.value)


def test_a_scheduler_that_overrides_a_core_variable_fails_the_manifest() -> None:
    tenant = load_tenant("demo")
    manifest_for(tenant)  # the tenant builds as it is
    provider, scheduler = provider_for(tenant), scheduler_for(tenant)
    with pytest.raises(ValueError, match=r"'slurm_cluster_name' is produced by both fmcluster.publish.build_manifest "
                                         r"and scheduler slurm-ec2's manifest_vars"):
        build_manifest(tenant, "0" * 40, {}, provider.queue_resources,
                       {**scheduler.manifest_vars(), "slurm_cluster_name": "other"}, provider.manifest_vars(), {},
                       booted_image(scheduler.image, provider.node_image))


@pytest.mark.parametrize("org", BUNDLED)
def test_every_manifest_key_is_declared_by_a_role_or_has_a_named_reader(org: str) -> None:
    manifest = manifest_for(load_tenant(org, BUNDLED[org]))  # merge_vars refuses a key produced twice
    declared = declared_by_roles()
    keys = {key: "vars" for key in manifest["vars"]}
    keys |= {key: where for where, values in group_vars(manifest) for key in values}
    unread = sorted(f"{key} ({where})" for key, where in keys.items() if key not in declared and key not in READERS)
    assert not unread, (f"{org}'s manifest ships variables no role's meta/argument_specs.yml declares: {unread}. "
                        "Declare each in the role that reads it, or add it to READERS here naming its reader, "
                        "or stop producing it")


@pytest.mark.parametrize("org", BUNDLED)
def test_a_manifest_key_is_given_once_across_the_inventory_s_levels(org: str) -> None:
    tenant = load_tenant(org, BUNDLED[org])
    manifest = manifest_for(tenant)
    inventory = assemble_inventory(manifest, nodes_for(tenant))
    # what the inventory derives from the membership does not replace a manifest variable
    assert {k: v for k, v in inventory["all"]["vars"].items() if k in manifest["vars"]} == manifest["vars"]
    for where, values in group_vars(manifest):
        assert not set(values) & {"fmcluster_instance_type", "fmcluster_instance", "fmcluster_queue"}, where
        allowed = PER_QUEUE_OVERRIDES if where.startswith("queue ") else set()
        assert set(values) & set(manifest["vars"]) <= allowed, where


def test_each_named_reader_reads_its_key_and_no_role_declares_it() -> None:
    declared = declared_by_roles()
    for key, readers in READERS.items():
        assert key not in declared, f"{key} is declared by a role now: drop it from READERS"
        for reader in readers:
            assert key in (ROOT / reader).read_text(), f"{reader} does not read {key}: fix READERS"
    produced = {key for org, root in BUNDLED.items() for m in [manifest_for(load_tenant(org, root))]
                for key in [*m["vars"], *(k for _, values in group_vars(m) for k in values)]}
    assert set(READERS) <= produced, f"READERS names keys no bundled manifest has: {set(READERS) - produced}"
