"""The repair agent: on the controller, from a triaged compute node back to a serving one, within budgets.

Each pass reads slurmctld's node list and the triage (health_checks.yml, xid.yml: what every reason needs) and
walks each unhealthy compute node up one ladder:

  restart   not this program's step: systemd restarts the node's daemons (Restart=always within a start
            budget), the controller's pass drains a node whose slurmd stops answering, and the node's own next
            healthy health run resumes it. A node drained so for longer than `restart_grace_s` did not come
            back by itself (its host is gone or its daemon's start budget is spent): it needs replacing.
  reboot    the scheduler's reboot command (slurm-ec2: `scontrol reboot ASAP nextstate=RESUME`: Slurm reboots
            the node once it is idle; its HealthCheckProgram runs before slurmd registers again, so it only
            returns healthy). A node that asks again within the window after its reboots escalates to replace.
  replace   the scheduler's replace command (slurm-ec2: its instance terminated in its Auto Scaling group with
            the capacity kept: the group launches a new one, which joins by itself).

Budgets keep the ladder from looping: at most `reboots_per_node` reboots per node and `replacements_per_queue`
replacements per queue (one queue is one instance type and launch template: the slot a new node takes) in
`window_s`; replacements in one queue wait `backoff_s`, doubled after each; at most a quarter of the compute
nodes (at least one) are in repair at once. A queue that needs more replacements than its budget is
quarantined: its failing nodes stay drained with a reason saying so, for a person. When a share of compute
nodes at or above `breaker_share` (and at least two) fails at once, the breaker opens and nothing is done: a
fabric, storage or control-plane fault is not fixed by rebooting or replacing nodes.

A person pauses the agent (maintenance) by writing the pause file (`pause_file`, its text the reason); it then
does nothing until the file is gone. Every action is a line in the log, an entry in the ledger (a JSON file: the budgets' memory across passes and
restarts), a Slurm reason starting with REPAIR_PREFIX and a counter in the controller's node_exporter textfile
(fmcluster_repair_*; the alert rules fire on an open breaker and on quarantine). Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, TextIO

from fmcluster.health import REASON_PREFIX, slurm, textfile, triage
from fmcluster.health.probe import Probe

#: Every reason the repair agent writes starts with this; triage leaves such nodes to the agent or a person.
REPAIR_PREFIX = "fmcluster-repair:"
#: Flags meaning Slurm is rebooting the node already.
REBOOTING = ("REBOOT_REQUESTED", "REBOOT_ISSUED")
KINDS = ("reboot", "replace", "quarantine")


@dataclass(frozen=True)
class Policy:
    """The budgets (tenant.yml health.repair, documented in docs/health.md)."""

    restart_grace_s: float = 300.0
    reboots_per_node: int = 1
    replacements_per_queue: int = 3
    window_s: float = 86400.0
    backoff_s: float = 60.0
    breaker_share: float = 0.5
    settle_s: float = 900.0

    @classmethod
    def from_config(cls, doc: Mapping[str, Any]) -> "Policy":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: type(getattr(cls, k))(v) for k, v in doc.items() if k in known})


@dataclass
class Entry:
    """One action the agent took (or tried)."""

    node: str
    queue: str
    kind: str
    at: float
    reason: str
    ok: bool = True
    detail: str = ""
    address: str = ""


@dataclass
class Ledger:
    """What the agent did, kept across passes: the budgets are counted from it."""

    entries: List[Entry] = field(default_factory=list)
    quarantined: Dict[str, str] = field(default_factory=dict)  # queue → why
    breaker: str = ""  # why it is open; "" closed
    totals: Dict[str, int] = field(default_factory=dict)  # "<kind>/<queue>" → count since the ledger began

    def recent(self, now: float, window_s: float, kind: str, node: str = "", queue: str = "") -> List[Entry]:
        return [e for e in self.entries if e.kind == kind and e.ok and now - e.at <= window_s
                and (not node or e.node == node) and (not queue or e.queue == queue)]

    def record(self, entry: Entry) -> None:
        self.entries.append(entry)
        key = f"{entry.kind}/{entry.queue}"
        self.totals[key] = self.totals.get(key, 0) + 1

    def prune(self, now: float, keep_s: float) -> None:
        self.entries = [e for e in self.entries if now - e.at <= keep_s]

    def to_json(self) -> str:
        return json.dumps({"entries": [asdict(e) for e in self.entries], "quarantined": self.quarantined,
                           "breaker": self.breaker, "totals": self.totals}, indent=1, sort_keys=True)

    @classmethod
    def load(cls, path: str) -> "Ledger":
        try:
            with open(path, encoding="utf-8") as handle:
                doc = json.load(handle)
        except FileNotFoundError:
            return cls()
        return cls([Entry(**e) for e in doc.get("entries", [])], dict(doc.get("quarantined", {})),
                   str(doc.get("breaker", "")), {str(k): int(v) for k, v in doc.get("totals", {}).items()})

    def save(self, path: str) -> None:
        textfile.write_atomic(path, self.to_json() + "\n")


@dataclass
class Step:
    """One decision of a pass: an action to take, or why a node that needs one waits."""

    node: str
    queue: str
    kind: str  # reboot | replace | quarantine | wait
    why: str
    address: str = ""
    trigger: str = ""  # the Slurm reason (or state) that asked for it


@dataclass
class Plan:
    steps: List[Step] = field(default_factory=list)
    breaker: str = ""

    @property
    def actions(self) -> List[Step]:
        return [s for s in self.steps if s.kind in KINDS]


def _since(node: slurm.Node) -> Optional[float]:
    try:
        return time.mktime(time.strptime(node.reason_time, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _need(node: slurm.Node, finding: triage.Finding, policy: Policy, now: float) -> tuple[str, str]:
    """What the node needs from this agent (reboot / replace / wait / none) and why."""
    if finding.check == "slurmd" and finding.origin == "fmcluster-health":
        since = _since(node)
        if since is not None and now - since < policy.restart_grace_s:
            return "wait", (f"slurmd stopped answering {now - since:.0f}s ago: systemd restarts it, the node's "
                            f"health run resumes it (grace {policy.restart_grace_s:.0f}s)")
        return "replace", (f"slurmd has not answered for more than {policy.restart_grace_s:.0f}s despite systemd's "
                           "restarts: the host is gone or the daemon cannot start")
    return finding.action, finding.why


def plan(nodes: Sequence[slurm.Node], findings: Sequence[triage.Finding], ledger: Ledger, policy: Policy,
         now: float) -> Plan:
    """The pass's decisions, from Slurm's nodes, the triage's findings and the ledger; no side effects."""
    by_name = {n.name: n for n in nodes}
    total = len(nodes)
    wanted: List[Step] = []
    # Tried lately, done or not: a failed command is not retried every pass, a done one has time to show.
    # (A reboot done shows in Slurm's REBOOT_* flags while under way, and a node failing after it escalates.)
    in_repair = {e.node for e in ledger.entries if (e.kind == "replace" or (e.kind == "reboot" and not e.ok))
                 and now - e.at < policy.settle_s and e.node in by_name}
    for finding in findings:
        node = by_name.get(finding.node)
        if finding.node in in_repair:
            continue
        if node is None or node.reason.startswith(REPAIR_PREFIX) or any(f in node.flags for f in REBOOTING):
            continue  # under way (ours), or unknown to slurmctld
        queue = node.partitions[0] if node.partitions else ""
        need, why = _need(node, finding, policy, now)
        trigger = finding.reason or finding.state
        if need == "reboot" and not node.responding:
            need, why = "replace", f"{why}; it needs a reboot but its slurmd does not answer to run one"
        if need == "reboot" and len(ledger.recent(now, policy.window_s, "reboot", node=node.name)) \
                >= policy.reboots_per_node:
            need, why = "replace", (f"{why}; rebooted {policy.reboots_per_node} time(s) in the last "
                                    f"{policy.window_s / 3600:g}h and failing again")
        if need in ("reboot", "replace", "wait"):
            wanted.append(Step(node.name, queue, need, why, node.address, trigger))

    failing = [s for s in wanted if s.kind in ("reboot", "replace")]
    if len(failing) >= 2 and total and len(failing) / total >= policy.breaker_share:
        why = (f"{len(failing)} of {total} compute nodes need a reboot or a replacement at once "
               f"(breaker at {policy.breaker_share:.0%}): a shared cause (fabric, storage, control plane, image) is "
               f"likelier; nothing is rebooted or replaced until fewer fail: "
               + ", ".join(f"{s.node} ({s.trigger})" for s in failing))
        return Plan([Step(s.node, s.queue, "wait", "breaker open", s.address, s.trigger) for s in wanted], why)

    slots = max(1, total // 4) - len(in_repair)
    steps: List[Step] = []
    for step in wanted:
        if step.kind == "replace":
            step = _budgeted_replace(step, ledger, policy, now)
        if step.kind in ("reboot", "replace"):
            if slots <= 0:
                step = Step(step.node, step.queue, "wait", f"{step.why}; waits: {len(in_repair)} node(s) in repair "
                            f"already (at most a quarter of the {total} compute nodes at once)", step.address,
                            step.trigger)
            else:
                slots -= 1
        steps.append(step)
    return Plan(steps)


def _budgeted_replace(step: Step, ledger: Ledger, policy: Policy, now: float) -> Step:
    if step.queue in ledger.quarantined:
        return Step(step.node, step.queue, "quarantine", f"queue {step.queue} is quarantined: "
                    f"{ledger.quarantined[step.queue]}", step.address, step.trigger)
    done = sorted(ledger.recent(now, policy.window_s, "replace", queue=step.queue), key=lambda e: e.at)
    if len(done) >= policy.replacements_per_queue:
        return Step(step.node, step.queue, "quarantine",
                    f"queue {step.queue} had {len(done)} replacement(s) in the last {policy.window_s / 3600:g}h "
                    f"(budget {policy.replacements_per_queue}) and a node fails again: a bad instance type, image "
                    f"or capacity pool is likelier than bad nodes ({step.why})", step.address, step.trigger)
    if done:
        ready = done[-1].at + policy.backoff_s * 2 ** (len(done) - 1)
        if now < ready:
            return Step(step.node, step.queue, "wait", f"{step.why}; backoff: the queue's next replacement at the "
                        f"earliest in {ready - now:.0f}s", step.address, step.trigger)
    return step


# --- acting -------------------------------------------------------------------------------------------------
def _fill(argv: Sequence[str], step: Step, reason: str, config: Mapping[str, Any]) -> List[str]:
    """A scheduler's command for this step: placeholders filled, a leading `scontrol` the cluster's own."""
    values = {"node": step.node, "address": step.address, "queue": step.queue, "reason": reason,
              "python": str(config.get("python", sys.executable))}
    filled = [str(part).format(**values) for part in argv]
    if filled and filled[0] == "scontrol":
        filled = [*(config.get("commands", {}).get("scontrol") or ["scontrol"]), *filled[1:]]
    return filled


def act(step: Step, config: Mapping[str, Any], probe: Probe) -> Entry:
    """Run one action through the scheduler's commands (config `mechanism`); the Slurm reason first, so a
    person reading `sinfo -R` sees what is under way."""
    scontrol = list(config.get("commands", {}).get("scontrol") or ["scontrol"])
    mechanism = config.get("mechanism", {})
    short = step.trigger[:120]
    entry = Entry(step.node, step.queue, step.kind, time.time(), step.why, address=step.address)
    reason = f"{REPAIR_PREFIX} {step.kind}: {short}"
    if step.kind == "quarantine":
        reason = f"{REPAIR_PREFIX} quarantined (queue {step.queue}): {short}"
        argvs = [slurm.drain_argv(scontrol, step.node, reason)]
    elif step.kind == "reboot":
        argvs = [_fill(mechanism["reboot"], step, reason, config)]
    else:
        # The request first: a node drained for a replacement that was never asked for would wait for nothing.
        argvs = [_fill(mechanism["replace"], step, reason, config), slurm.drain_argv(scontrol, step.node, reason)]
    for argv in argvs:
        done = probe.run(argv, timeout=float(config.get("action_timeout_s", 120)))
        if not done.ok:
            entry.ok, entry.detail = False, f"{' '.join(argv[:3])}…: {done.why()}"
            break
    return entry


def paused_by(config: Mapping[str, Any]) -> Optional[str]:
    """The pause file's text (why a person paused the agent: maintenance), or None when it runs."""
    path = str(config.get("pause_file", ""))
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return None


def metrics(ledger: Ledger, plan_: Plan, now: float, paused: bool = False) -> str:
    out = textfile.Exposition()
    out.add("fmcluster_repair_paused", "1 while a person paused the repair agent (its pause file exists).",
            1 if paused else 0)
    out.declare("fmcluster_repair_actions_total", "Repair actions taken by the controller's agent.", "counter")
    for key, count in sorted(ledger.totals.items()):
        kind, _, queue = key.partition("/")
        out.add("fmcluster_repair_actions_total", "", count, {"kind": kind, "queue": queue}, "counter")
    out.add("fmcluster_repair_breaker_open", "1 while the repair agent's breaker is open (too many nodes failing "
            "at once: nothing is repaired).", 1 if plan_.breaker else 0)
    out.declare("fmcluster_repair_quarantined", "1 for each queue the repair agent stopped replacing nodes in.")
    for queue in sorted(ledger.quarantined):
        out.add("fmcluster_repair_quarantined", "", 1, {"queue": queue})
    out.add("fmcluster_repair_waiting_nodes", "Nodes that need a repair the budgets hold back.",
            sum(1 for s in plan_.steps if s.kind == "wait"))
    out.add("fmcluster_repair_last_pass_timestamp_seconds", "When the repair agent last completed a pass.", now)
    return out.render()


def load_config(path: str) -> Dict[str, Any]:
    """The agent's config over the controller's pass config it names (Slurm's commands, the triage's data)."""
    with open(path, encoding="utf-8") as handle:
        own = json.load(handle)
    base: Dict[str, Any] = {}
    if own.get("cluster_config"):
        with open(str(own["cluster_config"]), encoding="utf-8") as handle:
            base = json.load(handle)
    return {**base, **own}


def _probe(config: Mapping[str, Any]) -> Probe:
    env = {str(k): str(v) for k, v in config.get("environment", {}).items()}
    if config.get("slurm_conf"):
        env["SLURM_CONF"] = str(config["slurm_conf"])
    return Probe(env)


def repair_pass(config: Mapping[str, Any], probe: Optional[Probe] = None, out: TextIO = sys.stdout,
                now: Optional[float] = None) -> Plan:
    probe = probe or _probe(config)
    policy = Policy.from_config(config.get("policy", {}))
    now = time.time() if now is None else now
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now))
    paused = paused_by(config)
    if paused is not None:
        out.write(f"{stamp} paused ({config['pause_file']}: {paused or 'no reason given'}): nothing repaired\n")
        out.flush()
        if config.get("textfile"):
            ledger = Ledger.load(str(config["ledger"]))
            textfile.write_atomic(str(config["textfile"]), metrics(ledger, Plan(breaker=ledger.breaker), now, True))
        return Plan()
    scontrol = list(config.get("commands", {}).get("scontrol") or ["scontrol"])
    shown = probe.run([*scontrol, "show", "node"], timeout=30)
    if not shown.ok:
        out.write(f"{stamp} cannot read the node list: {shown.why()} (nothing repaired)\n")
        out.flush()
        return Plan()
    rules = triage.Rules({"checks": config.get("checks", []), "external_reasons": config.get("external_reasons", [])},
                         config.get("xids", {}))
    findings = triage.unhealthy_nodes(shown.stdout, rules)
    ledger_path = str(config["ledger"])
    ledger = Ledger.load(ledger_path)
    decided = plan(slurm.parse_show_node(shown.stdout), findings, ledger, policy, now)
    if decided.breaker != ledger.breaker:
        out.write(f"{stamp} breaker {'OPEN: ' + decided.breaker if decided.breaker else 'closed'}\n")
        ledger.breaker = decided.breaker
    for step in decided.steps:
        if step.kind == "wait":
            continue
        if step.kind == "quarantine" and step.queue not in ledger.quarantined:
            ledger.quarantined[step.queue] = step.why
        entry = act(step, config, probe)
        ledger.record(entry)
        out.write(f"{stamp} {step.kind} {step.node} ({step.queue}): {'done' if entry.ok else 'FAILED'}: {step.why}"
                  + (f" [{entry.detail}]" if entry.detail else "") + "\n")
    ledger.quarantined = {q: why for q, why in ledger.quarantined.items()
                          if any(e.queue == q and now - e.at <= policy.window_s for e in ledger.entries)}
    ledger.prune(now, max(policy.window_s, policy.settle_s))
    ledger.save(ledger_path)
    if config.get("textfile"):
        textfile.write_atomic(str(config["textfile"]), metrics(ledger, decided, now))
    out.flush()
    return decided


def run_forever(config_path: str, every: float, out: TextIO = sys.stdout) -> int:
    config = load_config(config_path)
    policy = Policy.from_config(config.get("policy", {}))
    out.write(f"fmcluster-health repair every {every:g} s: {asdict(policy)}\n")
    out.flush()
    from fmcluster.health.cluster import repeat

    return repeat("repair pass", lambda: repair_pass(config, out=out), every, out)


def show(config_path: str, out: TextIO = sys.stdout) -> int:
    """The ledger for a person (and `invoke nodes`, `invoke fleet`): breaker, quarantines, recent actions; with
    `last_pass` (when a pass last completed: each saves the ledger) and `paused` (the pause file's reason) where
    they hold."""
    config = load_config(config_path)
    path = str(config["ledger"])
    doc: Dict[str, Any] = {}
    if os.path.exists(path):
        doc = json.loads(Ledger.load(path).to_json())
        doc["last_pass"] = os.path.getmtime(path)
    paused = paused_by(config)
    if paused is not None:
        doc["paused"] = paused or "no reason given"
    out.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


__all__ = ["Policy", "Ledger", "Entry", "Step", "Plan", "plan", "act", "repair_pass", "run_forever", "REPAIR_PREFIX",
           "REASON_PREFIX"]
