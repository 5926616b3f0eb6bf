"""The image catalog: what each image fmcluster's nodes boot ships, and what first boot adds (data/images.yml).

Which image a node gets is the scheduler's choice (`Scheduler.image`: by the instance's accelerator on
slurm-ec2, the service's own image where a service makes the cluster); this module only reads the catalog and
says, for plan and the deploy summary, which image each node kind boots.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal, get_args

import yaml

from fmcluster import versions
from fmcluster.capabilities import scheduler_data
from fmcluster.nccl import parse_version
from fmcluster.paths import DATA_DIR, PACKAGE_DIR

if TYPE_CHECKING:
    from fmcluster.model import Tenant

IMAGES_PATH = DATA_DIR / "images.yml"
#: This repository's docs, which the local substrate's own image cites for what no public page can say.
REPO_DOCS = PACKAGE_DIR.parent.parent / "docs"
Source = Literal["ssm", "chosen", "built"]
COMPONENTS = ("python", "aws_cli", "nvidia_driver", "efa_installer", "neuron", "lustre_client", "slurm")
ACCELERATORS = ("cuda", "neuron", "none")


class ImageCatalogError(ValueError):
    """images.yml breaks one of its rules; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class Component:
    present: bool
    version: str | None
    source: str


Init = Literal["systemd", "none"]
#: "hybrid-read-only": v1 controllers mounted read-only (a container whose manager delegates none of them).
Cgroup = Literal["v2", "v1", "hybrid", "hybrid-read-only"]
SlurmInstaller = Literal["fmcluster", "service"]
AcceleratorStack = Literal["upgradable", "service-owned", "none"]
#: roles/dcgm_exporter's runtime on an image that ships no container runtime: no exporter, said plainly.
DCGM_EXPORTER_ABSENT = "none"
#: Slurm's first release with a cgroup v2 plugin (https://slurm.schedmd.com/cgroup_v2.html).
SLURM_CGROUP_V2_SINCE = (22, 5)


