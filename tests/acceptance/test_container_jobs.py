"""The acceptance job from a container image (issue 39): an AWS tenant names the image its GPU queues' nccl-tests run
from (`acceptance.image`), and the job script the submit node gets runs them through the mechanism the scheduler's
nodes have (its capabilities.yml `job_container_runtime`): slurm-ec2 Slurm's OCI support with fmcluster-container's
bundle, ParallelCluster and HyperPod Pyxis over Enroot. Host-run stays the default.

The script is rendered as the nccl_tests role renders it (its template, its defaults, the manifest's variables and
the submit node's group vars), then read, checked by `bash -n`, and run with `srun` and `fmcluster-container`
stand-ins that record what they are given: the container flags, the image, the mounts, the environment, and what runs
inside. A configured image outside the tenant's registries is refused (validation, then the manifest with the
account known)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from conftest import ROOT
from fmcluster.capabilities import SCHEDULERS
from fmcluster.containers import ForeignRegistry
from fmcluster.model import load_tenant
from localtenant import manifest_for

TEMPLATE = ROOT / "roles" / "nccl_tests" / "templates" / "nccl-tests.sbatch.j2"
DEFAULTS: dict[str, Any] = yaml.safe_load((ROOT / "roles" / "nccl_tests" / "defaults" / "main.yml").read_text())
ACCOUNT = "123456789012"
TAG = "cuda12.9-efa1.47"


def ecr(region: str) -> str:
    return f"{ACCOUNT}.dkr.ecr.{region}.amazonaws.com"


def tenant_root(tmp: Path, base: str, change: dict[str, Any] | None = None, org: str | None = None) -> tuple[str, Path]:
    """A bundled tenant's spec copied under `tmp` (as `org`), its `tenant` keys updated with `change`."""
    doc = yaml.safe_load((ROOT / f"inventories/{base}/group_vars/all/tenant.yml").read_text())
    org = org or base
    doc["tenant"]["org"] = org
    for key, value in (change or {}).items():
        doc["tenant"][key] = value
    spec = tmp / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return org, tmp


def hyperpod_gpu(tmp: Path) -> tuple[str, Path]:
    """No bundled HyperPod tenant has GPUs (neuronlab is Trainium): neuronlab's spec with stockmark's P5 queue."""
    p5 = [{"name": "gpu", "instance_type": "p5.48xlarge", "count": 2}]
    return tenant_root(tmp, "neuronlab", {"queues": p5}, org="hpgpu")


#: Each bundled AWS scheduler with a GPU tenant: the bundled one, or (HyperPod) one made from it.
AWS_GPU_TENANTS = {
    "slurm-ec2": lambda tmp: tenant_root(tmp, "stockmark"),
    "parallelcluster": lambda tmp: tenant_root(tmp, "pclab"),
    "hyperpod": hyperpod_gpu,
}


def with_image(tmp: Path, scheduler: str, image: str | None = None) -> Any:
    """The tenant of `scheduler` with acceptance.image set to `image` (default: nccl-tests in its region's ECR)."""
    org, root = AWS_GPU_TENANTS[scheduler](tmp)
    spec = root / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    doc = yaml.safe_load(spec.read_text())
    region = doc["tenant"]["region"]
    doc["tenant"].setdefault("acceptance", {})["image"] = image or f"{ecr(region)}/nccl-tests:{TAG}"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_tenant(org, root)


def render(tenant: Any, collective: str = "all_reduce", **overrides: Any) -> str:
    """nccl-<collective>.sbatch as the submit node's play renders it: the role's defaults under the manifest's `all`
    vars and the submit node's group vars (the login node, else the controller), the stacks' registry known."""
    manifest = manifest_for(tenant, {"ContainerRegistry": ecr(tenant.region)})
    submit = manifest["groups"]["login"] or manifest["groups"]["controller"]
    variables = {**DEFAULTS, **manifest["vars"], **submit["vars"], "nccl_tests_collective": collective, **overrides}
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["quote"] = shlex.quote
    return env.from_string(TEMPLATE.read_text()).render(**variables)


def bash_n(script: str, tmp: Path) -> None:
    path = tmp / "job.sbatch"
    path.write_text(script)
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


#: The host step before the container step: one task per node, on the host, reading its EFA installer and driver.
HOST_PROBE = ["--ntasks-per-node=1", "--mpi=none", "--cpu-bind=none", "sh", "-c"]


