"""One stack at a time: change set → (plan: show | deploy: execute and stream events) → outcome.

CloudFormation semantics followed here, on AWS and on the emulator alike:
- a stack that does not exist gets a CREATE change set; one that does, an UPDATE change set;
- a change set that "didn't contain changes" means the stack is skipped;
- a stack left in ROLLBACK_COMPLETE (a failed first create) can only be deleted: it is deleted and
  created again, which is what makes a re-run after a failure resume cleanly;
- UPDATE_ROLLBACK_COMPLETE is a healthy stack (the failed update was undone): it is updated again;
- a stack still in progress (another run, or one interrupted) is waited for first;
- a stack whose resources carry a CreationPolicy ResourceSignal stays in progress until its nodes signal (their first
  boot): it is waited for up to the longest signal Timeout, CloudFormation itself failing it when that runs out, and
  meanwhile `while_waiting` is called (the deploy's: the provider boots the instances that exist; on AWS EC2 boots
  them and the call only notes it; on the local substrate it makes their hosts, which run their user data).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import ClientError

from fmcluster.capabilities import ApiCapabilities
from fmcluster.stacks.references import referenced
from fmcluster.stacks.render import RenderedStack, load_cfn_yaml
from fmcluster.stacks.result import EMULATOR_SKIPPED_TYPES, Failure, ResourceChange, StackOutcome

Out = Callable[[str], object]

MAX_TEMPLATE_BODY = 51_200  # bytes CloudFormation accepts inline; larger needs an S3 TemplateURL
RECREATE_STATES = {"ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "CREATE_FAILED", "DELETE_FAILED", "REVIEW_IN_PROGRESS"}
STUCK_STATES = {"UPDATE_ROLLBACK_FAILED"}
NO_CHANGES = ("didn't contain changes", "No updates are to be performed")
SYMBOL = {"Add": "+", "Modify": "~", "Remove": "-", "Import": "<", "Dynamic": "?"}


#: Called now and then while a stack waits for its nodes' signals (the deploy: the provider boots the instances).
WhileWaiting = Callable[[], object]
#: How often `while_waiting` is called while a stack waits for signals.
WHILE_WAITING_EVERY_S = 30.0
#: What the wait allows beyond the longest signal Timeout (CloudFormation fails the resource at the Timeout, "no
#: sooner than the time you specify but can occur shortly thereafter"; then the rollback).
SIGNAL_MARGIN_S = 300.0
#: A long wait polls less often: after this long, at most every SLOW_POLL_S.
SLOW_POLL_AFTER_S, SLOW_POLL_S = 10.0, 2.0


class StackTimeout(RuntimeError):
    pass


def signal_wait_s(stack: RenderedStack) -> float:
    """The longest a resource of the stack waits for its signals (CreationPolicy ResourceSignal Timeout; 0: none)."""
    from fmcluster.stacks.cfn import signal_timeout_s

    longest = 0.0
    for res in (load_cfn_yaml(stack.body).get("Resources") or {}).values():
        signal = (res.get("CreationPolicy") or {}).get("ResourceSignal") if isinstance(res, dict) else None
        if isinstance(signal, dict):
            try:
                longest = max(longest, signal_timeout_s(str(signal.get("Timeout", "PT5M"))))
            except ValueError:
                longest = max(longest, 1.0)  # CloudFormation refuses it: the change set fails, nothing waits
    return longest


def stack_status(cf: Any, name: str) -> dict[str, Any] | None:
    try:
        stacks = cf.describe_stacks(StackName=name)["Stacks"]
    except ClientError as err:
        if "does not exist" in str(err):
            return None
        raise
    live = [s for s in stacks if s["StackStatus"] != "DELETE_COMPLETE"]
    return live[0] if live else None


def _latest_event_id(cf: Any, name: str) -> str | None:
    try:
        events = cf.describe_stack_events(StackName=name)["StackEvents"]
    except ClientError:
        return None
    return events[0]["EventId"] if events else None


def _new_events(cf: Any, name: str, since: str | None) -> list[dict[str, Any]]:
    """Events after `since`, oldest first (describe_stack_events returns newest first)."""
    new: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"StackName": name}
    while True:
        try:
            page = cf.describe_stack_events(**kwargs)
        except ClientError:
            break
        for event in page["StackEvents"]:
            if event["EventId"] == since:
                return list(reversed(new))
            new.append(event)
        if not page.get("NextToken"):
            break
        kwargs["NextToken"] = page["NextToken"]
    return list(reversed(new))


def format_event(event: dict[str, Any]) -> str:
    stamp = event.get("Timestamp")
    when = stamp.astimezone(timezone.utc).strftime("%H:%M:%S") if isinstance(stamp, datetime) else "--:--:--"
    reason = f"  {event['ResourceStatusReason']}" if event.get("ResourceStatusReason") else ""
    return (f"    {when}  {event['ResourceStatus']:<28} {event['LogicalResourceId']} "
            f"({event.get('ResourceType', '')}){reason}")


def wait_for_stack(cf: Any, name: str, since: str | None, out: Out, poll_s: float, timeout_s: float,
                   while_waiting: WhileWaiting | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Stream the stack's events until it leaves *_IN_PROGRESS; returns (final status, events seen).

    `while_waiting`: called while the stack is CREATE_IN_PROGRESS or UPDATE_IN_PROGRESS (waiting for its nodes'
    signals), at once and then every WHILE_WAITING_EVERY_S; once more when the stack has finished (a rollback
    terminated the instances: the substrate drops what ran them). An exception it raises while the stack waits
    ends the wait (the stack is left in progress; a re-run waits for it again)."""
    seen: list[dict[str, Any]] = []
    started = time.monotonic()
    deadline = started + timeout_s
    called, next_call = False, started
    while True:
        for event in _new_events(cf, name, seen[-1]["EventId"] if seen else since):
            seen.append(event)
            out(format_event(event))
        stack = stack_status(cf, name)
        status = stack["StackStatus"] if stack else "DELETE_COMPLETE"
        if not status.endswith("_IN_PROGRESS") or status == "REVIEW_IN_PROGRESS":
            for event in _new_events(cf, name, seen[-1]["EventId"] if seen else since):
                seen.append(event)
                out(format_event(event))
            if called and while_waiting is not None:
                try:
                    while_waiting()
                except Exception as err:  # noqa: BLE001 - the stack's outcome stands; say why the substrate lags
                    out(f"  after {name} finished ({status}), the instances could not be reconciled: {err}")
            return status, seen
        now = time.monotonic()
        if while_waiting is not None and status in ("CREATE_IN_PROGRESS", "UPDATE_IN_PROGRESS") and now >= next_call:
            while_waiting()
            called, next_call = True, time.monotonic() + WHILE_WAITING_EVERY_S
        if time.monotonic() > deadline:
            raise StackTimeout(f"{name} still {status} after {timeout_s:.0f} s; re-run to resume waiting")
        time.sleep(poll_s if now - started < SLOW_POLL_AFTER_S else max(poll_s, SLOW_POLL_S))


