"""Images are contracts: every node kind of every bundled AWS tenant is walked through what its roles assume of
the image it boots (each role's meta/image.yml) against that image's contract (src/fmcluster/data/images.yml),
and the roles take those paths and switches from the manifest, never from literals of their own."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from fmcluster import role_defaults, versions
from fmcluster.images import (
    OFI_NCCL_ARCH_DIR,
    OFI_NCCL_FLAT_DIR,
    OFI_NCCL_LAYOUTS,
    OFI_NCCL_LIB64_DIR,
    Contract,
    ImageCatalogError,
    booted_image,
    load_images,
    parse_catalog,
    raw_catalog,
)
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


def gaps(roles: list[str], image: str, accelerator: str = "cuda", variables: dict[str, Any] | None = None) -> list[str]:
    """What the roles, converged in this order on a node of `accelerator` booted from `image`, assume and find neither
    in the image's contract nor added by a role before them (a rule with an `accelerator` holds on those nodes only,
    one with a `runtime` where the node kind's dcgm_exporter_runtime is that: `variables`, its group vars, by default
    what the image's contract decides)."""
    contract = load_images()[image].contract
    variables = contract.role_vars() if variables is None else variables
    found: list[str] = []
    added: set[str] = set()
    for role in roles:
        for rule in assumptions(role):
            if rule.get("accelerator", accelerator) != accelerator:
                continue
            if "runtime" in rule and variables.get("dcgm_exporter_runtime") != rule["runtime"]:
                continue
            value = fact(contract, rule["fact"])
            if "equals" in rule and value != rule["equals"]:
                found.append(f"{role} on {image}: {rule['fact']} is {value!r}, the role assumes {rule['equals']!r} "
                             f"({rule['why']})")
            if rule.get("present") and not value and rule["fact"] not in added:
                found.append(f"{role} on {image}: {rule['fact']} is {value!r}, the role assumes one ({rule['why']})")
        added |= provided(role)
    return found


def node_kinds(org: str) -> list[tuple[str, str, str, list[str], dict[str, Any]]]:
    """(node kind, image, accelerator, roles that read the image, group vars) of a tenant's nodes, from the manifest
    its deploy publishes."""
    tenant = load_tenant(org, ROOT)
    manifest = manifest_for(tenant)
    fmcluster_slurm = manifest["vars"]["fmcluster_capabilities"]["slurm_owner"] == "fmcluster"
    groups = manifest["groups"]
    kinds = [("controller", groups["controller"]), *([("login", groups["login"])] if groups["login"] else [])]
    kinds += [(f"queue {name}", queue) for name, queue in groups["queues"].items()]
    walked = []
    for kind, group in kinds:
        variables = group["vars"]
        # playbooks/slurm-cluster.yml: slurm (through its controller/compute/login roles) and node_health where
        # fmcluster installs Slurm (node_health's scope cluster on the controller, node on compute nodes)
        roles = (["slurm", "node_health"] if fmcluster_slurm else []) + list(variables.get("fmcluster_accelerator_roles", []))
        if fmcluster_slurm and manifest["vars"]["fmcluster_containers"] and kind != "controller":
            roles.append("slurm_containers")  # where srun and slurmd run (playbooks/slurm-cluster.yml)
        roles.append("dcgm_exporter")  # playbooks/monitoring.yml: the exporters on every node
        accelerator = group["instance"]["accelerator"]
        if accelerator in ("cuda", "neuron"):
            # nccl-tests built, nccom-test checked and run on the queue's own nodes (playbooks/acceptance-jobs.yml)
            roles.append("nccl_tests")
        walked.append((kind, variables["fmcluster_image"], accelerator, roles, variables))
    return walked


@pytest.mark.parametrize("org", AWS_ORGS)
def test_every_node_kind_s_roles_find_what_they_assume_in_its_image(org: str) -> None:
    """No gap is known and passed: a role that needs what an image lacks fails here until a role before it adds it."""
    problems = [f"{org} {kind}: {gap}" for kind, image, accelerator, roles, variables in node_kinds(org)
                for gap in gaps(roles, image, accelerator, variables)]
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
    users = {load_images()[image].contract.default_user for _, image, _, _, _ in node_kinds(org)}
    assert len(users) == 1, users
    assert provider_for(load_tenant(org, ROOT)).login_user() in users  # type: ignore[attr-defined]
    # ... and finds the Slurm clients in one place: the deploy's ssh commands put the controller image's on PATH.
    assert len({load_images()[image].contract.slurm_bin_dir for _, image, _, _, _ in node_kinds(org)}) == 1


def test_slurm_ec2_boots_images_whose_slurm_runs_with_cgroups_under_systemd() -> None:
    """Ubuntu 22.04 mounts cgroup v2 only and ships Slurm 21.08 (no cgroup v2 plugin before 22.05): slurmd would not
    start with cgroups there, so slurm-ec2 boots Ubuntu 24.04 (Slurm 23.11)."""
    catalog = load_images()
    assert not catalog["dlami-base-gpu-ubuntu-22.04"].contract.slurm_cgroups()
    for accelerator, key in catalog.ec2_images.items():
        contract = catalog[key].contract
        assert contract.init == "systemd" and contract.slurm_cgroups(), (accelerator, key)
        assert contract.role_vars()["slurm_use_cgroup"] is True


