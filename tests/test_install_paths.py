"""The install paths, as far as this machine allows: a local HTTP server stands in for the tenant's S3 mirror and a
prepared sysfs-shaped tree (accel_detect_root) stands in for the PCI bus. Nothing is installed: the EFA run stops
at the checksum, the NVIDIA and Neuron runs are --check."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import HOST_PYTHON, ROOT, venv_tool

pytestmark = pytest.mark.slow


class _Mirror(http.server.SimpleHTTPRequestHandler):
    requested: list[str] = []

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature of the base class
        _Mirror.requested.append(self.path)


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "bucket"
    for key in ("mirror/cuda/debian12/x86_64/3bf863cc.pub", "mirror/libnvidia-container/gpgkey",
                "mirror/neuron/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB"):
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n(test key)\n", encoding="ascii")
    tampered = io.BytesIO()
    with tarfile.open(fileobj=tampered, mode="w:gz") as tar:
        info = tarfile.TarInfo("aws-efa-installer/efa_installer.sh")
        payload = b"#!/bin/sh\necho this must never run\nexit 1\n"
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    (root / "mirror/efa").mkdir(parents=True)
    (root / "mirror/efa/aws-efa-installer-1.49.0.tar.gz").write_bytes(tampered.getvalue())
    _Mirror.requested = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Mirror(*a, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mirror", root
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A sysfs-shaped tree with 2 GPUs + 1 NVSwitch, 2 EFA and 1 Trainium function."""
    root = tmp_path / "node"
    for address, vendor, device, pci_class in [
        ("0000:10:00.0", "0x10de", "0x2330", "0x030200"), ("0000:11:00.0", "0x10de", "0x2330", "0x030200"),
        ("0000:12:00.0", "0x10de", "0x22a3", "0x068000"), ("0000:20:00.0", "0x1d0f", "0xefa1", "0x020000"),
        ("0000:21:00.0", "0x1d0f", "0xefa1", "0x020000"), ("0000:30:00.0", "0x1d0f", "0x7164", "0x120000"),
    ]:
        node_dir = root / "sys/bus/pci/devices" / address
        node_dir.mkdir(parents=True)
        for name, value in {"vendor": vendor, "device": device, "class": pci_class}.items():
            (node_dir / name).write_text(value + "\n", encoding="ascii")
    (root / "dev").mkdir()
    return root