def first_failure(events: list[dict[str, Any]]) -> Failure | None:
    """The resource that failed first (later ones are usually 'cancelled' knock-on failures)."""
    failed = [e for e in events if e["ResourceStatus"].endswith("_FAILED")]
    real = [e for e in failed if "cancelled" not in (e.get("ResourceStatusReason") or "").lower()]
    if not failed:
        return None
    event = (real or failed)[0]
    return Failure(event["LogicalResourceId"], event.get("ResourceType", ""), event["ResourceStatus"],
                   event.get("ResourceStatusReason") or "(no reason given)")


def delete_stack(cf: Any, name: str, out: Out, poll_s: float, timeout_s: float) -> tuple[str, Failure | None]:
    since = _latest_event_id(cf, name)
    cf.delete_stack(StackName=name)
    status, events = wait_for_stack(cf, name, since, out, poll_s, timeout_s)
    return status, (first_failure(events) if status == "DELETE_FAILED" else None)


def _describe_change_set(cf: Any, name: str, change_set: str, poll_s: float) -> tuple[dict[str, Any], list[ResourceChange]]:
    deadline = time.monotonic() + 300
    while True:
        desc = cf.describe_change_set(StackName=name, ChangeSetName=change_set)
        if desc["Status"] in ("CREATE_COMPLETE", "FAILED") or time.monotonic() > deadline:
            break
        time.sleep(poll_s)
    changes = list(desc.get("Changes", []))
    token = desc.get("NextToken")
    while token:
        page = cf.describe_change_set(StackName=name, ChangeSetName=change_set, NextToken=token)
        changes += page.get("Changes", [])
        token = page.get("NextToken")
    parsed = [ResourceChange(c["ResourceChange"]["Action"], c["ResourceChange"]["LogicalResourceId"],
                             c["ResourceChange"].get("ResourceType", ""),
                             str(c["ResourceChange"].get("Replacement", "")))
              for c in changes if "ResourceChange" in c]
    return desc, parsed


