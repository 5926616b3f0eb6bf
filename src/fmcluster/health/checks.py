"""The node check functions, by the name health_checks.yml gives them. Each reads its evidence through the
Context (the probe, the node config) and returns an Outcome; raising Unreadable fails it closed."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from fmcluster.health import efa, gpu, slurm, system, xid
from fmcluster.health.facts import Facts
from fmcluster.health.model import Outcome, Unreadable, worst
from fmcluster.health.probe import Completed, Deadline, Probe


@dataclass
class Context:
    node: str
    config: Mapping[str, Any]
    facts: Facts
    probe: Probe
    deadline: Deadline
    memo: Dict[str, Any] = field(default_factory=dict)

    def command(self, name: str) -> List[str]:
        """argv prefix of a tool (the config may point it elsewhere, e.g. at a recorded-output stand-in)."""
        configured = self.config.get("commands", {}).get(name)
        return list(configured) if configured else [name]

    def path(self, name: str, default: str) -> str:
        return str(self.config.get("paths", {}).get(name, default))

    def timeout(self, name: str, default: float = 15.0) -> float:
        return self.deadline.timeout(float(self.config.get("timeouts", {}).get(name, default)))

    def run(self, tool: str, args: Sequence[str], timeout_name: str = "default", stdin: Optional[str] = None,
            ) -> Completed:
        return self.probe.run(self.command(tool) + list(args), self.timeout(timeout_name), stdin)

    def smi(self) -> gpu.SmiLog:
        """`nvidia-smi -q -x`, asked once per run."""
        if "smi" not in self.memo:
            done = self.run("nvidia-smi", ["-q", "-x"], "nvidia-smi")
            self.memo["smi"] = done
        done = self.memo["smi"]
        if not done.ok:
            raise Unreadable(done.why())
        return gpu.parse_smi_xml(done.stdout)

    def show_self(self) -> Completed:
        """`scontrol show node <self>`, asked once per run (munge check, and the drain/resume decision)."""
        if "show_self" not in self.memo:
            self.memo["show_self"] = self.run("scontrol", ["show", "node", self.node], "scontrol")
        done: Completed = self.memo["show_self"]
        return done


CheckFn = Callable[[Context], Outcome]
REGISTRY: Dict[str, CheckFn] = {}


def check(name: str) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        REGISTRY[name] = fn
        return fn
    return register


@check("munge")
def check_munge(ctx: Context) -> Outcome:
    socket = str(ctx.config.get("munge", {}).get("socket", ""))
    sock_args = [f"--socket={socket}"] if socket else []
    made = ctx.run("munge", ["-n", *sock_args], "munge")
    if not made.ok:
        return Outcome(False, f"munged does not answer{' on ' + socket if socket else ''}: {made.why()}")
    decoded = ctx.run("unmunge", sock_args, "munge", stdin=made.stdout)
    if not decoded.ok:
        return Outcome(False, f"a credential made here does not decode here: {decoded.why()}")
    shown = ctx.show_self()
    if shown.ok:
        return Outcome(True, "credentials encode and decode here, and slurmctld accepts them")
    text = shown.stderr + shown.stdout
    if any(marker in text for marker in slurm.REJECTED):
        return Outcome(False, "slurmctld rejects this node's credentials (" + shown.why()
                       + "): the munge key here differs from the controller's")
    if shown.missing:
        raise Unreadable(shown.why())
    # slurmctld unreachable (or another error): munge itself works here; nothing to blame it for.
    return Outcome(True, f"credentials encode and decode here; slurmctld not asked ({shown.why()})",
                   evidence={"scontrol": shown.why()})


@check("mounts")
def check_mounts(ctx: Context) -> Outcome:
    try:
        mounts = system.parse_mountinfo(ctx.probe.read(ctx.path("mountinfo", "/proc/self/mountinfo")))
    except OSError as err:
        raise Unreadable(f"cannot read the mount table: {err}") from None
    problems = []
    for wanted in ctx.facts.mounts:
        found = system.find_mount(mounts, wanted["path"])
        if found is None:
            problems.append(f"{wanted['path']} is not mounted")
            continue
        if wanted["fstype"] and found.fstype != wanted["fstype"]:
            problems.append(f"{wanted['path']} is {found.fstype} ({found.source}), not {wanted['fstype']}")
            continue
        done = ctx.run("stat", ["-f", "-c", "%T", wanted["path"]], "mount")
        if not done.ok:
            problems.append(f"{wanted['path']} does not answer ({done.why()})")
    if problems:
        return Outcome(False, "; ".join(problems))
    return Outcome(True, ", ".join(m["path"] for m in ctx.facts.mounts) + " mounted and answering")


@check("disk")
def check_disk(ctx: Context) -> Outcome:
    problems, fine = [], []
    for entry in ctx.config.get("disk", []):
        path = str(entry["path"]).replace("%n", ctx.node)
        try:
            got = system.space(path)
        except OSError as err:
            problems.append(f"{path}: cannot statvfs ({err.strerror})")
            continue
        min_pct, min_mib = float(entry.get("min_free_percent", 0)), float(entry.get("min_free_mib", 0))
        min_inodes = float(entry.get("min_free_inodes_percent", 0))
        if got.free_percent < min_pct or got.free_mib < min_mib:
            problems.append(f"{path} has {got.free_mib:.0f} MiB ({got.free_percent:.1f}%) free, "
                            f"needs {min_mib:.0f} MiB and {min_pct:g}%")
        elif got.inodes_free_percent < min_inodes:
            problems.append(f"{path} has {got.inodes_free_percent:.1f}% inodes free, needs {min_inodes:g}%")
        else:
            fine.append(f"{path} {got.free_percent:.0f}%")
    if problems:
        return Outcome(False, "; ".join(problems))
    return Outcome(True, "free: " + ", ".join(fine) if fine else "no path configured")


@check("memory")
def check_memory(ctx: Context) -> Outcome:
    try:
        info = system.parse_meminfo(ctx.probe.read(ctx.path("meminfo", "/proc/meminfo")))
    except OSError as err:
        raise Unreadable(f"cannot read /proc/meminfo: {err}") from None
    total_mib = info["MemTotal"] // 1024
    wanted = ctx.facts.real_memory_mb
    if wanted <= 0:
        raise Unreadable("the node config has no real_memory_mb (Slurm's RealMemory for this node)")
    if total_mib < wanted:
        return Outcome(False, f"MemTotal {total_mib} MiB is below Slurm's RealMemory {wanted} MiB (memory missing)")
    return Outcome(True, f"MemTotal {total_mib} MiB >= RealMemory {wanted} MiB")


@check("gpu-count")
def check_gpu_count(ctx: Context) -> Outcome:
    expected = ctx.facts.gpus
    try:
        log = ctx.smi()
    except Unreadable as err:
        # nvidia-smi failing on a node that must have GPUs is the missing-GPU case itself (no devices found,
        # "Unable to determine the device handle", driver not loaded): fail, do not merely "not know".
        return Outcome(False, f"0 of {expected} GPUs visible: {err}")
    seen = len(log.gpus)
    if seen < expected:
        return Outcome(False, f"{seen} of {expected} GPUs visible to the driver ({expected - seen} missing)",
                       evidence={"bus_ids": [g.bus_id for g in log.gpus]})
    return Outcome(True, f"{seen} of {expected} GPUs visible (driver {log.driver})")


@check("xid")
def check_xid(ctx: Context) -> Outcome:
    table = xid.XidTable(ctx.config.get("xids", {}))
    kmsg = ctx.path("kmsg", "/dev/kmsg")
    try:
        boot_id = ctx.probe.read(ctx.path("boot_id", "/proc/sys/kernel/random/boot_id")).strip()
        records = xid.read_kmsg(kmsg)
    except OSError as err:
        raise Unreadable(f"cannot read the kernel log ({kmsg}: {err.strerror or err})") from None
    state_path = _state_path(ctx, "xid")
    scanned, new_state = xid.scan(records, xid.load_state(state_path) if state_path else {}, boot_id)
    if state_path:
        _write_json(state_path, new_state)
    by_code: Dict[int, List[xid.XidEvent]] = {}
    for event in scanned.events:
        by_code.setdefault(event.xid, []).append(event)
    acting = {code: table.action(code) for code in by_code if table.action(code) != "none"}
    summary = [f"XID {code} x{len(events)} ({table.describe(code)}; {table.action(code)})"
               for code, events in sorted(by_code.items(), key=lambda kv: -_rank(table.action(kv[0])))]
    evidence = {"xids": {str(k): [e.pci for e in v] for k, v in by_code.items()}}
    if scanned.lost is not None:
        a, b = scanned.lost
        return Outcome(False, f"kernel log records {a}..{b} were overwritten before they were read, so XIDs since "
                       "boot are unknown (raise log_buf_len); " + ("; ".join(summary) or "no XID in what was read"),
                       action=worst(["drain", *acting.values()]), evidence=evidence)
    if acting:
        first = max(acting, key=lambda code: _rank(acting[code]))
        gpus = sorted({e.pci for e in by_code[first]})
        return Outcome(False, f"XID {first} on GPU {', '.join(gpus)} ({table.describe(first)}): {acting[first]}"
                       + (f"; also {'; '.join(s for s in summary if not s.startswith(f'XID {first} '))}"
                          if len(summary) > 1 else ""),
                       action=worst(list(acting.values())), evidence=evidence)
    if by_code:
        return Outcome(True, "only XIDs that need no action since boot: " + "; ".join(summary), evidence=evidence)
    return Outcome(True, f"no XID since boot ({len(records)} kernel log records read)")


def _rank(action: str) -> int:
    from fmcluster.health.model import ACTIONS
    return ACTIONS.index(action) if action in ACTIONS else 1


@check("row-remap")
def check_row_remap(ctx: Context) -> Outcome:
    log = ctx.smi()
    failed = [g.bus_id for g in log.gpus if g.remap_failure]
    pending = [g.bus_id for g in log.gpus if g.remap_pending]
    unknown = [g.bus_id for g in log.gpus if g.remap_pending is None or g.remap_failure is None]
    if failed:
        return Outcome(False, f"row remapping failed on GPU {', '.join(failed)}: replace", action="replace")
    if pending:
        return Outcome(False, f"row remapping pending on GPU {', '.join(pending)}: reset the GPU (reboot)",
                       action="reboot")
    if unknown and len(unknown) == len(log.gpus):
        raise Unreadable("nvidia-smi reports no remapped_rows for any GPU (row remapping state unknown)")
    return Outcome(True, f"no remap pending or failed on {len(log.gpus)} GPUs")


@check("ecc")
def check_ecc(ctx: Context) -> Outcome:
    log = ctx.smi()
    off = [g.bus_id for g in log.gpus if g.ecc_mode.lower() != "enabled"]
    bad = {g.bus_id: sum(g.uncorrectable.values()) for g in log.gpus if sum(g.uncorrectable.values()) > 0}
    if bad:
        worst_gpu = max(bad, key=lambda b: bad[b])
        return Outcome(False, f"{sum(bad.values())} uncorrectable ECC error(s) since the driver loaded "
                       f"(GPU {worst_gpu}: {bad[worst_gpu]}): reset the GPU", evidence={"uncorrectable": bad})
    if off:
        return Outcome(False, f"ECC is not enabled on GPU {', '.join(off)}", action="drain")
    return Outcome(True, f"ECC on, no uncorrectable error on {len(log.gpus)} GPUs")


@check("gpu-throttle")
def check_gpu_throttle(ctx: Context) -> Outcome:
    log = ctx.smi()
    slowed = {g.bus_id: g.slowdowns for g in log.gpus if g.slowdowns}
    if slowed:
        text = "; ".join(f"{bus}: {', '.join(reasons)}" for bus, reasons in slowed.items())
        return Outcome(False, f"hardware slowdown active ({text}): check cooling and power", evidence=slowed)
    return Outcome(True, f"no hardware slowdown on {len(log.gpus)} GPUs")


def _dcgm(ctx: Context, level: int) -> Outcome:
    found = ctx.run("dcgmi", ["discovery", "-l"], "dcgm")
    if not found.ok:
        raise Unreadable(f"cannot list GPUs through DCGM: {found.why()} (is nv-hostengine running?)")
    count = gpu.parse_dcgm_discovery(found.stdout)
    if count < ctx.facts.gpus:
        return Outcome(False, f"DCGM sees {count} of {ctx.facts.gpus} GPUs")
    done = ctx.run("dcgmi", ["diag", "-r", str(level), "-j"], diag_timeout_name(ctx.config, level))
    # dcgmi diag exits non-zero when a test fails; its JSON says which, so read it before judging the exit.
    if done.missing or done.timed_out or not done.stdout.strip():
        raise Unreadable(f"dcgmi diag -r {level} gave no result: {done.why()}")
    ran, failures = gpu.parse_dcgm_diag(done.stdout)
    if failures:
        f = failures[0]
        more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
        return Outcome(False, f"dcgmi diag -r {level}: {f.test} failed on GPU {f.gpu or '?'}: {f.message[:120]}{more}",
                       evidence={"failures": [f.__dict__ for f in failures]})
    return Outcome(True, f"DCGM sees {count} GPUs; dcgmi diag -r {level} passed {len(ran)} tests")


@check("dcgm")
def check_dcgm(ctx: Context) -> Outcome:
    return _dcgm(ctx, 1)


def diag_timeout_name(config: Mapping[str, Any], level: int) -> str:
    """The timeouts key of `dcgmi diag -r <level>`: its own (dcgm-diag-r3: a level-3 run lasts about 15 minutes,
    dcgmi-diag(1)) where the config has one, else dcgm-diag (level 2, about two minutes), dcgm for level 1."""
    own = f"dcgm-diag-r{level}"
    if own in config.get("timeouts", {}):
        return own
    return "dcgm-diag" if level > 1 else "dcgm"


@check("dcgm-deep")
def check_dcgm_deep(ctx: Context) -> Outcome:
    return _dcgm(ctx, int(ctx.memo.get("diag_level", 2)))


#: The record the boot run (`fmcluster-health boot`, before slurmd starts) leaves in the state directory.
BOOT_RECORD = "boot"


def boot_id(ctx: Context) -> str:
    try:
        return ctx.probe.read(ctx.path("boot_id", "/proc/sys/kernel/random/boot_id")).strip()
    except OSError as err:
        raise Unreadable(f"cannot read this boot's id ({err.strerror or err})") from None


#: The marker the role leaves on a GPU node that received fmcluster-health-boot.service while slurmd already served
#: on this boot (an upgrade of a running cluster): the diagnostic is not started on busy GPUs, and return-diag passes
#: on this boot alone; the unit runs the diagnostic before slurmd at the node's next boot.
SERVING_RECORD = "boot-serving"


@check("return-diag")
def check_return_diag(ctx: Context) -> Outcome:
    """A GPU node serves only after this boot's diagnostic at the tenant's level passed: the record must be of this
    boot (a reboot or a new instance runs it again), at the level asked for or deeper, and healthy. A node that got
    the boot unit while it served (SERVING_RECORD of this boot) passes until its next boot."""
    level = int(ctx.config.get("return_diag_level", 2))
    path = _state_path(ctx, BOOT_RECORD)
    if not path:
        raise Unreadable("the node config has no state_dir, so no boot record can exist")
    this_boot = boot_id(ctx)
    try:
        record = json.loads(ctx.probe.read(path))
    except OSError:
        record = None
    except ValueError:
        raise Unreadable(f"{path} is not JSON") from None
    if record is None or not isinstance(record, dict) or record.get("boot_id") != this_boot:
        # A record of this boot always decides; only without one does the serving marker count.
        serving = _serving_marker(ctx, this_boot)
        if serving:
            return Outcome(True, f"fmcluster-health-boot.service was installed while this node served ({serving}): "
                           "no diagnostic on busy GPUs; it runs at the next boot", evidence={"serving": True})
    if record is None:
        return Outcome(False, f"no return diagnostic recorded ({path} missing): fmcluster-health-boot.service has "
                       "not run or not finished on this boot")
    if not isinstance(record, dict) or record.get("boot_id") != this_boot:
        return Outcome(False, f"the return diagnostic on record is of an earlier boot ({path}): "
                       "fmcluster-health-boot.service has not run on this boot")
    ran = int(record.get("level", 0) or 0)
    if ran < level:
        return Outcome(False, f"the boot's diagnostic ran at level {ran}, the tenant asks for {level} "
                       "(health.return_diag_level)")
    if record.get("healthy") is not True:
        return Outcome(False, f"the boot's diagnostic failed: {str(record.get('reason') or 'no reason recorded')[:160]}")
    return Outcome(True, f"this boot's DCGM diagnostic (level {ran}) passed", evidence={"level": ran})


def _serving_marker(ctx: Context, this_boot: str) -> str:
    """The serving marker's path when it is of this boot, else "" (missing, unreadable or an earlier boot's: the
    marker never outlives the boot it was written on)."""
    path = _state_path(ctx, SERVING_RECORD)
    try:
        marker = json.loads(ctx.probe.read(path))
    except (OSError, ValueError):
        return ""
    return path if isinstance(marker, dict) and marker.get("boot_id") == this_boot else ""


def write_serving_marker(state_dir: str, this_boot: str) -> tuple[str, bool]:
    """Record that the boot unit arrived while slurmd served on boot `this_boot` (the role decides that, from
    systemd: slurmd started this boot, the boot unit did not). Returns the path and whether it was written
    (a marker of this boot already there is left as it is, so a second converge changes nothing)."""
    path = os.path.join(state_dir, f"{SERVING_RECORD}.json")
    try:
        with open(path, encoding="utf-8") as handle:
            if json.load(handle).get("boot_id") == this_boot:
                return path, False
    except (OSError, ValueError, AttributeError):
        pass
    _write_json(path, {"boot_id": this_boot})
    return path, True


def write_boot_record(ctx: Context, level: int, healthy: bool, reason: str, started: float) -> str:
    """Leave the boot run's verdict where check return-diag reads it (`ctx`: the boot run's); returns the path
    ("" when the config has no state directory)."""
    path = _state_path(ctx, BOOT_RECORD)
    if path:
        _write_json(path, {"boot_id": boot_id(ctx), "level": level, "healthy": healthy, "reason": reason,
                           "started": started})
    return path


@check("efa")
def check_efa(ctx: Context) -> Outcome:
    root = Path(ctx.path("infiniband", efa.SYSFS_ROOT))
    devices = efa.efa_devices(root)
    expected = ctx.facts.efa
    if len(devices) < expected:
        return Outcome(False, f"{len(devices)} of {expected} EFA devices bound to the efa driver under {root}",
                       action="replace", evidence={"devices": [d.name for d in devices]})
    down = [f"{p.device}/{p.port} {p.state or 'state unreadable'}, {p.phys_state or 'phys_state unreadable'}"
            for d in devices for p in efa.ports(d) if not p.up]
    portless = [d.name for d in devices if not efa.ports(d)]
    if down or portless:
        text = "; ".join(down + [f"{name} has no port" for name in portless])
        return Outcome(False, f"EFA link not up: {text}", action="drain")
    return Outcome(True, f"{len(devices)} of {expected} EFA devices, every port ACTIVE and LinkUp")


def _state_path(ctx: Context, name: str) -> str:
    state_dir = str(ctx.config.get("state_dir", "")).replace("%n", ctx.node)
    return os.path.join(state_dir, f"{name}.json") if state_dir else ""


def _write_json(path: str, doc: Mapping[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=1, sort_keys=True)
    os.replace(tmp, path)