@dataclass(frozen=True)
class Contract:
    """What the roles may assume of a node booted from an image (images.yml's `contract`, each fact with its source)."""

    default_user: str
    init: Init
    cgroup: Cgroup
    slurm_version: str | None
    slurm_installed_by: SlurmInstaller
    nccl_home: str | None
    ofi_nccl_lib_dirs: tuple[str, ...]
    #: The CUDA toolkit nccl-tests builds with (nvcc, lib64/), or None: the image has no CUDA toolkit.
    cuda_home: str | None
    #: The EFA installer's prefix (libfabric: bin/fi_info, lib/), or None: the image has no EFA installer.
    efa_home: str | None
    #: The Open MPI nccl-tests builds and runs with (bin/mpicc, lib/), or None: the image has none.
    mpi_home: str | None
    accelerator_stack: AcceleratorStack
    imds_access_tool: str | None
    neuron_bin_dir: str | None
    dcgm_service: str | None
    #: The DCGM release the image ships (its release notes' dcgm_version), or None: it ships no DCGM, or no public
    #: source names the release. Its major picks the dcgm-exporter image that talks to that host engine.
    dcgm_version: str | None
    #: The image's python3, which the node's plays run their modules with (role_vars: ansible_python_interpreter).
    python_interpreter: str
    reboot_program: str | None
    #: Where the Slurm clients are when a non-login shell's PATH lacks them (a service's /opt/slurm/bin), or None.
    slurm_bin_dir: str | None
    #: The container CLI the image ships with NVIDIA's GPU support for containers (Docker and the NVIDIA Container
    #: Toolkit: `docker run --gpus`), or None: the image ships no container runtime.
    container_runtime: str | None
    sources: dict[str, str]

    def slurm_cgroups(self) -> bool:
        """Slurm may use its cgroup plugins: systemd delegates a subtree, and the Slurm knows the hierarchy."""
        if self.init != "systemd" or self.slurm_version is None or self.cgroup == "hybrid-read-only":
            return False
        if self.cgroup == "v1":
            return True
        major, minor = (int(part) for part in self.slurm_version.split(".")[:2])
        return (major, minor) >= SLURM_CGROUP_V2_SINCE

    def dcgm_exporter_image(self) -> str | None:
        """NVIDIA's dcgm-exporter image for a GPU node booted from this image (versions.yml dcgm_exporter, by the DCGM
        release an exporter release is paired with): where the image ships DCGM's host engine the exporter connects to
        it, so its libdcgm is that engine's exact release (dcgm_version; NVIDIA pairs them, and libdcgm and a host
        engine of other releases fail requests with "API version mismatch"); where it ships none the exporter runs its
        own embedded engine, of the table's `embedded` release. None: the image's host engine has no known release, or
        the table no image paired with it (a gap the image-contract test names)."""
        table = versions.load()["dcgm_exporter"]
        if self.dcgm_service is None:
            release = str(table["embedded"])
        elif self.dcgm_version is None:
            return None
        else:
            release = self.dcgm_version
        image = table["images"].get(release)
        return str(image) if image else None

    def role_vars(self) -> dict[str, Any]:
        """The role variables this contract decides, for every node booted from the image (manifest group vars)."""
        variables: dict[str, Any] = {
            "nccl_plugin_dirs": list(self.ofi_nccl_lib_dirs),
            "nccl_tests_ofi_nccl_lib_dirs": list(self.ofi_nccl_lib_dirs),
            # Empty where the image has none: the roles stop with a message there, never at a guessed path.
            "nccl_tests_cuda_home": self.cuda_home or "",
            "nccl_tests_mpi_home": self.mpi_home or "",
            "nccl_tests_efa_home": self.efa_home or "",
            # The EFA installer's fi_info, and the record of what it installed, beside its prefix (ParallelCluster's
            # cookbook reads both to find an image's EFA: https://github.com/aws/aws-parallelcluster-cookbook,
            # aws-parallelcluster-environment's EFA recipe, `cat /opt/amazon/efa_installed_packages`).
            "efa_fi_info": f"{self.efa_home}/bin/fi_info" if self.efa_home else "",
            "efa_installed_marker": f"{PurePosixPath(self.efa_home).parent}/efa_installed_packages" if self.efa_home else "",
            # A service-owned stack (HyperPod's) is checked, never reinstalled or upgraded to the pins.
            "efa_manage_stack": self.accelerator_stack == "upgradable",
            "nvidia_driver_manage_stack": self.accelerator_stack == "upgradable",
            "neuron_manage_stack": self.accelerator_stack == "upgradable",
            "imds_guard_access_tool": self.imds_access_tool or "",
            # The operator logs in as the image's default user (roles/operator_access keeps the key under /etc/ssh).
            "operator_access_user": self.default_user,
            # ... and submits the acceptance jobs as that user: it needs an association where they are enforced.
            "slurm_associations_operator": self.default_user,
            # ... which, where they run from an image, it runs as itself (roles/slurm_containers).
            "slurm_containers_operator": self.default_user,
            # Every play on the node runs its modules with the image's python3, not the toolchain's venv: Mitogen's
            # strategy (fmcluster.node.agent) runs a module in place, so Ansible's apt modules cannot re-start
            # themselves under the interpreter that has the distribution's apt binding, as they do from the venv.
            "ansible_python_interpreter": self.python_interpreter,
        }
        # An image without NCCL gets NVIDIA's packages on its GPU nodes (roles/nvidia_driver,
        # versions.yml nvidia.nccl_package), and nccl-tests builds against where they put it.
        variables["nvidia_driver_install_nccl"] = self.nccl_home is None
        variables["nccl_tests_nccl_home"] = self.nccl_home or versions.packaged_nccl_home()
        # the neuron role checks the Neuron stack with neuron-ls from here; empty: the image ships no Neuron tools
        variables["neuron_bin_dir"] = self.neuron_bin_dir or ""
        # A GPU node's boot diagnostic (roles/node_health) wants and follows DCGM's host engine where the image ships
        # one; without it, the unit names none.
        variables["node_health_dcgm_service"] = self.dcgm_service or ""
        # NVIDIA's dcgm-exporter runs as NVIDIA's container under the image's own container CLI; an image without one
        # gets no exporter: the role says why, Prometheus scrapes no dcgm target there and plan
        # lists the gap (gpu_exporter_gap). GPU health there comes from fmcluster-health's DCGM checks.
        variables["dcgm_exporter_runtime"] = "container" if self.container_runtime else DCGM_EXPORTER_ABSENT
        if self.container_runtime:
            variables["dcgm_exporter_docker"] = self.container_runtime
            # The exporter's DCGM is the image's host engine's major (a DCGM-3 exporter against a DCGM-4 engine is
            # a version mismatch); no image derivable: none given, and the role refuses to start (the contract
            # test names the gap first).
            exporter_image = self.dcgm_exporter_image()
            if exporter_image:
                variables["dcgm_exporter_image"] = exporter_image
        # Where the image runs DCGM's host engine, the exporter connects to it (dcgm-exporter -r) and its unit
        # requires and follows it; a second, embedded engine beside it contends for the GPUs' profiling counters
        # (docs/monitoring.md). Empty: the exporter embeds its own.
        variables["dcgm_exporter_hostengine_service"] = self.dcgm_service or ""
        if self.slurm_installed_by == "fmcluster":
            variables["slurm_use_cgroup"] = self.slurm_cgroups()
            # slurm.conf's RebootProgram, which `scontrol reboot` (the repair agent's reboot) runs; empty: none.
            variables["slurm_reboot_program"] = self.reboot_program or ""
        return variables


