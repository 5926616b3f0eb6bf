"""The local VPC's container registry: Debian's `docker-registry` (the CNCF distribution registry) on the VPC router
address, standing for the tenant's ECR.

On AWS a node pulls the tenant's images from ECR in its account through the instance role. Here the tenant's VPC
is a bridge with no route out, so the substrate puts a real registry where the account's registry endpoint would be
answered: the distribution registry (the registry ECR's API is modelled on), from Debian's packages, listening on the
private subnet's router address over plain HTTP (the only registry fmcluster-container reaches without TLS: the
role lists it as insecure, never an AWS tenant's). Its storage lives under the tenant's substrate directory and goes
with it; it is started with the tenant's hosts and stopped on destroy, as the package source is.

`push_bench_image` builds the CPU bench's image offline from the pristine node image's root file system (python3, sh,
coreutils' id/cat/ls and the libraries they load) and fmcluster's bench (fmcluster.acceptance.bench and what it
imports, under fmcluster.containers.BENCH_IMAGE_PYTHONPATH) with umoci and pushes it with skopeo: nothing leaves this
machine. The deploy pushes it (`ensure_bench_image`) where the acceptance's CPU jobs run from it, as an organization's
CI pushes its nccl-tests image to ECR before the gate runs; the tests push it under their own tags.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import fmcluster
from fmcluster.containers import BENCH_IMAGE_PYTHONPATH
from fmcluster.providers.local import image as node_image
from fmcluster.providers.local.daemons import answers, read_state, runs, start, stop
from fmcluster.providers.local.hosts import SubstrateError, substrate_root

PROGRAM = "docker-registry"
PORT = 5000
START_TIMEOUT_S = 20.0
#: The CPU bench's image (the acceptance's CPU jobs and the tests run it): its repository in the tenant's registry.
BENCH_REPOSITORY = "fmcluster/cpu-bench"
#: fmcluster's files the image carries, relative to the package's parent: the bench and what it imports (the rest is
#: the standard library). The build imports the bench inside the image and fails if this list falls short.
BENCH_SOURCES = ("fmcluster/__init__.py", "fmcluster/exits.py", "fmcluster/acceptance/bench.py")
#: What the bench image holds from the node image: the programs and what they load (found with the image's ldd).
TEST_PROGRAMS = ("/usr/bin/python3.11", "/usr/bin/dash", "/usr/bin/id", "/usr/bin/cat", "/usr/bin/ls", "/usr/bin/env",
                 "/usr/bin/hostname", "/usr/bin/touch", "/usr/bin/stat", "/usr/bin/nproc")
#: Parts of Python's standard library no test or bench imports (a smaller image, pushed and unpacked faster).
TEST_PYTHON_SKIPPED = ("test", "idlelib", "tkinter", "ensurepip", "lib2to3", "pydoc_data", "turtledemo")


@dataclass(frozen=True)
class Registry:
    address: str
    port: int
    pid: int
    started: bool

    @property
    def host(self) -> str:
        """host:port, as image references name it (and the role's slurm_containers_registries)."""
        return f"{self.address}:{self.port}"

    @property
    def note(self) -> str:
        how = "started" if self.started else "running"
        return (f"container registry: docker-registry (the distribution registry, standing for the tenant's ECR) {how} "
                f"on {self.host}, the VPC router address (on AWS: <account>.dkr.ecr.<region>.amazonaws.com)")


def _state_path(org: str) -> Path:
    return substrate_root(org) / "registry.json"


def config_text(address: str, storage: Path) -> str:
    """The registry's configuration (distribution's `version: 0.1` file): filesystem storage, deletes off, HTTP on
    the router address only."""
    return json.dumps({"version": 0.1, "log": {"level": "info", "accesslog": {"disabled": True}},
                       "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": False}},
                       "http": {"addr": f"{address}:{PORT}"}}, indent=2) + "\n"


