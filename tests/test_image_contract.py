"""Images are contracts: every node kind of every bundled AWS tenant is walked through what its roles assume of
the image it boots (each role's meta/image.yml) against that image's contract (src/fmcluster/data/images.yml),
and the roles take those paths and switches from the manifest, never from literals of their own."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from fmcluster import versions
from fmcluster.images import IMAGES_PATH, Contract, ImageCatalogError, booted_image, load_images, parse_catalog
from fmcluster.model import load_tenant
from fmcluster.providers.registry import provider_for
from fmcluster.schedulers.registry import scheduler_for
from localtenant import manifest_for

ORGS = sorted(p.name for p in (ROOT / "inventories").iterdir() if (p / "group_vars" / "all" / "tenant.yml").is_file())
AWS_ORGS = [org for org in ORGS if load_tenant(org, ROOT).provider == "aws"]


def role_meta(role: str) -> dict[str, Any]:
    path = ROOT / "roles" / role / "meta" / "image.yml"
    loaded: dict[str, Any] = yaml.safe_load(path.read_text()) if path.is_file() else {}
    return loaded


def assumptions(role: str) -> list[dict[str, Any]]:
    return list(role_meta(role).get("assumes", []))


def provided(role: str) -> set[str]:
    """Facts the role makes present on a node whose image lacks them (meta/image.yml `provides`)."""
    return {rule["fact"] for rule in role_meta(role).get("provides", []) if rule.get("where_absent")}


def fact(contract: Contract, name: str) -> Any:
    """A contract fact, or one the contract derives (slurm_cgroups)."""
    value = getattr(contract, name)
    return value() if callable(value) else value


def gaps(roles: list[str], image: str, accelerator: str = "cuda") -> list[str]:
    """What the roles, converged in this order on a node of `accelerator` booted from `image`, assume and find neither
    in the image's contract nor added by a role before them (a rule with an `accelerator` holds on those nodes only)."""
    contract = load_images()[image].contract
    found: list[str] = []
    added: set[str] = set()
    for role in roles:
        for rule in assumptions(role):
            if rule.get("accelerator", accelerator) != accelerator:
                continue
            value = fact(contract, rule["fact"])
            if "equals" in rule and value != rule["equals"]:
                found.append(f"{role} on {image}: {rule['fact']} is {value!r}, the role assumes {rule['equals']!r} "
                             f"({rule['why']})")
            if rule.get("present") and not value and rule["fact"] not in added:
                found.append(f"{role} on {image}: {rule['fact']} is {value!r}, the role assumes one ({rule['why']})")
        added |= provided(role)
    return found


def node_kinds(org: str) -> list[tuple[str, str, str, list[str]]]:
    """(node kind, image, accelerator, roles that read the image) of a tenant's nodes, from the manifest its deploy
    publishes."""
    tenant = load_tenant(org, ROOT)
    manifest = manifest_for(tenant)
    fmcluster_slurm = manifest["vars"]["fmcluster_capabilities"]["slurm_owner"] == "fmcluster"
    groups = manifest["groups"]
    kinds = [("controller", groups["controller"]), *([("login", groups["login"])] if groups["login"] else [])]
    kinds += [(f"queue {name}", queue) for name, queue in groups["queues"].items()]
    walked = []
    for kind, group in kinds:
        variables = group["vars"]
        roles = (["slurm"] if fmcluster_slurm else []) + list(variables.get("fmcluster_accelerator_roles", []))
        accelerator = group["instance"]["accelerator"]
        if accelerator in ("cuda", "neuron"):
            # nccl-tests built, nccom-test checked and run on the queue's own nodes (playbooks/acceptance-jobs.yml)
            roles.append("nccl_tests")
        walked.append((kind, variables["fmcluster_image"], accelerator, roles))
    return walked


