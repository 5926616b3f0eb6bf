"""The image catalog (src/fmcluster/data/images.yml): its rules, the schedulers' choices, and the stacks agreeing."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from fmcluster.images import (ACCELERATORS, COMPONENTS, IMAGES_PATH, ImageCatalogError, image_lines, load_images, parse_catalog,
                              raw_catalog)
from fmcluster.model import load_tenant
from fmcluster.providers.registry import provider_for
from fmcluster.schedulers.registry import scheduler_for
from fmcluster.stacks.render import BakedImageRef, ImageRef
from scheduler_stacks import render_stacks
from fmcluster.schedulers.slurm_ec2.template import AMI_PARAMETERS

ORGS = sorted(p.name for p in (ROOT / "inventories").iterdir() if (p / "group_vars" / "all" / "tenant.yml").is_file())


def raw() -> dict[str, Any]:
    return raw_catalog()


#: Images fmcluster's first boot cannot run on yet (it installs with apt and runs ansible-core 2.17, which needs Python
#: 3.10-3.12), each with why: named here, so that a tenant booting one plans, is refused by the deploy and is known not
#: to converge (Image.first_boot_gap says so from the catalog; this list keeps the rule and the data honest).
FIRST_BOOT_GAPS = {
    "pcs-sample-al2023-x86_64-slurm-25.11": "nothing yet: Amazon Linux 2023 has dnf and Python 3.9 "
                                            "(src/fmcluster/schedulers/pcs/README.md, \"What is not done yet\")",
}


def test_every_image_says_what_it_ships_with_a_public_source_per_fact() -> None:
    catalog = load_images()
    assert {"dlami-base-gpu-ubuntu-22.04", "dlami-base-gpu-ubuntu-24.04", "neuron-dlami-ubuntu-22.04",
            "hyperpod-default", "parallelcluster-ubuntu2204", "debian-12-local"} <= set(catalog.images)
    for image in catalog.images.values():
        assert set(image.ships) == set(COMPONENTS), image.key
        assert all(c.source.startswith("https://") for c in image.ships.values()), image.key
        assert (image.first_boot_gap() is None) == (image.key not in FIRST_BOOT_GAPS), (image.key, image.first_boot_gap())
        assert image.first_boot_adds, image.key
    for key, why in FIRST_BOOT_GAPS.items():  # said where a person reads it: plan's "first boot adds"
        assert catalog[key].first_boot_adds.startswith("nothing yet") and why.split(":")[0] in catalog[key].first_boot_adds
    local = catalog["debian-12-local"]
    assert local.ships["python"].version == "3.11" and not local.ships["aws_cli"].present


def test_every_image_slurm_ec2_launches_has_an_ssm_parameter_and_the_aws_cli_the_first_fetch_uses() -> None:
    catalog = load_images()
    for accelerator in ACCELERATORS:
        image = catalog.ec2_image(accelerator)
        assert image.ssm_parameter and image.ssm_parameter.startswith("/aws/service/"), accelerator
        assert image.ships["aws_cli"].present, f"{accelerator}: {image.key} has no AWS CLI; node-user-data.sh needs one"


def test_the_launch_templates_image_parameters_are_the_catalogs() -> None:
    catalog = load_images()
    assert {kind: path for kind, (_, path) in AMI_PARAMETERS.items()} == {
        kind: catalog.ec2_image(kind).ssm_parameter for kind in ACCELERATORS}
    stack = next(s for s in render_stacks(load_tenant("stockmark", ROOT)) if s.key == "cluster")
    # a baked image's ref (tests/test_baked_aws.py) stands over the catalogued one it replaces where none is recorded
    bases = {name: value.base if isinstance(value, BakedImageRef) else value for name, value in stack.parameters.items()}
    refs = {name: value.ssm_path for name, value in bases.items() if isinstance(value, ImageRef)}
    assert refs and all(path in {p for _, p in AMI_PARAMETERS.values()} for path in refs.values()), refs


@pytest.mark.parametrize("org", ORGS)
def test_each_scheduler_names_a_catalogued_image_for_every_node_kind(org: str) -> None:
    tenant = load_tenant(org, ROOT)
    scheduler = scheduler_for(tenant)
    for accelerator in ACCELERATORS:
        assert load_images()[scheduler.image(accelerator)].key
    lines = image_lines(tenant, scheduler.image, provider_for(tenant).node_image)
    assert lines[0].startswith("Node images") and any("first boot adds:" in line for line in lines)
    assert len(lines) <= 8, "a few lines in plan and the deploy summary"


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["images"]["hyperpod-default"].update(source="somewhere"), "images.hyperpod-default.source"),
    (lambda d: d["images"]["dlami-base-gpu-ubuntu-22.04"].update(ssm_parameter=None), "ssm_parameter"),
    (lambda d: d["images"]["debian-12-local"]["ships"].pop("slurm"), "images.debian-12-local.ships"),
    (lambda d: d["images"]["debian-12-local"]["ships"]["python"].update(source="a blog"), "ships.python.source"),
    (lambda d: d["images"]["debian-12-local"]["ships"]["slurm"].update(version="24.11"), "ships.slurm.version"),
    (lambda d: d["ec2_images"].update(none="hyperpod-default"), "ec2_images.none"),
])
def test_a_broken_catalog_is_refused_naming_the_key_and_the_fix(edit: Any, message: str) -> None:
    document = copy.deepcopy(raw())
    edit(document)
    with pytest.raises(ImageCatalogError, match="fix:") as refused:
        parse_catalog(document)
    assert message in str(refused.value) and "images.yml" in str(refused.value)



def test_a_scheduler_folder_adds_its_own_entries_to_a_core_data_file_and_one_entry_has_one_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: what belongs to one scheduler lives in its folder, as a file named like the core data file and holding
    some of its sections (ParallelCluster's official AMI: schedulers/parallelcluster/images.yml); the loader adds a
    mapping's entries and a list's items. An entry held twice, or a section the core file lacks, is refused naming
    both places."""
    from fmcluster import capabilities

    assert "parallelcluster-ubuntu2204" not in yaml.safe_load(IMAGES_PATH.read_text())["images"]
    assert load_images()["parallelcluster-ubuntu2204"].contract.slurm_installed_by == "service"
    own, other = tmp_path / "own", tmp_path / "other"
    own.mkdir()
    other.mkdir()
    (own / "images.yml").write_text("images:\n  own-image: {name: x}\nnames: [b]\n")
    monkeypatch.setattr(capabilities, "SCHEDULER_FOLDERS", {"own": own, "other": other})
    core = {"images": {"core-image": {}}, "names": ["a"], "ec2_images": {"cuda": "core-image"}}
    merged = capabilities.scheduler_data("images.yml", core)
    assert merged == {"images": {"core-image": {}, "own-image": {"name": "x"}}, "names": ["a", "b"],
                      "ec2_images": {"cuda": "core-image"}}
    assert core["images"] == {"core-image": {}} and core["names"] == ["a"]  # the core's own document is not changed
    for text, message in [("images:\n  own-image: {}\n", rf"images\.own-image is in {own}/images\.yml already"),
                          ("images:\n  core-image: {}\n", r"images\.core-image is in data/images\.yml already"),
                          ("names: [a]\n", r"names\.a is in data/images\.yml already"),
                          ("flavours: {a: 1}\n", r"section 'flavours' is not a mapping or list section"),
                          ("names: {a: 1}\n", r"section 'names' is not a mapping or list section")]:
        (other / "images.yml").write_text(text)
        with pytest.raises(ValueError, match=message):
            capabilities.scheduler_data("images.yml", core)