def resource_details(stack: RenderedStack) -> dict[str, str]:
    """Short facts worth seeing in a plan: instance type, EFA interfaces, capacity reservation, how a
    group waits for its nodes and how it is replaced, what keeps the controller in place."""
    details: dict[str, str] = {}
    for lid, res in load_cfn_yaml(stack.body).get("Resources", {}).items():
        if res.get("Type") == "AWS::EC2::LaunchTemplate":
            data = res["Properties"]["LaunchTemplateData"]
            kinds = [nic.get("InterfaceType") for nic in data.get("NetworkInterfaces", [])]
            efa = sum(1 for kind in kinds if kind in ("efa", "efa-only"))
            only = sum(1 for kind in kinds if kind == "efa-only")
            # A PCS node group's launch template has none: its node group names the instance type.
            facts = [*([str(data["InstanceType"])] if "InstanceType" in data else []),
                     (f"{efa} EFA interfaces ({efa - only} efa, {only} efa-only)" if efa else "no EFA")]
            target = data.get("CapacityReservationSpecification", {}).get("CapacityReservationTarget", {})
            if target.get("CapacityReservationId"):
                block = data.get("InstanceMarketOptions", {}).get("MarketType") == "capacity-block"
                facts.append(f"{'capacity block' if block else 'capacity reservation'} {target['CapacityReservationId']}")
            details[lid] = ", ".join(facts)
        elif res.get("Type") == "AWS::AutoScaling::AutoScalingGroup":
            signal = res.get("CreationPolicy", {}).get("ResourceSignal", {})
            rolling = res.get("UpdatePolicy", {}).get("AutoScalingRollingUpdate", {})
            count = res["Properties"].get("DesiredCapacity")
            facts = [f"{count} node{'' if str(count) == '1' else 's'}"]
            if signal:
                plural = "" if str(signal.get("Count")) == "1" else "s"
                facts.append(f"waits for {signal.get('Count')} bootstrap signal{plural} ({signal.get('Timeout')})")
            if rolling:
                facts.append(f"a launch template change replaces nodes {rolling.get('MaxBatchSize')} at a time")
            if "PlacementGroup" in res["Properties"]:
                facts.append("in the cluster placement group")
            details[lid] = ", ".join(facts)
        elif res.get("Type") == "AWS::PCS::ComputeNodeGroup":
            props = res["Properties"]
            scaling = props.get("ScalingConfiguration", {})
            types = ", ".join(str(c.get("InstanceType")) for c in props.get("InstanceConfigs", []))
            details[lid] = f"{types}, {scaling.get('MinInstanceCount')}-{scaling.get('MaxInstanceCount')} nodes"
        elif res.get("Type") == "AWS::EC2::Instance":
            version = res["Properties"].get("LaunchTemplate", {}).get("Version")
            if isinstance(version, str):
                details[lid] = (f"{res['Properties'].get('InstanceType')}, pinned image, launch template version "
                                f"{version}: later launch template changes do not replace it")
    return details