def ensure_registry(org: str, address: str) -> Registry:
    """The tenant's registry on `address` (the VPC router address), started unless it runs."""
    state = _state_path(org)
    known = read_state(state)
    pid = int(known.get("pid", 0))
    folder = substrate_root(org) / "registry"
    config = folder / "config.yml"  # JSON is YAML: the registry reads it as its YAML configuration
    if known.get("address") == address and runs(pid, PROGRAM, str(config)) and answers(address, PORT):
        return Registry(address, PORT, pid, False)
    if runs(pid, PROGRAM, str(config)):
        stop_registry(org)
    (folder / "storage").mkdir(parents=True, exist_ok=True)
    config.write_text(config_text(address, folder / "storage"))
    pid = start([PROGRAM, "serve", str(config)], folder / "console.log", address, PORT, START_TIMEOUT_S,
                "the container registry (docker-registry)")
    state.write_text(json.dumps({"pid": pid, "address": address, "port": PORT}) + "\n")
    return Registry(address, PORT, pid, True)


def stop_registry(org: str, timeout_s: float = 10.0) -> bool:
    """Stop the tenant's registry if it runs (its storage goes with the substrate directory). True if stopped."""
    state = _state_path(org)
    known = read_state(state)
    state.unlink(missing_ok=True)
    pid = int(known.get("pid", 0))
    if not runs(pid, PROGRAM, str(substrate_root(org) / "registry" / "config.yml")):
        return False
    stop(pid, timeout_s)
    return True


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
    except FileNotFoundError:
        raise SubstrateError(f"{argv[0]} is missing; run scripts/bootstrap.sh (it installs skopeo and umoci from "
                             "Debian's packages)") from None
    if done.returncode != 0:
        raise SubstrateError(f"{what} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout


def cpu_test_rootfs(node_rootfs: Path, target: Path) -> None:
    """A small root file system from the node image's own files: TEST_PROGRAMS, the libraries they load (the
    image's ldd, in a chroot), Python's standard library less TEST_PYTHON_SKIPPED, passwd/group; usrmerge links."""
    for folder in ("usr/bin", "usr/lib", "usr/lib64", "usr/sbin", "etc", "tmp", "root", "proc", "sys", "dev"):
        (target / folder).mkdir(parents=True, exist_ok=True)
    (target / "tmp").chmod(0o1777)
    for link in ("bin", "lib", "lib64", "sbin"):
        (target / link).symlink_to(f"usr/{link}")
    listed = _run(["chroot", str(node_rootfs), "ldd", *TEST_PROGRAMS], "ldd in the node image")
    libraries = sorted({word for word in listed.split() if word.startswith("/") and ".so" in word})
    wanted = [*TEST_PROGRAMS, *libraries]
    # The image's links are absolute (usrmerge: /lib64/ld-linux... -> /usr/lib/...): resolved inside it.
    resolved = _run(["chroot", str(node_rootfs), "readlink", "-f", *wanted], "readlink in the node image").split()
    for path, real in zip(wanted, resolved, strict=True):
        copy = target / real.lstrip("/")
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(node_rootfs / real.lstrip("/"), copy)
        if real != path and not (target / path.lstrip("/")).exists():
            (target / path.lstrip("/")).symlink_to(real)
    (target / "usr/bin/sh").symlink_to("dash")
    (target / "usr/bin/python3").symlink_to("python3.11")
    shutil.copytree(node_rootfs / "usr/lib/python3.11", target / "usr/lib/python3.11", symlinks=True,
                    ignore=lambda folder, names: [n for n in names if n in TEST_PYTHON_SKIPPED or n == "__pycache__"])
    for name in ("passwd", "group", "nsswitch.conf"):
        shutil.copy2(node_rootfs / "etc" / name, target / "etc" / name)


def _bench_sources() -> dict[str, bytes]:
    package_parent = Path(fmcluster.__file__).parent.parent
    return {name: (package_parent / name).read_bytes() for name in BENCH_SOURCES}


def bench_tag() -> str:
    """The bench image's tag: the bench's version and a digest of all it is built from (the node image, the programs,
    fmcluster's files), so a changed bench or node image is a new tag and a deploy never runs a stale one."""
    from fmcluster.acceptance.bench import VERSION

    made_of = hashlib.sha256(json.dumps({"node_image": node_image.digest(), "programs": TEST_PROGRAMS,
                                         "skipped": TEST_PYTHON_SKIPPED}, sort_keys=True).encode())
    for name, content in sorted(_bench_sources().items()):
        made_of.update(name.encode() + b"\0" + content)
    return f"{VERSION}-{made_of.hexdigest()[:12]}"


def bench_reference(registry_host: str) -> str:
    """The bench image's reference in the registry at `registry_host` (host:port), as the nodes pull it."""
    return f"{registry_host}/{BENCH_REPOSITORY}:{bench_tag()}"


def _add_bench(rootfs: Path) -> None:
    """fmcluster's bench under BENCH_IMAGE_PYTHONPATH; the image's fmcluster.acceptance holds the bench alone, so its
    package file is written here (the checkout's imports the judging side, which needs PyYAML)."""
    lib = rootfs / BENCH_IMAGE_PYTHONPATH.lstrip("/")
    for name, content in _bench_sources().items():
        (lib / name).parent.mkdir(parents=True, exist_ok=True)
        (lib / name).write_bytes(content)
    (lib / "fmcluster/acceptance/__init__.py").write_text(
        '"""fmcluster\'s CPU bench, alone: the image\'s copy (fmcluster.providers.local.registry)."""\n')
    _run(["chroot", str(rootfs), "/usr/bin/env", f"PYTHONPATH={BENCH_IMAGE_PYTHONPATH}", "/usr/bin/python3", "-c",
          "import fmcluster.acceptance.bench"], "importing the bench inside its image")


def push_bench_image(registry: Registry, node_rootfs: Path, tag: str | None = None) -> str:
    """Build the bench image from the node image (umoci init/new/unpack/repack/config) and fmcluster's bench and push
    it to the tenant's registry with skopeo under `tag` (default: bench_tag()); its reference."""
    tag = tag or bench_tag()
    reference = f"{registry.host}/{BENCH_REPOSITORY}:{tag}"
    with tempfile.TemporaryDirectory(prefix="fmcluster-bench-image.") as scratch:
        layout, bundle = Path(scratch) / "layout", Path(scratch) / "bundle"
        image = f"{layout}:{tag}"
        _run(["umoci", "init", "--layout", str(layout)], "umoci init")
        _run(["umoci", "new", "--image", image], "umoci new")
        _run(["umoci", "unpack", "--image", image, str(bundle)], "umoci unpack")
        shutil.rmtree(bundle / "rootfs")
        cpu_test_rootfs(node_rootfs, bundle / "rootfs")
        _add_bench(bundle / "rootfs")
        _run(["umoci", "repack", "--image", image, str(bundle)], "umoci repack")
        _run(["umoci", "config", "--image", image, "--config.cmd", "/usr/bin/python3",
              "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin",
              "--config.env", f"PYTHONPATH={BENCH_IMAGE_PYTHONPATH}"], "umoci config")
        _run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{image}", f"docker://{reference}"],
             f"skopeo copy to {reference}")
    return reference


@dataclass(frozen=True)
class BenchImage:
    reference: str
    pushed: bool  # by this call
    seconds: float

    @property
    def note(self) -> str:
        how = f"built from the node image and pushed in {self.seconds:.0f}s" if self.pushed else "in the registry"
        return (f"acceptance image: fmcluster's CPU bench {self.reference}, {how} (standing for the organization's "
                "image pushed to its ECR); the CPU queues' acceptance jobs run from it")


def ensure_bench_image(registry: Registry, node_rootfs: Path) -> BenchImage:
    """The bench image of this checkout in the tenant's registry, pushed unless its tag is there already."""
    reference = bench_reference(registry.host)
    there = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{reference}"],
                           capture_output=True, text=True, check=False, timeout=120)
    if there.returncode == 0:
        return BenchImage(reference, False, 0.0)
    started = time.monotonic()
    push_bench_image(registry, node_rootfs)
    return BenchImage(reference, True, time.monotonic() - started)
