"""The AWS side of scheduler parallelcluster: ParallelCluster's own `pcluster` CLI, driven and read back.

    upload_custom_action(s3, bucket, out) -> key               the OnNodeConfigured script, before create
    apply(cfg, config_path, run, out) -> Outcome                 create or update: `--dryrun true` first, then
                                                                  for real; "no-changes" when nothing differs
    wait(name, region, run, out, ...) -> ClusterState            poll describe-cluster until it settles, with progress
    delete(name, region, run, out, ...) -> ClusterState          delete-cluster, then wait until it is gone
    describe(name, region, run) -> ClusterState                  for `invoke status`; status_lines(state) words it

`run` executes one pcluster command line and returns its exit code and parsed JSON (run_pcluster does it
with the tool environment's `pcluster`, AWS credentials from boto3's usual chain); the argv builders are
separate so the exact command lines are testable without AWS. pcluster prints JSON on stdout for every
outcome; a dry run that would succeed exits 1 with "Request would have succeeded, but DryRun flag is set."
(ParallelCluster's DryrunOperationException), which is the only non-zero exit read as success.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fmcluster.schedulers.parallelcluster.config import CUSTOM_ACTION_KEY, CUSTOM_ACTION_SOURCE, custom_action_script
from fmcluster.schedulers.parallelcluster.rendered import ClusterConfig
from fmcluster.schedulers.parallelcluster.schema import TOOL_VENV
from fmcluster.paths import source_root

Out = Callable[[str], object]
DRYRUN_OK = "Request would have succeeded, but DryRun flag is set."
NO_CHANGES = "No changes found in your cluster configuration."  # inside a BadRequest message
SETTLED_OK = ("CREATE_COMPLETE", "UPDATE_COMPLETE")
SETTLED_FAILED = ("CREATE_FAILED", "UPDATE_FAILED", "DELETE_FAILED")


class PclusterError(Exception):
    """pcluster refused or failed; `lines` say why, in ParallelCluster's words."""

    def __init__(self, summary: str, lines: list[str] | None = None) -> None:
        super().__init__(summary)
        self.lines = lines or []


@dataclass(frozen=True)
class PclusterResult:
    argv: tuple[str, ...]
    rc: int
    data: dict[str, Any]  # the JSON pcluster printed ({} when it printed none)
    stderr: str = ""

    @property
    def message(self) -> str:
        return str(self.data.get("message", ""))


Runner = Callable[[list[str]], PclusterResult]


def pcluster_bin() -> str:
    venv = Path(os.environ.get("FMCLUSTER_PCLUSTER_VENV") or source_root() / TOOL_VENV)
    return str(venv / "bin" / "pcluster")


def create_argv(name: str, config_path: Path, region: str, *, dryrun: bool) -> list[str]:
    return [pcluster_bin(), "create-cluster", "--cluster-name", name, "--cluster-configuration", str(config_path),
            "--region", region, "--dryrun", "true" if dryrun else "false"]


def update_argv(name: str, config_path: Path, region: str, *, dryrun: bool) -> list[str]:
    return [pcluster_bin(), "update-cluster", "--cluster-name", name, "--cluster-configuration", str(config_path),
            "--region", region, "--dryrun", "true" if dryrun else "false"]


def describe_argv(name: str, region: str) -> list[str]:
    return [pcluster_bin(), "describe-cluster", "--cluster-name", name, "--region", region]


def delete_argv(name: str, region: str) -> list[str]:
    return [pcluster_bin(), "delete-cluster", "--cluster-name", name, "--region", region]


def run_pcluster(argv: list[str], timeout_s: float = 900.0) -> PclusterResult:
    """Run one pcluster command; its JSON output parsed. Output that is not JSON is a failure, never a pass."""
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise PclusterError(f"`{' '.join(argv[1:3])}` did not run: {err}") from None
    return parse_result(argv, run.returncode, run.stdout, run.stderr)


def parse_result(argv: list[str], rc: int, stdout: str, stderr: str = "") -> PclusterResult:
    try:
        data = json.loads(stdout) if stdout.strip() else {}
    except json.JSONDecodeError:
        raise PclusterError(f"`{' '.join(argv[1:3])}` printed no JSON (exit {rc})",
                            [line for line in (stdout + stderr).strip().splitlines()[-20:]]) from None
    if not isinstance(data, dict):
        raise PclusterError(f"`{' '.join(argv[1:3])}` printed {type(data).__name__}, not an object (exit {rc})")
    return PclusterResult(tuple(argv), rc, data, stderr)


