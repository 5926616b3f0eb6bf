"""The nodes' convergence reports, read where the nodes file them:
s3://<bucket>/fmcluster/report/<aws:userid>/<instance id>.json (and .log beside it).

A node files under its own caller identity's prefix (aws:userid, "<role id>:<role session name>": the only prefix
its role may write) and names the object after its own instance id, so nodes that share one role session never
overwrite each other. On EC2 the session is named after the instance ("<role id>:i-…"); on SageMaker HyperPod every
node of an instance group runs in the group's execution role under the one session "SageMaker" (docs/stacks.md,
"Node IAM"). A report is read for the instance its key names, never for what its body claims, and fail closed:
- a key that is not <role id>:<session>/<instance id>.json names no node;
- a session named after an instance (EC2's) speaks for that instance only: a node cannot file for another under
  its own prefix;
- one instance filed under two sessions (its role replaced, or another node of a shared session writing its name):
  the newest report is read and the others are said (NodeStatus.line, failed_node_reports).
Nodes sharing one session share its credentials: IAM cannot tell them apart, and neither can the key.

`wait_for_reports` is the deploy's converge step: it waits, with progress, until every node of the cluster
has reported converging the published commit and manifest (and the controller and login nodes the current
membership, since their Slurm configuration lists the nodes), fails as soon as one reports a failure, and
gives up after a bounded time, naming the silent nodes with what their console printed.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fmcluster.baked import installed_summary
from fmcluster.manifest import membership_digest
from fmcluster.nodes import Node

REPORT_PREFIX = "fmcluster/report/"
#: Nodes whose configuration lists every node: they must have converged the current membership.
MEMBERSHIP_ROLES = ("controller", "login")

Out = Callable[[str], object]


def first_boot_image(report: dict[str, Any]) -> str:
    """A first boot's image and what it still installed (issue 40), as the deploy's line for the node says them."""
    if not report.get("image"):
        return ""
    installed = report.get("first_boot_installed") or {}
    return f"; image {report['image']}, {installed_summary(installed if isinstance(installed, dict) else {})}"


@dataclass
class NodeStatus:
    node: Node
    report: dict[str, Any] | None
    state: str  # converged | converging | failed | silent
    detail: str = ""
    #: What the reader says about this node's reports beyond the one it read (Listed.said), whatever the state.
    note: str = ""

    def line(self) -> str:
        return self._line() + (f" [{self.note}]" if self.note else "")

    def _line(self) -> str:
        r = self.report or {}
        where = f"{self.node.name} ({self.node.role}{', ' + self.node.queue if self.node.queue else ''}, {self.node.address})"
        if self.state == "converged":
            stages = r.get("boot_stages") or {}
            boot = (f"; first boot {sum(stages.values()):.0f}s: " + ", ".join(f"{k} {v:.1f}s" for k, v in stages.items())
                    if isinstance(stages, dict) and stages else "")
            # A membership pass (a node joined or left) is named: it is the controller's share of a join.
            scope = " (membership pass)" if str(r.get("playbook", "")).endswith("membership.yml") else ""
            return (f"{where}: converged {r.get('ref', '')[:12]} in {r.get('seconds', '?')}s{scope}, "
                    f"changed={r.get('changed')}{boot}{first_boot_image(r)}")
        if self.state == "failed":
            return f"{where}: FAILED at {r.get('stage')}: {r.get('error', '')}"
        return f"{where}: {self.state}{': ' + self.detail if self.detail else ''}"


@dataclass
class Wait:
    statuses: list[NodeStatus] = field(default_factory=list)
    seconds: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return bool(self.statuses) and all(s.state == "converged" for s in self.statuses)

    @property
    def failed(self) -> list[NodeStatus]:
        return [s for s in self.statuses if s.state in ("failed", "silent", "converging")]


#: A first boot above this share of the scheduler's window is warned about: the local substrate's network and an
#: image that lacks more (or a slower archive) can take longer on AWS.
BOOT_WINDOW_SHARE = 0.5


def _boot_interval(report: dict[str, Any], stages: dict[str, float]) -> tuple[float, float] | None:
    """(start, end) of a first boot in epoch seconds: it ends when its report was finished and lasted its stages."""
    try:
        end = datetime.fromisoformat(str(report["finished"])).timestamp()
    except (KeyError, ValueError):
        return None
    return end - sum(stages.values()), end


def _sharing(mine: tuple[float, float] | None, others: Sequence[tuple[float, float] | None], fallback: int) -> float:
    """How many first boots ran at once, on average over this one (itself included); `fallback` without times."""
    if mine is None or mine[1] <= mine[0] or any(o is None for o in others):
        return float(fallback)
    overlap = sum(max(0.0, min(mine[1], o[1]) - max(mine[0], o[0])) for o in others if o is not None)
    return max(1.0, overlap / (mine[1] - mine[0]))


def _stages(status: NodeStatus) -> dict[str, float] | None:
    """The report's first-boot stage times; None when it has none, {} when they are not finite seconds."""
    raw = (status.report or {}).get("boot_stages")
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        stages = {str(k): float(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        return {}
    return stages if all(math.isfinite(v) and v >= 0 for v in stages.values()) else {}


def first_boot_warnings(statuses: Sequence[NodeStatus], window: tuple[str, float] | None,
                        shared_cores: int | None = None) -> list[str]:
    """Each first boot projected to an instance of its own, warned about above half of the window it must fit.

    On AWS a node's stage times are its own image's on its own cores: the projection is the measurement. Where the
    nodes share the deploy machine's cores (`shared_cores`, the local substrate), every stage ran at the share of a
    core its node had: a first boot that overlapped on average `n` others on `c` cores is projected at c/n of its
    time (never more than measured). Unreadable stage times are said, not skipped."""
    if window is None:
        return []
    what, seconds = window
    booted = [(status, stages) for status in statuses if (stages := _stages(status)) is not None]
    lines = [f"warning: {status.node.name}'s first-boot stage times are not finite seconds "
             f"({(status.report or {}).get('boot_stages')!r}): its fit in {what} is unknown"
             for status, stages in booted if not stages]
    booted = [(status, stages) for status, stages in booted if stages]
    intervals = [_boot_interval(status.report or {}, stages) for status, stages in booted]
    projected: list[tuple[NodeStatus, dict[str, float], float, float]] = []
    for (status, stages), interval in zip(booted, intervals):
        sharing = _sharing(interval, intervals, len(booted)) if shared_cores else 1.0
        scale = min(1.0, shared_cores / sharing) if shared_cores else 1.0
        projected.append((status, {k: v * scale for k, v in stages.items()}, sum(stages.values()), sharing))
    for status, stages, measured, sharing in projected:
        total = sum(stages.values())
        if total <= seconds * BOOT_WINDOW_SHARE:
            continue
        largest = max(stages, key=lambda k: stages[k])
        verdict = "would not fit" if total > seconds else "uses more than half of"
        took = (f"projects to {total:.0f}s on an instance of its own (measured {measured:.0f}s here, {sharing:.1f} "
                f"first boots sharing {shared_cores} cores; " if shared_cores else f"took {total:.0f}s (")
        lines.append(f"warning: {status.node.name}'s first boot {took}{largest} {stages[largest]:.0f}s the largest "
                     f"stage): it {verdict} {what}, {seconds:.0f}s")
    if shared_cores and projected:
        totals = sorted(sum(stages.values()) for _, stages, _, _ in projected)
        measured_totals = sorted(measured for _, _, measured, _ in projected)
        lines.insert(0, f"first boots projected to instances of their own: {totals[0]:.0f}-{totals[-1]:.0f}s of "
                        f"{what}, {seconds:.0f}s (measured here {measured_totals[0]:.0f}-{measured_totals[-1]:.0f}s, "
                        f"{len(projected)} first boots on {shared_cores} shared cores)")
    return lines


def report_key(user_id: str, instance_id: str, suffix: str = ".json") -> str:
    """Where a node files its report (`suffix` ".json") and log (".log"): under its caller identity's prefix, named by
    its instance id."""
    return f"{REPORT_PREFIX}{user_id}/{instance_id}{suffix}"


def _is_instance_id(value: str) -> bool:
    return value.startswith("i-") and len(value) > 2 and value[2:].isalnum()


def report_owner(stem: str) -> tuple[str, str] | None:
    """(session, instance id) of a report key's stem "<role id>:<session name>/<instance id>"; None when the stem is
    not one, or its session is named after another instance (EC2's sessions speak for their own instance only)."""
    session, sep, instance = stem.partition("/")
    role_id, colon, name = session.partition(":")
    if not (sep and colon and role_id and name and _is_instance_id(instance)) or "/" in instance:
        return None
    if name.startswith("i-") and name != instance:
        return None
    return session, instance


@dataclass(frozen=True)
class Listed:
    stem: str  # "<session>/<instance id>": the report is f"{REPORT_PREFIX}{stem}.json", its log ….log
    etag: str
    modified: float
    #: Other sessions that filed a report for this instance, older than this one (not read).
    others: tuple[str, ...] = ()

    @property
    def session(self) -> str:
        return self.stem.partition("/")[0]

    def said(self) -> str:
        """What the reader says about the reports it did not read for this instance ("" when there are none)."""
        if not self.others:
            return ""
        return (f"also filed under {', '.join(self.others)} (older; the newest, under {self.session}, is the one "
                f"read)")


def list_reports(s3: Any, bucket: str) -> dict[str, Listed]:
    """Instance id → its newest report object (one listing; 1,000 keys a page). Raises what the listing raises."""
    found: dict[str, Listed] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=REPORT_PREFIX):
        for item in page.get("Contents", []):
            key = str(item["Key"])
            if not key.endswith(".json"):
                continue
            stem = key[len(REPORT_PREFIX):-len(".json")]
            owner = report_owner(stem)
            if owner is None:
                continue
            session, instance = owner
            modified = item.get("LastModified")
            listed = Listed(stem, str(item.get("ETag", "")), modified.timestamp() if modified else 0.0)
            held = found.get(instance)
            if held is None:
                found[instance] = listed
            elif listed.modified >= held.modified:  # the same instance under two sessions: the newer speaks
                found[instance] = Listed(stem, listed.etag, listed.modified, (*held.others, held.session))
            else:
                found[instance] = Listed(held.stem, held.etag, held.modified, (*held.others, session))
    return found


def _read_object(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception:  # noqa: BLE001 - not filed yet (or unreadable): the node is still silent
        return None
    try:
        loaded = json.loads(body)
    except ValueError:
        return {"ok": False, "stage": "report", "error": f"unreadable report ({len(body)} bytes)"}
    return loaded if isinstance(loaded, dict) else None


def read_report(s3: Any, bucket: str, instance_id: str) -> dict[str, Any] | None:
    """The last report of one instance (None: none filed, or the listing failed)."""
    try:
        listed = list_reports(s3, bucket).get(instance_id)
    except Exception:  # noqa: BLE001 - no listing: nothing can be said to be this node's
        return None
    return _read_object(s3, bucket, f"{REPORT_PREFIX}{listed.stem}.json") if listed else None


def failed_node_reports(s3: Any, bucket: str, tail: int = 5, since: str = "") -> list[str]:
    """Every node whose last report is a failure, as a person reads it: the node, the stage, its failed task and the
    end of its log. What the deploy says first when a cluster stack fails: on AWS one node's FAILURE signal rolls
    the stack back, and CloudFormation's reason names the group, never the node or its task. `since` (an ISO time):
    only reports finished then or later (the nodes of an earlier, rolled-back attempt are not this run's)."""
    try:
        listed = list_reports(s3, bucket)
    except Exception as err:  # noqa: BLE001 - say why nothing can be read rather than nothing
        return [f"the node reports could not be listed (s3://{bucket}/{REPORT_PREFIX}): {err}"]
    lines: list[str] = []
    for instance, item in sorted(listed.items()):
        report = _read_object(s3, bucket, f"{REPORT_PREFIX}{item.stem}.json")
        if not report or report.get("ok") or str(report.get("finished") or "") < since:
            continue
        where = f"{report.get('node') or report.get('address') or instance} ({instance})"
        lines.append(f"{where}: FAILED at {report.get('stage', '?')}: {report.get('error', '')}")
        if item.said():
            lines.append(f"    {item.said()}")
        for task in (report.get("failed_tasks") or [])[:1]:
            if isinstance(task, dict):
                lines.append(f"    failed task: {task.get('task', '?')}: {task.get('msg', '')}")
        log = report.get("log_tail") or read_log(s3, bucket, instance, tail)
        lines += [f"    | {line}" for line in [str(x) for x in log][-tail:]]
    return lines


def read_log(s3: Any, bucket: str, instance_id: str, lines: int = 20) -> list[str]:
    try:
        listed = list_reports(s3, bucket).get(instance_id)
        if listed is None:
            return []
        body = s3.get_object(Bucket=bucket, Key=f"{REPORT_PREFIX}{listed.stem}.log")["Body"].read()
    except Exception:  # noqa: BLE001
        return []
    text: str = body.decode(errors="replace")
    return text.strip().splitlines()[-lines:]


def failure_details(wait: Wait, s3: Any, bucket: str, console: Callable[[Node], str], lines: int = 12) -> list[str]:
    """What each node that did not converge left behind, for a person: a failed node's failed tasks and log; a
    silent or still converging node's last console lines (where it hangs) and any log it uploaded."""
    details: list[str] = []
    for status in wait.failed:
        details.append(f"--- {status.node.name} ({status.state}) ---")
        report = status.report or {}
        for task in report.get("failed_tasks", [])[:3]:
            details.append(f"    task '{task.get('task')}': {task.get('msg')}")
        if status.state in ("silent", "converging"):
            details += [f"    console: {line}" for line in console(status.node).strip().splitlines()[-lines:]]
        logged = read_log(s3, bucket, status.node.instance_id, lines) or report.get("log_tail", [])[-lines:]
        details += [f"    log: {line}" for line in logged]
    return details


def node_status(node: Node, report: dict[str, Any] | None, ref: str, manifest: str, membership: str,
                silent: str = "no report yet") -> NodeStatus:
    """A node's state against what the deploy published (fail closed: no report, or an old one, is not converged)."""
    if report is None:
        return NodeStatus(node, None, "silent", silent)
    current = report.get("ref") == ref and report.get("manifest_digest") == manifest
    if node.role in MEMBERSHIP_ROLES:
        current = current and report.get("membership_digest") == membership
    if not report.get("ok") and report.get("retry"):
        # A first boot that failed on something transient and tries again: not final until it says so.
        return NodeStatus(node, report, "converging",
                          f"{report['retry']} (FAILED at {report.get('stage')}: {report.get('error', '')})")
    if not report.get("ok"):
        # A failure for what is published now is final; an older failure may be superseded by a re-converge.
        # A node of the published commit that could not read the manifest has no manifest digest: final too.
        before_manifest = report.get("ref") == ref and not report.get("manifest_digest")
        if current or before_manifest or report.get("ref") in ("", None) or report.get("stage") in ("bundle", "toolchain"):
            return NodeStatus(node, report, "failed")
        return NodeStatus(node, report, "converging", "its last converge (of an older commit or manifest) failed")
    if current:
        return NodeStatus(node, report, "converged")
    return NodeStatus(node, report, "converging", f"last converged {str(report.get('ref', ''))[:12]}")


class ReportReader:
    """The nodes' reports, read with one listing per poll instead of one read per node.

    A poll lists the report prefix (ListObjectsV2: 1,000 keys a page, each with its ETag) and reads again only
    the reports that are new or whose ETag changed since this reader's last poll; the others are the reports it
    already holds. A wait over N nodes and P polls so costs P × ceil(N/1000) listings plus one read per report
    filed, not P × N reads (at 1,000 nodes and a 2 s poll, 500 reads a second, one after another). A report
    rewritten between the listing and the read is read new and listed new next time: it is read once more.
    Should the listing fail, no report is taken as any node's (fail closed: the keys name the nodes) and
    `error` says why."""

    def __init__(self, s3: Any, bucket: str) -> None:
        self.s3, self.bucket = s3, bucket
        self._held: dict[str, tuple[str, dict[str, Any] | None]] = {}
        self.error = ""
        #: Instance id → what the last poll said about reports of it not read (Listed.said); absent: nothing.
        self.notes: dict[str, str] = {}

    def read(self, instance_ids: Sequence[str]) -> dict[str, dict[str, Any] | None]:
        try:
            listed = list_reports(self.s3, self.bucket)
            self.error = ""
        except Exception as err:  # noqa: BLE001 - permissions, a flaky endpoint: said, and every node silent
            self.error = f"cannot list s3://{self.bucket}/{REPORT_PREFIX}: {type(err).__name__}: {err}"
            self.notes = {}
            return {i: None for i in instance_ids}
        found: dict[str, dict[str, Any] | None] = {}
        self.notes = {i: listed[i].said() for i in instance_ids if i in listed and listed[i].said()}
        for instance in instance_ids:
            item = listed.get(instance)
            held = self._held.get(instance)
            if item is None:
                found[instance] = None  # not filed (yet)
            elif held is not None and item.etag and held[0] == f"{item.stem}/{item.etag}":
                found[instance] = held[1]
            else:
                found[instance] = _read_object(self.s3, self.bucket, f"{REPORT_PREFIX}{item.stem}.json")
                if found[instance] is None:  # listed but not read (a transient error): read it again next poll
                    self._held.pop(instance, None)
                else:
                    self._held[instance] = (f"{item.stem}/{item.etag}", found[instance])
        return found


def statuses(s3: Any, bucket: str, nodes: Sequence[Node], ref: str, manifest: str,
             reader: ReportReader | None = None) -> list[NodeStatus]:
    membership = membership_digest(nodes)
    reader = reader or ReportReader(s3, bucket)
    reports = reader.read([n.instance_id for n in nodes])
    detail = reader.error or "no report yet"
    found = [node_status(n, reports[n.instance_id], ref, manifest, membership, detail) for n in nodes]
    for status in found:
        status.note = reader.notes.get(status.node.instance_id, "")
    return found


def wait_for_reports(s3: Any, bucket: str, list_nodes: Callable[[], list[Node]], ref: str, manifest: str,
                     timeout_s: float, out: Out, poll_s: float = 2.0) -> Wait:
    """Wait until every node converged what is published; stop at the first failure or after `timeout_s`."""
    started = time.monotonic()
    last = ""
    wait = Wait()
    reader = ReportReader(s3, bucket)
    while True:
        nodes = list_nodes()
        wait.statuses = statuses(s3, bucket, nodes, ref, manifest, reader)
        done = [s for s in wait.statuses if s.state == "converged"]
        failed = [s for s in wait.statuses if s.state == "failed"]
        line = f"{len(done)}/{len(nodes)} nodes converged"
        if failed:
            line += f", {len(failed)} failed"
        if line != last:
            pending = [s.node.name for s in wait.statuses if s.state not in ("converged", "failed")]
            out(f"    {line}" + (f" (waiting for {', '.join(pending[:6])}{'…' if len(pending) > 6 else ''})" if pending else "")
                + f" [{time.monotonic() - started:.0f}s]")
            last = line
        wait.seconds = time.monotonic() - started
        if failed or (nodes and len(done) == len(nodes)):
            return wait
        if wait.seconds > timeout_s:
            wait.timed_out = True
            return wait
        time.sleep(poll_s)
