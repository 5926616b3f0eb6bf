"""EC2's hypervisor stood in: a daemon per local tenant that boots the instances the AWS APIs launch, with no
deploy machine taking part.

On AWS, when an Auto Scaling group launches an instance (a compute node terminated in its group with the capacity
kept, or marked Unhealthy), EC2 boots it; nobody's laptop does. Locally the hosts used to appear only while a task
on the deploy machine called `LocalProvider.boot`. This daemon closes that gap: every few seconds it compares the
emulator's instances of the tenant with the hosts, and when they differ it runs `LocalProvider.boot` — the very
path `invoke deploy`, `nodes-up` and `replace` take — which boots a host for each running instance that has none
and removes the hosts whose instances were terminated. The deploy's own calls and the daemon's are serialized by
one lock per tenant (`boot_lock`), so an instance is never booted twice.

A host taken down hard by `invoke halt` (a crash) is remembered as halted: the daemon does not boot it again, as
EC2 does not restart an instance that fails its status checks; `nodes-up`, `deploy` or the instance's
termination (its replacement) end that. The daemon logs to `<substrate>/hypervisor.log`, records what it booted
and removed in `<substrate>/hypervisor-events.jsonl` (so a task running meanwhile reports those hosts too), and is
started with the emulator (LocalProvider.endpoint) and stopped first by the teardown.

    python -m fmcluster.providers.local.hypervisor_daemon --org=ORG --endpoint=URL [--interval=S]
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fmcluster.nodes import LIVE_STATES
from fmcluster.providers.local import daemons
from fmcluster.providers.local.hosts import substrate_root

#: The daemon itself (it runs LocalProvider.boot, which imports this module).
MODULE = "fmcluster.providers.local.hypervisor_daemon"
#: Seconds between two looks at the emulator's instances.
INTERVAL_S = 3.0
#: How long the teardown waits for a daemon in the middle of a boot to finish it (then KILL).
STOP_TIMEOUT_S = 120.0
STATE_FILE = "hypervisor.json"
LOG_FILE = "hypervisor.log"
EVENTS_FILE = "hypervisor-events.jsonl"
HALTED_FILE = "halted.json"
LOCK_FILE = "boot.lock"


# --- the decision ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """What the substrate must do to match the emulator's instances: instance ids to boot, hosts to remove."""

    boot: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.boot or self.remove)


def reconcile_plan(instances: Sequence[Mapping[str, Any]], hosts: Collection[str], halted: Collection[str] = ()) -> Plan:
    """`instances`: the tenant's instances as DescribeInstances gives them (any state); `hosts`: the instance ids
    that have a host; `halted`: instance ids taken down hard and left down. Boot each live (pending or running)
    instance without a host that is not halted; remove each host whose instance is not live (terminated,
    shutting down, stopped, or unknown to the emulator)."""
    live = {str(i["InstanceId"]) for i in instances if (i.get("State") or {}).get("Name") in LIVE_STATES}
    boot = sorted(key for key in live if key not in hosts and key not in halted)
    remove = sorted(key for key in hosts if key not in live)
    return Plan(boot, remove)


# --- the lock the deploy's boots and the daemon's share ------------------------------------------------------

@contextmanager
def boot_lock(org: str) -> Iterator[None]:
    """One boot at a time per tenant (LocalProvider.boot from any process)."""
    root = substrate_root(org)
    root.mkdir(parents=True, exist_ok=True)
    with (root / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- halted hosts ---------------------------------------------------------------------------------------------

def halted(org: str) -> set[str]:
    known = daemons.read_state(substrate_root(org) / HALTED_FILE).get("halted", [])
    return {str(key) for key in known} if isinstance(known, list) else set()


def _write_halted(org: str, keys: Collection[str]) -> None:
    path = substrate_root(org) / HALTED_FILE
    if not keys:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"halted": sorted(keys)}) + "\n")
    tmp.replace(path)


def mark_halted(org: str, key: str) -> None:
    _write_halted(org, halted(org) | {key})


def clear_halted(org: str, keys: Collection[str] | None = None) -> None:
    """Forget the halted marks of `keys` (all when None): an explicit boot, or the instances are gone."""
    _write_halted(org, set() if keys is None else halted(org) - set(keys))


# --- what the daemon did, for the tasks running meanwhile ----------------------------------------------------

def record(org: str, started: Sequence[str], removed: Sequence[str]) -> None:
    if not (started or removed):
        return
    with (substrate_root(org) / EVENTS_FILE).open("a") as sink:
        sink.write(json.dumps({"at": time.time(), "started": list(started), "removed": list(removed)}) + "\n")


def events_since(org: str, since: float) -> tuple[list[str], list[str]]:
    """(started, removed) host names the daemon booted and removed since `since` (time.time())."""
    started: list[str] = []
    removed: list[str] = []
    try:
        lines = (substrate_root(org) / EVENTS_FILE).read_text().splitlines()
    except OSError:
        return started, removed
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if float(event.get("at", 0)) >= since:
            started += [h for h in event.get("started", []) if h not in started]
            removed += [h for h in event.get("removed", []) if h not in removed]
    return started, removed


# --- the daemon ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Started:
    pid: int
    started: bool
    note: str


def _state_path(org: str) -> Path:
    return substrate_root(org) / STATE_FILE


def running(org: str) -> int | None:
    """The pid of the tenant's daemon, when it runs."""
    state = daemons.read_state(_state_path(org))
    pid = int(state.get("pid", 0) or 0)
    return pid if pid and daemons.runs(pid, Path(sys.executable).name, f"--org={org}") else None


def ensure_hypervisor(org: str, endpoint: str, interval_s: float = INTERVAL_S) -> Started:
    """The tenant's daemon, started when it does not run (or watches another endpoint)."""
    state = daemons.read_state(_state_path(org))
    pid = running(org)
    if pid is not None and state.get("endpoint") == endpoint:
        return Started(pid, False, f"EC2's hypervisor stood in: pid {pid} boots what the AWS APIs launch")
    if pid is not None:
        daemons.stop(pid, STOP_TIMEOUT_S)
    root = substrate_root(org)
    root.mkdir(parents=True, exist_ok=True)
    log = root / LOG_FILE
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[3]), os.environ.get("PYTHONPATH", "")]))}
    import subprocess

    with log.open("ab") as sink:
        proc = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
            [sys.executable, "-m", MODULE, f"--org={org}", f"--endpoint={endpoint}", f"--interval={interval_s}"],
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    tmp = _state_path(org).with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": proc.pid, "endpoint": endpoint, "log": str(log)}) + "\n")
    tmp.replace(_state_path(org))
    return Started(proc.pid, True, f"EC2's hypervisor stood in: a daemon (pid {proc.pid}) boots a host for each "
                                   f"instance the AWS APIs launch and removes terminated ones, every {interval_s:g}s "
                                   f"(log {log})")


def stop_hypervisor(org: str) -> bool:
    """Stop the tenant's daemon (a boot under way is finished first); True if one was stopped."""
    pid = running(org)
    _state_path(org).unlink(missing_ok=True)
    if pid is None:
        return False
    daemons.stop(pid, STOP_TIMEOUT_S)
    return True