@dataclass(frozen=True)
class ClusterState:
    """What describe-cluster says (fields as in ParallelCluster's DescribeClusterResponseContent)."""

    name: str
    exists: bool
    status: str = ""  # clusterStatus: CREATE_IN_PROGRESS ... UPDATE_FAILED
    stack_status: str = ""  # cloudFormationStackStatus
    fleet: str = ""  # computeFleetStatus: RUNNING, STOPPED, ...
    version: str = ""
    head_node: dict[str, Any] = field(default_factory=dict)
    login_pools: tuple[dict[str, Any], ...] = ()
    failures: tuple[str, ...] = ()
    last_updated: str = ""

    @property
    def in_progress(self) -> bool:
        return self.status.endswith("_IN_PROGRESS")


def parse_describe(result: PclusterResult, name: str) -> ClusterState:
    """describe-cluster's JSON → ClusterState; a cluster that does not exist is exists=False; other errors raise."""
    data = result.data
    if result.rc != 0:
        if "does not exist" in result.message:
            return ClusterState(name, exists=False)
        raise PclusterError(f"describe-cluster {name} failed: {result.message or result.stderr.strip()[-300:]}")
    for key in ("clusterName", "clusterStatus"):
        if key not in data:
            raise PclusterError(f"describe-cluster {name} answered without {key}")
    failures = [f"{f.get('failureCode', '?')}: {f.get('failureReason', '')}" for f in data.get("failures") or []]
    if data.get("failureReason"):  # before ParallelCluster 3.5
        failures.append(str(data["failureReason"]))
    login = data.get("loginNodes") or []
    pools = tuple(login) if isinstance(login, list) else (login,)  # a list since 3.11, one object before
    return ClusterState(
        name=str(data["clusterName"]), exists=True, status=str(data["clusterStatus"]),
        stack_status=str(data.get("cloudFormationStackStatus", "")), fleet=str(data.get("computeFleetStatus", "")),
        version=str(data.get("version", "")), head_node=dict(data.get("headNode") or {}), login_pools=pools,
        failures=tuple(failures), last_updated=str(data.get("lastUpdatedTime", "")),
    )


def describe(name: str, region: str, run: Runner = run_pcluster) -> ClusterState:
    return parse_describe(run(describe_argv(name, region)), name)


def status_lines(state: ClusterState) -> list[str]:
    """`invoke status` for the cluster: what ParallelCluster says about it."""
    if not state.exists:
        return [f"{state.name}: does not exist (ParallelCluster)"]
    lines = [f"{state.name}: {state.status} (ParallelCluster {state.version}, stack {state.stack_status}), "
             f"compute fleet {state.fleet or 'unknown'}"]
    head = state.head_node
    if head:
        lines.append(f"  head node {head.get('instanceId', '?')} {head.get('instanceType', '')} "
                     f"{head.get('state', '')} {head.get('privateIpAddress', '')}".rstrip())
    for pool in state.login_pools:
        lines.append(f"  login pool {pool.get('poolName', '?')}: {pool.get('status', '?')}, "
                     f"{pool.get('healthyNodes', '?')} healthy, {pool.get('unhealthyNodes', '?')} unhealthy"
                     + (f", {pool['address']}" if pool.get("address") else ""))
    lines += [f"  failure {f}" for f in state.failures]
    return lines


def validation_lines(result: PclusterResult) -> list[str]:
    """ParallelCluster's validation and update messages of a create/update answer, one per line."""
    data = result.data
    lines = [f"{m.get('level', '?')} {m.get('type', '')}: {m.get('message', '')}"
             for key in ("configurationValidationErrors", "validationMessages") for m in data.get(key) or []]
    lines += [f"update refused for {e.get('parameter', '?')}: {e.get('message', '')} "
              f"({e.get('currentValue')} → {e.get('requestedValue')})" for e in data.get("updateValidationErrors") or []]
    return lines


def change_lines(result: PclusterResult) -> list[str]:
    return [f"{c.get('parameter', '?')}: {c.get('currentValue')} → {c.get('requestedValue')}"
            for c in result.data.get("changeSet") or []]


@dataclass
class Outcome:
    action: str  # create | update | no-changes
    state: ClusterState | None = None
    notes: list[str] = field(default_factory=list)


