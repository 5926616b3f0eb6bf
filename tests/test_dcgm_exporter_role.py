"""roles/dcgm_exporter against the image its node boots (issue 36). Where the image runs DCGM's host engine (contract
dcgm_service: the AWS Deep Learning AMIs' nvidia-dcgm.service, DCGM 4), the exporter connects to it
(dcgm-exporter --remote-hostengine-info, its container on the host's network so that localhost is the host's
nv-hostengine), its unit requires and follows that service, and its image is paired with that engine's DCGM release; an embedded
engine beside the host's contends for the same GPUs (NVIDIA/dcgm-exporter#7, #61; NVIDIA/DCGM#108). Where the image
ships no host engine, the exporter embeds its own, as before.

This machine has no GPU and no Docker: the role's command line and unit are rendered as Ansible renders them (its
Templar, with the role's own expressions and supervised_service's unit template), and the slow test converges the
role in --check against a fake /dev with NVIDIA device nodes."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from role_helpers import trusted
from fmcluster import versions
from fmcluster.images import Contract, load_images

ROLE = ROOT / "roles" / "dcgm_exporter"
SUPERVISED = ROOT / "roles" / "supervised_service"
LISTEN = "10.1.2.3"
#: The catalogued images whose GPU nodes run the exporter's container beside the image's own DCGM host engine, of a
#: recorded release (HyperPod's has none recorded: a gap, tests/test_image_contract.py).
WITH_HOST_ENGINE = sorted(key for key, image in load_images().images.items()
                          if image.contract.container_runtime and image.contract.dcgm_service
                          and image.contract.dcgm_version)


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def render(group_vars: dict[str, Any], **overrides: Any) -> tuple[dict[str, Any], str]:
    """(the variables the role passes to supervised_service, the unit file it writes) on a GPU node whose group vars
    (the manifest's: the image contract's role_vars) are `group_vars`. Precedence as in a play: role defaults, group
    vars, extra vars, then the block's and the include's own vars."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    tasks = _yaml(ROLE / "tasks" / "main.yml")
    run = next(task for task in tasks if task["name"] == "Run the DCGM exporter")
    start = next(task for task in run["block"] if task["name"] == "Start dcgm-exporter")
    variables = trusted({**_yaml(SUPERVISED / "defaults" / "main.yml"), **_yaml(ROLE / "defaults" / "main.yml"),
                          **group_vars, "dcgm_exporter_listen_address": LISTEN, **overrides, **run["vars"],
                          **start["vars"], "dcgm_exporter_counters": {"changed": False}})
    templar = Templar(loader=DataLoader(), variables=variables)
    passed = {name: templar.template(trust_as_template("{{ %s }}" % name)) for name in start["vars"]}
    unit = Templar(loader=DataLoader(), variables={**variables, **passed}).template(
        trust_as_template((SUPERVISED / "templates" / "unit.service.j2").read_text()), overrides={"trim_blocks": True})
    return passed, str(unit)


def directives(unit: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(f"{key}=")]


def major(version: str) -> str:
    return version.split(".")[0]


def tag_dcgm_release(image: str) -> str:
    """The DCGM release a dcgm-exporter image is paired with: its tag is <dcgm-version>-<exporter-version>-<variant>
    (NVIDIA, "Install DCGM Exporter", Requirements and Version Compatibility)."""
    tag = image.rsplit(":", 1)[1]
    assert re.fullmatch(r"\d+\.\d+\.\d+-\d+\.\d+\.\d+-[a-z0-9.]+", tag), image
    return tag.split("-")[0]


def test_the_dlami_gpu_images_are_the_ones_running_the_exporter_beside_a_host_engine() -> None:
    assert WITH_HOST_ENGINE == ["dlami-base-gpu-ubuntu-22.04", "dlami-base-gpu-ubuntu-24.04"]
    assert load_images().ec2_image("cuda").key in WITH_HOST_ENGINE  # every slurm-ec2 GPU node


@pytest.mark.parametrize("key", WITH_HOST_ENGINE)
def test_the_exporter_connects_to_the_image_s_host_engine_and_its_unit_requires_it(key: str) -> None:
    contract = load_images()[key].contract
    passed, unit = render(contract.role_vars())
    args = passed["supervised_service_args"]
    assert args[args.index("--network") + 1] == "host" and "--publish" not in args, args
    assert "--remote-hostengine-info=localhost:5555" in args and f"--address={LISTEN}:9400" in args, args
    assert passed["supervised_service_requires"] == [contract.dcgm_service]
    assert directives(unit, "Requires") == [contract.dcgm_service], unit
    assert directives(unit, "After") == ["network-online.target", contract.dcgm_service], unit
    execstart = directives(unit, "ExecStart")[0].split()
    assert execstart[0] == contract.container_runtime and "--remote-hostengine-info=localhost:5555" in execstart
    # ... with the exporter paired with the host engine's exact DCGM release (4.7.0 on the DLAMIs): before, a DCGM
    # 4.4.2 libdcgm (4.4.2-4.7.1) talked to the DLAMIs' 4.7.0 engine
    image = execstart[execstart.index("--volume") + 2]
    assert contract.dcgm_version and tag_dcgm_release(image) == contract.dcgm_version == "4.7.0", image