def run_job(script: str, tmp: Path, pyxis: bool = True) -> tuple[int, list[list[str]], str]:
    """The job run as sbatch would on its first node, `srun` and `fmcluster-container` stand-ins on PATH: srun records
    its argv (and answers `--help` as a Slurm with Pyxis does, or without), then runs what follows the container and
    MPI flags on this machine (the `sh -c` that runs inside the container)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp / "srun.calls"
    help_text = "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH" if pyxis else "      --mpi=MPI_TYPE"
    (bin_dir / "srun").write_text(
        "#!/usr/bin/python3\nimport json, os, sys\n"
        f"if sys.argv[1:] == ['--help']:\n    print({help_text!r}); sys.exit(0)\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "rest = sys.argv[1:]\n"
        "while rest and rest[0].startswith('-'):\n    rest = rest[1:]\n"
        "os.execvp(rest[0], rest)\n")
    (bin_dir / "fmcluster-container").write_text(
        '#!/bin/sh\n[ "$1" = bundle ] || exit 2\necho /fsx/.fmcluster/containers/bundles/ops/sha256-abc\n')
    for tool in ("srun", "fmcluster-container"):
        (bin_dir / tool).chmod(0o755)
    job = tmp / "job.sbatch"
    job.write_text(script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "4242", "HOME": str(tmp)}
    done = subprocess.run(["bash", str(job)], capture_output=True, text=True, env=env, timeout=60)
    recorded = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return done.returncode, recorded, done.stdout + done.stderr


# --- the runtime is the scheduler's, as data ----------------------------------------------------------------------

def test_each_bundled_scheduler_names_its_container_runtime_in_its_folder() -> None:
    assert {name: row.job_container_runtime for name, row in SCHEDULERS.items() if name in AWS_GPU_TENANTS} == {
        "slurm-ec2": "slurm-oci", "parallelcluster": "pyxis", "hyperpod": "pyxis"}


# --- host-run stays the default -----------------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", sorted(AWS_GPU_TENANTS))
def test_without_an_image_the_job_runs_the_nodes_own_nccl_tests_build(tmp_path: Path, scheduler: str) -> None:
    org, root = AWS_GPU_TENANTS[scheduler](tmp_path)
    script = render(load_tenant(org, root))
    assert "exec srun --mpi=pmix --cpu-bind=none /opt/nccl-tests/nccl-tests-2.17.6/build/all_reduce_perf" in script
    assert "--container" not in script and "image=" not in script
    assert "export LD_LIBRARY_PATH=" in script  # the node's own libraries (the image contract's directories)
    bash_n(script, tmp_path)


# --- from the configured image ------------------------------------------------------------------------------------

def test_slurm_ec2_runs_the_image_through_slurm_s_oci_support_with_fmcluster_container_s_bundle(tmp_path: Path) -> None:
    tenant = with_image(tmp_path, "slurm-ec2")
    image = f"{ecr('ap-northeast-1')}/nccl-tests:{TAG}"
    script = render(tenant)
    bash_n(script, tmp_path)
    assert f"image={image}\n" in script
    assert 'bundle=$(fmcluster-container bundle "$image")' in script and 'container=(--container="$bundle")' in script
    assert "--container-image" not in script.split("set -euo pipefail")[1]
    code, calls, output = run_job(script, tmp_path, pyxis=False)
    # first each node's host values, on the host (no container flags), then the ranks in the container
    assert calls == [HOST_PROBE + [calls[0][5]],
                     ["--container=/fsx/.fmcluster/containers/bundles/ops/sha256-abc", "--mpi=pmix", "--cpu-bind=none", "sh", "-c", calls[1][5], "fmcluster-acceptance",
        "/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "16G", "-f", "2", "-g", "1", "-c", "1", "-n", "100"]]
    assert f"# fmcluster acceptance job: all_reduce_perf in {image}" in output
    # this machine has no EFA device: the step fails inside, before nccl-tests, saying why
    assert code != 0 and "no EFA device (/dev/infiniband/uverbs*) inside the container" in output, output


@pytest.mark.parametrize("scheduler", ["parallelcluster", "hyperpod"])
def test_parallelcluster_and_hyperpod_run_the_image_through_pyxis_with_the_fabric_mounted(
        tmp_path: Path, scheduler: str) -> None:
    tenant = with_image(tmp_path, scheduler)
    registry = ecr(tenant.region)
    script = render(tenant, "all_gather")
    bash_n(script, tmp_path)
    assert "fmcluster-container" not in script
    code, calls, output = run_job(script, tmp_path, pyxis=True)
    assert len(calls) == 2 and calls[0][:5] == HOST_PROBE, output
    argv = calls[1]
    # an Enroot URI: the registry host, '#', the repository and tag (Pyxis's --container-image)
    assert argv[:2] == [f"--container-image={registry}#nccl-tests:{TAG}",
                        f"--container-mounts={tenant.storage.lustre.mount_point}:{tenant.storage.lustre.mount_point},"
                        "/dev/infiniband:/dev/infiniband"]
    assert argv[2:5] == ["--mpi=pmix", "--cpu-bind=none", "sh"]
    assert argv[7:] == ["fmcluster-acceptance", "/opt/nccl-tests/build/all_gather_perf", "-b", "8", "-e", "16G", "-f", "2", "-g", "1", "-c",
                        "1", "-n", "100"]
    assert code != 0 and "no EFA device (/dev/infiniband/uverbs*) inside the container" in output, output


def test_a_slurm_without_pyxis_runs_nothing_and_fails(tmp_path: Path) -> None:
    code, calls, output = run_job(render(with_image(tmp_path, "parallelcluster")), tmp_path, pyxis=False)
    assert code == 1 and calls == []
    assert "this Slurm has no Pyxis (srun knows no --container-image)" in output


@pytest.mark.parametrize("scheduler", sorted(AWS_GPU_TENANTS))
def test_the_fabric_s_environment_is_set_for_inside_the_container(tmp_path: Path, scheduler: str) -> None:
    script = render(with_image(tmp_path, scheduler))
    outside, inside = script.split("inside='", 1)
    inside = inside.split("'\n", 1)[0]
    # the step's environment (Pyxis and Slurm's OCI support hand it to the container): libfabric's EFA provider, the
    # INFO lines the verdict reads; never the node's library path, which names the node's NCCL and plugin
    assert "export FI_PROVIDER=efa\n" in outside and "export NCCL_DEBUG=INFO\n" in outside
    assert "LD_LIBRARY_PATH" not in outside
    # inside: the EFA devices and unlimited locked memory checked, then the image's own NCCL and aws-ofi-nccl
    assert "/dev/infiniband/uverbs*" in inside and '"$(ulimit -l)" != unlimited' in inside
    library_path = next(line for line in inside.splitlines() if line.startswith("export LD_LIBRARY_PATH="))
    assert library_path.split("=", 1)[1].split(":")[:4] == [
        "/opt/nccl/build/lib", *RECIPE_PLUGIN_DIRS], library_path
    assert inside.rstrip().endswith('exec "$@"')


def test_inside_locked_memory_must_be_unlimited_and_with_the_fabric_there_nccl_tests_runs(tmp_path: Path) -> None:
    """The same `sh -c`, its device check pointed at a directory holding a uverbs device and its image paths at a
    stand-in image that passes the host-against-image checks. This machine's locked memory is limited (and cannot be
    raised here): the check refuses it; with the limit it requires set to this machine's, the command runs, with the
    image's library path."""
    script = render(with_image(tmp_path, "parallelcluster"))
    root = stand_in_image(tmp_path)
    inside = rooted(script.split("inside='", 1)[1].split("'\n", 1)[0], root)
    limit = subprocess.run(["sh", "-c", "ulimit -l"], capture_output=True, text=True).stdout.strip()

    def run(text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", text, "fmcluster-acceptance", "sh", "-c", 'echo "$LD_LIBRARY_PATH"'],
                              capture_output=True, text=True, env=image_env(root, HOST_OK))

    if limit != "unlimited":
        refused = run(inside)
        assert refused.returncode == 1 and refused.stdout == "", refused.stdout
        assert f"locked memory is {limit} KiB inside the container" in refused.stderr and "EFA needs unlimited" in \
            refused.stderr
    assert '!= unlimited ]' in inside
    done = run(inside.replace("!= unlimited ]", f"!= {limit} ]"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith(
        f"{root}/opt/nccl/build/lib:" + "".join(f"{root}{d}:" for d in RECIPE_PLUGIN_DIRS))


# --- the host against the image, on every rank before nccl-tests ---------------------------------------------------
# Stand-in values: nvidia-smi's header as driver 535.183.01 prints it (seen in many public logs), `fi_info --version`
# as libfabric's fi_info prints it, /usr/local/cuda/version.json as the CUDA toolkit writes it and the first line of
# /opt/amazon/efa_installed_packages as efa_installer.sh writes it (write_package_file).
SMI_HEADER = ("| NVIDIA-SMI 535.183.01             Driver Version: 535.183.01   CUDA Version: 12.2     |")
HOST_OK = "n1 efa=1.47.0 cuda=12.2 driver=535.183.01\nn2 efa=1.47.0 cuda=12.2 driver=535.183.01"


#: Where awsome-distributed-training's nccl-tests.Dockerfile has put aws-ofi-nccl (fmcluster.containers,
#: NCCL_TESTS_IMAGE_LAYOUT): the EFA installer 1.48's /opt/amazon/ofi-nccl/lib, an older installer's arch directory,
#: and the recipe's own build until August 2025.
RECIPE_PLUGIN_DIRS = ["/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu",
                      "/opt/aws-ofi-nccl/install/lib"]


def stand_in_image(tmp: Path, cuda: str | None = "12.2.2", plugin: str | None = "libnccl-net-ofi.so",
                   efa_provider: bool = True, fi_info: bool = True, unresolved: str = "",
                   plugin_dir: str = "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu") -> Path:
    """A directory standing for the image's root (its CUDA, aws-ofi-nccl, EFA installer record, /dev/infiniband) and a
    bin/ of stand-ins for what the check runs inside: fi_info (the efa provider found or not) and ldd."""
    root = tmp / "image"
    (root / "dev" / "infiniband").mkdir(parents=True)
    (root / "dev" / "infiniband" / "uverbs0").write_text("")
    cuda_dir = root / "usr" / "local" / "cuda"
    (cuda_dir / "lib64").mkdir(parents=True)
    if cuda:
        (cuda_dir / "version.json").write_text(
            '{\n   "cuda" : {\n      "name" : "CUDA SDK",\n      "version" : "%s"\n   },\n'
            '   "cuda_cccl" : {\n      "name" : "CUDA C++ Core Compute Libraries",\n      "version" : "2.2.0"\n   }\n}\n'
            % cuda)
    lib = root / plugin_dir.lstrip("/")
    lib.mkdir(parents=True)
    if plugin:
        (lib / plugin).write_text("")
    (root / "opt" / "amazon").mkdir(parents=True, exist_ok=True)
    (root / "opt" / "amazon" / "efa_installed_packages").write_text(
        "# EFA installer version: 1.43.2\n# Debug packages installed: yes\n# Packages installed:\nlibfabric-aws\n")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    if fi_info:
        (bin_dir / "fi_info").write_text(
            '#!/bin/sh\nif [ "$1" = --version ]; then\n  printf "fi_info: 2.1.0amzn3.0\\nlibfabric: 2.1.0amzn3.0\\n'
            'libfabric api: 2.1\\n"; exit 0\nfi\n'
            + ('echo "provider: efa"\n' if efa_provider else "exit 61\n"))
    (root / "ldd.out").write_text("\tlinux-vdso.so.1 (0x00007ffd)\n" + (f"{unresolved}\n" if unresolved else ""))
    (bin_dir / "ldd").write_text(f"#!/bin/sh\ncat {root / 'ldd.out'}\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return root


def rooted(inside: str, root: Path) -> str:
    """The rendered `sh -c` with the image's paths under `root` (the check reads the image where it runs)."""
    for path in ("/dev/infiniband/", "/usr/local/cuda/", "/opt/"):
        inside = inside.replace(path, f"{root}{path}")
    return inside


def image_env(root: Path, host_facts: str, node: str = "n1") -> dict[str, str]:
    return {"PATH": f"{root}/bin:/usr/bin:/bin", "FMC_HOST_FACTS": host_facts, "SLURMD_NODENAME": node,
            "SLURM_LOCALID": "0"}


def run_inside(tmp: Path, root: Path, host_facts: str = HOST_OK, node: str = "n1") -> subprocess.CompletedProcess[str]:
    """The rendered `sh -c` of the P5 tenant (EFA on every GPU queue) run against the stand-in image, its locked
    memory check set to this machine's limit; the command after it says it ran."""
    script = render(with_image(tmp, "parallelcluster"))
    inside = rooted(script.split("inside='", 1)[1].split("'\n", 1)[0], root)
    limit = subprocess.run(["sh", "-c", "ulimit -l"], capture_output=True, text=True).stdout.strip()
    inside = inside.replace("!= unlimited ]", f"!= {limit} ]")
    return subprocess.run(["sh", "-c", inside, "fmcluster-acceptance", "echo", "nccl-tests ran"],
                          capture_output=True, text=True, env=image_env(root, host_facts, node))


def test_the_host_probe_reads_the_efa_installer_and_the_cuda_the_driver_supports(tmp_path: Path) -> None:
    """The host step's `sh -c`, run with a stand-in nvidia-smi and EFA installer record: one line per node."""
    script = render(with_image(tmp_path, "slurm-ec2"))
    probe = script.split("host_probe='", 1)[1].split("'\n", 1)[0]
    assert "/opt/amazon/efa_installed_packages" in probe
    record = tmp_path / "efa_installed_packages"
    record.write_text("# EFA installer version: 1.47.0\n# Debug packages installed: no\n# Packages installed:\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho 'Mon Dec  7 06:00:00 2026'\necho '+---+'\necho '{SMI_HEADER}'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURMD_NODENAME": "ip-10-0-1-5"}
    done = subprocess.run(["sh", "-c", probe.replace("/opt/amazon/efa_installed_packages", str(record))],
                          capture_output=True, text=True, env=env)
    assert done.stdout == "ip-10-0-1-5 efa=1.47.0 cuda=12.2 driver=535.183.01\n", done.stderr
    # a node without either: '-', which the ranks read as "cannot be read"
    bare = subprocess.run(["sh", "-c", probe.replace("/opt/amazon/efa_installed_packages", str(tmp_path / "none"))],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "n9"})
    assert bare.stdout == "n9 efa=- cuda=- driver=-\n"


def test_a_matching_image_runs_and_names_host_and_image_values(tmp_path: Path) -> None:
    done = run_inside(tmp_path, stand_in_image(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "fmcluster acceptance: container check on n1: host EFA installer 1.47.0, driver 535.183.01 " \
        "(CUDA 12.2); image CUDA 12.2, EFA installer 1.43.2, libfabric 2.1.0amzn3.0, plugin " \
        f"{tmp_path}/image/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so\nnccl-tests ran\n"
    assert "failed" not in done.stderr and "skipped" not in done.stderr


def test_a_cuda_runtime_of_a_newer_major_release_than_the_driver_supports_fails_closed(tmp_path: Path) -> None:
    done = run_inside(tmp_path, stand_in_image(tmp_path, cuda="13.0.1"))
    assert done.returncode == 1 and "nccl-tests ran" not in done.stdout
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("fmcluster acceptance: container check failed on n1: CUDA: host driver 535.183.01 supports "
                           "CUDA 12.2, the image CUDA runtime is 13.0; rule: ")
    assert "CUDA driver version is insufficient for CUDA runtime version" in line and "fix: " in line


def test_a_newer_minor_release_runs_by_minor_version_compatibility_saying_so(tmp_path: Path) -> None:
    done = run_inside(tmp_path, stand_in_image(tmp_path, cuda="12.9.1"))
    assert done.returncode == 0 and done.stdout.endswith("nccl-tests ran\n"), done.stderr
    assert "container check skipped on n1: CUDA: the image CUDA runtime 12.9 is newer than the host driver " \
        "535.183.01 supports (CUDA 12.2) and runs by minor version compatibility" in done.stderr


def test_an_older_runtime_runs_and_the_cuda_version_falls_back_to_libcudart(tmp_path: Path) -> None:
    root = stand_in_image(tmp_path, cuda=None)
    (root / "usr" / "local" / "cuda" / "lib64" / "libcudart.so.11.8.89").write_text("")
    done = run_inside(tmp_path, root)
    assert done.returncode == 0, done.stderr
    assert "image CUDA 11.8," in done.stdout


@pytest.mark.parametrize(("host_facts", "why"), [
    ("n2 efa=1.47.0 cuda=12.2 driver=535.183.01", "the host nvidia-smi printed no CUDA Version (driver unknown)"),
    ("n1 efa=- cuda=- driver=-", "the host nvidia-smi printed no CUDA Version (driver unknown)"),
    ("", "the host nvidia-smi printed no CUDA Version"),
])
def test_a_host_value_that_cannot_be_read_skips_its_comparison_saying_why(
        tmp_path: Path, host_facts: str, why: str) -> None:
    done = run_inside(tmp_path, stand_in_image(tmp_path, cuda="13.0.1"), host_facts=host_facts)
    assert done.returncode == 0 and done.stdout.endswith("nccl-tests ran\n"), done.stderr
    assert f"container check skipped on n1: CUDA: {why}" in done.stderr and "13.0 is not compared" in done.stderr


def test_an_image_cuda_that_cannot_be_read_skips_saying_why(tmp_path: Path) -> None:
    done = run_inside(tmp_path, stand_in_image(tmp_path, cuda=None))
    assert done.returncode == 0, done.stderr
    assert "container check skipped on n1: CUDA: the image has no /usr/local/cuda/version.json, libcudart.so.X.Y " \
        "or CUDA_VERSION" in done.stderr.replace(str(tmp_path / "image"), "")


def test_an_image_without_aws_ofi_nccl_fails_closed_before_nccl_falls_back_to_sockets(tmp_path: Path) -> None:
    done = run_inside(tmp_path, stand_in_image(tmp_path, plugin=None))
    assert done.returncode == 1 and "nccl-tests ran" not in done.stdout
    assert "container check failed on n1: aws-ofi-nccl: the image has no libnccl-net.so or libnccl-net-ofi.so on " \
        in done.stderr and "(host EFA installer 1.47.0); rule: without the plugin NCCL falls back to sockets " \
        "(NET/Socket)" in done.stderr


@pytest.mark.parametrize(("plugin_dir", "plugin"), [
    ("/opt/amazon/ofi-nccl/lib", "libnccl-net-ofi.so"),  # EFA installer 1.48+: no arch directory
    ("/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu", "libnccl-net-ofi.so"),  # an older EFA installer's
    ("/opt/aws-ofi-nccl/install/lib", "libnccl-net.so"),  # the recipe's own aws-ofi-nccl build until August 2025
])
def test_an_image_built_from_any_of_the_recipe_s_layouts_finds_its_plugin(
        tmp_path: Path, plugin_dir: str, plugin: str) -> None:
    """awsome-distributed-training's nccl-tests.Dockerfile has put aws-ofi-nccl in three places; the gate looked only
    in the arch directory, so an image of the current recipe (EFA installer 1.48, /opt/amazon/ofi-nccl/lib) or of one
    before September 2025 (/opt/aws-ofi-nccl/install/lib) failed "the image has no libnccl-net.so" with its plugin
    there."""
    done = run_inside(tmp_path, stand_in_image(tmp_path, plugin=plugin, plugin_dir=plugin_dir))
    assert done.returncode == 0, done.stderr
    assert f"plugin {tmp_path}/image{plugin_dir}/{plugin}\n" in done.stdout, done.stdout


def test_a_plugin_whose_libraries_do_not_resolve_fails_closed(tmp_path: Path) -> None:
    # the symbol-version mismatch of a libfabric paired with an older rdma-core (prime-rl PR 3454)
    missing = "/opt/amazon/efa/lib/libfabric.so.1: /lib/x86_64-linux-gnu/libefa.so.1: version `EFA_1.4' not found"
    done = run_inside(tmp_path, stand_in_image(tmp_path, unresolved=missing))
    assert done.returncode == 1, done.stdout
    assert f"aws-ofi-nccl: the image plugin {tmp_path}/image/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/" \
        f"libnccl-net-ofi.so does not load: {missing}; rule: " in done.stderr


def test_an_image_libfabric_that_finds_no_efa_provider_fails_closed_naming_both_installers(tmp_path: Path) -> None:
    done = run_inside(tmp_path, stand_in_image(tmp_path, efa_provider=False))
    assert done.returncode == 1, done.stdout
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("fmcluster acceptance: container check failed on n1: EFA: the image libfabric 2.1.0amzn3.0 "
                           "(EFA installer 1.43.2) finds no efa provider (fi_info -p efa -t FI_EP_RDM) on the host EFA "
                           "devices (host EFA installer 1.47.0); rule: ")


def test_an_image_without_fi_info_skips_the_provider_check_saying_why(tmp_path: Path) -> None:
    done = run_inside(tmp_path, stand_in_image(tmp_path, fi_info=False))
    assert done.returncode == 0, done.stderr
    assert "container check skipped on n1: EFA: the image has no fi_info" in done.stderr


def test_only_a_node_s_first_rank_reports_what_it_checked_every_rank_fails(tmp_path: Path) -> None:
    root = stand_in_image(tmp_path, cuda="13.0.1")
    script = render(with_image(tmp_path, "parallelcluster"))
    inside = rooted(script.split("inside='", 1)[1].split("'\n", 1)[0], root)
    limit = subprocess.run(["sh", "-c", "ulimit -l"], capture_output=True, text=True).stdout.strip()
    env = {**image_env(root, HOST_OK), "SLURM_LOCALID": "3"}
    done = subprocess.run(["sh", "-c", inside.replace("!= unlimited ]", f"!= {limit} ]"), "x", "true"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 1 and "container check failed on n1: CUDA" in done.stderr
    ok = subprocess.run(["sh", "-c", rooted(script.split("inside='", 1)[1].split("'\n", 1)[0], root).replace(
        "!= unlimited ]", f"!= {limit} ]").replace("13.0", "12.2"), "x", "true"], capture_output=True, text=True,
        env={**env, "FMC_HOST_FACTS": "n1 efa=1.47.0 cuda=13.0 driver=580.65.06"})
    assert ok.returncode == 0 and ok.stdout == "" and ok.stderr == "", ok.stderr


# --- refused images -----------------------------------------------------------------------------------------------

def validate(root: Path, org: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    from fmcluster import commands

    monkeypatch.setenv("FMCLUSTER_ROOT", str(root))
    lines: list[str] = []
    return commands.validate(org, out=lines.append), "\n".join(lines)


KEY = "tenant.acceptance.image"
REFUSED = [
    ("public-ecr", "slurm-ec2", "public.ecr.aws/hpc-cloud/nccl-tests:latest", "registry 'public.ecr.aws'"),
    ("docker-hub", "parallelcluster", "docker.io/library/nccl-tests:1", "registry 'docker.io'"),
    ("other-region-unlisted", "slurm-ec2", f"{ecr('us-west-2')}/nccl-tests:{TAG}",
     "is ECR in us-west-2, not in the tenant's region ap-northeast-1, and containers.registries does not list it"),
    ("no-registry", "hyperpod", "nccl-tests:latest", "is not an image reference"),
    ("shell-in-tag", "slurm-ec2", f"{ecr('ap-northeast-1')}/nccl-tests:1;id", "no shell characters"),
    ("substitution", "parallelcluster", f"{ecr('us-east-1')}/nccl-tests:$(id)", "no shell characters"),
    ("upper-case-path", "slurm-ec2", f"{ecr('ap-northeast-1')}/NCCL-tests:1", "lower-case path"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_an_image_outside_the_tenant_s_registries_is_refused_with_file_key_and_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[str, str, str, str]) -> None:
    _, scheduler, image, why = case
    org, root = AWS_GPU_TENANTS[scheduler](tmp_path)
    spec = root / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    doc = yaml.safe_load(spec.read_text())
    doc["tenant"].setdefault("acceptance", {})["image"] = image
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, output = validate(root, org, monkeypatch)
    assert code == 2 and "Traceback" not in output, output
    assert f"inventories/{org}/group_vars/all/tenant.yml:" in output and KEY in output, output
    assert why in output and "\n    fix: " in output, output


def test_another_region_s_ecr_listed_in_containers_registries_is_the_tenant_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = ecr("us-west-2")
    org, root = tenant_root(tmp_path, "stockmark", {"containers": {"registries": [other]},
                                                    "acceptance": {"image": f"{other}/nccl-tests:{TAG}"}})
    code, output = validate(root, org, monkeypatch)
    assert code == 0, output
    assert f"image={other}/nccl-tests:{TAG}" in render(load_tenant(org, root))


def test_another_account_than_the_stacks_is_refused_when_the_manifest_is_built(tmp_path: Path) -> None:
    """Offline the account is not known; the deploy reads it from the storage stack's ContainerRegistry output."""
    tenant = with_image(tmp_path, "slurm-ec2")
    with pytest.raises(ForeignRegistry) as refused:
        manifest_for(tenant, {"ContainerRegistry": "210987654321.dkr.ecr.ap-northeast-1.amazonaws.com"})
    message = str(refused.value)
    assert message.startswith("inventories/stockmark/group_vars/all/tenant.yml: acceptance.image: ")
    assert "is not in a registry of the tenant's account" in message and "Fix: push the image" in message


@pytest.mark.parametrize(("base", "change", "why"), [
    ("demo", {}, "provider local's nodes have no GPUs"),
    ("neuronlab", {}, "no queue has NVIDIA GPUs (neuron)"),
    ("stockmark", {"containers": {"enabled": False}}, "containers.enabled is false"),
])
def test_an_image_where_nothing_would_run_it_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, base: str, change: dict[str, Any], why: str) -> None:
    doc = yaml.safe_load((ROOT / f"inventories/{base}/group_vars/all/tenant.yml").read_text())
    image = f"{ecr(doc['tenant']['region'])}/nccl-tests:{TAG}"
    org, root = tenant_root(tmp_path, base, {**change, "acceptance": {**doc["tenant"].get("acceptance", {}),
                                                                      "image": image}})
    code, output = validate(root, org, monkeypatch)
    assert code == 2 and KEY in output and why in output, output


# --- the CPU bench from its image (the local substrate) --------------------------------------------------------------
CPU_TEMPLATE = ROOT / "roles" / "nccl_tests" / "templates" / "cpu-bench.sbatch.j2"


def render_cpu(tenant: Any) -> str:
    """cpu-all_reduce.sbatch as the submit node's play renders it for a local tenant (the provider's registry known)."""
    manifest = manifest_for(tenant)
    submit = manifest["groups"]["login"] or manifest["groups"]["controller"]
    variables = {**DEFAULTS, **manifest["vars"], **submit["vars"], "nccl_tests_collective": "all_reduce"}
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["quote"] = shlex.quote
    return env.from_string(CPU_TEMPLATE.read_text()).render(**variables)


def test_locally_the_cpu_queues_bench_runs_from_its_image_in_the_vpc_s_registry(tmp_path: Path) -> None:
    """Issue 39: where the nodes run images through fmcluster's runtime (the demo: slurm-ec2, containers enabled), the
    CPU queues' acceptance job runs the bench from the image the deploy pushes (its tag made of what it is built from),
    as the operator, each task in its own rootless runc (fmcluster-container run), with the image's own python3."""
    from fmcluster.containers import BENCH_IMAGE_PYTHONPATH
    from fmcluster.providers.local.registry import BENCH_REPOSITORY, bench_tag
    from fmcluster.providers.registry import provider_for

    tenant = load_tenant("demo")
    registry = provider_for(tenant).container_registry({})
    assert registry is not None and registry.bench_image == f"{registry.host}/{BENCH_REPOSITORY}:{bench_tag()}"
    script = render_cpu(tenant)
    bash_n(script, tmp_path)
    assert f"image={shlex.quote(registry.bench_image)}\n" in script
    assert 'fmcluster-container bundle "$image" >/dev/null' in script
    command = " ".join(script.split("exec srun ", 1)[1].replace("\\\n", " ").split())
    assert command == ('--mpi=none --kill-on-bad-exit=1 fmcluster-container run "$image" -- /usr/bin/env '
                       f'PYTHONPATH={BENCH_IMAGE_PYTHONPATH} MASTER_ADDR="$MASTER_ADDR" MASTER_PORT="$MASTER_PORT" '
                       '${FMC_BENCH_SOCKET_IFNAME:+"FMC_BENCH_SOCKET_IFNAME=$FMC_BENCH_SOCKET_IFNAME"} '
                       '/usr/bin/python3 -m fmcluster.acceptance.bench --op all_reduce "$@"'), command
    assert "export PYTHONPATH" not in script  # nothing of the node's checkout


@pytest.mark.parametrize("org, change", [("demo", {"containers": {"enabled": False}}), ("pcdemo", {}), ("hpdemo", {})])
def test_without_fmcluster_s_runtime_the_bench_runs_from_the_nodes_own_checkout(
        tmp_path: Path, org: str, change: dict[str, Any]) -> None:
    """Containers disabled, or a scheduler whose nodes run images through Pyxis (not rehearsed locally): the bench
    runs from the node's checkout, and no image is pushed or named."""
    from fmcluster.containers import bench_runs_in_container

    name, root = tenant_root(tmp_path, org, change, org=f"{org}x")
    tenant = load_tenant(name, root)
    assert not bench_runs_in_container(tenant)
    manifest = manifest_for(tenant)
    assert manifest["vars"]["nccl_tests_cpu_container_image"] == ""
    if "cpu" in manifest["vars"]["nccl_tests_backends"]:
        script = render_cpu(tenant)
        assert "--container" not in script and "-m fmcluster.acceptance.bench" in script


@pytest.mark.parametrize(("image", "host_facts"), [
    ({"cuda": "13.0.1"}, HOST_OK),
    ({"plugin": None}, HOST_OK),
    ({"efa_provider": False}, HOST_OK),
])
def test_the_gate_reads_the_check_s_refusal_as_container_check_failed(
        tmp_path: Path, image: dict[str, Any], host_facts: str) -> None:
    """What the job writes when its check refuses (the launcher's header, the check's line, srun's exit) is judged
    container_check_failed, naming the line, not "no results"."""
    from fmcluster.acceptance.expectation import expectation_for
    from fmcluster.acceptance.parser import parse_text
    from fmcluster.acceptance.verdict import judge
    from fmcluster.catalog import load_catalog

    done = run_inside(tmp_path, stand_in_image(tmp_path, **image), host_facts=host_facts)
    assert done.returncode == 1
    log = (f"# fmcluster acceptance job: all_reduce_perf in {ecr('us-east-1')}/nccl-tests:{TAG}\n"
           + "".join(f"0: {line}\n" for line in done.stderr.splitlines())
           + "srun: error: n1: tasks 0-7: Exited with exit code 1\n")
    verdict = judge(parse_text(log), expectation_for(load_catalog()["p5.48xlarge"], 2, collective="all_reduce"))
    assert verdict.status == "fail" and [f.code for f in verdict.failures] == ["container_check_failed"]
    # the line as the check wrote it (the parser keeps a line's first 500 characters; here the stand-in image's
    # long paths take most of them)
    assert done.stderr.strip().splitlines()[-1][:150] in verdict.failures[0].message


def test_a_run_from_the_image_that_fell_back_to_sockets_names_the_image_s_plugin(tmp_path: Path) -> None:
    """The recorded P5 socket-fallback log as the container job writes it (its first line names the image): still
    socket_fallback, now pointing at the image's plugin rather than at the node's efa role."""
    from fmcluster.acceptance.expectation import expectation_for
    from fmcluster.acceptance.parser import parse_text
    from fmcluster.acceptance.verdict import judge
    from fmcluster.catalog import load_catalog

    image = f"{ecr('us-east-1')}/nccl-tests:{TAG}"
    text = (ROOT / "tests" / "fixtures" / "nccl" / "p5_2node_socket_fallback.log").read_text()
    exp = expectation_for(load_catalog()["p5.48xlarge"], 2, collective="all_reduce")
    host = next(f for f in judge(parse_text(text), exp).failures if f.code == "socket_fallback")
    log = parse_text(f"# fmcluster acceptance job: all_reduce_perf in {image}\n" + text)
    assert log.container_image == image
    found = next(f for f in judge(log, exp).failures if f.code == "socket_fallback")
    assert found.message == host.message + f", running from the image {image}"
    assert "efa role" in host.fix and "efa role" not in found.fix
    assert "the image's aws-ofi-nccl must load" in found.fix and "NCCL_TESTS_IMAGE_LAYOUT" in found.fix


def test_without_efa_only_cuda_is_compared_and_a_newer_major_still_fails(tmp_path: Path) -> None:
    """A GPU queue without EFA (nccl_tests_container_efa false): no device, plugin or provider check, the CUDA one
    stays."""
    script = render(with_image(tmp_path, "parallelcluster"), nccl_tests_container_efa=False)
    bash_n(script, tmp_path)
    inside = script.split("inside='", 1)[1].split("'\n", 1)[0]
    assert "uverbs" not in inside and "fi_info" not in inside and "libnccl-net" not in inside
    root = stand_in_image(tmp_path, plugin=None, fi_info=False)
    ok = subprocess.run(["sh", "-c", rooted(inside, root), "x", "echo", "ran"], capture_output=True, text=True,
                        env=image_env(root, HOST_OK))
    assert ok.returncode == 0 and ok.stdout == ("fmcluster acceptance: container check on n1: host driver 535.183.01 "
                                                "(CUDA 12.2); image CUDA 12.2\nran\n"), ok.stderr
    newer = subprocess.run(["sh", "-c", rooted(inside, root), "x", "echo", "ran"], capture_output=True, text=True,
                           env=image_env(root, "n1 efa=- cuda=11.8 driver=520.61.05"))
    assert newer.returncode == 1 and "CUDA: host driver 520.61.05 supports CUDA 11.8, the image CUDA runtime is " \
        "12.2; rule: " in newer.stderr