#: What a role would otherwise hard-code and the contract owns: NCCL's home, the aws-ofi-nccl directories, DCGM's host
#: engine unit, the reboot command.
CONTRACT_LITERALS = ("/opt/nccl/build", "/opt/amazon/ofi-nccl/lib", "nvidia-dcgm", "/sbin/reboot")


def test_the_roles_keep_no_literal_of_what_the_contract_owns() -> None:
    """No NCCL home or plugin directory, DCGM unit or reboot command in a role's defaults, tasks or templates: a node
    kind's image says where they are (and whether it has them)."""
    nccl_tests = yaml.safe_load((ROOT / "roles/nccl_tests/defaults/main.yml").read_text())
    nccl = yaml.safe_load((ROOT / "roles/nccl/defaults/main.yml").read_text())
    assert nccl_tests["nccl_tests_nccl_home"] == "" and nccl_tests["nccl_tests_ofi_nccl_lib_dirs"] == []
    assert nccl["nccl_plugin_dirs"] == []
    slurm = yaml.safe_load((ROOT / "roles/slurm/defaults/main.yml").read_text())
    assert slurm["slurm_use_cgroup"] is False and slurm["slurm_reboot_program"] == ""
    assert yaml.safe_load((ROOT / "roles/node_health/defaults/main.yml").read_text())["node_health_dcgm_service"] == ""
    files = [p for p in (ROOT / "roles").glob("*/*/**/*") if p.is_file() and p.suffix in (".yml", ".yaml", ".j2")]
    assert any(p.name == "fmcluster-health-boot.service.j2" for p in files)  # templates are read too
    for path in files:
        text = path.read_text()
        found = [literal for literal in CONTRACT_LITERALS if literal in text]
        assert not found, f"{path.relative_to(ROOT)} names {found}: take it from the image contract (role_vars)"


#: Where AWS's images keep what they ship (CUDA, the EFA installer's libfabric, Open MPI and aws-ofi-nccl, the Neuron
#: tools, a service's Slurm and scripts, the DLAMI's NVMe mount): a role variable holding such a path holds a fact of the
#: node's image, which its contract owns.
IMAGE_PATH_PREFIXES = ("/usr/local/cuda", "/opt/amazon", "/opt/aws", "/opt/slurm", "/opt/parallelcluster", "/opt/nccl",
                       "/opt/dlami", "/opt/ml")


def image_path_literals(value: Any) -> list[str]:
    """The strings in a role variable's default that name a path under IMAGE_PATH_PREFIXES (a list's or dict's too)."""
    if isinstance(value, str):
        return [value] if value.startswith("/usr/local/cuda-") or any(  # a DLAMI's CUDA of one release too
            value == prefix or value.startswith(prefix + "/") for prefix in IMAGE_PATH_PREFIXES) else []
    if isinstance(value, list):
        return [found for item in value for found in image_path_literals(item)]
    if isinstance(value, dict):
        return [found for item in value.values() for found in image_path_literals(item)]
    return []


def role_default_image_paths(roles_dir: Path) -> list[str]:
    """`role: variable = value` for every role variable whose default (defaults/main.yml, or meta/argument_specs.yml's
    `default`) is a path into an image."""
    found = []
    for defaults in sorted(roles_dir.glob("*/defaults/main.yml")):
        for name, value in (yaml.safe_load(defaults.read_text()) or {}).items():
            found += [f"{defaults.parts[-3]}: {name} = {literal}" for literal in image_path_literals(value)]
    for specs in sorted(roles_dir.glob("*/meta/argument_specs.yml")):
        for entry in (role_defaults.load_spec(specs)["argument_specs"]).values():
            for name, option in (entry.get("options") or {}).items():
                found += [f"{specs.parts[-3]}: {name} = {literal} (argument_specs default)"
                          for literal in image_path_literals(option.get("default"))]
    return found


def test_no_role_variable_defaults_to_a_path_into_an_image() -> None:
    """Issue 36: nccl_tests built against /usr/local/cuda, /opt/amazon/openmpi and /opt/amazon/efa written in its
    defaults, the efa role read /opt/amazon/efa/bin/fi_info, the neuron role /opt/aws/neuron/bin: paths that hold on
    some images only, and on the others a node fails at a guessed path. Each is now a fact of the image's contract
    (cuda_home, mpi_home, efa_home, neuron_bin_dir), given to every node kind by the manifest, and the role's default
    is empty so a node whose image lacks it stops with a message naming the fact."""
    assert role_default_image_paths(ROOT / "roles") == []