@pytest.mark.parametrize("key", WITH_HOST_ENGINE)
def test_after_the_image_the_container_gets_only_the_exporter_s_flags(key: str) -> None:
    """NVIDIA's image runs `exec /usr/bin/dcgm-exporter "$@"` (docker/dcgm-exporter-entrypoint.sh), and dcgm-exporter's
    urfave/cli v2 stops reading flags at the first positional argument (urfave/cli#1177): the `dcgm-exporter` word
    the role put after the image made every flag after it an ignored argument (default counters on :9400 and an
    embedded host engine beside the image's)."""
    contract = load_images()[key].contract
    passed, _ = render(contract.role_vars())
    args = passed["supervised_service_args"]
    after = args[args.index(contract.role_vars()["dcgm_exporter_image"]) + 1:]
    assert after and all(arg.startswith("--") for arg in after), after
    assert {arg.split("=", 1)[0] for arg in after} >= {"--collectors", "--address", "--remote-hostengine-info"}, after


def test_the_dcgm_4_exporter_images_are_the_distroless_variant_nvidia_publishes() -> None:
    """NVIDIA publishes only the distroless image from 4.5.3-4.8.2 on (NVIDIA/dcgm-exporter#703): the
    4.7.0-4.9.0-ubuntu22.04 tag recorded before names no image, and every GPU node's pull failed. The DCGM 3 pairing
    predates the distroless variant (4.3.1-4.4.1) and keeps its ubuntu22.04 image."""
    table = versions.load()["dcgm_exporter"]
    for dcgm, image in table["images"].items():
        variant = image.rsplit(":", 1)[1].split("-", 2)[2]
        assert variant == ("distroless" if major(dcgm) == "4" else "ubuntu22.04"), image


def test_a_binary_exporter_connects_to_the_host_engine_too() -> None:
    contract = load_images()["dlami-base-gpu-ubuntu-24.04"].contract
    passed, unit = render({**contract.role_vars(), "dcgm_exporter_runtime": "binary"})
    assert passed["supervised_service_args"] == [
        "--collectors=/etc/dcgm-exporter/fmcluster-counters.csv", f"--address={LISTEN}:9400",
        "--xid-count-window-size=300000", "--remote-hostengine-info=localhost:5555"]
    assert directives(unit, "Requires") == [contract.dcgm_service]


def test_where_the_image_ships_no_host_engine_the_exporter_embeds_its_own_as_before() -> None:
    dlami = load_images()["dlami-base-gpu-ubuntu-24.04"].contract
    contract = dataclasses.replace(dlami, dcgm_service=None, dcgm_version=None)
    variables = contract.role_vars()
    assert variables["dcgm_exporter_hostengine_service"] == ""
    passed, unit = render(variables)
    args = passed["supervised_service_args"]
    assert args[args.index("--publish") + 1] == f"{LISTEN}:9400:9400" and "--network" not in args, args
    assert "--address=:9400" in args and not [arg for arg in args if arg.startswith("--remote-hostengine-info")]
    assert passed["supervised_service_requires"] == [] and directives(unit, "Requires") == []
    assert directives(unit, "After") == ["network-online.target"]
    table = versions.load()["dcgm_exporter"]
    assert variables["dcgm_exporter_image"] == table["images"][table["embedded"]]


