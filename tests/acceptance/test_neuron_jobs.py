"""Trainium queues in the deploy's gate (issue 37): the manifest asks the nccl_tests role for AWS Neuron's nccom-test
job scripts where a queue is Trainium, with nccom-test's directory from that queue's image contract; the role renders
`neuron-<collective>.sbatch`; the script runs nccom-test with one worker per NeuronCore over the job's nodes and
echoes its command line; the gate submits it for the Trainium queue and judges its output.

The script is run here as Slurm would run it on a trn1 node: Slurm's environment, `scontrol` answering for two
nodes, and in a private mount namespace a /dev holding `neuron0` (what the script looks for before it runs
anything). nccom-test itself is a stand-in printing the AWS Neuron user guide's own output (its healthy 2-instance
table, its neuron-bench failure): what is tested is the command line the script builds and the verdict on it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from conftest import HOST_PYTHON, ROOT, venv_tool
from fmcluster.acceptance import runner
from fmcluster.acceptance.expectation import expectation_for
from fmcluster.acceptance.neuron import NEURON_CORES
from fmcluster.acceptance.parser import parse_text
from fmcluster.acceptance.verdict import judge, render
from fmcluster.catalog import load_catalog
from fmcluster.images import load_images
from fmcluster.model import load_tenant
from localtenant import make_root, manifest_for

FIELD_LOGS = ROOT / "tests" / "fixtures" / "field_logs"
HEALTHY_TABLE = "".join(line for line in (FIELD_LOGS / "neuron-docs-nccom-test-trn1-2node.log").read_text()
                        .splitlines(keepends=True) if "nccom-test" not in line)
BENCH_FAILURE = "".join(line for line in (FIELD_LOGS / "neuron-docs-nccom-test-neuron-bench-failure.log").read_text()
                        .splitlines(keepends=True) if "nccom-test" not in line)


def role_vars(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest["vars"].items() if k.startswith("nccl_tests_")}


# --- what the manifest asks for -----------------------------------------------------------------------------------

def test_hyperpod_s_trainium_queue_gets_nccom_test_scripts_from_its_image() -> None:
    tenant = load_tenant("neuronlab", ROOT)
    variables = role_vars(manifest_for(tenant))
    assert variables["nccl_tests_backends"] == ["neuron"]
    assert variables["nccl_tests_neuron_workers_per_node"] == NEURON_CORES["trn1.32xlarge"].per_node == 32
    assert variables["nccl_tests_neuron_bin_dir"] == load_images()["hyperpod-default"].contract.neuron_bin_dir


def test_a_slurm_ec2_trainium_queue_runs_nccom_test_from_its_own_image_not_the_login_node_s(tmp_path: Path) -> None:
    """slurm-ec2's login node boots the GPU DLAMI, which ships no Neuron: the path is the Trainium image's."""
    root = make_root(tmp_path, "trnec2", "10.77.0.0/16", login=1, provider="aws",
                     queues=[{"name": "trn", "instance_type": "trn1.32xlarge", "count": 2},
                             {"name": "cpu", "instance_type": "c5.2xlarge", "count": 1}])
    manifest = manifest_for(load_tenant("trnec2", root))
    variables = role_vars(manifest)
    catalog = load_images()
    assert variables["nccl_tests_backends"] == ["cpu", "neuron"]
    assert catalog[manifest["groups"]["login"]["vars"]["fmcluster_image"]].contract.neuron_bin_dir is None
    assert variables["nccl_tests_neuron_bin_dir"] == catalog.ec2_image("neuron").contract.neuron_bin_dir
    assert variables["nccl_tests_neuron_bin_dir"]  # the Neuron DLAMI ships aws-neuronx-tools


def test_gpu_and_cpu_tenants_get_no_neuron_scripts() -> None:
    for org in ("stockmark", "demo"):
        variables = role_vars(manifest_for(load_tenant(org, ROOT)))
        assert "neuron" not in variables["nccl_tests_backends"], org
        assert variables["nccl_tests_neuron_bin_dir"] == "" and variables["nccl_tests_neuron_workers_per_node"] == 0


def test_a_trainium_queue_on_an_image_without_neuron_tools_gets_no_script(tmp_path: Path) -> None:
    """The local substrate's image ships no Neuron: no script, so the gate says the queue is not gated and why."""
    root = make_root(tmp_path, "trnlocal", "10.78.0.0/16",
                     queues=[{"name": "trn", "instance_type": "trn1.32xlarge", "count": 2}])
    variables = role_vars(manifest_for(load_tenant("trnlocal", root)))
    assert variables["nccl_tests_backends"] == [] and variables["nccl_tests_neuron_bin_dir"] == ""