def test_a_role_default_naming_an_image_path_is_found(tmp_path: Path) -> None:
    """The walk above finds a literal in defaults, in a list, and in argument_specs; fmcluster's own prefixes pass."""
    role = tmp_path / "roles" / "probe"
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults" / "main.yml").write_text(yaml.safe_dump({
        "probe_cuda": "/usr/local/cuda", "probe_cuda_12": "/usr/local/cuda-12.4", "probe_dirs": ["/opt/amazon/efa/lib"],
        "probe_own": "/opt/nccl-tests", "probe_empty": "", "probe_fmcluster": "/opt/fmcluster/efa"}))
    (role / "meta" / "argument_specs.yml").write_text(yaml.safe_dump({"argument_specs": {"main": {"options": {
        "probe_mpi": {"type": "str", "default": "/opt/amazon/openmpi"}}}}}))
    assert role_default_image_paths(tmp_path / "roles") == [
        "probe: probe_cuda = /usr/local/cuda", "probe: probe_cuda_12 = /usr/local/cuda-12.4",
        "probe: probe_dirs = /opt/amazon/efa/lib", "probe: probe_mpi = /opt/amazon/openmpi (argument_specs default)"]


def test_the_toolchain_paths_come_from_each_image_s_contract() -> None:
    """CUDA, Open MPI and the EFA installer's prefix reach the nccl_tests and efa roles from the node's image: the
    DLAMI's default-CUDA link, the EFA installer's /opt/amazon; none on the local image (no GPU, no EFA: the build and
    the EFA stack are skipped by facts there), and a GPU queue booted from an image without a CUDA toolkit is a gap."""
    catalog = load_images()
    dlami = catalog.ec2_image("cuda").contract.role_vars()
    assert (dlami["nccl_tests_cuda_home"], dlami["nccl_tests_mpi_home"], dlami["nccl_tests_efa_home"]) == (
        "/usr/local/cuda", "/opt/amazon/openmpi", "/opt/amazon/efa")
    assert dlami["efa_fi_info"] == "/opt/amazon/efa/bin/fi_info"
    assert dlami["efa_installed_marker"] == "/opt/amazon/efa_installed_packages"
    local = catalog["debian-12-local"].contract
    assert (local.cuda_home, local.mpi_home, local.efa_home, local.neuron_bin_dir) == (None, None, None, None)
    assert {name: local.role_vars()[name] for name in ("nccl_tests_cuda_home", "nccl_tests_mpi_home",
                                                        "nccl_tests_efa_home", "efa_fi_info", "neuron_bin_dir")} == {
        "nccl_tests_cuda_home": "", "nccl_tests_mpi_home": "", "nccl_tests_efa_home": "", "efa_fi_info": "",
        "neuron_bin_dir": ""}
    for key, image in catalog.images.items():
        if image.ships["efa_installer"].present:
            assert image.contract.efa_home and image.contract.mpi_home, key
        if image.contract.nccl_home == "/usr/local/cuda":
            assert image.contract.cuda_home == "/usr/local/cuda", key  # NCCL beside the default CUDA
    # the Neuron DLAMI has no CUDA toolkit: nccl-tests on a GPU queue booted from it is a gap the walk names
    found = gaps(["nccl_tests"], "neuron-dlami-ubuntu-24.04", "cuda")
    assert any("cuda_home" in gap for gap in found), found
    assert not gaps(["nccl_tests"], "neuron-dlami-ubuntu-24.04", "neuron")
    assert any("efa_home" in gap for gap in gaps(["efa"], "debian-12-local"))
    assert any("neuron_bin_dir" in gap for gap in gaps(["neuron"], "parallelcluster-ubuntu2204", "neuron"))


@pytest.mark.parametrize(("os_name", "release", "expected"), [
    ("Ubuntu 22.04", "1.43.2", {OFI_NCCL_ARCH_DIR}),
    ("Ubuntu 22.04", "1.44.0", {OFI_NCCL_ARCH_DIR, OFI_NCCL_FLAT_DIR}),  # the sources disagree from here ...
    ("Ubuntu 24.04", "1.47.0", {OFI_NCCL_ARCH_DIR, OFI_NCCL_FLAT_DIR}),
    ("Ubuntu 22.04", "1.48.0", {OFI_NCCL_FLAT_DIR}),  # ... to here: awsome-distributed-training 16da837e
    ("Ubuntu 24.04", "1.49.0", {OFI_NCCL_FLAT_DIR}),
    ("Ubuntu 22.04", None, {OFI_NCCL_ARCH_DIR, OFI_NCCL_FLAT_DIR}),  # not recorded: either
    ("Amazon Linux 2023", "1.43.2", {OFI_NCCL_ARCH_DIR}),
    ("Amazon Linux 2023", "1.47.0", {OFI_NCCL_LIB64_DIR}),
])
def test_the_aws_ofi_nccl_directory_follows_the_efa_installer_release(os_name: str, release: str | None,
                                                                      expected: set[str]) -> None:
    layout = next(rule for family, rule in OFI_NCCL_LAYOUTS.items() if os_name.startswith(family))
    assert layout.dirs(release) == expected