def test_the_exporter_image_is_the_one_paired_with_the_image_s_dcgm_release_from_one_table() -> None:
    """NVIDIA pairs each exporter release with a DCGM release and says to run it with that DCGM; a libdcgm of another
    release against the host engine is a version mismatch (4.4.2 against the DLAMIs' 4.7.0 before; DCGM 4.7.1 and an
    earlier release fail requests outright). The contract records the image's DCGM release (its release notes'
    dcgm_version), versions.yml holds one image per paired DCGM release, and the role holds none."""
    table = versions.load()["dcgm_exporter"]
    assert {tag_dcgm_release(image) for image in table["images"].values()} == set(table["images"])
    assert table["embedded"] in table["images"]
    for key, image in load_images().images.items():
        variables = image.contract.role_vars()
        assert variables["dcgm_exporter_hostengine_service"] == (image.contract.dcgm_service or ""), key
        if variables["dcgm_exporter_runtime"] == "container" and image.contract.dcgm_version is None:
            # a host engine of no recorded release (HyperPod's): no image, the role refuses, the walk names the gap
            assert image.contract.dcgm_service and "dcgm_exporter_image" not in variables, key
        elif variables["dcgm_exporter_runtime"] == "container":
            version = image.contract.dcgm_version
            assert version and "dlami/latest/devguide" in image.contract.sources["dcgm_version"], key
            assert variables["dcgm_exporter_image"] == table["images"][version], key
            assert tag_dcgm_release(variables["dcgm_exporter_image"]) == version, key
        else:
            assert "dcgm_exporter_image" not in variables, key
    dlami = load_images()["dlami-base-gpu-ubuntu-24.04"].contract
    assert _with(dlami, dcgm_version="3.3.9").role_vars()["dcgm_exporter_image"] == table["images"]["3.3.9"]
    assert "dcgm_exporter_image" not in _with(dlami, dcgm_version="99.0.0").role_vars()  # no guess
    # a DLAMI moving to DCGM 4.7.1 gets no 4.7.0 exporter (4.7.1 and an earlier libdcgm fail): a named gap instead
    assert "dcgm_exporter_image" not in _with(dlami, dcgm_version="4.7.1").role_vars()
    assert "dcgm_exporter_image" not in _with(dlami, dcgm_version=None).role_vars()
    defaults = _yaml(ROLE / "defaults" / "main.yml")
    assert defaults["dcgm_exporter_image"] == "" and defaults["dcgm_exporter_hostengine_service"] == ""
    assert "dcgm-exporter:" not in (ROLE / "defaults" / "main.yml").read_text()


def _with(contract: Contract, **changes: Any) -> Contract:
    return dataclasses.replace(contract, **changes)


def test_the_role_refuses_to_start_a_container_without_an_exporter_image() -> None:
    tasks = _yaml(ROLE / "tasks" / "main.yml")
    required = next(task for task in tasks if task["name"].startswith("Require the image's container CLI"))
    assert "dcgm_exporter_image | length > 0" in required["ansible.builtin.assert"]["that"]
    assert "dcgm_exporter_runtime == 'container'" in required["when"]


@pytest.mark.slow
def test_converged_in_check_mode_on_a_gpu_node_of_the_dlami_the_unit_requires_the_host_engine(tmp_path: Path) -> None:
    """The role itself, in --check --diff, on this machine given a /dev with two NVIDIA device nodes: nothing written,
    the unit it would write follows the image's host engine and the exporter connects to it."""
    from role_helpers import converge_role

    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (dev / name).touch()
    contract = load_images()["dlami-base-gpu-ubuntu-24.04"].contract
    service = f"fmcluster-dcgm-exporter-test-{tmp_path.name}"
    code, _, out = converge_role("dcgm_exporter", tmp_path, {
        **contract.role_vars(), "dcgm_exporter_dev_dir": str(dev), "dcgm_exporter_config_dir": str(tmp_path / "etc"),
        "dcgm_exporter_listen_address": "127.0.0.1", "dcgm_exporter_service_name": service}, "--check", "--diff")
    assert code == 0, out[-4000:]
    assert not (tmp_path / "etc").exists() and not Path(f"/etc/systemd/system/{service}.service").exists()
    added = [line[1:] for line in out.splitlines() if line.startswith("+")]
    assert f"Requires={contract.dcgm_service}" in added and f"After={contract.dcgm_service}" in added, out[-4000:]
    execstart = next(line for line in added if line.startswith("ExecStart="))
    assert "--network host" in execstart and "--remote-hostengine-info=localhost:5555" in execstart, execstart
    assert f"{contract.role_vars()['dcgm_exporter_image']} --collectors=" in execstart, execstart


@pytest.mark.parametrize("key", WITH_HOST_ENGINE)
def test_a_restart_after_a_crash_or_reboot_removes_the_leftover_container_first(key: str) -> None:
    """`docker run --name X` fails while a container X exists, and --rm removes it only when dockerd sees it exit: after
    a crash of dockerd or the host, or a SIGKILL of the client, every restart of the unit failed ("Conflict. The
    container name ... is already in use"). Each start first removes any such container, its failure ignored."""
    contract = load_images()[key].contract
    passed, unit = render(contract.role_vars())
    name = passed["supervised_service_name"]
    assert directives(unit, "ExecStartPre") == [f"-{contract.container_runtime} rm --force {name}"], unit
    lines = unit.splitlines()
    assert lines.index(f"ExecStartPre=-{contract.container_runtime} rm --force {name}") < \
        next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    execstart = directives(unit, "ExecStart")[0].split()
    assert execstart[1:5] == ["run", "--rm", "--name", name], execstart


def test_a_binary_exporter_removes_no_container() -> None:
    contract = load_images()["dlami-base-gpu-ubuntu-24.04"].contract
    passed, unit = render({**contract.role_vars(), "dcgm_exporter_runtime": "binary"})
    assert passed["supervised_service_exec_start_pre"] == [] and directives(unit, "ExecStartPre") == []