# --- the role renders the scripts, the script runs nccom-test, the gate judges it ---------------------------------

INVENTORY = """all:
  vars: {{ansible_connection: local, ansible_python_interpreter: "{python}"}}
  children:
    controller: {{hosts: {{fmn-ctl: {{}}}}}}
    login: {{hosts: {{fmn-ctl: {{}}}}}}
    compute: {{hosts: {{fmn-c1: {{}}}}}}
"""


@pytest.fixture(scope="module")
def neuronlab_jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """neuronlab's job scripts as the role renders them from its manifest's variables."""
    tmp = tmp_path_factory.mktemp("neuronlab-jobs")
    (tmp / "hosts.yml").write_text(INVENTORY.format(python=HOST_PYTHON))
    variables = {**role_vars(manifest_for(load_tenant("neuronlab", ROOT))), "nccl_tests_job_dir": str(tmp / "jobs")}
    run = subprocess.run([venv_tool("ansible-playbook"), "-i", str(tmp / "hosts.yml"),
                          str(ROOT / "playbooks" / "acceptance-jobs.yml"), "-e", json.dumps(variables)],
                         cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
    assert run.returncode == 0, run.stdout + run.stderr
    # this machine has no Neuron device: the compute play says so and checks nothing
    assert "has no Neuron device (no /dev/neuron[0-9]*): nccom-test check skipped" in run.stdout.replace("\n    ", " ")
    return tmp / "jobs"


def run_job(script: Path, tmp: Path, nodes: list[str], output: str, *args: str, device: bool = True) -> str:
    """The job as Slurm runs it on the first of `nodes`, with nccom-test a stand-in that prints `output`."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = show ] && [ "$2" = hostnames ]; then printf "%s\\n" ' + " ".join(nodes) + "; exit 0; fi\n"
        'if [ "$1" = -o ]; then n=$4; echo "NodeName=$n Arch=x86_64 NodeAddr=10.1.4.${n##*-} State=ALLOCATED"; '
        "exit 0; fi\nexit 1\n")
    (bin_dir / "nccom-test").write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\n")
    for tool in ("scontrol", "nccom-test"):
        (bin_dir / tool).chmod(0o755)
    contract_dir = load_images()["hyperpod-default"].contract.neuron_bin_dir
    assert contract_dir and f"{contract_dir}/nccom-test" in script.read_text()
    job = tmp / script.name
    job.write_text(script.read_text().replace(f"{contract_dir}/nccom-test", f"{bin_dir}/nccom-test"))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURMD_NODENAME": nodes[0], "SLURM_JOB_NODELIST": ",".join(nodes),
           "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NTASKS_PER_NODE": "32", "SLURM_JOB_ID": "4242"}
    argv = ["bash", str(job), *args]
    if device:  # a /dev of its own with neuron0 in it, in a private mount namespace: this machine's /dev is untouched
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs fmcluster-dev /dev && : > /dev/neuron0 && : > /dev/null && exec "$@"', "job", *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    return proc.stdout + proc.stderr


def gate(text: str, nodes: int) -> Any:
    return judge(parse_text(text), expectation_for(load_catalog()["trn1.32xlarge"], nodes, collective="all_reduce",
                                                   require_data_check=True))


@pytest.mark.slow
def test_the_role_renders_nccom_test_scripts_for_the_trainium_queue_only(neuronlab_jobs: Path) -> None:
    assert sorted(p.name for p in neuronlab_jobs.iterdir()) == [
        "neuron-all_gather.sbatch", "neuron-all_reduce.sbatch", "neuron-alltoall.sbatch",
        "neuron-reduce_scatter.sbatch"]
    text = (neuronlab_jobs / "neuron-all_reduce.sbatch").read_text()
    assert text.startswith("#!/bin/bash\n# generated by fmcluster (nccl_tests role); edits will be reverted")
    assert "#SBATCH --ntasks-per-node=32" in text and "-d fp32" in text and "--check" in text
    assert "/opt/aws/neuron/bin/nccom-test" in text  # hyperpod-default's contract, through the manifest
    check = subprocess.run(["bash", "-n", str(neuronlab_jobs / "neuron-all_reduce.sbatch")], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.slow
def test_the_script_runs_one_worker_per_neuroncore_over_the_job_s_nodes(neuronlab_jobs: Path, tmp_path: Path) -> None:
    out = run_job(neuronlab_jobs / "neuron-all_reduce.sbatch", tmp_path, ["trn-1", "trn-2"], HEALTHY_TABLE)
    command = next(line for line in out.splitlines() if line.startswith("# fmcluster acceptance job:"))
    assert "NEURON_RT_ROOT_COMM_ID=10.1.4.1:" in command
    assert command.endswith("-r 64 -N 2 -d fp32 -b 8 -e 1GB -f 2 -n 20 -w 5 --check all_reduce --hosts 10.1.4.1 "
                            "10.1.4.2"), command
    verdict = gate(out, 2)
    assert verdict.passed, render(verdict)
    single = run_job(neuronlab_jobs / "neuron-all_reduce.sbatch", tmp_path, ["trn-1"], HEALTHY_TABLE, "-b", "1G",
                     "-e", "1G", "--check", "-n", "20")
    line = next(line for line in single.splitlines() if line.startswith("# fmcluster acceptance job:"))
    assert line.endswith("-r 32 -N 1 -d fp32 -b 1G -e 1G --check -n 20 all_reduce") and "--hosts" not in line


@pytest.mark.slow
def test_a_node_without_neuron_devices_runs_nothing_and_fails(neuronlab_jobs: Path, tmp_path: Path) -> None:
    out = run_job(neuronlab_jobs / "neuron-all_reduce.sbatch", tmp_path, ["trn-1", "trn-2"], HEALTHY_TABLE,
                  device=False)
    assert "has no Neuron device (no /dev/neuron[0-9]*): nccom-test not run" in out and "size(B)" not in out
    assert not gate(out, 2).passed


class RenderedSlurm:
    """sinfo, `test -f` on the role's rendered scripts, sbatch, wait and the job logs the scripts wrote."""

    def __init__(self, jobs: Path, logs: dict[str, str]) -> None:
        self.jobs, self.logs = jobs, logs
        self.submitted: list[tuple[str, tuple[str, ...], int | None]] = []

    def run(self, argv: list[str], check: bool = True, timeout: float = 60) -> "subprocess.CompletedProcess[str]":
        if argv[0] == "sinfo":
            return subprocess.CompletedProcess(argv, 0, "trn-1 idle\ntrn-2 idle\n", "")
        assert argv[:2] == ["test", "-f"] and PurePosixPath(argv[2]).parent == runner.JOB_DIR, argv
        return subprocess.CompletedProcess(argv, 0 if (self.jobs / PurePosixPath(argv[2]).name).is_file() else 1, "", "")

    def make_dir(self, path: PurePosixPath) -> None:
        pass

    def submit(self, script: PurePosixPath, *, nodes: list[str], output: PurePosixPath,
               ntasks_per_node: int | None = None, **_: object) -> Any:
        from fmcluster.acceptance.slurm import Job

        self.submitted.append((script.name, tuple(nodes), ntasks_per_node))
        return Job(len(self.submitted), tuple(nodes), output)

    def wait(self, jobs: list[Any], timeout: float, poll: float = 0.5) -> dict[int, str]:
        return {j.job_id: "COMPLETED" for j in jobs}

    def read_file(self, path: PurePosixPath) -> str | None:
        return self.logs.get(path.name)


@pytest.mark.slow
@pytest.mark.parametrize("nccom_output", ["healthy", "neuron-bench failure"])
def test_the_gate_plans_nccom_test_for_neuronlab_s_trainium_queue_and_judges_it(
        neuronlab_jobs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nccom_output: str) -> None:
    tenant = load_tenant("neuronlab", ROOT)
    monkeypatch.setattr(runner.results, "new_run_dir", lambda org, now=None: tmp_path)
    monkeypatch.setattr(runner.results, "previous_result", lambda org, current: None)
    output = HEALTHY_TABLE if nccom_output == "healthy" else BENCH_FAILURE
    script = neuronlab_jobs / "neuron-all_reduce.sbatch"
    slurm = RenderedSlurm(neuronlab_jobs, {"trn-all_reduce-2nodes.log": run_job(script, tmp_path, ["trn-1", "trn-2"],
                                                                                output)})
    result = runner.run_acceptance(tenant, slurm, "/fsx", out=lambda line: None)  # type: ignore[arg-type]
    assert ("neuron-all_reduce.sbatch", ("trn-1", "trn-2"), 32) in slurm.submitted
    assert ("neuron-all_gather.sbatch", ("trn-1", "trn-2"), 32) in slurm.submitted  # neuronlab's tests
    assert not any("not gated" in note for note in result.notes), result.notes
    verdict = {t.name: t.verdict for t in result.tests}["trn-all_reduce-2nodes"]
    if nccom_output == "healthy":
        assert verdict.passed, render(verdict)
        assert verdict.expectation is not None and verdict.expectation.min_busbw_gbps == 40
    else:
        assert not verdict.passed and "nccom_test_failed" in {f.code for f in verdict.failures}, render(verdict)