def test_every_image_lists_where_its_efa_installer_puts_aws_ofi_nccl() -> None:
    """An image's nodes run its own EFA installer and, where fmcluster keeps the stack at the pins, versions.yml's:
    the contract lists the plugin's directory for each (the installer 1.48 has no x86_64-linux-gnu directory), and
    the nccl and nccl_tests roles (and nccl_profiles.yml's tuner path, {ofi_nccl_lib_dir}) look only there."""
    pin = str(versions.load()["efa_installer"]["version"])
    for key, image in load_images().images.items():
        assert image.missing_ofi_nccl_dirs() == [], key
        variables = image.contract.role_vars()
        assert variables["nccl_plugin_dirs"] == variables["nccl_tests_ofi_nccl_lib_dirs"] \
            == list(image.contract.ofi_nccl_lib_dirs), key
        if image.contract.accelerator_stack == "upgradable":
            assert pin in image.efa_installer_releases(), key
    assert OFI_NCCL_FLAT_DIR in load_images()["hyperpod-default"].contract.ofi_nccl_lib_dirs  # EFA "below 1.49"
    assert load_images()["pcs-sample-al2023-x86_64-slurm-25.11"].contract.ofi_nccl_lib_dirs[0] == OFI_NCCL_LIB64_DIR


@pytest.mark.parametrize(("image", "release", "dirs", "missing"), [
    ("hyperpod-default", None, [OFI_NCCL_ARCH_DIR], OFI_NCCL_FLAT_DIR),  # main's HyperPod contract
    ("hyperpod-default", "1.48.0", [OFI_NCCL_ARCH_DIR], OFI_NCCL_FLAT_DIR),
    ("hyperpod-default", "1.43.2", [OFI_NCCL_FLAT_DIR], OFI_NCCL_ARCH_DIR),
    # an upgradable image is raised to the pinned installer (1.49), whatever it shipped
    ("dlami-base-gpu-ubuntu-24.04", "1.43.2", [OFI_NCCL_ARCH_DIR], OFI_NCCL_FLAT_DIR),
    ("pcs-sample-al2023-x86_64-slurm-25.11", "1.47.0", [OFI_NCCL_FLAT_DIR], OFI_NCCL_LIB64_DIR),  # main's PCS contract
])
def test_a_contract_missing_the_plugin_directory_of_its_efa_installer_is_refused(image: str, release: str | None,
                                                                                 dirs: list[str], missing: str) -> None:
    raw = raw_catalog()
    raw["images"][image]["ships"]["efa_installer"]["version"] = release
    raw["images"][image]["contract"]["ofi_nccl_lib_dirs"]["value"] = dirs
    with pytest.raises(ImageCatalogError, match=rf"images\.{image}\.contract\.ofi_nccl_lib_dirs: lacks {missing}"):
        parse_catalog(raw)


@pytest.mark.parametrize(("layout", "found"), [
    ({"lib": ["libnccl-net.so", "libnccl-net-ofi.so"]}, "lib"),  # the installer 1.48's flat directory
    ({"lib/x86_64-linux-gnu": ["libnccl-net.so"]}, "lib/x86_64-linux-gnu"),  # an older installer's, NCCL's name only
    ({"lib": ["libnccl-net-ofi.so"]}, "lib"),  # the plugin's own name only
])
def test_the_nccl_role_points_at_the_directory_that_holds_the_plugin_in_either_layout(
        tmp_path: Path, layout: dict[str, list[str]], found: str) -> None:
    """The nccl role looks in the contract's directories, in order, for the file NCCL loads (libnccl-net.so) or the
    plugin's own name (libnccl-net-ofi.so); a value's {ofi_nccl_lib_dir} (nccl_profiles.yml's tuner path) names the
    directory it found. Before, it looked for libnccl-net-ofi.so alone, and in a layout with libnccl-net.so only it
    said the plugin was missing and pointed the tuner at the first directory listed."""
    from role_helpers import converge_role

    root = tmp_path / "opt/amazon/ofi-nccl"
    for folder, names in layout.items():
        (root / folder).mkdir(parents=True)
        for name in names:
            (root / folder / name).write_bytes(b"")
    variables = {"nccl_plugin_dirs": [str(root / "lib"), str(root / "lib/x86_64-linux-gnu")],
                 "nccl_environment": {"NCCL_TUNER_PLUGIN": "{ofi_nccl_lib_dir}/libnccl-ofi-tuner.so"},
                 "nccl_profile_path": str(tmp_path / "profile.sh"), "nccl_task_prolog_path": str(tmp_path / "prolog.sh")}
    rc, _, output = converge_role("nccl", tmp_path, variables)
    assert rc == 0, output
    assert f"export NCCL_TUNER_PLUGIN={root / found}/libnccl-ofi-tuner.so" in (tmp_path / "profile.sh").read_text()
    assert f"Plugin present at {root / found}/" in " ".join(output.split()).replace("\\n", " ")