#: Where the EFA installer puts the aws-ofi-nccl plugin, by the image's distribution and the installer's release. The
#: public sources disagree on the release that moved it off Debian's multiarch directory on Ubuntu: AWS's Deep Learning
#: Containers check lib/ (libnccl-net-ofi.so) from 1.44.0 and lib/<arch>-linux-gnu/ (libnccl-net.so) before
#: (https://github.com/aws/deep-learning-containers/blob/main/scripts/docker/common/install_efa.sh, commit 70722f35,
#: November 2025), while awsome-distributed-training's nccl-tests image found its plugin under lib/x86_64-linux-gnu/
#: with the installer 1.47.0 and under lib/ with 1.48.0 ("EFA 1.48 ships the OFI NCCL plugin at /opt/amazon/ofi-nccl/lib/
#: directly (no x86_64-linux-gnu subdir)",
#: https://github.com/awslabs/awsome-distributed-ai/commit/16da837e33e1ce3a226b690b480602527af1cb14). No EFA changelog
#: entry read here names the move, so a release between the two claims may use either directory and an image whose
#: release is not recorded either one: its contract must list both (a directory the image lacks is skipped by the
#: roles). On Amazon Linux 2023 the same Deep Learning Containers put it under lib64/ from 1.44.0 and under
#: lib/<arch>-linux-gnu/ before (https://github.com/aws/deep-learning-containers/blob/main/scripts/docker/common/
#: install_efa_amzn2023.sh). x86_64 only: the catalog has no Arm GPU image.
OFI_NCCL_ARCH_DIR = "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu"
OFI_NCCL_FLAT_DIR = "/opt/amazon/ofi-nccl/lib"
OFI_NCCL_LIB64_DIR = "/opt/amazon/ofi-nccl/lib64"


@dataclass(frozen=True)
class OfiNcclLayout:
    """An OS family's aws-ofi-nccl directory before and after the EFA installer moved it; `moved` the earliest and
    latest installer release a public source names for the move (equal where the sources agree)."""

    before: str
    after: str
    moved: tuple[tuple[int, ...], tuple[int, ...]]

    def dirs(self, efa_installer: str | None) -> set[str]:
        """The directories an image with this EFA installer release (None: not recorded) may keep the plugin in."""
        if efa_installer is None:
            return {self.before, self.after}
        release = parse_version(efa_installer)
        if release < self.moved[0]:
            return {self.before}
        if release >= self.moved[1]:
            return {self.after}
        return {self.before, self.after}


