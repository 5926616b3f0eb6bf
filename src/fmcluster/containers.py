"""Users' containers through Slurm (docs/containers.md): which registries a tenant's nodes pull from, as role variables.

Flow: the provider gives the tenant's own registry (Provider.container_registry: on AWS the account's ECR in the
region, read from the storage stack's output `ContainerRegistry`; locally the VPC's registry on the router address),
the spec may add more ECR registries of the same account (`containers.registries`, checked by fmcluster.validation
for their form), and `manifest_vars` refuses one of another account here, where the account is known (the deploy),
naming file, key and fix. The roles (roles/slurm_containers) get the list, and which of them are ECR with their
regions, and never decide either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fmcluster.capabilities import CONTAINER_RUNTIMES
from fmcluster.model import Tenant
from fmcluster.validation import ECR_REGISTRY, IMAGE_REFERENCE


@dataclass(frozen=True)
class ContainerRegistry:
    """A registry the provider gives the tenant: `host` as image references name it (host[:port]); `insecure`: plain
    HTTP (only a substrate's own registry, never an AWS tenant's); `what`: what it is, for the deploy's notes;
    `bench_image`: the image of fmcluster's CPU bench the provider keeps in it (the local substrate's, pushed by its
    deploy), which the acceptance's CPU jobs run from where `bench_runs_in_container`; empty: none."""

    host: str
    insecure: bool = False
    what: str = ""
    bench_image: str = ""


class ForeignRegistry(ValueError):
    """A registry the spec names is not of the account the tenant's stacks are in."""


def ecr_account(host: str) -> str | None:
    """The account of an ECR registry host, None for any other host."""
    match = ECR_REGISTRY.fullmatch(host)
    return match.group("account") if match else None


def ecr_registries(registries: list[str]) -> list[dict[str, str]]:
    """The ECR registries among `registries`, each with the region its token is asked in: split here, so the nodes'
    token refresher and fmcluster-container hold no pattern of ECR's hosts."""
    found = [(host, ECR_REGISTRY.fullmatch(host)) for host in registries]
    return [{"host": host, "region": match["region"]} for host, match in found if match is not None]


def manifest_vars(tenant: Tenant, given: ContainerRegistry | None) -> dict[str, Any]:
    """`fmcluster_containers` (the playbooks' gate) and the slurm_containers role's registries and users.

    `given`: the provider's registry of this tenant, None where it is not known yet (an AWS tenant whose storage stack
    has no output yet: `invoke plan` offline); the role then refuses to converge rather than pull from nowhere."""
    spec = f"inventories/{tenant.org}/group_vars/all/tenant.yml"
    registries = [given.host] if given is not None else []
    account = ecr_account(given.host) if given is not None else None
    for i, host in enumerate(tenant.containers.registries):
        if account is not None and ecr_account(host) != account:
            raise ForeignRegistry(
                f"{spec}: containers.registries[{i}]: {host!r} is not a registry of the tenant's account {account} "
                f"(its ECR: {given.host if given else ''}); nodes pull only from the tenant's own registries. Fix: "
                f"push the image to {account}'s ECR and list {account}.dkr.ecr.<region>.amazonaws.com, or remove it")
        if host not in registries:
            registries.append(host)
    users = sorted(tenant.users, key=lambda u: u.name)
    return {
        **acceptance_image_vars(tenant, registries if given is not None else None),
        **bench_image_vars(tenant, given),
        "fmcluster_containers": tenant.containers.enabled,
        "slurm_containers_registries": registries,
        "slurm_containers_insecure_registries": [given.host] if given is not None and given.insecure else [],
        "slurm_containers_ecr_registries": ecr_registries(registries),
        "slurm_containers_cache_dir": f"{tenant.storage.lustre.mount_point}/.fmcluster/containers",
        "slurm_containers_mounts": [tenant.storage.lustre.mount_point],
        "slurm_containers_users": [{"name": u.name, "uid": u.uid, "gid": u.gid, "removed": u.removed} for u in users],
    }