def test_an_image_with_an_efa_installer_on_an_os_of_no_known_layout_is_refused() -> None:
    raw = raw_catalog()
    raw["images"]["parallelcluster-ubuntu2204"]["os"] = "Rocky Linux 9"
    with pytest.raises(ImageCatalogError, match=r"parallelcluster-ubuntu2204\.contract\.ofi_nccl_lib_dirs: lacks \?"):
        parse_catalog(raw)


def test_the_boot_diagnostic_follows_the_image_s_dcgm_host_engine_only_where_it_ships_one() -> None:
    """dcgmi (the checks dcgm, dcgm-deep and the boot diagnostic before slurmd) needs DCGM's host engine. The DLAMI
    Base GPU AMIs list dcgm_version in their release notes, HyperPod's Slurm AMI is built on them, ParallelCluster's
    cookbook installs datacenter-gpu-manager on NVIDIA nodes; the Neuron DLAMIs and the local image ship no DCGM."""
    catalog = load_images()
    for key, image in catalog.images.items():
        assert image.contract.role_vars()["node_health_dcgm_service"] == (image.contract.dcgm_service or ""), key
    shipping = {key for key, image in catalog.images.items() if image.contract.dcgm_service}
    assert shipping == {"dlami-base-gpu-ubuntu-22.04", "dlami-base-gpu-ubuntu-24.04", "hyperpod-default",
                        "parallelcluster-ubuntu2204"}
    assert {catalog[key].contract.dcgm_service for key in shipping} == {"nvidia-dcgm.service"}
    assert catalog.ec2_image("cuda").contract.dcgm_service  # every slurm-ec2 GPU node has a host engine
    # a GPU node booted from an image without DCGM is a gap; a Trainium node needs none
    assert gaps(["node_health"], "debian-12-local") and not gaps(["node_health"], "dlami-base-gpu-ubuntu-24.04")
    assert not gaps(["node_health"], "neuron-dlami-ubuntu-24.04", "neuron")
    unnamed = raw_catalog()
    unnamed["images"]["hyperpod-default"]["contract"]["dcgm_service"]["value"] = "nvidia-dcgm"  # a unit, with .service
    with pytest.raises(ImageCatalogError, match=r"hyperpod-default\.contract\.dcgm_service\.value"):
        parse_catalog(unnamed)
    for service in ("nvidia-dcgm.service", ""):
        unit = render_boot_unit(service)
        directives = [line for line in unit.splitlines() if line.startswith(("Wants=", "After=", "Before="))]
        expected = [f"Wants={service}", f"After={service}"] if service else []
        assert directives == [*expected, "Before=fmcluster-slurmd.service"], unit


def render_boot_unit(dcgm_service: str, **overrides: Any) -> str:
    """roles/node_health's boot unit as Ansible's template module renders it (Jinja2, trim_blocks)."""
    import jinja2

    defaults = yaml.safe_load((ROOT / "roles/node_health/defaults/main.yml").read_text())
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    template = env.from_string((ROOT / "roles/node_health/templates/fmcluster-health-boot.service.j2").read_text())
    return template.render(**{**{name: defaults[name] for name in (
        "node_health_return_diag_level", "node_health_slurmd_unit", "node_health_install_dir",
        "node_health_config_path", "node_health_timeouts", "node_health_boot_after")},
        "node_health_node_name": "gpu-3", "node_health_dcgm_service": dcgm_service, **overrides})


def test_on_nvswitch_instances_the_boot_diagnostic_waits_for_fabric_manager() -> None:
    """A p5's GPUs reach each other over NVSwitch only once Fabric Manager runs (NVIDIA Fabric Manager User Guide):
    its queue's nodes order the boot diagnostic after it; a queue without NVSwitch after nothing more."""
    from fmcluster.accelerators import queue_vars

    p5, trn1 = queue_vars("p5.48xlarge", ["p5.48xlarge"]), queue_vars("trn1.32xlarge", ["trn1.32xlarge"])
    assert p5["node_health_boot_after"] == ["nvidia-fabricmanager.service"] and trn1["node_health_boot_after"] == []
    unit = render_boot_unit("nvidia-dcgm.service", node_health_boot_after=p5["node_health_boot_after"])
    assert [line for line in unit.splitlines() if line.startswith("After=")] == [
        "After=nvidia-dcgm.service", "After=nvidia-fabricmanager.service"], unit