#: By the first word(s) of images.yml's `os`.
OFI_NCCL_LAYOUTS: dict[str, OfiNcclLayout] = {
    "Ubuntu": OfiNcclLayout(OFI_NCCL_ARCH_DIR, OFI_NCCL_FLAT_DIR, ((1, 44), (1, 48))),
    "Debian": OfiNcclLayout(OFI_NCCL_ARCH_DIR, OFI_NCCL_FLAT_DIR, ((1, 44), (1, 48))),
    "Amazon Linux 2023": OfiNcclLayout(OFI_NCCL_ARCH_DIR, OFI_NCCL_LIB64_DIR, ((1, 44), (1, 44))),
}


@dataclass(frozen=True)
class Image:
    key: str
    name: str
    os: str
    source: Source
    ssm_parameter: str | None
    ships: dict[str, Component]
    first_boot_adds: str
    contract: Contract

    def efa_installer_releases(self) -> list[str | None]:
        """The EFA installer releases a node booted from this image may run (None: one not recorded): the image's own,
        and, where fmcluster keeps the stack at or above the pins (accelerator_stack upgradable), versions.yml's."""
        efa = self.ships["efa_installer"]
        releases: list[str | None] = [efa.version] if efa.present else []
        if self.contract.accelerator_stack == "upgradable":
            releases.append(str(versions.load()["efa_installer"]["version"]))
        return releases

    def missing_ofi_nccl_dirs(self) -> list[str]:
        """The aws-ofi-nccl directories the EFA installer releases this image's nodes may run put the plugin in and the
        contract's ofi_nccl_lib_dirs lacks (OFI_NCCL_LAYOUTS); an image with an EFA installer on an OS no layout is
        known for lacks them all (`?`), so it cannot pass unread."""
        releases = self.efa_installer_releases()
        if not releases:
            return []
        layout = next((rule for family, rule in OFI_NCCL_LAYOUTS.items() if self.os.startswith(family)), None)
        if layout is None:
            return ["?"]
        wanted = set().union(*(layout.dirs(release) for release in releases))
        return sorted(wanted - set(self.contract.ofi_nccl_lib_dirs))

    def first_boot_gap(self) -> str | None:
        """Why fmcluster's first boot cannot run on a node booted from this image, or None. It runs the image's own
        python3 (the S3 client, then the node toolchain built from a wheelhouse made for versions.yml's
        node_toolchain_targets, with no index) and installs what the image lacks with apt (node-bootstrap.sh, the
        roles' package tasks)."""
        python = self.ships["python"]
        pythons = toolchain_pythons()
        if not python.present:
            return "it ships no python3, which the first boot's S3 client and the node toolchain run on"
        if python.version not in pythons:
            return (f"its Python {python.version or '(release not recorded)'} is none the node toolchain is built "
                    f"for ({', '.join(pythons)}: versions.yml node_toolchain_targets, the newest ansible-core that "
                    "installs on all of them)")
        if not self.os.startswith(APT_OS_FAMILIES):
            return f"its OS {self.os} has no apt, which node-bootstrap.sh and the roles install packages with"
        return None

    def shipped(self) -> str:
        """`python 3.10, aws_cli 2, nvidia_driver` — what the image has, versions where the catalog names one."""
        return ", ".join(name + (f" {c.version}" if c.version else "") for name, c in self.ships.items() if c.present)


def toolchain_pythons() -> list[str]:
    """The Pythons the node toolchain's wheelhouse is built for (versions.yml node_toolchain_targets)."""
    return [str(target["python"]) for target in versions.load()["node_toolchain_targets"]]


