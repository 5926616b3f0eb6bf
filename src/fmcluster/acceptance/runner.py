"""The acceptance gate: run the collectives through Slurm, judge them, bisect and drain, record the run.

`run_acceptance(tenant)` is what `invoke acceptance` and the deploy flow call. Per compute queue it runs
each of `tenant.acceptance.tests` on one node and on all available nodes of the queue (jobs submitted
with `sbatch` to the job scripts the `nccl_tests` role installed: nccl-tests, the CPU bench, or AWS Neuron's
nccom-test on Trainium queues where its `neuron-<collective>.sbatch` is installed), parses and judges every log against
the catalog, and when the all-node all_reduce fails for a reason a node can cause (bandwidth under the
floor with no configuration problem visible, wrong data, a hang) bisects node pairs and drains the
nodes found (`scontrol update nodename=… state=drain reason=…`). Configuration-wide failures (sockets
instead of EFA, ranks not wired) drain nothing: they are not a node's fault.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from fmcluster.acceptance import results
from fmcluster.acceptance.bisect import Bisection, Pair, find_bad_nodes
from fmcluster.acceptance.expectation import expectation_for
from fmcluster.acceptance.model import ParsedLog
from fmcluster.acceptance.slurm import Job, SlurmClient
from fmcluster.acceptance.verdict import Verdict, human_bytes, judge_file, render
from fmcluster.catalog import InstanceType
from fmcluster.exits import ExitCode
from fmcluster.model import Queue, Tenant

Backend = Literal["nccl", "cpu", "neuron"]
Out = Callable[[str], object]

#: Where the nccl_tests role puts the job scripts on the login node (the controller without one).
JOB_DIR = PurePosixPath("/opt/fmcluster/acceptance")
#: Under the cluster's shared file system: the job logs, written by the compute nodes, read back by the deploy.
SHARED_RUNS = "fmcluster/acceptance"
#: CPU stand-in: one rank per node on the all-node run, two on the single-node run (a 1-rank collective
#: moves no data).
CPU_SINGLE_NODE_RANKS = 2
PROBE_ARGS: dict[Backend, tuple[str, ...]] = {"cpu": ("-n", "3", "-w", "1"), "nccl": ("-g", "1", "-c", "1", "-n", "20"),
                                              "neuron": ("--check", "-n", "20")}


def backend_for(instance: InstanceType) -> Backend | None:
    """nccl-tests on CUDA instances, fmcluster's TCP-ring bench on CPU ones, AWS Neuron's nccom-test on Trainium."""
    return {"cuda": "nccl", "none": "cpu", "neuron": "neuron"}.get(instance.accelerator)  # type: ignore[return-value]


def job_script(jobs: PurePosixPath, backend: Backend, collective: str) -> PurePosixPath:
    """`<backend>-<collective>.sbatch` in the job directory the nccl_tests role fills."""
    return jobs / f"{backend}-{collective}.sbatch"


@dataclass(frozen=True)
class CollectiveRun:
    name: str
    queue: str
    collective: str
    nodes: tuple[str, ...]
    ranks_per_node: int
    job_id: int | None
    job_state: str
    log: str
    parsed: ParsedLog
    verdict: Verdict
    seconds: float

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "queue": self.queue, "collective": self.collective, "nodes": list(self.nodes),
                "ranks_per_node": self.ranks_per_node, "job_id": self.job_id, "job_state": self.job_state,
                "log": self.log, "passed": self.passed, "busbw_gbps": self.verdict.busbw_gbps,
                "measured_at_bytes": self.verdict.measured_at_bytes, "cause": self.verdict.cause,
                "avg_busbw_gbps": self.parsed.avg_busbw_gbps, "network": self.parsed.network.network,
                "seconds": round(self.seconds, 2)}


@dataclass(frozen=True)
class Drain:
    node: str
    reason: str


@dataclass
class AcceptanceResult:
    org: str
    run_dir: Path | None
    started: str
    passed: bool = True
    skipped: str | None = None
    tests: list[CollectiveRun] = field(default_factory=list)
    bisection: Bisection | None = None
    probes: list[CollectiveRun] = field(default_factory=list)
    drained: list[Drain] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    comparison: list[str] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return ExitCode.OK if self.passed else ExitCode.FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "org": self.org, "started": self.started, "seconds": round(self.seconds, 2), "passed": self.passed,
            "skipped": self.skipped, "tests": [t.summary() for t in self.tests],
            "verdicts": {t.name: t.verdict.to_dict() for t in self.tests},
            "bisection": asdict(self.bisection) if self.bisection else None,
            "probes": [p.summary() for p in self.probes],
            "drained": [asdict(d) for d in self.drained], "unavailable": self.unavailable,
            "comparison": self.comparison, "notes": self.notes,
        }


class _Gate:
    """One acceptance run's state: the client, the run directory and the thresholds of one queue."""

    def __init__(self, tenant: Tenant, client: SlurmClient, run_dir: Path, remote_dir: PurePosixPath, out: Out,
                 timeout: float) -> None:
        self.tenant, self.client, self.run_dir, self.out, self.timeout = tenant, client, run_dir, out, timeout
        self.remote_dir = remote_dir
        self.jobs = JOB_DIR
        self.probes: list[CollectiveRun] = []

    def submit(self, name: str, backend: Backend, collective: str, nodes: Sequence[str], rpn: int,
               args: Sequence[str] = ()) -> Job:
        return self.client.submit(
            job_script(self.jobs, backend, collective), nodes=nodes, output=self.remote_dir / f"{name}.log",
            ntasks_per_node=rpn, job_name=f"fmc-accept-{name}"[:60], args=args)

    def collect(self, specs: Sequence[tuple[str, str, Queue, tuple[str, ...], int, Job]]) -> list[CollectiveRun]:
        started = time.monotonic()
        states = self.client.wait([s[5] for s in specs], timeout=self.timeout)
        elapsed = time.monotonic() - started
        runs = []
        for name, collective, queue, nodes, rpn, job in specs:
            local = self.run_dir / job.output.name
            text = self.client.read_file(job.output)  # the log on the cluster's shared file system
            if text is not None:
                local.write_text(text)
            # the one judging call: the same parse/expectation/judge as `fmcluster acceptance parse`
            expectation = expectation_for(queue.instance, len(nodes), self.tenant.acceptance.min_busbw_gbps, rpn,
                                          collective=collective, require_data_check=True)
            log, verdict = judge_file(local, expectation)
            runs.append(CollectiveRun(name, queue.name, collective, nodes, rpn, job.job_id, states[job.job_id],
                                job.output.name, log, verdict, elapsed))
        return runs

    def probe(self, queue: Queue, backend: Backend) -> Callable[[Sequence[Pair]], dict[Pair, bool]]:
        size = human_size_arg(queue.instance.acceptance.message_bytes)
        rpn = ranks_per_node(queue.instance, backend)

        def run_pairs(pairs: Sequence[Pair]) -> dict[Pair, bool]:
            specs = []
            for a, b in pairs:
                name = f"probe-{queue.name}-{a}-{b}"
                job = self.submit(name, backend, "all_reduce", (a, b), rpn, ("-b", size, "-e", size, *PROBE_ARGS[backend]))
                specs.append((name, "all_reduce", queue, (a, b), rpn, job))
            runs = self.collect(specs)
            self.probes.extend(runs)
            for r in runs:
                self.out(f"  probe {r.nodes[0]}+{r.nodes[1]}: {'pass' if r.passed else 'FAIL'} "
                         f"({_bw(r)}; {r.verdict.cause if not r.passed else 'ok'})")
            return {(r.nodes[0], r.nodes[1]): r.passed for r in runs}

        return run_pairs


