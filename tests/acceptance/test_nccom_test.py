"""Trainium acceptance (issue 37): AWS Neuron's nccom-test output is read and judged by the same fail-closed rule as
nccl-tests': its command line (operation, workers, nodes, --check), one completed table, no failure line, physical
rows (in GiB/s or GB/s, whichever nccom-test printed), a row at the reference size, all_reduce's busbw at the
catalog's floor. The healthy log is the Neuron user guide's 2-instance example (tests/fixtures/field_logs); every
failure below is that log edited once.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from fmcluster.acceptance.expectation import expectation_for, resolve_expectation
from fmcluster.acceptance.neuron import bus_factor, parse_command, units
from fmcluster.acceptance.parser import parse_file, parse_text
from fmcluster.acceptance.slurm import Job
from fmcluster.acceptance.verdict import Verdict, judge, render
from fmcluster.catalog import load_catalog
from fmcluster.cli import main
from fmcluster.exits import ExitCode

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "fixtures" / "field_logs" / "neuron-docs-nccom-test-trn1-2node.log"
PUBLIC = Path(__file__).resolve().parent / "public_logs"
CHECKED = HEALTHY.read_text().replace(" allr --hosts", " --check allr --hosts")


def gate(text: str, instance_type: str = "trn1.32xlarge", nodes: int = 2, require: bool = True) -> Verdict:
    exp = expectation_for(load_catalog()[instance_type], nodes, collective="all_reduce", require_data_check=require)
    return judge(parse_text(text), exp)


def failed(v: Verdict) -> set[str]:
    return {f.code for f in v.failures}


# --- reading ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "operation", "ranks", "nodes", "check"), [
    ("nccom-test -r 2 allr", "all_reduce", 2, 1, False),
    ("NEURON_RT_ROOT_COMM_ID=10.1.4.145:45654 nccom-test -r 64 -N 2 -b 8 -e 1GB -f 2 -d fp32 allr --hosts 127.0.0.1 "
     "10.1.4.138", "all_reduce", 64, 2, False),
    ("+ nccom-test --nworkers 64 --nnodes 2 --minbytes 8 --maxbytes 512KB --datatype fp32 all_reduce --hosts a b",
     "all_reduce", 64, 2, False),
    ("# fmcluster acceptance job: nccom-test --nworkers=64 --nnodes=2 --check random redsct", "reduce_scatter", 64, 2,
     True),
    ("$ /opt/aws/neuron/bin/nccom-test allg -r 64 -c --streams-json s.json", "all_gather", 64, 1, True),
    ('nccom-test -r $((NEURON_CORE_PER_NODE*WORKER_NODE_COUNT)) -N 2 -b "8" -e "2G" allr', "all_reduce", None, 2, False),
])
def test_the_command_line_says_operation_workers_nodes_and_check(line: str, operation: str, ranks: int | None,
                                                                 nodes: int, check: bool) -> None:
    cmd = parse_command(line)
    assert cmd is not None
    assert (cmd.operation, cmd.ranks, cmd.nodes, cmd.check) == (operation, ranks, nodes, check)


@pytest.mark.parametrize("prose", ["nccom-test is a benchmarking tool for Collective Communication",
                                   "see /tmp/nccom_test_log_7pqpdfjf.log", "the nccom-test user guide"])
def test_a_line_that_only_mentions_nccom_test_is_not_a_command(prose: str) -> None:
    assert parse_command(prose) is None


def test_the_bus_factors_are_the_user_guide_s() -> None:
    assert bus_factor("all_reduce", 64) == pytest.approx(2 * 63 / 64)
    assert bus_factor("all_gather", 32) == bus_factor("alltoall", 32) == pytest.approx(31 / 32)
    assert bus_factor("sendrecv", 8) == bus_factor("permute", 8) == 1.0
    assert bus_factor("all_gatherv", 8) is None and bus_factor("all_reduce", None) is None


def test_both_units_nccom_test_has_printed_are_told_apart_by_the_row_itself() -> None:
    old = parse_file(HEALTHY).nccom
    new = parse_file(PUBLIC / "neuron-docs-nccom-test-show-algorithm.log").nccom
    assert old is not None and new is not None
    gib = old.row_at(1 << 30)
    dec = new.row_at(536870912)
    assert gib is not None and units(gib)[0][0] == "GiB/s"
    assert dec is not None and units(dec)[0][0] == "GB/s" and dec.algorithm == "kangaring"


def test_the_healthy_log_is_read_whole() -> None:
    log = parse_file(HEALTHY)
    run = log.nccom
    assert log.tool == "nccom-test" and log.completed and log.avg_busbw_gbps == pytest.approx(9.3924)
    assert run is not None and len(run.rows) == 28 and run.tables == 1 and run.garbled_lines == 0
    assert run.command is not None and run.command.hosts == ("127.0.0.1", "10.1.4.138")
    assert log.rows == ()  # nccl-tests' size rows stay empty: the nccom-test rows have one half only


# --- the verdict ---------------------------------------------------------------------------------------------

def test_the_healthy_trn1_log_passes_with_its_floor_and_public_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acceptance", "parse", str(HEALTHY), "--instance-type", "trn1.32xlarge", "--json"]) == ExitCode.OK
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "pass" and data["codes"] == ["data_unchecked"]
    assert "2 node(s) from the nccom-test command line" in data["expectation_basis"]
    baseline = data["verdict"]["baseline"]
    assert "measured 50.56 GB/s (nccom-test printed 47.09 GiB/s)" in baseline
    assert "floor 40 GB/s (catalog:" in baseline and "~50.6 GB/s at 1 GiB on 2 node(s)" in baseline
    assert "nccom-test.html" in baseline


def test_the_gate_requires_check_and_passes_a_checked_run() -> None:
    unchecked = gate(HEALTHY.read_text())
    assert failed(unchecked) == {"data_unchecked"}, render(unchecked)
    checked = gate(CHECKED)
    assert checked.passed and checked.busbw_gbps == pytest.approx(50.56, abs=0.01), render(checked)


def _edit(old: str, new: str, text: str = CHECKED) -> str:
    assert old in text, old
    return text.replace(old, new)


@pytest.mark.parametrize(("edited", "code"), [
    (_edit("1073741824       268435456    fp32       41806          23.92          47.09",
           "1073741824       268435456    fp32       62709          15.95          31.40"), "below_floor"),
    (_edit("-r 64 -N 2", "-r 32 -N 2"), "rank_count"),
    (_edit("-r 64 -N 2", "-r 64 -N 3"), "host_count"),
    (_edit("Avg bus bandwidth:      9.3924GB/s\n", ""), "truncated"),
    (CHECKED + "1 errors found - test failed\n", "nccom_test_failed"),
    (_edit("41806          23.92          47.09", "41806          23.92          57.09"), "non_physical"),
    (_edit("41806          23.92          47.09", "4180          23.92          47.09"), "non_physical"),
    (_edit("41806          23.92          47.09", "41806          nan          47.09"), "non_finite"),
    (_edit("1073741824       268435456", "2147483648       536870912"), "reference_size_missing"),
    (_edit(" allr --hosts", " allg --hosts"), "benchmark_mismatch"),
    (_edit(" allr --hosts", " allr --data-parallel-dimension 2 --hosts"), "benchmark_mismatch"),
    (CHECKED + CHECKED, "multiple_tables"),
], ids=["below-floor", "half-the-workers", "three-nodes", "no-footer", "failure-line", "busbw-vs-algbw",
        "time-vs-algbw", "nan", "no-reference-row", "another-operation", "replica-groups", "two-runs"])
def test_each_edit_of_the_healthy_log_fails_with_its_code(edited: str, code: str) -> None:
    v = gate(edited)
    assert v.status == "fail" and code in failed(v), render(v)


def test_a_log_without_its_command_line_never_passes() -> None:
    lines = [line for line in CHECKED.splitlines() if "nccom-test" not in line]
    v = gate("\n".join(lines))
    assert v.status == "fail" and "data_unchecked" in failed(v) and "rank_count_unknown" in v.codes, render(v)
    relaxed = gate("\n".join(lines), require=False)
    assert relaxed.status == "fail" and "no_positive_evidence" in failed(relaxed), render(relaxed)
    assert "command line" in relaxed.cause


def test_removing_any_one_line_passes_only_when_it_is_a_size_row_other_than_the_reference() -> None:
    lines = CHECKED.splitlines()
    for i, line in enumerate(lines):
        v = gate("\n".join(lines[:i] + lines[i + 1:]))
        reference = line.split()[0] == str(1 << 30)
        other_row = line.split()[0].isdigit() and not reference
        assert v.passed == other_row, f"removed line {i + 1} ({line!r}):\n{render(v)}"


def test_instance_types_and_tools_that_do_not_match_fail() -> None:
    as_p5 = gate(CHECKED, "p5.48xlarge")
    assert "benchmark_mismatch" in failed(as_p5) and "nccl-tests" in as_p5.cause
    nccl_log = (ROOT / "fixtures" / "nccl" / "p5_2node_all_reduce_ok.log").read_text()
    as_trn1 = gate(nccl_log)
    assert failed(as_trn1) == {"benchmark_mismatch"} and "nccom-test" in as_trn1.cause


def test_without_an_instance_type_it_is_not_judged_but_a_failure_still_fails() -> None:
    log = parse_file(HEALTHY)
    found = resolve_expectation(log, load_catalog())
    v = judge(log, found.expectation, not_judged_reason=found.reason)
    assert v.status == "not_judged" and "neuron_not_judged" in v.codes
    broken = judge(parse_text(CHECKED + "1 errors found - test failed\n"), None)
    assert broken.status == "fail" and failed(broken) == {"nccom_test_failed"}


def test_the_worker_count_is_one_per_neuroncore_of_each_instance() -> None:
    catalog = load_catalog()
    assert expectation_for(catalog["trn1.32xlarge"], 2).expected_ranks == 64
    assert expectation_for(catalog["trn1n.32xlarge"], 1).expected_ranks == 32
    assert expectation_for(catalog["trn2.48xlarge"], 1).expected_ranks == 64
    assert expectation_for(catalog["trn1.32xlarge"], 2).tool == "nccom-test"


def test_the_user_guide_s_failure_and_driver_examples_are_nccom_test_failures() -> None:
    for name in ("neuron-docs-nccom-test-neuron-bench-failure.log", "neuron-docs-nccom-test-dkms-not-running.log"):
        log = parse_file(ROOT / "fixtures" / "field_logs" / name)
        v = judge(log, expectation_for(load_catalog()["trn1.32xlarge"], 1))
        assert failed(v) == {"nccom_test_failed"}, render(v)
        assert re.search(r"neuron-bench|DKMS", v.cause)


# --- the gate on a Trainium queue ------------------------------------------------------------------------------

class FakeSlurm:
    """sinfo, `test -f` on the job scripts, sbatch, wait and cat of the job logs: what run_acceptance sends."""

    def __init__(self, scripts: set[str], logs: dict[str, str]) -> None:
        self.scripts, self.logs = scripts, logs
        self.submitted: list[tuple[str, tuple[str, ...], int | None]] = []

    def run(self, argv: list[str], check: bool = True, timeout: float = 60) -> "subprocess.CompletedProcess[str]":
        if argv[0] == "sinfo":
            return subprocess.CompletedProcess(argv, 0, "trn-1 idle\ntrn-2 idle\n", "")
        assert argv[:2] == ["test", "-f"], argv
        return subprocess.CompletedProcess(argv, 0 if argv[2] in self.scripts else 1, "", "")

    def make_dir(self, path: PurePosixPath) -> None:
        pass

    def submit(self, script: PurePosixPath, *, nodes: list[str], output: PurePosixPath,
               ntasks_per_node: int | None = None, **_: object) -> Job:
        self.submitted.append((str(script), tuple(nodes), ntasks_per_node))
        return Job(len(self.submitted), tuple(nodes), output)

    def wait(self, jobs: list[Job], timeout: float, poll: float = 0.5) -> dict[int, str]:
        return {j.job_id: "COMPLETED" for j in jobs}

    def read_file(self, path: PurePosixPath) -> str | None:
        return self.logs.get(path.name)


def _trn1_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripts: set[str]) -> tuple[Any, FakeSlurm]:
    from fmcluster.acceptance import runner
    from fmcluster.model import load_spec

    tenant = load_spec(ROOT / "golden" / "parallelcluster" / "trn1-tenant.yml")
    monkeypatch.setattr(runner.results, "new_run_dir", lambda org, now=None: tmp_path)
    monkeypatch.setattr(runner.results, "previous_result", lambda org, current: None)
    single = (PUBLIC / "neuron-docs-nccom-test-single-2rank.log").read_text()
    slurm = FakeSlurm(scripts, {"trn-all_reduce-1node.log": single, "trn-all_reduce-2nodes.log": CHECKED})
    result = runner.run_acceptance(tenant, slurm, "/fsx", out=lambda line: None)  # type: ignore[arg-type]
    return result, slurm


def test_a_trainium_queue_without_the_nccom_test_job_script_is_reported_not_gated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, slurm = _trn1_gate(tmp_path, monkeypatch, set())
    assert slurm.submitted == [] and result.tests == [] and result.passed
    assert any("nccom-test" in n and "neuron-all_reduce.sbatch" in n and "not gated" in n for n in result.notes)


def test_a_trainium_queue_with_the_job_script_runs_nccom_test_and_judges_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, slurm = _trn1_gate(tmp_path, monkeypatch, {"/opt/fmcluster/acceptance/neuron-all_reduce.sbatch"})
    assert slurm.submitted == [("/opt/fmcluster/acceptance/neuron-all_reduce.sbatch", ("trn-1",), 32),
                               ("/opt/fmcluster/acceptance/neuron-all_reduce.sbatch", ("trn-1", "trn-2"), 32)]
    verdicts = {t.name: t.verdict for t in result.tests}
    assert verdicts["trn-all_reduce-2nodes"].passed, render(verdicts["trn-all_reduce-2nodes"])
    assert "rank_count" in failed(verdicts["trn-all_reduce-1node"])  # the guide's 2-worker run is not a full instance
    assert not result.passed and result.bisection is None  # only a failing all-node run is bisected