#: The first words of images.yml's `os` whose package manager is apt, the only one node-bootstrap.sh and the roles
#: use (roles/common, roles/nvidia_driver's Debian-family assert).
APT_OS_FAMILIES = ("Ubuntu", "Debian")


@dataclass(frozen=True)
class ImageCatalog:
    images: dict[str, Image]
    ec2_images: dict[str, str]  # accelerator -> image key (slurm-ec2's launch templates)

    def __getitem__(self, key: str) -> Image:
        if key not in self.images:
            raise ImageCatalogError(f"{IMAGES_PATH}: no image '{key}' under images, here or in a scheduler folder's "
                                    f"images.yml (known: {', '.join(self.images)})")
        return self.images[key]

    def ec2_image(self, accelerator: str) -> Image:
        return self[self.ec2_images[accelerator]]


def _fail(where: str, problem: str, fix: str) -> ImageCatalogError:
    return ImageCatalogError(f"{IMAGES_PATH.name}: {where}: {problem} (fix: {fix})")


def _image(key: str, raw: Any) -> Image:
    where = f"images.{key}"
    if not isinstance(raw, dict):
        raise _fail(where, "not a mapping", "give name, os, source, ssm_parameter, ships, first_boot_adds")
    missing = {"name", "os", "source", "ssm_parameter", "ships", "first_boot_adds", "contract"} - set(raw)
    if missing:
        raise _fail(where, f"missing {', '.join(sorted(missing))}", "add them")
    if raw["source"] not in get_args(Source):
        raise _fail(f"{where}.source", f"{raw['source']!r}", f"one of {', '.join(get_args(Source))}")
    if (raw["source"] == "ssm") != bool(raw["ssm_parameter"]):
        raise _fail(f"{where}.ssm_parameter", "set exactly when source is ssm",
                    "name the public SSM parameter for source ssm, null otherwise")
    if raw["ssm_parameter"] and not str(raw["ssm_parameter"]).startswith("/aws/service/"):
        raise _fail(f"{where}.ssm_parameter", f"{raw['ssm_parameter']!r} is not a public parameter",
                    "use the /aws/service/... path AWS publishes")
    ships = raw["ships"]
    if not isinstance(ships, dict) or set(ships) != set(COMPONENTS):
        raise _fail(f"{where}.ships", f"has {sorted(ships) if isinstance(ships, dict) else ships!r}",
                    f"list exactly {', '.join(COMPONENTS)}")
    components = {}
    for name in COMPONENTS:
        fact = ships[name]
        at = f"{where}.ships.{name}"
        if not isinstance(fact, dict) or set(fact) != {"present", "version", "source"}:
            raise _fail(at, "not {present, version, source}", "give all three")
        if not isinstance(fact["present"], bool):
            raise _fail(f"{at}.present", f"{fact['present']!r}", "true or false")
        if fact["version"] is not None and (not fact["present"] or not isinstance(fact["version"], str)):
            raise _fail(f"{at}.version", f"{fact['version']!r}", "a quoted version of a present component, or null")
        if not str(fact["source"]).startswith("https://"):
            raise _fail(f"{at}.source", f"{fact['source']!r}", "the public https:// page that says it")
        components[name] = Component(fact["present"], fact["version"], str(fact["source"]))
    return Image(key, str(raw["name"]), str(raw["os"]), raw["source"], raw["ssm_parameter"], components,
                 str(raw["first_boot_adds"]), _contract(where, raw["contract"]))