def test_scontrol_reboot_runs_the_reboot_command_of_the_image_s_own_package() -> None:
    """RebootProgram is the path systemd-sysv installs on each image (its distribution's file list: /sbin/reboot on
    Ubuntu 22.04 and Debian 12, /usr/sbin/reboot on Ubuntu 24.04), set only where fmcluster installs Slurm; and, one
    line of slurm.conf for the whole cluster, the same on every node kind of a tenant whose Slurm fmcluster installs."""
    catalog = load_images()
    for key, image in catalog.images.items():
        contract = image.contract
        # Amazon Linux 2023 (PCS's sample AMI) is downstream of Fedora, whose systemd package installs the command.
        assert contract.reboot_program and any(list_ in contract.sources["reboot_program"] for list_ in (
            "systemd-sysv/filelist", "packages.fedoraproject.org/pkgs/systemd/systemd")), key
        variables = contract.role_vars()
        if contract.slurm_installed_by == "fmcluster":
            assert variables["slurm_reboot_program"] == contract.reboot_program, key
        else:  # the service's own slurm.conf says it (ParallelCluster, HyperPod)
            assert "slurm_reboot_program" not in variables, key
    assert catalog.ec2_image("cuda").contract.reboot_program == "/usr/sbin/reboot"  # noble's systemd-sysv
    assert catalog["debian-12-local"].contract.reboot_program == "/sbin/reboot"  # bookworm's
    assert any(rule["fact"] == "reboot_program" and rule.get("present") for rule in assumptions("slurm"))
    for org in ORGS:
        groups = manifest_for(load_tenant(org, ROOT))["groups"]
        kinds = [groups["controller"], *([groups["login"]] if groups["login"] else []), *groups["queues"].values()]
        programs = {kind["vars"].get("slurm_reboot_program") for kind in kinds}
        assert len(programs) == 1, (org, programs)


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
    raw = raw_catalog()
    broken = copy.deepcopy(raw)
    broken["images"]["dlami-base-gpu-ubuntu-24.04"]["contract"]["nccl_home"]["value"] = "usr/local/cuda"
    with pytest.raises(ImageCatalogError, match=r"images\.dlami-base-gpu-ubuntu-24\.04\.contract\.nccl_home\.value"):
        parse_catalog(broken)
    unsourced = copy.deepcopy(raw)
    unsourced["images"]["hyperpod-default"]["contract"]["init"]["source"] = "trust me"
    with pytest.raises(ImageCatalogError, match=r"contract\.init\.source.*https://"):
        parse_catalog(unsourced)


def test_role_assumptions_name_contract_facts() -> None:
    facts = set(Contract.__dataclass_fields__) | {"slurm_cgroups", "dcgm_exporter_image"}  # and what it derives
    for path in sorted(Path(ROOT / "roles").glob("*/meta/image.yml")):
        meta = yaml.safe_load(path.read_text())
        for rule in meta["assumes"]:
            assert rule["fact"] in facts and rule["why"], (path, rule)
            assert ("equals" in rule) != ("present" in rule), (path, rule)
            assert rule.get("accelerator", "cuda") in ("cuda", "neuron", "none"), (path, rule)
            assert rule.get("runtime", "container") in ("container", "binary", "none"), (path, rule)
        for rule in meta.get("provides", []):
            assert rule["fact"] in facts and rule["why"] and rule["where_absent"] is True, (path, rule)


#: What each image ships to run NVIDIA's containers with GPUs (contract: container_runtime), from its sources: the
#: DLAMI Base GPU AMIs' release notes list docker-ce-cli, containerd and nvidia_container_toolkit_version;
#: ParallelCluster's cookbook installs neither Docker nor the toolkit (its NVIDIA recipe: driver, CUDA, DCGM, Fabric
#: Manager, GDRCopy); HyperPod sets up Docker before an OnInitComplete script runs, and AWS's OnInitComplete extension
#: runs the DCGM exporter there with `docker run --gpus all` (awslabs/awsome-distributed-ai, Extensions/observability);
#: the Neuron DLAMIs have no NVIDIA stack; the local image has no Docker (docs/local-nodes.md).
CONTAINER_RUNTIMES = {
    "dlami-base-gpu-ubuntu-22.04": "/usr/bin/docker", "dlami-base-gpu-ubuntu-24.04": "/usr/bin/docker",
    "neuron-dlami-ubuntu-22.04": None, "neuron-dlami-ubuntu-24.04": None, "hyperpod-default": "/usr/bin/docker",
    "parallelcluster-ubuntu2204": None, "debian-12-local": None, "pcs-sample-al2023-x86_64-slurm-25.11": None,
}


def test_each_image_s_container_runtime_is_its_sources_and_decides_the_gpu_exporter() -> None:
    catalog = load_images()
    assert {key: image.contract.container_runtime for key, image in catalog.images.items()} == CONTAINER_RUNTIMES
    pcluster = catalog["parallelcluster-ubuntu2204"].contract
    assert "aws-parallelcluster-cookbook" in pcluster.sources["container_runtime"]
    assert "dlami/latest/devguide" in catalog["dlami-base-gpu-ubuntu-24.04"].contract.sources["container_runtime"]
    assert catalog["debian-12-local"].contract.sources["container_runtime"] == "docs/local-nodes.md"
    for key, image in catalog.images.items():
        variables = image.contract.role_vars()
        if image.contract.container_runtime:
            assert variables["dcgm_exporter_runtime"] == "container", key
            assert variables["dcgm_exporter_docker"] == image.contract.container_runtime, key
        else:
            assert variables["dcgm_exporter_runtime"] == "none" and "dcgm_exporter_docker" not in variables, key
    # the exporter's container on a GPU node needs the CLI; with runtime none the role assumes nothing of the image
    assert gaps(["dcgm_exporter"], "parallelcluster-ubuntu2204", "cuda", {"dcgm_exporter_runtime": "container"})
    assert not gaps(["dcgm_exporter"], "parallelcluster-ubuntu2204")
    assert not gaps(["dcgm_exporter"], "dlami-base-gpu-ubuntu-24.04")
    defaults = yaml.safe_load((ROOT / "roles/dcgm_exporter/defaults/main.yml").read_text())
    assert defaults["dcgm_exporter_docker"] == ""  # the contract names the CLI, never a literal of the role