@pytest.mark.parametrize("org", AWS_ORGS)
def test_every_node_kind_s_roles_find_what_they_assume_in_its_image(org: str) -> None:
    """No gap is known and passed: a role that needs what an image lacks fails here until a role before it adds it."""
    problems = [f"{org} {kind}: {gap}" for kind, image, accelerator, roles in node_kinds(org)
                for gap in gaps(roles, image, accelerator)]
    assert not problems, "\n".join(sorted(problems))


def test_a_gpu_node_whose_image_has_no_nccl_gets_nvidia_s_packages_and_builds_against_them() -> None:
    """ParallelCluster's official AMI installs CUDA with NVIDIA's runfile (--toolkit): no NCCL
    (aws-parallelcluster-cookbook recipes/install/cuda.rb). Its GPU nodes install libnccl2/libnccl-dev at the pin and
    nccl-tests builds against where those packages put NCCL; images that ship NCCL keep theirs."""
    pcluster = load_images()["parallelcluster-ubuntu2204"].contract
    assert pcluster.nccl_home is None and "aws-parallelcluster-cookbook" in pcluster.sources["nccl_home"]
    variables = pcluster.role_vars()
    package = versions.load()["nvidia"]["nccl_package"]
    assert variables["nvidia_driver_install_nccl"] is True
    assert variables["nccl_tests_nccl_home"] == package["home"] == versions.role_vars()["nvidia_driver_nccl_home"]
    assert package["version"].startswith(versions.load()["nccl_assumed"] + "-")
    dlami = load_images()["dlami-base-gpu-ubuntu-24.04"].contract.role_vars()
    assert dlami["nvidia_driver_install_nccl"] is False and dlami["nccl_tests_nccl_home"] == "/usr/local/cuda"
    assert gaps(["nccl_tests"], "parallelcluster-ubuntu2204")  # the build alone would find none
    assert not gaps(["nvidia_driver", "nccl_tests"], "parallelcluster-ubuntu2204")
    tasks = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/main.yml").read_text())
    nccl = [t for t in tasks if t.get("ansible.builtin.include_tasks") == "nccl.yml"]
    assert nccl and "nvidia_driver_install_nccl" in nccl[0]["when"]
    assert "nvidia_driver_manage_stack" not in nccl[0]["when"]  # beside a service-owned driver too


@pytest.mark.parametrize("org", ORGS)
def test_each_node_kind_carries_the_contract_of_the_image_it_boots(org: str) -> None:
    tenant = load_tenant(org, ROOT)
    image_of = booted_image(scheduler_for(tenant).image, provider_for(tenant).node_image)
    groups = manifest_for(tenant)["groups"]
    for name, queue in groups["queues"].items():
        key = image_of(queue["instance"]["accelerator"])
        assert queue["vars"]["fmcluster_image"] == key, name
        for variable, value in load_images()[key].contract.role_vars().items():
            assert queue["vars"][variable] == value, (name, variable)
    assert groups["controller"]["vars"]["fmcluster_image"] == image_of(tenant.controller.accelerator)


@pytest.mark.parametrize("org", AWS_ORGS)
def test_the_operator_logs_in_as_one_default_user_on_every_node_kind(org: str) -> None:
    users = {load_images()[image].contract.default_user for _, image, _, _ in node_kinds(org)}
    assert len(users) == 1, users
    assert provider_for(load_tenant(org, ROOT)).login_user() in users  # type: ignore[attr-defined]


def test_slurm_ec2_boots_images_whose_slurm_runs_with_cgroups_under_systemd() -> None:
    """Ubuntu 22.04 mounts cgroup v2 only and ships Slurm 21.08 (no cgroup v2 plugin before 22.05): slurmd would not
    start with cgroups there, so slurm-ec2 boots Ubuntu 24.04 (Slurm 23.11)."""
    catalog = load_images()
    assert not catalog["dlami-base-gpu-ubuntu-22.04"].contract.slurm_cgroups()
    for accelerator, key in catalog.ec2_images.items():
        contract = catalog[key].contract
        assert contract.init == "systemd" and contract.slurm_cgroups(), (accelerator, key)
        assert contract.role_vars()["slurm_use_cgroup"] is True