def apply(cfg: ClusterConfig, config_path: Path, run: Runner = run_pcluster, out: Out = print,
          **wait_args: Any) -> Outcome:
    """Create the cluster, or update it; each time `--dryrun true` first, and nothing for real if it refuses.
    Returns after ParallelCluster accepted the request; wait() follows it to the end. A cluster left in
    CREATE_FAILED (a failed first create) is deleted and created again, as the stacks are."""
    if cfg.placeholders:
        raise PclusterError(f"{config_path} still holds placeholders for {', '.join(cfg.placeholders)}: "
                            "render it from the deployed stacks' outputs first")
    state = describe(cfg.cluster_name, cfg.region, run)
    if state.in_progress:
        raise PclusterError(f"{cfg.cluster_name} is {state.status}: wait for it (invoke status) and run again")
    if state.status == "CREATE_FAILED":
        out(f"[cluster] {cfg.cluster_name} is CREATE_FAILED: deleting it to create it again")
        state = delete(cfg.cluster_name, cfg.region, run, out, **wait_args)
    action = "update" if state.exists else "create"
    argv = update_argv if state.exists else create_argv
    out(f"[cluster] {cfg.cluster_name}: pcluster {action}-cluster --dryrun true")
    dry = run(argv(cfg.cluster_name, config_path, cfg.region, dryrun=True))
    if NO_CHANGES in dry.message:  # "Bad Request: No changes found ..." (exit 1)
        out(f"  {cfg.cluster_name}: no changes")
        return Outcome("no-changes", state)
    notes = validation_lines(dry)
    for line in notes + change_lines(dry):
        out(f"    {line}")
    if dry.message != DRYRUN_OK:
        raise PclusterError(f"pcluster {action}-cluster --dryrun refused the config: {dry.message or f'exit {dry.rc}'}",
                            validation_lines(dry))
    out(f"  dry run accepted; pcluster {action}-cluster")
    real = run(argv(cfg.cluster_name, config_path, cfg.region, dryrun=False))
    if real.rc != 0:
        raise PclusterError(f"pcluster {action}-cluster failed: {real.message or f'exit {real.rc}'}",
                            validation_lines(real))
    summary = real.data.get("cluster") or {}
    out(f"  {cfg.cluster_name}: {summary.get('clusterStatus', '?')} (stack {summary.get('cloudformationStackArn', '?')})")
    return Outcome(action, None, notes)


def wait(name: str, region: str, run: Runner = run_pcluster, out: Out = print, *, poll_s: float = 30.0,
         timeout_s: float = 3 * 3600.0, sleep: Callable[[float], None] = time.sleep,
         clock: Callable[[], float] = time.monotonic, until_gone: bool = False) -> ClusterState:
    """Poll describe-cluster until the cluster settles (or is gone, for a delete); a line on every change and
    one every 10 minutes meanwhile. A *_FAILED status, a timeout or a vanished cluster raises PclusterError."""
    start = clock()
    last: tuple[str, str, str] | None = None
    last_said = start
    while True:
        state = describe(name, region, run)
        now = clock()
        elapsed = now - start
        if not state.exists:
            if until_gone:
                out(f"  {name}: deleted ({elapsed / 60:.0f} min)")
                return state
            raise PclusterError(f"{name} does not exist (any more)")
        seen = (state.status, state.stack_status, state.fleet)
        if seen != last or now - last_said >= 600:
            out(f"  {name}: {state.status}, stack {state.stack_status}, compute fleet {state.fleet or '?'} "
                f"({elapsed / 60:.0f} min)")
            last, last_said = seen, now
        # While a delete runs, the status it started from (e.g. CREATE_FAILED) may still show once.
        if state.status in (("DELETE_FAILED",) if until_gone else SETTLED_FAILED):
            raise PclusterError(f"{name} is {state.status}", list(state.failures)
                                or [f"see `pcluster get-cluster-stack-events -n {name} -r {region}`"])
        if state.status in SETTLED_OK and not until_gone:
            return state
        if elapsed >= timeout_s:
            raise PclusterError(f"{name} is still {state.status} after {timeout_s / 60:.0f} min")
        sleep(poll_s)


def delete(name: str, region: str, run: Runner = run_pcluster, out: Out = print, **wait_args: Any) -> ClusterState:
    """Delete the cluster (fmcluster's stacks and bucket are untouched) and wait until it is gone."""
    state = describe(name, region, run)
    if not state.exists:
        out(f"[cluster] {name}: does not exist")
        return state
    out(f"[cluster] pcluster delete-cluster {name}")
    result = run(delete_argv(name, region))
    if result.rc != 0:
        raise PclusterError(f"pcluster delete-cluster failed: {result.message or f'exit {result.rc}'}")
    return wait(name, region, run, out, until_gone=True, **wait_args)


def upload_custom_action(s3: Any, bucket: str, out: Out = print) -> str:
    """Put the OnNodeConfigured script where the cluster config names it (before the cluster is created or
    updated, and before the local stand-in's instances boot)."""
    s3.put_object(Bucket=bucket, Key=CUSTOM_ACTION_KEY, Body=custom_action_script())
    out(f"uploaded {CUSTOM_ACTION_SOURCE.name} + node-user-data.sh to s3://{bucket}/{CUSTOM_ACTION_KEY}")
    return CUSTOM_ACTION_KEY