def test_a_hyperpod_gpu_node_is_a_gap_until_its_dcgm_release_is_recorded() -> None:
    """HyperPod's OnInitComplete nodes have Docker with NVIDIA's GPU support (AWS's own extension runs the DCGM exporter
    there with `docker run --gpus all`), so a HyperPod GPU node runs the exporter's container beside the image's
    nvidia-dcgm host engine; no HyperPod release note read names that engine's DCGM release, so no exporter image is
    paired with it. The walk names the gap, plan prints it, and a Trainium node (no exporter) has none. Before, the
    contract said HyperPod ships no container runtime and the node got no exporter, on no source."""
    from fmcluster.images import gpu_exporter_gaps

    contract = load_images()["hyperpod-default"].contract
    assert "Extensions/observability" in contract.sources["container_runtime"]
    assert contract.role_vars()["dcgm_exporter_runtime"] == "container" and contract.dcgm_version is None
    found = gaps(["dcgm_exporter"], "hyperpod-default", "cuda")
    assert len(found) == 1 and "dcgm_exporter_image is None" in found[0], found
    assert not gaps(["dcgm_exporter"], "hyperpod-default", "neuron")
    tenant = load_tenant("neuronlab", ROOT)
    gpu = dataclasses.replace(tenant, queues=(dataclasses.replace(
        tenant.queues[0], instance=load_tenant("stockmark", ROOT).queues[0].instance),))
    lines = gpu_exporter_gaps(gpu, lambda accelerator: "hyperpod-default")
    assert len(lines) == 1 and "GAP on" in lines[0] and "dcgm_version" in lines[0], lines
    assert not gpu_exporter_gaps(tenant, lambda accelerator: "hyperpod-default")
    # What plan and the deploy refuse before anything is created: that node's converge would fail.
    from fmcluster.images import first_boot_refusals

    refused = first_boot_refusals(gpu, lambda accelerator: "hyperpod-default")
    assert len(refused) == 1 and refused[0].startswith(f"tenant '{gpu.org}': queue {gpu.queues[0].name} boot ")
    assert "dcgm_version" in refused[0] and "converge would fail" in refused[0], refused
    assert not first_boot_refusals(tenant, lambda accelerator: "hyperpod-default")


def test_a_gpu_image_whose_host_engine_has_no_known_dcgm_release_is_a_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exporter's image is the one paired with the host engine's DCGM release (tests/test_dcgm_exporter_role.py): an image that runs the
    exporter's container beside a host engine of no recorded release has no exporter image, and the walk names it."""
    import sys

    raw = raw_catalog()
    raw["images"]["dlami-base-gpu-ubuntu-24.04"]["contract"]["dcgm_version"]["value"] = None
    catalog = parse_catalog(raw)
    assert not gaps(["dcgm_exporter"], "dlami-base-gpu-ubuntu-24.04")
    monkeypatch.setattr(sys.modules[__name__], "load_images", lambda: catalog)
    found = gaps(["dcgm_exporter"], "dlami-base-gpu-ubuntu-24.04")
    assert len(found) == 1 and "dcgm_exporter_image is None" in found[0], found
    assert not gaps(["dcgm_exporter"], "dlami-base-gpu-ubuntu-24.04", "neuron")  # a Trainium node runs none
    raw["images"]["dlami-base-gpu-ubuntu-24.04"]["contract"]["dcgm_version"]["value"] = "v4"
    with pytest.raises(ImageCatalogError, match=r"dlami-base-gpu-ubuntu-24\.04\.contract\.dcgm_version\.value"):
        parse_catalog(raw)


@pytest.mark.parametrize(("path", "value"), [("/usr/bin/docker", True), (None, True), ("docker", False),
                                             ("/usr/bin/", False), ("/usr/bin/docker run", False), (True, False)])
def test_a_container_runtime_is_an_absolute_path_or_null(path: Any, value: bool) -> None:
    raw = raw_catalog()
    raw["images"]["hyperpod-default"]["contract"]["container_runtime"]["value"] = path
    if value:
        assert parse_catalog(raw)["hyperpod-default"].contract.container_runtime == path
    else:
        with pytest.raises(ImageCatalogError, match=r"hyperpod-default\.contract\.container_runtime\.value"):
            parse_catalog(raw)


