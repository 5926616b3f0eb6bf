"""roles/slurm_containers on a harness host running Debian 12's Slurm 22.05 (slurmctld and a configless slurmd, as
fmcluster's compute nodes run it): alice runs the tests' image from the tenant's local registry with
`srun --container=$(fmcluster-container bundle REF)`, as herself outside (rootless runc: root of her own user
namespace inside, uid 0 mapped to hers), with her home and /fsx mounted; the second run takes the bundle from the
cache on /fsx without pulling; a reference outside the tenant's registry is refused; the operator's acceptance job
for CPU queues (roles/nccl_tests' cpu-bench.sbatch.j2 with its image) runs fmcluster's bench from the image and its
log is judged as the gate judges it. The registry is the substrate's (fmcluster.providers.local.registry), the image
built from the node image on this machine: nothing leaves it.

Slurm is configured by hand here (one node, no accounting): what is under test is the role and Slurm's OCI path,
the Slurm roles have their own tests (molecule/slurm_cluster)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from conftest import ROOT
from fmcluster.acceptance import parse_text
from fmcluster.containers import BENCH_IMAGE_PYTHONPATH
from fmcluster.providers.local import image
from fmcluster.providers.local.hosts import Host, host_run, router_address
from fmcluster.providers.local.registry import Registry, ensure_registry, push_bench_image
from fmcluster.stacks.render import subnet_cidrs
from role_helpers import converge_hosts, systemd_hosts

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="harness hosts (namespaces, systemd-nspawn) need root")]

ORG = "t-oci"
VPC = "10.95.88.0/24"
ALICE = {"name": "alice", "uid": 2001, "gid": 2001}
#: The image's default user, who submits the acceptance jobs (not one of the tenant's users).
OPERATOR = "ops"
SPOOL = "/var/spool/slurmd"
#: Where a configless slurmd keeps what it fetched, and where slurmstepd then reads oci.conf (beside that slurm.conf).
CONF_CACHE = f"{SPOOL}/conf-cache"


def run(node: Host, script: str, timeout: float = 300) -> str:
    done = host_run(node, ["sh", "-ec", script], timeout=timeout)
    assert done.returncode == 0, f"{script}\n{done.stdout}{done.stderr}"
    return done.stdout


def as_alice(node: Host, script: str) -> tuple[int, str, str]:
    done = host_run(node, ["runuser", "-u", "alice", "--", "sh", "-c", f"cd && {script}"], timeout=300)
    return done.returncode, done.stdout, done.stderr


def slurm_conf(node: Host) -> str:
    return "\n".join([
        "ClusterName=t-oci", f"SlurmctldHost={node.hostname}({node.address})", "AuthType=auth/munge",
        "SlurmctldParameters=enable_configless", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log", "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "StateSaveLocation=/var/lib/slurm/slurmctld", f"SlurmdSpoolDir={SPOOL}", "ReturnToService=2", "MpiDefault=none",
        f"NodeName={node.hostname} NodeAddr={node.address} CPUs=2 State=UNKNOWN",
        "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Host, Registry, str]]:
    tmp = tmp_path_factory.mktemp("oci-hosts")
    with systemd_hosts(ORG, VPC, 1, tmp, shared=["/fsx"]) as (inventory, hosts):
        node = hosts[0]
        registry = ensure_registry(ORG, router_address(subnet_cidrs(VPC)["private"]).split("/")[0])
        reference = push_bench_image(registry, image.ensure_image(lambda _: None).rootfs)
        run(node, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurmctld slurmd "
                  "slurm-client munge >/dev/null", timeout=900)
        (node.root / "etc/slurm/slurm.conf").write_text(slurm_conf(node))
        # slurmd is configless, as on fmcluster's compute nodes: it fetches slurm.conf from slurmctld into its cache.
        (node.root / "etc/default/slurmd").write_text(f"SLURMD_OPTIONS=\"--conf-server {node.address}\"\n")
        run(node, f"""
            mkdir -p /var/lib/slurm/slurmctld {SPOOL} /var/log/slurm && chown slurm: /var/lib/slurm/slurmctld /var/log/slurm
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
            chown munge: /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
            useradd -m -u {ALICE['uid']} -U alice
            useradd -m -u 2002 -U {OPERATOR}
            systemctl restart munge slurmctld && sleep 1 && systemctl restart slurmd
            for i in $(seq 60); do sinfo -h -o %T | grep -q idle && exit 0; sleep 1; done; sinfo; exit 1""")
        yield inventory, node, registry, reference


def play(registry: Registry) -> list[dict[str, Any]]:
    return [{"name": "slurm_containers", "hosts": "all", "gather_facts": True, "gather_subset": ["min"],
             "roles": [{"role": "slurm_containers", "vars": {
                 "slurm_containers_registries": [registry.host],
                 "slurm_containers_insecure_registries": [registry.host],
                 "slurm_containers_users": [ALICE],
                 "slurm_containers_operator": OPERATOR,
                 "slurm_containers_conf_cache_dir": CONF_CACHE}}]}]


def test_alice_runs_the_registry_image_through_srun_container_and_the_second_run_uses_the_cache(
        cluster: tuple[Path, Host, Registry, str], tmp_path: Path) -> None:
    inventory, node, registry, reference = cluster
    code, _, out = converge_hosts(inventory, play(registry), tmp_path)
    assert code == 0, out
    code, changed, out = converge_hosts(inventory, play(registry), tmp_path)
    assert code == 0 and set(changed.values()) == {0}, out

    srun = (f"srun --container=\"$(fmcluster-container bundle {reference})\" sh -c "
            "'id -u; cat /proc/self/uid_map; pwd; hostname; touch /fsx/alice-was-here ~/alice-was-here; "
            "python3 -c \"print(6 * 7)\"'")
    code, stdout, stderr = as_alice(node, srun)
    assert code == 0, stdout + stderr
    lines = stdout.split()
    # Root of her own user namespace inside (runc maps only her uid, to 0), herself outside.
    assert lines[0] == "0" and lines[1:4] == ["0", str(ALICE["uid"]), "1"], stdout
    assert lines[4] == "/home/alice" and lines[5] == node.hostname and lines[6] == "42", stdout
    # Seen from the node (/fsx is bound into the host's own mount namespace): hers outside.
    owners = run(node, "stat -c %u:%g /fsx/alice-was-here /home/alice/alice-was-here").split()
    assert owners == [f"{ALICE['uid']}:{ALICE['gid']}"] * 2, owners
    assert "pulled into /fsx/.fmcluster/containers/images/sha256-" in stderr, stderr

    code, stdout, stderr = as_alice(node, srun)
    assert code == 0 and stdout.split()[6] == "42", stdout + stderr
    assert "not pulled again" in stderr and "(cached)" in stderr, stderr


def test_a_reference_outside_the_tenant_s_registry_or_with_shell_characters_is_refused(
        cluster: tuple[Path, Host, Registry, str], tmp_path: Path) -> None:
    inventory, node, registry, _ = cluster
    code, _, out = converge_hosts(inventory, play(registry), tmp_path)
    assert code == 0, out
    for reference, why in [("docker.io/library/busybox:latest", "is not the tenant's"),
                           (f"{registry.host}/fmcluster/cpu-test:1;id", "no shell characters")]:
        code, stdout, stderr = as_alice(node, f"fmcluster-container bundle '{reference}'")
        assert code == 2 and reference in stderr and why in stderr and "fix: push the image to the tenant's registry " \
            f"({registry.host})" in stderr, stdout + stderr
        assert not stdout


def test_a_configless_slurmstepd_reads_oci_conf_only_from_slurmd_s_cache_and_the_role_keeps_it_there(
        cluster: tuple[Path, Host, Registry, str], tmp_path: Path) -> None:
    """Slurm 22.05 serves no oci.conf to configless nodes and slurmstepd reads it beside the slurm.conf slurmd fetched:
    the copy in /etc/slurm alone does nothing there (the command runs on the node, not in the image). slurmd empties
    its cache when it starts (measured: the copy is gone after a restart); the role's keeper service puts it back, also when slurmd restarts in quick succession (as it does while a node joins) or is
    reconfigured. (A compute node of the e2e cluster ran alice's `srun --container` job uncontained when a watch on
    the cache's slurm.conf had put oci.conf back before slurmd dropped it again.)"""
    inventory, node, registry, reference = cluster
    code, _, out = converge_hosts(inventory, play(registry), tmp_path)
    assert code == 0, out
    in_image = f"srun --container=\"$(fmcluster-container bundle {reference})\" cat /proc/self/uid_map"
    contained = ["0", str(ALICE["uid"]), "1"]
    reconfigure = (f"old=$(stat -c %Y.%Z {CONF_CACHE}/slurm.conf); sleep 1.1; scontrol reconfigure; "
                   f"for i in $(seq 60); do sleep 0.5; test \"$(stat -c %Y.%Z {CONF_CACHE}/slurm.conf)\" != \"$old\" "
                   "&& exit 0; done; exit 1")
    oci_conf_back = f"sleep 2; for i in $(seq 20); do test -f {CONF_CACHE}/oci.conf && exit 0; sleep 0.5; done; exit 1"
    # Slurm's own behaviour, the keeper stopped: without oci.conf in the cache the job runs on the node itself.
    run(node, f"systemctl stop fmcluster-oci-conf && rm {CONF_CACHE}/oci.conf")
    try:
        code, stdout, stderr = as_alice(node, in_image)
        assert stdout.split() != contained, stdout + stderr  # not in a container
    finally:
        run(node, "systemctl start fmcluster-oci-conf")
    # slurmd restarted in quick succession (as while a node joins), then reconfigured: oci.conf stays or comes back.
    run(node, "for i in 1 2 3 4 5; do systemctl restart slurmd; done; "
              "for i in $(seq 60); do sinfo -h -o %T | grep -q idle && exit 0; sleep 1; done; exit 1")
    run(node, oci_conf_back)
    assert run(node, f"cmp /etc/slurm/oci.conf {CONF_CACHE}/oci.conf && echo same").split() == ["same"]
    code, stdout, stderr = as_alice(node, in_image)
    assert code == 0 and stdout.split() == contained, stdout + stderr
    run(node, reconfigure)
    run(node, oci_conf_back)
    code, stdout, stderr = as_alice(node, in_image)
    assert code == 0 and stdout.split() == ["0", str(ALICE["uid"]), "1"], stdout + stderr


def test_the_operator_s_cpu_acceptance_job_runs_the_bench_from_its_image_and_passes_the_gate_s_parser(
        cluster: tuple[Path, Host, Registry, str], tmp_path: Path) -> None:
    """Issue 39: the CPU queues' acceptance job as roles/nccl_tests renders it with the bench image the manifest names
    (fmcluster.containers.bench_image_vars), submitted with sbatch by the operator (the image's default user, given a
    runtime root and a bundle directory by the role): the bench runs in the image (the job's environment, MASTER_ADDR
    and each task's own rank reaching it: fmcluster-container run per task), and its log parses as a clean nccl-tests
    log of fmcluster's bench with both ranks."""
    inventory, node, registry, reference = cluster
    code, _, out = converge_hosts(inventory, play(registry), tmp_path)
    assert code == 0, out
    defaults = yaml.safe_load((ROOT / "roles/nccl_tests/defaults/main.yml").read_text())
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["quote"] = shlex.quote
    job = env.from_string((ROOT / "roles/nccl_tests/templates/cpu-bench.sbatch.j2").read_text()).render(
        **{**defaults, "nccl_tests_collective": "all_reduce", "nccl_tests_cpu_container_image": reference,
           "nccl_tests_cpu_container_pythonpath": BENCH_IMAGE_PYTHONPATH})
    (node.root / f"home/{OPERATOR}/cpu-all_reduce.sbatch").write_text(job)  # the host's /tmp is its own tmpfs
    log = f"/home/{OPERATOR}/cpu-all_reduce.log"
    # Two ranks on the one node, as the gate's single-node run starts them.
    submitted = run(node, f"runuser -u {OPERATOR} -- sbatch --parsable --wait --nodes=1 --ntasks-per-node=2 "
                          f"--output={log} /home/{OPERATOR}/cpu-all_reduce.sbatch "
                          "-b 64K -e 256K -f 2 -n 2 -w 1 -c 1")
    assert submitted.strip().isdigit(), submitted
    text = (node.root / log.lstrip("/")).read_text()
    assert f"# fmcluster acceptance job: all_reduce_perf in {reference}" in text, text
    assert f"bundles/{OPERATOR}/sha256-" in text, text  # the operator's own bundle, as a user's
    parsed = parse_text(text)
    assert parsed.tests_version and parsed.tests_version.startswith("fmcluster-cpu-bench "), text
    assert parsed.completed and parsed.out_of_bounds == 0 and parsed.rows and not parsed.errors, text
    assert parsed.ranks == 2 and parsed.rank_lines == 2, text  # each rank its own, inside its own container
    in_image = run(node, f"runuser -u {OPERATOR} -- sh -c 'cd && srun --container=\"$(fmcluster-container bundle "
                         f"{reference} 2>/dev/null)\" cat /proc/self/uid_map'").split()
    assert in_image == ["0", "2002", "1"], in_image