#: Each contract fact: its check (on the value) and what a valid value is, for the error message.
_CONTRACT_FACTS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "default_user": (lambda v: isinstance(v, str) and re.fullmatch(r"[a-z_][a-z0-9_-]*", v) is not None,
                     "an account name (lower-case letters, digits, _ and -, e.g. ec2-user)"),
    "init": (lambda v: v in get_args(Init), f"one of {', '.join(get_args(Init))}"),
    "cgroup": (lambda v: v in get_args(Cgroup), f"one of {', '.join(get_args(Cgroup))}"),
    "slurm_version": (lambda v: v is None or (isinstance(v, str) and v.count(".") >= 1
                                              and all(p.isdigit() for p in v.split(".")[:2])),
                      "a quoted version like \"23.11.4\", or null"),
    "slurm_installed_by": (lambda v: v in get_args(SlurmInstaller), f"one of {', '.join(get_args(SlurmInstaller))}"),
    "nccl_home": (lambda v: v is None or (isinstance(v, str) and v.startswith("/")), "an absolute path, or null"),
    "ofi_nccl_lib_dirs": (lambda v: isinstance(v, list) and all(isinstance(d, str) and d.startswith("/") for d in v),
                          "a list of absolute paths (empty: no plugin)"),
    "accelerator_stack": (lambda v: v in get_args(AcceleratorStack), f"one of {', '.join(get_args(AcceleratorStack))}"),
    "imds_access_tool": (lambda v: v is None or (isinstance(v, str) and v.startswith("/")), "an absolute path, or null"),
    "neuron_bin_dir": (lambda v: v is None or (isinstance(v, str) and v.startswith("/")), "an absolute path, or null"),
    "cuda_home": (lambda v: v is None or (isinstance(v, str) and v.startswith("/")), "an absolute path, or null"),
    "efa_home": (lambda v: v is None or (isinstance(v, str) and v.startswith("/")), "an absolute path, or null"),
    "mpi_home": (lambda v: v is None or (isinstance(v, str) and v.startswith("/")), "an absolute path, or null"),
    "dcgm_service": (lambda v: v is None or (isinstance(v, str) and v.endswith(".service") and "/" not in v
                                             and len(v) > len(".service")),
                     "a systemd service unit's name like \"nvidia-dcgm.service\", or null"),
    "dcgm_version": (lambda v: v is None or (isinstance(v, str) and v.count(".") >= 1
                                             and all(p.isdigit() for p in v.split("."))),
                     "a quoted DCGM release like \"4.7.0\", or null"),
    "python_interpreter": (lambda v: isinstance(v, str) and v.startswith("/") and " " not in v,
                           "the absolute path of the image's python3, e.g. \"/usr/bin/python3\""),
    "reboot_program": (lambda v: v is None or (isinstance(v, str) and v.startswith("/")), "an absolute path, or null"),
    "slurm_bin_dir": (lambda v: v is None or (isinstance(v, str) and v.startswith("/") and v.replace("/", "").replace(
        "_", "").replace("-", "").replace(".", "").isalnum()), "an absolute path (letters, digits, . _ -), or null"),
    "container_runtime": (lambda v: v is None or (isinstance(v, str) and v.startswith("/") and not v.endswith("/")
                                                   and " " not in v), "an absolute path to the CLI, or null"),
}