def render_changes(changes: list[ResourceChange], emulator: bool, details: dict[str, str] | None = None) -> list[str]:
    lines = []
    for c in changes:
        extra = f"  [{details[c.logical_id]}]" if details and c.logical_id in details else ""
        extra += f"  (replacement: {c.replacement})" if c.replacement else ""
        if emulator and c.action == "Add" and c.resource_type in EMULATOR_SKIPPED_TYPES:
            extra += "  [the emulator will NOT create this]"
        lines.append(f"    {SYMBOL.get(c.action, c.action)} {c.logical_id} ({c.resource_type}){extra}")
    return lines


def template_resources(stack: RenderedStack) -> dict[str, str]:
    return stack.resource_types()


def not_created(cf: Any, stack: RenderedStack) -> list[tuple[str, str]]:
    """Resources in the template that the stack does not hold (the emulator skipped them)."""
    present: set[str] = set()
    kwargs: dict[str, Any] = {"StackName": stack.name}
    while True:
        page = cf.list_stack_resources(**kwargs)
        present |= {r["LogicalResourceId"] for r in page["StackResourceSummaries"] if r.get("LogicalResourceId")}
        if not page.get("NextToken"):
            break
        kwargs["NextToken"] = page["NextToken"]
    return [(lid, rtype) for lid, rtype in template_resources(stack).items() if lid not in present]


def outputs_left_out(stack: RenderedStack, not_created: list[tuple[str, str]]) -> list[str]:
    """The outputs that read a resource the stack does not hold: absent with it (the emulator leaves both out)."""
    missing = {lid for lid, _ in not_created}
    outputs = load_cfn_yaml(stack.body).get("Outputs", {})
    return [key for key, spec in outputs.items() if referenced(spec.get("Value")) & missing]


def stack_outputs(stack_desc: dict[str, Any] | None) -> dict[str, str]:
    return {o["OutputKey"]: o["OutputValue"] for o in (stack_desc or {}).get("Outputs") or []}


#: Asked with an update's change set before it is executed; a Failure leaves it unexecuted (fmcluster.stacks.rollout).
BeforeExecute = Callable[[RenderedStack, list[ResourceChange]], "Failure | None"]