#: Where an nccl-tests image keeps nccl-tests and the libraries it runs with: the layout of awsome-distributed-training's
#: micro-benchmarks/nccl-tests/nccl-tests.Dockerfile (nccl-tests in /opt/nccl-tests/build; NCCL in /opt/nccl/build;
#: libfabric, Open MPI, GDRCopy, CUDA), https://github.com/awslabs/awsome-distributed-ai/blob/main/micro-benchmarks/nccl-tests/nccl-tests.Dockerfile
#: (MIT-0; the repository aws-samples/awsome-distributed-training moved there). The image's, not a node's: the nodes'
#: own NCCL home comes from their image contract. aws-ofi-nccl has lived in three places as the recipe changed, and
#: an image built from any of them is the recipe's, so the library path names all three (a directory an image lacks
#: is skipped by the loader and by the job's plugin check, which takes the first plugin on the path):
#: - /opt/amazon/ofi-nccl/lib: the EFA installer 1.48 "ships the OFI NCCL plugin at /opt/amazon/ofi-nccl/lib/ (no arch
#:   subdir)" (the Dockerfile's comment since awslabs/awsome-distributed-ai 16da837e, #1070, May 2026, whose
#:   LD_LIBRARY_PATH lists it first and whose build verifies /opt/amazon/ofi-nccl/lib/libnccl-net*.so);
#: - /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu: the EFA installer's plugin before 1.48, which the recipe used from
#:   e5732423 ("Remove Install AWS-OFI-NCCL plugin", September 2025) and keeps "for back-compat with images rebuilt
#:   against older EFA installers";
#: - /opt/aws-ofi-nccl/install/lib: the recipe's own aws-ofi-nccl build (./configure --prefix=/opt/aws-ofi-nccl/install)
#:   until 0877e0e3 (August 2025, aws-ofi-nccl v1.16.3), which images built then still carry.
#: Only x86_64: fmcluster's GPU instance catalog has no Arm GPU instance.
NCCL_TESTS_IMAGE_LAYOUT: dict[str, Any] = {
    "nccl_tests_container_bin_dir": "/opt/nccl-tests/build",
    "nccl_tests_container_library_path": ["/opt/nccl/build/lib", "/opt/amazon/ofi-nccl/lib",
                                          "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu", "/opt/aws-ofi-nccl/install/lib",
                                          "/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib", "/opt/gdrcopy/lib",
                                          "/usr/local/cuda/lib64"],
}


#: Where the CPU bench's image keeps fmcluster's bench (fmcluster.providers.local.registry builds it so): the
#: acceptance's CPU jobs run `python3 -m fmcluster.acceptance.bench` inside it with this on PYTHONPATH.
BENCH_IMAGE_PYTHONPATH = "/opt/fmcluster/lib"


def bench_runs_in_container(tenant: Tenant) -> bool:
    """Whether the acceptance's CPU jobs run the bench from its image: the tenant has CPU queues and its nodes run
    images through what fmcluster installs (its scheduler's job_container_runtime, with containers.enabled). Elsewhere
    the bench runs from the nodes' own checkout."""
    runtime = tenant.capabilities.scheduler.job_container_runtime
    return (tenant.containers.enabled and CONTAINER_RUNTIMES.get(str(runtime)) == "fmcluster"
            and any(q.instance.accelerator == "none" for q in tenant.queues))


def bench_image_vars(tenant: Tenant, given: ContainerRegistry | None) -> dict[str, Any]:
    """The nccl_tests role's CPU bench image (`given.bench_image` where the bench runs from it, else empty: the
    nodes' own checkout) and where the image keeps the bench."""
    image = given.bench_image if given is not None and bench_runs_in_container(tenant) else ""
    return {"nccl_tests_cpu_container_image": image,
            "nccl_tests_cpu_container_pythonpath": BENCH_IMAGE_PYTHONPATH if image else ""}


def acceptance_image_vars(tenant: Tenant, registries: list[str] | None) -> dict[str, Any]:
    """The nccl_tests role's container variables (docs/acceptance.md, "From a container image"): the image the GPU
    queues' nccl-tests run from (`acceptance.image`, empty: the nodes' own build), how the scheduler's nodes run it
    (its capability job_container_runtime), what is mounted into it (the shared file system and, where every GPU queue has
    EFA, /dev/infiniband) and whether the job checks the EFA devices inside.

    `registries`: the tenant's registries where the account is known (the deploy), None offline; an image in none of
    them is refused here, naming file, key and fix (validation has checked its form and region already)."""
    image = tenant.acceptance.image
    if image is None:
        return {"nccl_tests_container_image": "", "nccl_tests_container_runtime": "", "nccl_tests_container_mounts": [],
                "nccl_tests_container_efa": False, "nccl_tests_container_bin_dir": "",
                "nccl_tests_container_library_path": []}
    found = IMAGE_REFERENCE.fullmatch(image)
    if found is None:  # validation refuses it first; never rendered into a job script
        raise ValueError(f"acceptance.image {image!r} is not an image reference")
    if registries is not None and found.group("registry") not in registries:
        spec = f"inventories/{tenant.org}/group_vars/all/tenant.yml"
        raise ForeignRegistry(
            f"{spec}: acceptance.image: {image!r} is not in a registry of the tenant's account (its registries: "
            f"{', '.join(registries) or 'none'}); nodes pull only from the tenant's own registries. Fix: push the "
            f"image to {registries[0] if registries else 'your account ECR'} and name it there, or remove "
            "acceptance.image")
    gpu_queues = [q for q in tenant.queues if q.instance.accelerator == "cuda"]
    efa = bool(gpu_queues) and all(q.instance.has_efa for q in gpu_queues)
    return {
        "nccl_tests_container_image": image,
        "nccl_tests_container_runtime": tenant.capabilities.scheduler.job_container_runtime or "",
        "nccl_tests_container_mounts": [tenant.storage.lustre.mount_point, *(["/dev/infiniband"] if efa else [])],
        "nccl_tests_container_efa": efa,
        **NCCL_TESTS_IMAGE_LAYOUT,
    }