def _contract(where: str, raw: Any) -> Contract:
    where = f"{where}.contract"
    if not isinstance(raw, dict) or set(raw) != set(_CONTRACT_FACTS):
        raise _fail(where, f"has {sorted(raw) if isinstance(raw, dict) else raw!r}",
                    f"list exactly {', '.join(_CONTRACT_FACTS)}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, (valid, expected) in _CONTRACT_FACTS.items():
        fact = raw[name]
        at = f"{where}.{name}"
        if not isinstance(fact, dict) or set(fact) != {"value", "source"}:
            raise _fail(at, "not {value, source}", "give both")
        if not valid(fact["value"]):
            raise _fail(f"{at}.value", f"{fact['value']!r}", expected)
        source = str(fact["source"])
        if not (source.startswith("https://") or (source.startswith("docs/") and (REPO_DOCS.parent / source).is_file())):
            raise _fail(f"{at}.source", f"{source!r}", "the public https:// page that says it (or, for the local "
                        "substrate's own image, the docs/ page of this repository that does)")
        values[name] = tuple(fact["value"]) if name == "ofi_nccl_lib_dirs" else fact["value"]
        sources[name] = source
    return Contract(**values, sources=sources)


def parse_catalog(raw: Any) -> ImageCatalog:
    if not isinstance(raw, dict) or set(raw) != {"images", "ec2_images"}:
        raise _fail("top level", "needs exactly the keys images and ec2_images", "see the file's header")
    images = {str(key): _image(str(key), value) for key, value in raw["images"].items()}
    ec2 = raw["ec2_images"]
    if not isinstance(ec2, dict) or set(ec2) != set(ACCELERATORS):
        raise _fail("ec2_images", f"has {ec2!r}", f"map each of {', '.join(ACCELERATORS)} to an image key")
    for accelerator, key in ec2.items():
        if key not in images or images[key].source != "ssm":
            raise _fail(f"ec2_images.{accelerator}", f"{key!r} is not an image with an SSM parameter",
                        "name an image of source ssm (launch templates resolve its parameter)")
    for key, image in images.items():
        missing = image.missing_ofi_nccl_dirs()
        if missing:
            releases = ", ".join(release or "not recorded" for release in image.efa_installer_releases())
            raise _fail(f"images.{key}.contract.ofi_nccl_lib_dirs",
                        f"lacks {', '.join(missing)}, where the EFA installer ({releases}) may put aws-ofi-nccl on "
                        f"{image.os}", "list it (fmcluster.images.OFI_NCCL_LAYOUTS, with its sources), or record the "
                        "image's EFA installer release under ships.efa_installer.version")
    return ImageCatalog(images, {str(k): str(v) for k, v in ec2.items()})


def raw_catalog(path: Path = IMAGES_PATH) -> dict[str, Any]:
    """images.yml as written, with the images each scheduler's folder catalogues in its own images.yml (the one its
    service boots) added under `images` (fmcluster.capabilities.scheduler_data)."""
    return scheduler_data(IMAGES_PATH.name, yaml.safe_load(path.read_text(encoding="utf-8")))


@lru_cache(maxsize=1)
def load_images(path: Path = IMAGES_PATH) -> ImageCatalog:
    return parse_catalog(raw_catalog(path))


def node_kinds(tenant: Tenant) -> list[tuple[str, str]]:
    """(node kind, accelerator) of the tenant's nodes: controller, login, each queue."""
    kinds: list[tuple[str, str]] = [("controller", tenant.controller.accelerator)]
    if tenant.login is not None and tenant.login_count > 0:
        kinds.append(("login", tenant.login.accelerator))
    kinds += [(f"queue {q.name}", q.instance.accelerator) for q in tenant.queues]
    return kinds


def booted_image(scheduler_image: Callable[[str], str], substrate_image: str | None) -> Callable[[str], str]:
    """accelerator → the image a node boots: the provider's own where it boots one (the local substrate's rootfs),
    else the scheduler's (Scheduler.image). The manifest gives each node kind this image's contract."""
    return lambda accelerator: substrate_image or scheduler_image(accelerator)


def image_lines(tenant: Tenant, scheduler_image: Callable[[str], str], substrate_image: str | None) -> list[str]:
    """For plan and the deploy summary: which image each node kind boots and what first boot adds to it.
    `scheduler_image`: the tenant's scheduler's image for an accelerator (Scheduler.image); `substrate_image`:
    the image the provider boots instead (Provider.node_image). Passed in, so that this catalog module, which the
    cluster templates read, depends on neither registry."""
    catalog = load_images()
    by_image: dict[str, list[str]] = {}
    for kind, accelerator in node_kinds(tenant):
        by_image.setdefault(scheduler_image(accelerator), []).append(kind)
    lines = ["Node images (data/images.yml):"]
    for key, kinds in by_image.items():
        image = catalog[key]
        lines += [f"  {', '.join(kinds)}: {image.name} (ships {image.shipped()})",
                  f"    first boot adds: {image.first_boot_adds}"]
    # A substrate that boots its own image instead of AWS's names it (provider local: the pristine rootfs).
    if substrate_image:
        local = catalog[str(substrate_image)]
        lines.append(f"  here every node boots {local.name} instead; first boot adds: {local.first_boot_adds}")
    lines += gpu_exporter_gaps(tenant, booted_image(scheduler_image, substrate_image))
    return lines


def first_boot_refusals(tenant: Tenant, image_of: Callable[[str], str]) -> list[str]:
    """Why the tenant's nodes could not converge, by the image they boot (`image_of`, by accelerator: booted_image):
    one line per image whose first boot cannot run (Image.first_boot_gap), and one per image whose GPU nodes would
    run a DCGM exporter paired with no host-engine release (the role refuses to start it, failing their converge:
    `_exporter_gaps`), naming the node kinds. Plan says it and exits 2; the deploy refuses before it changes anything,
    rather than create a cluster whose every node of that kind fails its first boot."""
    catalog = load_images()
    unpaired = [f"tenant '{tenant.org}': {', '.join(kinds)} boot {catalog[key].name} ({key}), whose DCGM host engine "
                "has no recorded release (images.yml contract dcgm_version), so no dcgm-exporter image is paired with "
                "it and the dcgm_exporter role refuses to start there: their converge would fail. Fix: record the "
                "release from the image's notes, with its source"
                for key, kinds in _exporter_gaps(tenant, image_of)[1].items()]
    kinds_of: dict[str, list[str]] = {}
    for kind, accelerator in node_kinds(tenant):
        kinds_of.setdefault(image_of(accelerator), []).append(kind)
    refusals = []
    for key, kinds in kinds_of.items():
        gap = catalog[key].first_boot_gap()
        if gap is not None:
            refusals.append(f"tenant '{tenant.org}': {', '.join(kinds)} boot {catalog[key].name} ({key}), and "
                            f"fmcluster's first boot cannot run there: {gap}. Fix: boot an image the first boot runs on "
                            f"(src/fmcluster/data/images.yml), or make it run on this one (its entry's "
                            "first_boot_adds says what is missing)")
    return refusals + unpaired


def gpu_exporter_gaps(tenant: Tenant, image_of: Callable[[str], str]) -> list[str]:
    """What differs is listed: the GPU node kinds that get no dcgm-exporter, because the image they boot (`image_of`,
    by accelerator) ships no container runtime to run NVIDIA's exporter container (contract: container_runtime), and
    those whose image runs one but whose DCGM host engine has no exporter image paired with its release
    (contract: dcgm_version; the role refuses to start an unpaired exporter there, so their converge fails)."""
    catalog = load_images()
    missing, unpaired = _exporter_gaps(tenant, image_of)
    return [f"  no GPU exporter on {', '.join(kinds)}: {catalog[key].name} ships no container runtime "
            "(dcgm-exporter runs as NVIDIA's container); GPU health there comes from fmcluster-health's DCGM checks "
            "and their metrics, and Prometheus scrapes no dcgm target"
            for key, kinds in missing.items()] + [
            f"  GAP on {', '.join(kinds)}: {catalog[key].name} runs DCGM's host engine of no recorded release "
            "(images.yml contract dcgm_version), so no dcgm-exporter image is paired with it and the dcgm_exporter "
            "role refuses to start there (the node's converge fails): record the release from the image's notes"
            for key, kinds in unpaired.items()]


def _exporter_gaps(tenant: Tenant, image_of: Callable[[str], str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(image → GPU node kinds whose image ships no container runtime, image → those whose host engine's DCGM release
    is not recorded), by the image they boot."""
    catalog = load_images()
    missing: dict[str, list[str]] = {}
    unpaired: dict[str, list[str]] = {}
    for kind, accelerator in node_kinds(tenant):
        if accelerator != "cuda":
            continue
        contract = catalog[image_of(accelerator)].contract
        if contract.container_runtime is None:
            missing.setdefault(image_of(accelerator), []).append(kind)
        elif contract.dcgm_exporter_image() is None:
            unpaired.setdefault(image_of(accelerator), []).append(kind)
    return missing, unpaired