def test_pclab_s_gpu_queue_gets_no_exporter_and_no_dcgm_target_and_plan_says_why() -> None:
    """ParallelCluster's AMI ships no container runtime: its GPU nodes start no dcgm-exporter (which would fail the
    converge, OnNodeConfigured with it, and ParallelCluster would replace the node in a loop), Prometheus expects
    no dcgm target, and plan lists the gap."""
    from fmcluster import monitoring
    from fmcluster.images import gpu_exporter_gaps, image_lines

    tenant = load_tenant("pclab", ROOT)
    manifest = manifest_for(tenant)
    gpu = manifest["groups"]["queues"]["gpu"]
    assert gpu["instance"]["accelerator"] == "cuda"
    assert gpu["vars"]["dcgm_exporter_runtime"] == "none" and "dcgm_exporter_docker" not in gpu["vars"]
    jobs = manifest["vars"]["prometheus_scrape_jobs"]
    assert [job["job"] for job in jobs] == ["node", "efa"]
    assert jobs == monitoring.scrape_jobs(tenant)
    image_of = booted_image(scheduler_for(tenant).image, provider_for(tenant).node_image)
    name = load_images()["parallelcluster-ubuntu2204"].name
    gap = gpu_exporter_gaps(tenant, image_of)
    assert gap == [f"  no GPU exporter on queue gpu: {name} ships no container runtime (dcgm-exporter runs as "
                   "NVIDIA's container); GPU health there comes from fmcluster-health's DCGM checks and their metrics, "
                   "and Prometheus scrapes no dcgm target"]
    assert gap[0] in image_lines(tenant, scheduler_for(tenant).image, provider_for(tenant).node_image)


def test_stockmark_s_gpu_queue_runs_the_exporter_container_and_is_scraped() -> None:
    from fmcluster import monitoring
    from fmcluster.images import image_lines

    tenant = load_tenant("stockmark", ROOT)
    manifest = manifest_for(tenant)
    gpu = [q for q in manifest["groups"]["queues"].values() if q["instance"]["accelerator"] == "cuda"]
    assert gpu and all(q["vars"]["dcgm_exporter_runtime"] == "container" for q in gpu)
    assert all(q["vars"]["dcgm_exporter_docker"] == "/usr/bin/docker" for q in gpu)
    dcgm = [job for job in manifest["vars"]["prometheus_scrape_jobs"] if job["job"] == "dcgm"]
    assert dcgm == [{"job": "dcgm", "port": 9400, "instance_types": sorted({q["instance_type"] for q in gpu})}]
    assert dcgm[0] in monitoring.scrape_jobs(tenant)
    lines = image_lines(tenant, scheduler_for(tenant).image, provider_for(tenant).node_image)
    assert not [line for line in lines if "no GPU exporter" in line]


def test_the_dcgm_exporter_role_says_why_and_starts_nothing_where_the_image_has_no_runtime() -> None:
    tasks = yaml.safe_load((ROOT / "roles/dcgm_exporter/tasks/main.yml").read_text())
    said = next(t for t in tasks if "ships no container runtime" in str(t.get("ansible.builtin.debug", {})))
    assert "dcgm_exporter_runtime == 'none'" in said["when"]
    run = next(t for t in tasks if t["name"] == "Run the DCGM exporter")
    assert "dcgm_exporter_runtime != 'none'" in run["when"]
    specs = role_defaults.load_spec(ROOT / "roles/dcgm_exporter/meta/argument_specs.yml")
    assert "none" in specs["argument_specs"]["main"]["options"]["dcgm_exporter_runtime"]["choices"]


def test_every_node_kind_runs_its_modules_with_its_image_s_python3_and_the_agent_names_none() -> None:
    """The modules of a node's plays run with the image's python3 (images.yml python_interpreter, its package's file
    list or the OS's guide), which has the distribution's apt binding where there is apt: Mitogen runs a module in
    place, so apt's modules cannot re-start themselves there from the venv's python. The manifest gives it every node
    kind; the agent passes no interpreter of its own that would override it."""
    catalog = load_images()
    for key, image in catalog.images.items():
        contract = image.contract
        assert contract.python_interpreter == "/usr/bin/python3" and image.ships["python"].present, key
        assert contract.role_vars()["ansible_python_interpreter"] == contract.python_interpreter, key
    for org in ORGS:
        groups = manifest_for(load_tenant(org, ROOT))["groups"]
        kinds = [groups["controller"], *([groups["login"]] if groups["login"] else []), *groups["queues"].values()]
        assert all(kind["vars"]["ansible_python_interpreter"] == "/usr/bin/python3" for kind in kinds), org
    agent = (ROOT / "src" / "fmcluster" / "node" / "agent.py").read_text()
    assert "ansible_python_interpreter=" not in agent
    broken = copy.deepcopy(raw_catalog())
    broken["images"]["debian-12-local"]["contract"]["python_interpreter"]["value"] = "python3"
    with pytest.raises(ImageCatalogError, match=r"images\.debian-12-local\.contract\.python_interpreter\.value.*"
                                                r"absolute path of the image's python3"):
        parse_catalog(broken)