def run_role(tmp_path: Path, role: str, variables: dict[str, Any], *args: str) -> tuple[int, dict[str, Any]]:
    play = tmp_path / f"{role}.yml"
    play.write_text(f"- hosts: localhost\n  gather_facts: true\n  roles: [{role}]\n", encoding="utf-8")
    extra = tmp_path / f"{role}-vars.json"
    extra.write_text(json.dumps({"ansible_python_interpreter": HOST_PYTHON, **variables}), encoding="utf-8")
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_CACHE_PLUGIN": "memory"}
    proc = subprocess.run([venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", f"@{extra}", str(play), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, json.loads(proc.stdout)


def image_vars(image: str, *names: str) -> dict[str, Any]:
    """The named role variables the manifest gives a node booted from `image` (its contract's paths)."""
    from fmcluster.images import load_images

    variables = load_images()[image].contract.role_vars()
    return {name: variables[name] for name in names}


def results(run: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(t["task"]["name"], t["hosts"]["localhost"]) for p in run["plays"] for t in p["tasks"] if "localhost" in t["hosts"]]


def test_a_tampered_efa_tarball_from_the_mirror_is_refused_by_its_checksum(tmp_path: Path, mirror: tuple[str, Path], node: Path) -> None:
    url, root = mirror
    work = tmp_path / "efa-work"
    rc, run = run_role(tmp_path, "efa", {
        "accel_detect_root": str(node), "efa_expected_interfaces": 2, "efa_require_devices": False, "efa_source": "s3",
        "efa_mirror_url": url, "efa_work_dir": str(work), "efa_limits_file": str(tmp_path / "limits.conf"),
        **image_vars("dlami-base-gpu-ubuntu-24.04", "efa_fi_info", "efa_installed_marker"),
    })
    assert rc != 0
    failed = [(name, r) for name, r in results(run) if r.get("failed")]
    assert [name for name, _ in failed] == ["efa : Download the EFA installer and verify its SHA-256 (s3)"]
    actual = hashlib.sha256((root / "mirror/efa/aws-efa-installer-1.49.0.tar.gz").read_bytes()).hexdigest()
    assert "checksum" in failed[0][1]["msg"].lower()
    assert actual != "cf2e9281a2328a243c76f911a490faed43ca0fecfe4733c25e34b2e92a32c309"
    assert "/mirror/efa/aws-efa-installer-1.49.0.tar.gz" in _Mirror.requested
    assert not (work / "aws-efa-installer").exists() and not (tmp_path / "limits.conf").exists()


@pytest.mark.parametrize(("role", "variables", "stop"), [
    ("efa", {"efa_expected_interfaces": 2, "efa_require_devices": False},
     "efa : Stop where the node's image names no EFA installer prefix"),
    ("neuron", {"neuron_expected_devices": 1}, "neuron : Stop where the node's image names no Neuron tools"),
])
def test_a_node_whose_image_names_no_path_for_its_devices_stops_before_anything_is_installed(
        tmp_path: Path, node: Path, role: str, variables: dict[str, Any], stop: str) -> None:
    """Issue 36: the EFA installer's fi_info and the Neuron tools' directory are facts of the node's image (its
    contract's efa_home, neuron_bin_dir), never the role's guess: converged without them on a node with the devices,
    the role stops first, naming the fact, and changes nothing."""
    rc, run = run_role(tmp_path, role, {"accel_detect_root": str(node), **variables}, "--check")
    assert rc != 0
    failed = [(name, r) for name, r in results(run) if r.get("failed")]
    assert [name for name, _ in failed] == [stop]
    assert "src/fmcluster/data/images.yml" in failed[0][1]["msg"]
    assert not [name for name, r in results(run) if r.get("changed")]


def test_nvidia_install_path_in_check_mode_uses_the_mirror_and_writes_nothing(tmp_path: Path, mirror: tuple[str, Path], node: Path) -> None:
    url, _ = mirror
    before = sorted(os.listdir("/etc/apt/sources.list.d"))
    rc, run = run_role(tmp_path, "nvidia_driver", {
        "accel_detect_root": str(node), "nvidia_driver_expected_gpus": 2, "nvidia_driver_fabric_manager": True,
        "nvidia_driver_container_toolkit": True, "nvidia_driver_source": "s3", "nvidia_driver_mirror_url": url,
    }, "--check", "--diff")
    assert rc == 0, [r.get("msg") for _, r in results(run) if r.get("failed")]
    assert sorted(os.listdir("/etc/apt/sources.list.d")) == before
    sources = [r for name, r in results(run) if name.endswith("Add the NVIDIA apt repositories (s3)")][0]
    written = [item["diff"][0]["after"] if isinstance(item["diff"], list) else item["diff"]["after"] for item in sources["results"]]
    assert f"URIs: {url}/cuda/debian12/x86_64/\n" in written[0]
    assert f"URIs: {url}/libnvidia-container/amd64/\n" in written[1]
    assert {"/mirror/cuda/debian12/x86_64/3bf863cc.pub", "/mirror/libnvidia-container/gpgkey"} <= set(_Mirror.requested)


def test_neuron_install_path_in_check_mode_uses_the_mirror_and_writes_nothing(tmp_path: Path, mirror: tuple[str, Path], node: Path) -> None:
    url, _ = mirror
    rc, run = run_role(tmp_path, "neuron", {
        "accel_detect_root": str(node), "neuron_expected_devices": 1, "neuron_source": "s3", "neuron_mirror_url": url,
        "neuron_profile_path": str(tmp_path / "neuron.sh"), **image_vars("neuron-dlami-ubuntu-24.04", "neuron_bin_dir"),
    }, "--check", "--diff")
    assert rc == 0, [r.get("msg") for _, r in results(run) if r.get("failed")]
    assert not Path("/etc/apt/sources.list.d/fmcluster-neuron.sources").exists() and not (tmp_path / "neuron.sh").exists()
    assert "/mirror/neuron/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB" in _Mirror.requested


def test_the_neuron_dlami_s_own_entry_of_the_neuron_repository_is_used_never_listed_twice(
        tmp_path: Path, mirror: tuple[str, Path], node: Path) -> None:
    """The Neuron DLAMI lists the Neuron repository itself (neuron.list, its key in apt's trusted keys): a second entry
    of ours with a Signed-By makes apt refuse every source list, and with it every apt task of the converge. The role
    uses the image's entry, fetches no key, writes no second entry and removes one of ours left from before."""
    url, _ = mirror
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "keyrings").mkdir()
    image_entry = apt / "sources.list.d" / "neuron.list"
    image_entry.write_text(f"deb {url}/neuron jammy main\n", encoding="ascii")
    ours = apt / "sources.list.d" / "fmcluster-neuron.sources"
    ours.write_text(f"Types: deb\nURIs: {url}/neuron\nSuites: jammy\nComponents: main\n"
                    f"Signed-By: {apt}/keyrings/fmcluster-neuron.asc\n", encoding="ascii")
    rc, run = run_role(tmp_path, "neuron", {
        "accel_detect_root": str(node), "neuron_expected_devices": 1, "neuron_source": "s3", "neuron_mirror_url": url,
        "neuron_profile_path": str(tmp_path / "neuron.sh"), "neuron_apt_dir": str(apt),
        **image_vars("neuron-dlami-ubuntu-24.04", "neuron_bin_dir"),
    }, "--check", "--diff")
    assert rc == 0, [r.get("msg") for _, r in results(run) if r.get("failed")]
    by_name = dict(results(run))
    said = by_name["neuron : Say that the image lists the Neuron repository itself"]["msg"]
    assert str(image_entry) in said and str(ours) not in said, said
    assert by_name["neuron : Remove an entry of ours for the repository the image lists itself"]["changed"]
    assert by_name["neuron : Add the Neuron apt repository (s3)"].get("skipped")
    assert "/mirror/neuron/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB" not in _Mirror.requested  # the image's key, not ours
    assert ours.exists() and image_entry.exists()  # --check wrote and removed nothing


def test_nccl_for_an_image_without_it_comes_from_nvidia_s_repository_beside_a_service_owned_driver(
        tmp_path: Path, mirror: tuple[str, Path], node: Path) -> None:
    """ParallelCluster's AMI: its driver is checked, never reinstalled, but NCCL (which it lacks) is added from the
    CUDA repository at the pin (--check: the repository is written in the diff only, the install is planned)."""
    url, _ = mirror
    before = sorted(os.listdir("/etc/apt/sources.list.d"))
    rc, run = run_role(tmp_path, "nvidia_driver", {
        "accel_detect_root": str(node), "nvidia_driver_expected_gpus": 2, "nvidia_driver_fabric_manager": True,
        "nvidia_driver_manage_stack": False, "nvidia_driver_install_nccl": True,
        "nvidia_driver_source": "s3", "nvidia_driver_mirror_url": url,
    }, "--check", "--diff")
    assert rc == 0, [r.get("msg") for _, r in results(run) if r.get("failed")]
    assert sorted(os.listdir("/etc/apt/sources.list.d")) == before
    names = [name for name, _ in results(run)]
    assert not any(name.endswith("Install what the image lacks") for name in names)  # the driver stays the image's
    sources = [r for name, r in results(run) if name.endswith("Add the NVIDIA apt repositories (s3)")][0]
    written = [item["diff"][0]["after"] if isinstance(item["diff"], list) else item["diff"]["after"] for item in sources["results"]]
    assert written == [f"# generated by fmcluster (nvidia_driver role); edits will be reverted\nTypes: deb\n"
                       f"URIs: {url}/cuda/debian12/x86_64/\nSuites: /\n"
                       "Signed-By: /etc/apt/keyrings/fmcluster-cuda.asc\n"]
    assert "nvidia_driver : Install NCCL from NVIDIA's CUDA repository, version 2.27.7-1+cuda12.9" in names


def test_a_repository_the_image_already_lists_is_used_as_listed_never_listed_twice(
        tmp_path: Path, mirror: tuple[str, Path], node: Path) -> None:
    """An image that lists NVIDIA's CUDA repository itself (NVIDIA's cuda-keyring writes cuda-<distro>-<arch>.list with
    signed-by its own keyring) next to a second entry of ours with another Signed-By makes apt refuse every source list
    ("Conflicting values set for option Signed-By"), and with it every apt task of the converge. The role uses the
    image's entry and key, writes no second one, removes one of ours left from before, and refreshes the lists before
    it installs NCCL (in --check that install is planned only)."""
    url, _ = mirror
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "keyrings").mkdir()  # Ubuntu ships /etc/apt/keyrings (--check creates no directory)
    (apt / "sources.list").write_text("# deb http://archive.example/debian bookworm main\n", encoding="ascii")
    image_entry = apt / "sources.list.d" / "cuda-debian12-x86_64.list"
    image_entry.write_text(f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {url}/cuda/debian12/x86_64/ /\n",
                           encoding="ascii")
    # NVIDIA's own list of the container toolkit names the architecture as apt expands it, $(ARCH).
    toolkit_entry = apt / "sources.list.d" / "nvidia-container-toolkit.list"
    toolkit_entry.write_text("deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
                             f"{url}/libnvidia-container/$(ARCH) /\n", encoding="ascii")
    ours = apt / "sources.list.d" / "fmcluster-cuda.sources"
    ours.write_text(f"Types: deb\nURIs: {url}/cuda/debian12/x86_64/\nSuites: /\n"
                    f"Signed-By: {apt}/keyrings/fmcluster-cuda.asc\n", encoding="ascii")
    rc, run = run_role(tmp_path, "nvidia_driver", {
        "accel_detect_root": str(node), "nvidia_driver_expected_gpus": 2, "nvidia_driver_fabric_manager": True,
        "nvidia_driver_manage_stack": False, "nvidia_driver_install_nccl": True, "nvidia_driver_container_toolkit": True,
        "nvidia_driver_source": "s3", "nvidia_driver_mirror_url": url, "nvidia_driver_apt_dir": str(apt),
    }, "--check", "--diff")
    assert rc == 0, [r.get("msg") for _, r in results(run) if r.get("failed")]
    by_name = dict(results(run))
    said = by_name["nvidia_driver : Say which repositories are the image's own"]["msg"]
    assert "fmcluster-cuda, fmcluster-nvidia-container-toolkit" in said, said
    assert str(image_entry) in said and str(toolkit_entry) in said and str(ours) not in said
    added = by_name["nvidia_driver : Add the NVIDIA apt repositories (s3)"]
    assert not added.get("results") and not added.get("changed"), added  # no second entry of the repository
    assert by_name["nvidia_driver : Remove an entry of ours for a repository the image lists itself"]["changed"]
    assert "/mirror/cuda/debian12/x86_64/3bf863cc.pub" not in _Mirror.requested  # the image's key, not ours
    assert by_name["nvidia_driver : Install NCCL from NVIDIA's CUDA repository, version 2.27.7-1+cuda12.9"].get("skipped")
    assert ours.exists() and image_entry.exists()  # --check wrote and removed nothing

    # An image whose entry is commented out, or sits in a file apt does not read, lists nothing: ours is written.
    ours.unlink()
    toolkit_entry.unlink()
    image_entry.rename(image_entry.with_suffix(".list.save"))
    (apt / "sources.list.d" / "old.list").write_text(f"# deb {url}/cuda/debian12/x86_64/ /\n", encoding="ascii")
    rc, run = run_role(tmp_path, "nvidia_driver", {
        "accel_detect_root": str(node), "nvidia_driver_expected_gpus": 2, "nvidia_driver_fabric_manager": True,
        "nvidia_driver_manage_stack": False, "nvidia_driver_install_nccl": True,
        "nvidia_driver_source": "s3", "nvidia_driver_mirror_url": url, "nvidia_driver_apt_dir": str(apt),
    }, "--check", "--diff")
    assert rc == 0, [r.get("msg") for _, r in results(run) if r.get("failed")]
    by_name = dict(results(run))
    assert by_name["nvidia_driver : Say which repositories are the image's own"].get("skipped")
    assert by_name["nvidia_driver : Add the NVIDIA apt repositories (s3)"]["changed"]