def apply_stack(cf: Any, stack: RenderedStack, parameters: dict[str, str], tags: dict[str, str], *,
                execute: bool, apis: ApiCapabilities, out: Out, template_url: str | None = None,
                before_execute: BeforeExecute | None = None, while_waiting: WhileWaiting | None = None) -> StackOutcome:
    """Create/update one stack through a change set; with execute=False only show the change set.
    `apis`: how the APIs answer (the provider's): the poll and the wait, and whether to list what an emulator left out.
    `before_execute`: asked with an update's changes before they are executed (the replacement gate).
    `while_waiting`: called while the stack waits for its nodes' signals (wait_for_stack)."""
    poll_s, timeout_s = apis.stack_poll_s, apis.stack_timeout_s
    signal_s = signal_wait_s(stack)
    if signal_s:  # its nodes boot and signal meanwhile: CloudFormation's own Timeout ends the wait
        timeout_s = max(timeout_s, signal_s + SIGNAL_MARGIN_S)
    else:
        while_waiting = None
    outcome = StackOutcome(stack.key, stack.name, "failed")
    if len(stack.body.encode()) > MAX_TEMPLATE_BODY and template_url is None:
        raise ValueError(f"{stack.name}: rendered template is {len(stack.body.encode())} bytes, over the "
                         f"{MAX_TEMPLATE_BODY} CloudFormation accepts inline (and no bucket to pass it through yet)")
    current = stack_status(cf, stack.name)
    if current and current["StackStatus"].endswith("_IN_PROGRESS") and current["StackStatus"] != "REVIEW_IN_PROGRESS":
        out(f"  {stack.name} is {current['StackStatus']} (another run?): waiting for it first")
        wait_for_stack(cf, stack.name, _latest_event_id(cf, stack.name), out, poll_s, timeout_s, while_waiting)
        current = stack_status(cf, stack.name)
    if current and current["StackStatus"] in STUCK_STATES:
        outcome.status = current["StackStatus"]
        outcome.failure = Failure(stack.name, "AWS::CloudFormation::Stack", current["StackStatus"],
                                  "the stack needs `aws cloudformation continue-update-rollback` before fmcluster can update it")
        return outcome
    if current and current["StackStatus"] in RECREATE_STATES:
        if not execute:
            outcome.notes.append(f"{stack.name} is {current['StackStatus']} (a failed or interrupted create): "
                                 "deploy will delete it and create it again")
            outcome.action = "would-create"
            outcome.changes = [ResourceChange("Add", lid, rtype) for lid, rtype in template_resources(stack).items()]
            return outcome
        out(f"  {stack.name} is {current['StackStatus']} (a failed or interrupted create was rolled back): "
            "deleting it so it can be created again")
        status, failure = delete_stack(cf, stack.name, out, poll_s, timeout_s)
        if failure:
            outcome.failure, outcome.status = failure, status
            return outcome
        current = None

    change_set_type = "UPDATE" if current else "CREATE"
    change_set = f"fmc-{datetime.now(timezone.utc).strftime('%Y%m%d%H%M%S%f')}"
    try:
        cf.create_change_set(
            StackName=stack.name, ChangeSetName=change_set, ChangeSetType=change_set_type,
            **({"TemplateURL": template_url} if template_url else {"TemplateBody": stack.body}),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
            Capabilities=["CAPABILITY_IAM"],
            Tags=[{"Key": k, "Value": v} for k, v in tags.items()],
            Description=f"fmcluster {'plan' if not execute else 'deploy'} of {stack.name}",
        )
    except ClientError as err:
        # CloudFormation answers "no changes" with a FAILED change set; the emulator refuses the call.
        if not any(marker in str(err) for marker in NO_CHANGES):
            raise
        desc, changes = {"Status": "FAILED", "StatusReason": str(err)}, list[ResourceChange]()
    else:
        desc, changes = _describe_change_set(cf, stack.name, change_set, poll_s)
    reason = desc.get("StatusReason") or ""
    if desc["Status"] == "FAILED":
        if "ChangeSetId" in desc:
            cf.delete_change_set(StackName=stack.name, ChangeSetName=change_set)
        if any(marker in reason for marker in NO_CHANGES):
            outcome.action = "unchanged" if execute else "no-changes"
            outcome.status = current["StackStatus"] if current else ""
            outcome.outputs = stack_outputs(current)
            if apis.emulated and current:
                outcome.not_created = not_created(cf, stack)
            return outcome
        outcome.failure = Failure(stack.name, "AWS::CloudFormation::ChangeSet", "FAILED", reason)
        return outcome
    outcome.changes = changes

    if not execute:
        cf.delete_change_set(StackName=stack.name, ChangeSetName=change_set)
        if change_set_type == "CREATE":
            cf.delete_stack(StackName=stack.name)  # the empty REVIEW_IN_PROGRESS stack the change set made
        outcome.action = "would-create" if change_set_type == "CREATE" else "would-update"
        outcome.status = current["StackStatus"] if current else "(does not exist)"
        return outcome

    if before_execute is not None and change_set_type == "UPDATE":
        refused = before_execute(stack, changes)
        if refused is not None:
            cf.delete_change_set(StackName=stack.name, ChangeSetName=change_set)
            outcome.failure, outcome.status = refused, current["StackStatus"] if current else ""
            return outcome
    out(f"  {stack.name}: {change_set_type.lower()} ({len(changes)} resource change(s))")
    since = _latest_event_id(cf, stack.name)
    cf.execute_change_set(StackName=stack.name, ChangeSetName=change_set)
    if while_waiting is not None:
        out(f"  {stack.name} waits for its nodes' signals (at most {signal_s:.0f} s); booting its instances meanwhile")
    status, events = wait_for_stack(cf, stack.name, since, out, poll_s, timeout_s, while_waiting)
    outcome.status = status
    if status not in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
        outcome.failure = first_failure(events) or Failure(stack.name, "AWS::CloudFormation::Stack", status,
                                                           "no failed resource event; see the stack's events")
        return outcome
    outcome.action = "created" if change_set_type == "CREATE" else "updated"
    outcome.outputs = stack_outputs(stack_status(cf, stack.name))
    if apis.emulated:
        outcome.not_created = not_created(cf, stack)
    return outcome