def human_size_arg(n: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def ranks_per_node(instance: InstanceType, backend: Backend, single: bool = False) -> int:
    if backend == "nccl":
        return instance.accelerators_per_node
    if backend == "neuron":  # nccom-test's workers: one per NeuronCore (fmcluster.acceptance.neuron)
        from fmcluster.acceptance.neuron import NEURON_CORES

        cores = NEURON_CORES.get(instance.name)
        return cores.per_node if cores else 0
    return CPU_SINGLE_NODE_RANKS if single else 1


def _bw(run: CollectiveRun) -> str:
    bw = run.verdict.busbw_gbps
    return f"busbw {bw:.3f} GB/s" if bw is not None else "no busbw"


def run_acceptance(tenant: Tenant, client: SlurmClient, shared_dir: str, *, out: Out = print,
                   timeout: float = 600.0, every_node: bool = True) -> AcceptanceResult:
    """Run the acceptance gate on `tenant`'s Slurm cluster; drain bad nodes; save and compare the run.

    `client` runs the Slurm commands where a user would (the deploy's: ssh to the login node); job logs
    go to `<shared_dir>/fmcluster/acceptance/<run>/` on the cluster's shared file system and are read back
    into the local run directory.

    Returns an AcceptanceResult whose `passed`/`exit_code` gate the deploy. Never raises for a failing
    fabric (that is a verdict); raises SlurmError only when Slurm itself cannot be used. `every_node`: a node of a
    gated queue that was drained or down before the run was not tested, so the run is not a PASS of the cluster
    (False: the operator accepted a degraded cluster; the untested nodes are listed, the tested ones judged).
    """
    began = time.monotonic()
    now = datetime.now(timezone.utc)
    result = AcceptanceResult(org=tenant.org, run_dir=None, started=now.isoformat(timespec="seconds"))
    if not tenant.acceptance.enabled:
        result.skipped = "acceptance.enabled is false in the tenant spec"
        out(f"acceptance: skipped ({result.skipped})")
        return result
    run_dir = results.new_run_dir(tenant.org, now)
    result.run_dir = run_dir
    remote_dir = PurePosixPath(shared_dir) / SHARED_RUNS / run_dir.name
    client.make_dir(remote_dir)
    gate = _Gate(tenant, client, run_dir, remote_dir, out, timeout)
    specs: list[tuple[str, str, Queue, tuple[str, ...], int, Job]] = []
    queues: list[tuple[Queue, Backend, list[str]]] = []
    for queue in tenant.queues:
        backend = backend_for(queue.instance)
        unrunnable = _unrunnable(client, gate, queue, backend, tenant.acceptance.tests)
        if backend is None or unrunnable:
            result.notes.append(f"queue {queue.name}: {unrunnable or 'no benchmark for its accelerator'} — not gated")
            out(f"acceptance: {result.notes[-1]}")
            continue
        nodes, unavailable = available_nodes(client, queue.name)
        result.unavailable += unavailable
        if unavailable:
            out(f"acceptance: queue {queue.name}: skipping unavailable node(s) {', '.join(unavailable)}")
        if not nodes:
            result.passed = False
            result.notes.append(f"queue {queue.name}: no available node to test")
            continue
        queues.append((queue, backend, nodes))
        for collective in tenant.acceptance.tests:
            single = ranks_per_node(queue.instance, backend, single=True)
            name = f"{queue.name}-{collective}-1node"
            specs.append((name, collective, queue, (nodes[0],), single, gate.submit(name, backend, collective, nodes[:1], single)))
            if len(nodes) > 1:
                rpn = ranks_per_node(queue.instance, backend)
                name = f"{queue.name}-{collective}-{len(nodes)}nodes"
                specs.append((name, collective, queue, tuple(nodes), rpn, gate.submit(name, backend, collective, nodes, rpn)))
    out(f"acceptance: {len(specs)} job(s) submitted; logs in {run_dir}")
    result.tests = gate.collect(specs)
    for run in result.tests:
        out(f"  {run.name}: {'PASS' if run.passed else 'FAIL'} ({_bw(run)} over {len(run.nodes)} node(s), "
            f"job {run.job_id} {run.job_state})" + ("" if run.passed else f" — {run.verdict.cause}"))
    result.passed = result.passed and all(t.passed for t in result.tests)
    if result.unavailable and every_node:
        result.passed = False
        result.notes.append(f"not a PASS of the cluster: {len(result.unavailable)} declared node(s) could not be "
                            f"tested (drained or down before this run): {', '.join(result.unavailable)}")
        out(f"acceptance: {result.notes[-1]}")

    for queue, backend, nodes in queues:
        failing = [t for t in result.tests if t.queue == queue.name and not t.passed and len(t.nodes) > 1]
        codes = {f.code for t in failing for f in t.verdict.failures}
        if not failing:
            continue
        if not any(t.verdict.blames_node for t in failing):  # the verdict says whether a node can be the cause
            result.notes.append(f"queue {queue.name}: the failure is configuration-wide ({', '.join(sorted(codes))}); "
                                "no node is drained — fix the setting named in the verdict")
            out(f"acceptance: {result.notes[-1]}")
            continue
        out(f"acceptance: bisecting {len(nodes)} node(s) of queue {queue.name} in pairs")
        bisection = find_bad_nodes(nodes, gate.probe(queue, backend))
        result.bisection = bisection
        if bisection.cluster_wide:
            result.notes.append(f"queue {queue.name}: every pair failed — a cluster-wide problem, no node drained")
            out(f"acceptance: {result.notes[-1]}")
            continue
        for node in bisection.bad:
            reason = drain_reason(now, failing[0], node, bisection, gate.probes)
            if tenant.acceptance.drain_on_failure:
                client.drain(node, reason)
                result.drained.append(Drain(node, reason))
                out(f"acceptance: drained {node}: {reason}")
            else:
                result.notes.append(f"{node} is bad ({reason}); not drained (drain_on_failure is false)")
                out(f"acceptance: {result.notes[-1]}")
    result.probes = gate.probes
    result.seconds = time.monotonic() - began
    data = result.to_dict()
    result.comparison = results.compare(data, results.previous_result(tenant.org, run_dir))
    data["comparison"] = result.comparison
    results.write(run_dir, data, summary_text(result))
    out(f"acceptance: {'PASS' if result.passed else 'FAIL'} in {result.seconds:.0f}s; "
        f"{run_dir / 'summary.md'}")
    for line in result.comparison:
        out(f"  {line}")
    return result


def _unrunnable(client: SlurmClient, gate: _Gate, queue: Queue, backend: Backend | None,
                collectives: Sequence[str]) -> str:
    """Why a Trainium queue cannot be gated ('' when it can): the verdict judges nccom-test output, and the job scripts
    that run it (`neuron-<collective>.sbatch`) come from the nccl_tests role, which installs them only where the queue's
    image names its Neuron tools (images.yml neuron_bin_dir; fmcluster.publish.acceptance_vars)."""
    if backend != "neuron":
        return ""
    if not ranks_per_node(queue.instance, backend):
        return f"{queue.instance.name}: fmcluster does not know its NeuronCores per instance (nccom-test's workers)"
    missing = [str(job_script(gate.jobs, backend, c)) for c in collectives
               if client.run(["test", "-f", str(job_script(gate.jobs, backend, c))], check=False).returncode != 0]
    if missing:
        return (f"{queue.instance.name} runs AWS Neuron's nccom-test, whose job script is not installed "
                f"({', '.join(missing)}; the nccl_tests role installs it where the queue's image contract names its "
                "Neuron tools, images.yml neuron_bin_dir)")
    return ""


def available_nodes(client: SlurmClient, partition: str) -> tuple[list[str], list[str]]:
    """(usable nodes, drained/down nodes) of a partition, from `sinfo`."""
    proc = client.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N %t"])
    usable: list[str] = []
    unavailable: list[str] = []
    for line in proc.stdout.splitlines():
        if not line.strip():
            continue
        node, state = line.split()[:2]
        bad = any(s in state for s in ("drain", "drng", "down", "fail", "maint", "unk", "*"))
        target = unavailable if bad else usable
        if node not in target:
            target.append(node)
    return usable, unavailable


def drain_reason(now: datetime, failing: CollectiveRun, node: str, bisection: Bisection,
                 probes: Sequence[CollectiveRun] = ()) -> str:
    """`fmcluster acceptance <when>: <code> <measured> < <floor> GB/s at <size>; failed in pair a+b`."""
    th = failing.verdict.expectation
    mine = [p for p in probes if node in p.nodes and not p.passed]
    evidence = mine[0] if mine else failing
    code = evidence.verdict.failures[0].code if evidence.verdict.failures else "failed"
    bw = evidence.verdict.busbw_gbps
    measured = f" {bw:.3g} <" if bw is not None and code == "below_floor" else ""
    floor = f"{th.min_busbw_gbps:g} GB/s at {human_bytes(th.message_bytes)}" if th else "no floor"
    return (f"fmcluster acceptance {now.strftime('%Y-%m-%dT%H:%MZ')}: {code}{measured} {floor}; "
            f"{bisection.evidence(node)}")


def summary_text(result: AcceptanceResult) -> str:
    lines = [f"# Acceptance run {result.run_dir.name if result.run_dir else ''} — tenant `{result.org}`", "",
             f"**{'PASS' if result.passed else 'FAIL'}** in {result.seconds:.0f} s (started {result.started}).", ""]
    if result.skipped:
        lines.append(f"Skipped: {result.skipped}")
    if result.tests:
        lines += ["| test | nodes | busbw (GB/s) | at | verdict |", "|---|---|---|---|---|"]
        for t in result.tests:
            bw = f"{t.verdict.busbw_gbps:.3f}" if t.verdict.busbw_gbps is not None else "-"
            at = human_bytes(t.verdict.measured_at_bytes) if t.verdict.measured_at_bytes else "-"
            lines.append(f"| {t.name} | {len(t.nodes)} | {bw} | {at} | {'pass' if t.passed else 'FAIL: ' + t.verdict.cause} |")
        lines += ["", "## Verdicts", ""]
        for t in result.tests:
            lines += [f"### {t.name} ({t.log})", "", "```", render(t.verdict, t.parsed), "```", ""]
    if result.bisection:
        b = result.bisection
        lines += ["## Bisection", "", f"bad: {', '.join(b.bad) or 'none'}; good: {', '.join(b.good) or 'none'}"
                  f"{'; cluster-wide' if b.cluster_wide else ''}", ""]
        lines += [f"- {a}+{c}: {'pass' if ok else 'FAIL'}" for (a, c), ok in b.probes]
        lines.append("")
    if result.drained:
        lines += ["## Drained", ""] + [f"- `{d.node}`: {d.reason}" for d in result.drained]
        lines += ["", "Resume after the repair: `scontrol update nodename=NODE state=resume`.", ""]
    if result.unavailable:
        lines += [f"Not tested (drained or down before this run): {', '.join(result.unavailable)}", ""]
    if result.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in result.notes] + [""]
    if result.comparison:
        lines += ["## Compared with the previous run", ""] + [f"- {c}" for c in result.comparison] + [""]
    return "\n".join(lines)