def test_the_roles_keep_no_literal_of_what_the_contract_owns() -> None:
    """No NCCL home or plugin directory in a role's defaults: a node kind's image says where they are."""
    nccl_tests = yaml.safe_load((ROOT / "roles/nccl_tests/defaults/main.yml").read_text())
    nccl = yaml.safe_load((ROOT / "roles/nccl/defaults/main.yml").read_text())
    assert nccl_tests["nccl_tests_nccl_home"] == "" and nccl_tests["nccl_tests_ofi_nccl_lib_dirs"] == []
    assert nccl["nccl_plugin_dirs"] == []
    assert yaml.safe_load((ROOT / "roles/slurm/defaults/main.yml").read_text())["slurm_use_cgroup"] is False
    for path in (ROOT / "roles").glob("*/*/*.yml"):
        assert "/opt/nccl/build" not in path.read_text(), path


def test_a_service_owned_stack_is_checked_never_reinstalled() -> None:
    """HyperPod's AMI ships its own Neuron driver and EFA below fmcluster's pins; AWS warns against reinstalling them."""
    variables = load_images()["hyperpod-default"].contract.role_vars()
    assert variables["efa_manage_stack"] is False and variables["neuron_manage_stack"] is False
    assert variables["nvidia_driver_manage_stack"] is False
    assert load_images()["dlami-base-gpu-ubuntu-24.04"].contract.role_vars()["efa_manage_stack"] is True


def test_parallelcluster_s_head_node_lets_fmcluster_s_imds_accounts_through_its_own_lockdown() -> None:
    contract = load_images()["parallelcluster-ubuntu2204"].contract
    assert contract.imds_access_tool == "/opt/parallelcluster/scripts/imds/imds-access.sh"
    assert contract.role_vars()["imds_guard_access_tool"] == contract.imds_access_tool
    tasks = (ROOT / "roles/imds_guard/tasks/main.yml").read_text()
    assert '"{{ imds_guard_access_tool }}", --allow' in tasks


def test_every_contract_fact_has_a_source_and_bad_facts_are_refused_by_name() -> None:
    for image in load_images().images.values():
        assert set(image.contract.sources) == {f for f in Contract.__dataclass_fields__ if f != "sources"}, image.key
    raw = yaml.safe_load(IMAGES_PATH.read_text())
    broken = copy.deepcopy(raw)
    broken["images"]["dlami-base-gpu-ubuntu-24.04"]["contract"]["nccl_home"]["value"] = "usr/local/cuda"
    with pytest.raises(ImageCatalogError, match=r"images\.dlami-base-gpu-ubuntu-24\.04\.contract\.nccl_home\.value"):
        parse_catalog(broken)
    unsourced = copy.deepcopy(raw)
    unsourced["images"]["hyperpod-default"]["contract"]["init"]["source"] = "trust me"
    with pytest.raises(ImageCatalogError, match=r"contract\.init\.source.*https://"):
        parse_catalog(unsourced)


def test_role_assumptions_name_contract_facts() -> None:
    facts = set(Contract.__dataclass_fields__) | {"slurm_cgroups"}
    for path in sorted(Path(ROOT / "roles").glob("*/meta/image.yml")):
        meta = yaml.safe_load(path.read_text())
        for rule in meta["assumes"]:
            assert rule["fact"] in facts and rule["why"], (path, rule)
            assert ("equals" in rule) != ("present" in rule), (path, rule)
            assert rule.get("accelerator", "cuda") in ("cuda", "neuron", "none"), (path, rule)
        for rule in meta.get("provides", []):
            assert rule["fact"] in facts and rule["why"] and rule["where_absent"] is True, (path, rule)