def test_the_local_image_is_the_catalogued_stock_image_and_holds_nothing_of_fmcluster_s() -> None:
    from fmcluster.providers.local import image

    entry = load_images()[image.NAME]
    assert entry.ships["python"].present and not entry.ships["aws_cli"].present and not entry.ships["slurm"].present
    assert "python3" in image.PACKAGES and "openssh-server" in image.PACKAGES
    for lent in ("awscli", "git", "slurmd", "slurmctld", "munge", "prometheus", "python3-venv", "python3-boto3"):
        assert lent not in image.PACKAGES, f"the local image would be lent {lent}"


def test_node_convergence_md_shows_each_image_s_first_boot_and_contract_from_the_catalog() -> None:
    """Issue 36: per image, what a first boot adds and each contract fact with its source, generated from
    images.yml (never a hand-kept copy)."""
    from fmcluster import image_docs
    from fmcluster.images import load_images

    page = image_docs.page_path().read_text()
    assert image_docs.render_page(page) == page, "run: .venv/bin/python -m fmcluster.image_docs"
    for image in load_images().images.values():
        assert f"**`{image.key}`**" in page and image.first_boot_adds.split(";")[0] in page
        assert all(source.split()[0] in page for source in image.contract.sources.values())


def test_an_image_first_boot_cannot_run_on_is_named_by_its_python_or_its_package_manager() -> None:
    """The rule reads the catalog and versions.yml's toolchain targets, not a list of its own: a Python outside the
    wheelhouse's targets, none at all, or an OS without apt is a gap, each said with why."""
    catalog = raw()
    pcs = parse_catalog(catalog)["pcs-sample-al2023-x86_64-slurm-25.11"]
    assert "Python 3.9" in (pcs.first_boot_gap() or "") and "node_toolchain_targets" in (pcs.first_boot_gap() or "")
    changed = copy.deepcopy(catalog)
    entry = changed["images"]["debian-12-local"]  # no EFA installer: no aws-ofi-nccl layout to satisfy
    entry["os"] = "Amazon Linux 2023"
    assert "has no apt" in (parse_catalog(changed)["debian-12-local"].first_boot_gap() or "")
    entry["ships"]["python"].update(present=False, version=None)
    assert "no python3" in (parse_catalog(changed)["debian-12-local"].first_boot_gap() or "")
