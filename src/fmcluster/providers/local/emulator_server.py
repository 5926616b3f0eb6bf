"""The local AWS emulator: moto's server, with two fidelity fixes to its CloudFormation change sets.

Run as `python -m fmcluster.providers.local.emulator_server --port N` (fmcluster.providers.local.emulator starts it).
It is moto 5.1 unchanged except for what CloudFormation's and EC2's contracts need and moto lacks:

1. Executing a change set did not compute the stack's outputs (only create_stack/update_stack did):
   they are now computed after every executed change set, exactly as moto does for update_stack.
2. Deleting a stack whose resources could not all be deleted answered HTTP 500 and forgot the stack.
   Now the stack stays, in DELETE_FAILED, with an event naming the resources left and the reason.
3. Network interfaces made when an instance launched survived its termination (EC2 deletes them,
   and moto lost the launch template's DeleteOnTermination); and moto's CloudFormation never deletes
   route tables, NAT gateways, internet gateways or VPC endpoints, so the VPC could not be deleted.
   Deleting a stack's VPC now first deletes those, as CloudFormation would have done before it.
4. A resource that failed to create or update made ExecuteChangeSet answer HTTP 500 and left the
   stack half-built. Now, as in CloudFormation, the failing resource gets a CREATE_FAILED or
   UPDATE_FAILED event with the reason, the stack rolls back (created resources deleted, or the
   previous template re-applied) and ends in ROLLBACK_COMPLETE / UPDATE_ROLLBACK_COMPLETE.
   Each resource moto does create also gets its *_COMPLETE event, so progress can be streamed. A resource an
   update (or a rollback) removes is forgotten with it: moto kept it, and an update adding it back created nothing.

5. An instance launched from a launch template took only its image and tags: RunInstances (and with it
   the auto scaling groups) now takes the template's user data, key pair and primary network interface's
   subnet where the request omits them, as EC2 does; and CloudFormation's AWS::EC2::Instance, which
   ignored its LaunchTemplate property altogether, launches from the template.
6. Updating an auto scaling group through CloudFormation deleted it and made a new one, replacing every
   instance. CloudFormation updates a group in place: a new desired capacity launches or terminates only
   the difference, a new launch template version applies to instances launched from then on.
7. An output whose value reads an attribute (Fn::GetAtt) of a resource moto skipped (FSx, placement group…)
   failed the whole stack call with HTTP 500, while a Ref to one silently drops the output. Both now drop
   the output: the stack exists, and the output is absent because its resource is (reported as such).
8. CreationPolicy and SignalResource (moto implemented neither). A change set that creates an auto scaling
   group or an instance with a CreationPolicy ResourceSignal leaves it CREATE_IN_PROGRESS (event "Resource creation
   Initiated"), and the stack CREATE_IN_PROGRESS / UPDATE_IN_PROGRESS, until its signals arrive: Count SUCCESS
   signals, or for a group its MinSuccessfulInstancesPercent (default 100) of Count, rounded to a tenth of a percent
   and up to whole instances. Each UniqueId counts once; each signal is a stack event ("Received SUCCESS signal with
   UniqueId i-…"). A FAILURE on an instance, FAILURE signals that leave too few instances to succeed, or the
   Timeout (PT#H#M#S, at most PT12H; default Count 1, PT5M) running out fails the resource with CloudFormation's
   reason ("Received 1 FAILURE signal(s) out of 3. Unable to satisfy 100% MinSuccessfulInstancesPercent
   requirement", "Failed to receive 3 resource signal(s) within the specified duration"), the others waiting are
   cancelled, and the stack rolls back as in fix 4 (instances terminated). Timeouts are found by a timer thread,
   not by the next Describe* call, so the stack rolls back on time whether or not anybody polls. A signal to a
   resource that waits for none is refused as CloudFormation refuses it ("… is in CREATE_COMPLETE state and cannot
   be signaled"). Every CloudFormation, EC2 and Auto Scaling request is serialized with that timer (one lock).
   Not emulated: resources that depend on a waiting one are created at once (moto creates them in one pass; on
   AWS they wait); CreateStack/UpdateStack (fmcluster uses change sets only) do not wait; UpdatePolicy's
   AutoScalingRollingUpdate is not applied (fix 6 replaces no instance, so there is nothing to wait for).

9. Capacity and quotas, which moto does not have, are stood in (said as such by the capacity pre-flight,
   fmcluster.capacity): EC2 capacity reservations — CreateCapacityReservation (On-Demand Capacity
   Reservations), DescribeCapacityBlockOfferings + PurchaseCapacityBlock (Capacity Blocks for ML; any window
   is sold, in the region's first zone), DescribeCapacityReservations (state from the window: scheduled,
   active, expired; cancelled after CancelCapacityReservation) — and Service Quotas for EC2 (GetServiceQuota:
   every quota is EMULATOR_EC2_QUOTA until RequestServiceQuotaIncrease sets it, at once, to the value asked).
   The substrate has no account limit of its own, so the stand-in's default never refuses.

10. AWS::SageMaker::Cluster (HyperPod), which moto's CloudFormation skips, is made: its instance groups' instances
   are launched into its VPC and run a stand-in of HyperPod's agent, which runs the groups' lifecycle scripts; SageMaker's
   DescribeCluster, ListClusterNodes and DescribeClusterNode answer from those instances
   (fmcluster.providers.local.emulator_hyperpod says what is stood in and what differs).

Resource types moto does not implement are still silently skipped here, as in moto: fmcluster
detects and reports them itself (fmcluster.stacks.api), it never pretends they exist.
"""

from __future__ import annotations

import argparse
import math
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class ResourceFailed(Exception):
    def __init__(self, logical_id: str, resource_type: str, reason: str) -> None:
        super().__init__(f"{logical_id} ({resource_type}): {reason}")
        self.logical_id = logical_id
        self.resource_type = resource_type
        self.reason = reason


def _reason(err: BaseException) -> str:
    message = getattr(err, "message", None) or str(err) or repr(err)
    code = getattr(err, "error_type", None) or getattr(err, "code", None) or type(err).__name__
    return f"{code}: {message}"


def _stack_of(resources_map: Any) -> Any:
    from moto.cloudformation import models

    backend = models.cloudformation_backends[resources_map._account_id][resources_map._region_name]
    return backend.stacks.get(resources_map.stack_id)


def _resource_event(stack: Any, logical_id: str, physical_id: str, rtype: str, status: str,
                    reason: str | None = None) -> None:
    from moto.cloudformation import models

    if stack is not None:
        stack.events.append(models.Event(stack.stack_id, stack.name, logical_id, physical_id, rtype, status, reason,
                                         None))


def _roll_back(stack: Any, change_set: Any, failure: ResourceFailed, previous_template: str,
               previous_parameters: dict[str, Any], *, created: bool | None = None,
               cancelled: Sequence[tuple[str, str, str]] = ()) -> None:
    """CloudFormation's rollback after `failure`: the failed resource's event, then each `cancelled` resource's
    (logical id, physical id, type), then the stack's rollback. `created`: the failed resource was being created
    (default: the change set creates the stack)."""
    creating = change_set.change_set_type == "CREATE"
    created = creating if created is None else created
    _resource_event(stack, failure.logical_id, "", failure.resource_type,
                    "CREATE_FAILED" if created else "UPDATE_FAILED", failure.reason)
    for logical_id, physical_id, rtype in cancelled:
        _resource_event(stack, logical_id, physical_id, rtype, "CREATE_FAILED", "Resource creation cancelled")
    change_set.execution_status = "EXECUTE_FAILED"
    verb = "create" if created else "update"
    if creating:
        stack.status = "ROLLBACK_IN_PROGRESS"
        stack._add_stack_event("ROLLBACK_IN_PROGRESS",
                               f"The following resource(s) failed to create: [{failure.logical_id}]. "
                               "Rollback requested by user.")
        try:
            stack.resource_map.delete()
        except Exception:  # noqa: BLE001, S110 - best effort, like a rollback that leaves orphans
            pass
        stack.status = "ROLLBACK_COMPLETE"
        stack._add_stack_event("ROLLBACK_COMPLETE")
    else:
        stack.status = "UPDATE_ROLLBACK_IN_PROGRESS"
        stack._add_stack_event("UPDATE_ROLLBACK_IN_PROGRESS",
                               f"The following resource(s) failed to {verb}: [{failure.logical_id}].")
        try:
            stack.resource_map.update(stack.parse_template(previous_template), previous_parameters)
        except Exception:  # noqa: BLE001, S110
            pass
        stack.template = previous_template
        stack._parse_template()
        stack.output_map = stack._create_output_map()
        stack.status = "UPDATE_ROLLBACK_COMPLETE"
        stack._add_stack_event("UPDATE_ROLLBACK_COMPLETE")


def install_fidelity_fixes() -> None:
    from moto.cloudformation import models, parsing

    def reporting(original: Any, done_status: str) -> Any:
        """Wrap moto's create/update of one resource: a failure names the resource, success adds its event (a
        resource created with a CreationPolicy's ResourceSignal waits for its signals instead: fix 8)."""
        def wrapper(logical_id: str, resource_json: dict[str, Any], resources_map: Any, account_id: str,
                    region_name: str) -> Any:
            try:
                resource = original(logical_id, resource_json, resources_map, account_id, region_name)
            except ResourceFailed:
                raise
            except Exception as err:  # noqa: BLE001 - any emulator error is this resource's failure
                raise ResourceFailed(logical_id, resource_json.get("Type", "?"), _reason(err)) from err
            if resource is not None:
                physical_id = str(getattr(resource, "physical_resource_id", ""))
                stack = _stack_of(resources_map)
                if done_status == "CREATE_COMPLETE" and _awaits_signals(logical_id, resource_json, physical_id):
                    _resource_event(stack, logical_id, physical_id, resource_json["Type"], "CREATE_IN_PROGRESS",
                                    "Resource creation Initiated")
                else:
                    _resource_event(stack, logical_id, physical_id, resource_json["Type"], done_status)
            return resource
        return wrapper

    parsing.parse_and_create_resource = reporting(parsing.parse_and_create_resource, "CREATE_COMPLETE")
    parsing.parse_and_update_resource = reporting(parsing.parse_and_update_resource, "UPDATE_COMPLETE")

    original_update = parsing.ResourceMap.update

    def update(self: Any, template: dict[str, Any], parameters: dict[str, Any] | None = None) -> None:
        # moto deletes a removed resource but keeps it among the parsed ones: a later update adding it back (a
        # rolled-back update executed again) found the deleted one and created nothing.
        removed = self.build_resource_diff(template, parameters)["Remove"]
        original_update(self, template, parameters)
        for logical_id in removed:
            self._parsed_resources.pop(logical_id, None)

    setattr(parsing.ResourceMap, "update", update)

    original_execute = models.CloudFormationBackend.execute_change_set

    def execute_change_set(self: Any, change_set_name: str, stack_name: str | None = None) -> None:
        change_set = self.change_sets.get(change_set_name) or next(
            (cs for cs in self.change_sets.values() if cs.change_set_name == change_set_name
             and (stack_name is None or stack_name in (cs.stack_name, cs.stack_id))), None)
        if change_set is None:
            return original_execute(self, change_set_name, stack_name)
        stack = self.stacks[change_set.stack_id]
        previous_template, previous_parameters = stack.template, dict(stack.resource_map.input_parameters)
        waits: list[SignalWait] = []
        _EXECUTING.waits = waits
        try:
            original_execute(self, change_set_name, stack_name)
        except Exception as err:  # noqa: BLE001
            _EXECUTING.waits = None
            traceback.print_exc()  # into the emulator log, for whoever debugs the emulator itself
            failure = err if isinstance(err, ResourceFailed) else ResourceFailed(stack.name, "AWS::CloudFormation::Stack", _reason(err))
            _roll_back(stack, change_set, failure, previous_template, previous_parameters)
            return None
        finally:
            _EXECUTING.waits = None
        stack._parse_template()  # a CREATE change set's stack was made with an empty template
        if waits:  # CloudFormation is still waiting for signals: moto's *_COMPLETE is not yet true
            _hold(stack, change_set, waits, previous_template, previous_parameters)
            return None
        stack.output_map = stack._create_output_map()
        stack.description = stack.template_dict.get("Description")
        return None

    setattr(models.CloudFormationBackend, "execute_change_set", execute_change_set)


def install_delete_fixes() -> None:
    from moto.cloudformation import models
    from moto.ec2.models.instances import Instance

    original_delete = models.CloudFormationBackend.delete_stack

    def delete_stack(self: Any, name_or_stack_id: str) -> None:
        stack = self.stacks.get(name_or_stack_id) or next(
            (st for st in self.stacks.values() if st.name == name_or_stack_id), None)
        if stack is not None:
            forget_waits(stack.stack_id)  # a stack deleted while it waits for signals (CloudFormation cancels them)
        try:
            original_delete(self, name_or_stack_id)
        except Exception as err:  # noqa: BLE001
            traceback.print_exc()
            if stack is None:
                raise
            left = sorted(lid for lid, res in stack.resource_map._parsed_resources.items()
                          if not lid.startswith("AWS::") and res is not None and not isinstance(res, str))
            self.stacks[stack.stack_id] = stack
            self.deleted_stacks.pop(stack.stack_id, None)
            stack.events.append(models.Event(stack.stack_id, stack.name, ", ".join(left) or stack.name, "",
                                             "AWS::CloudFormation::Stack", "DELETE_FAILED",
                                             f"resources not deleted: {', '.join(left)}: {_reason(err)}", None))
            stack.status = "DELETE_FAILED"
            stack._add_stack_event("DELETE_FAILED", _reason(err))

    setattr(models.CloudFormationBackend, "delete_stack", delete_stack)

    original_prep_nics = Instance.prep_nics

    def prep_nics(self: Any, nic_spec: list[dict[str, Any]], *args: Any, **kwargs: Any) -> None:
        keep = any(str(nic.get("DeleteOnTermination", "")).lower() == "false" for nic in nic_spec)
        before = set(self.ec2_backend.enis)
        original_prep_nics(self, nic_spec, *args, **kwargs)
        for nic in self.nics.values():
            if nic.id not in before and not keep:  # made at launch: goes with the instance, as on EC2
                nic.delete_on_termination = True

    setattr(Instance, "prep_nics", prep_nics)

    from moto.ec2.models import ec2_backends
    from moto.ec2.models.vpcs import VPC

    original_vpc_delete = VPC.delete_from_cloudformation_json.__func__  # type: ignore[attr-defined]

    def delete_vpc(cls: Any, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str) -> None:
        # moto's CloudFormation never deletes these (their delete is a no-op), yet they block the
        # VPC's deletion. CloudFormation would have deleted them before the VPC: do it here.
        ec2 = ec2_backends[account_id][region_name]
        subnets = {sub.id for sub in ec2.describe_subnets() if sub.vpc_id == resource_name}
        if subnets:  # not yet: moto deletes a stack's resources in passes, the subnets go first
            original_vpc_delete(cls, resource_name, cloudformation_json, account_id, region_name)
        for nat in list(ec2.nat_gateways.values()):
            if nat.subnet_id in subnets or nat.state != "deleted" and nat._eni.vpc_id == resource_name:
                nat.state = "deleted"
                ec2.enis.pop(nat._eni.id, None)
        endpoints = [vpce.id for vpce in ec2.vpc_end_points.values() if vpce.vpc_id == resource_name]
        if endpoints:
            ec2.delete_vpc_endpoints(endpoints)
        for table in list(ec2.route_tables.values()):
            if table.vpc_id == resource_name and not table.main_association_id:
                table.associations.clear()
                ec2.route_tables.pop(table.id, None)
        for igw in list(ec2.internet_gateways.values()):
            if igw.vpc is not None and igw.vpc.id == resource_name:
                igw.vpc = None
                ec2.internet_gateways.pop(igw.id, None)
        try:
            original_vpc_delete(cls, resource_name, cloudformation_json, account_id, region_name)
        except Exception:
            traceback.print_exc()
            raise

    setattr(VPC, "delete_from_cloudformation_json", classmethod(delete_vpc))


def install_launch_fixes() -> None:
    from moto.ec2.models.instances import Instance, InstanceBackend

    original_run = InstanceBackend.run_instances

    def run_instances(self: Any, image_id: str, count: int, user_data: Any, security_group_names: list[str],
                      **kwargs: Any) -> Any:
        template_arg = kwargs.get("launch_template")
        if template_arg:
            version = self._get_template_from_args(template_arg)
            data = version.data
            if user_data is None:
                user_data = version.user_data
            if not kwargs.get("key_name") and data.get("KeyName"):
                kwargs["key_name"] = data["KeyName"]
            primary = next((nic for nic in data.get("NetworkInterfaces") or []
                            if int(nic.get("DeviceIndex", 0)) == 0 and int(nic.get("NetworkCardIndex", 0)) == 0), None)
            if not kwargs.get("subnet_id") and primary and primary.get("SubnetId"):
                kwargs["subnet_id"] = primary["SubnetId"]
        return original_run(self, image_id, count, user_data, security_group_names, **kwargs)

    setattr(InstanceBackend, "run_instances", run_instances)

    original_create = Instance.create_from_cloudformation_json.__func__  # type: ignore[attr-defined]

    def create_instance(cls: Any, /, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str,
                        **kwargs: Any) -> Any:
        properties = cloudformation_json["Properties"]
        template = properties.get("LaunchTemplate")
        if not template:
            return original_create(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
        from moto.ec2.models import ec2_backends

        ec2 = ec2_backends[account_id][region_name]
        template_arg = {k: str(v) for k, v in template.items() if k in ("LaunchTemplateId", "LaunchTemplateName", "Version")}
        version = ec2._get_template_from_args(template_arg)
        instance_type = properties.get("InstanceType") or version.instance_type
        reservation = ec2.run_instances(
            image_id=properties.get("ImageId") or version.image_id, user_data=properties.get("UserData"), count=1,
            security_group_names=[], instance_type=instance_type or "m1.small",
            is_instance_type_default=not instance_type, subnet_id=properties.get("SubnetId"),
            key_name=properties.get("KeyName"), launch_template=template_arg)
        instance = reservation.instances[0]
        for tag in properties.get("Tags", []):
            instance.add_tag(tag["Key"], tag["Value"])
        return instance

    setattr(Instance, "create_from_cloudformation_json", classmethod(create_instance))


def install_output_fixes() -> None:
    from moto.cloudformation import parsing

    from fmcluster.stacks.references import referenced

    original_parse_output = parsing.parse_output

    def parse_output(output_logical_id: str, output_json: Any, resources_map: Any) -> Any:
        skipped = {name for name in referenced(output_json.get("Value"))
                   if name in resources_map._resource_json_map
                   and not hasattr(resources_map._parsed_resources.get(name), "physical_resource_id")}
        if skipped:
            return None  # its resource was not created by the emulator
        return original_parse_output(output_logical_id, output_json, resources_map)

    parsing.parse_output = parse_output


def install_scaling_fixes() -> None:
    from moto.autoscaling.models import FakeAutoScalingGroup, autoscaling_backends

    original_update = FakeAutoScalingGroup.update_from_cloudformation_json.__func__  # type: ignore[attr-defined]

    def number(value: Any) -> int | None:
        return None if value in (None, "") else int(value)

    def update_group(cls: Any, /, original_resource: Any, new_resource_name: str, cloudformation_json: Any,
                     account_id: str, region_name: str) -> Any:
        properties = cloudformation_json["Properties"]
        renamed = properties.get("AutoScalingGroupName") not in (None, original_resource.name)
        if renamed:  # the one property whose change replaces the group
            return original_update(cls, original_resource, new_resource_name, cloudformation_json, account_id,
                                   region_name)
        backend = autoscaling_backends[account_id][region_name]
        return backend.update_auto_scaling_group(
            name=original_resource.name, availability_zones=properties.get("AvailabilityZones", []),
            desired_capacity=number(properties.get("DesiredCapacity")), max_size=number(properties.get("MaxSize")),
            min_size=number(properties.get("MinSize")), launch_config_name=properties.get("LaunchConfigurationName"),
            launch_template=properties.get("LaunchTemplate", {}),
            vpc_zone_identifier=",".join(properties.get("VPCZoneIdentifier", [])) or "",
            health_check_period=properties.get("HealthCheckGracePeriod"),
            health_check_type=properties.get("HealthCheckType"))

    setattr(FakeAutoScalingGroup, "update_from_cloudformation_json", classmethod(update_group))


# --- CloudFormation's signals (fix 8) ----------------------------------------------------------------------------

#: The resource types whose CreationPolicy's ResourceSignal the emulator honours (moto creates no WaitCondition).
SIGNALLED_TYPES = frozenset({"AWS::AutoScaling::AutoScalingGroup", "AWS::EC2::Instance"})
#: A ResourceSignal's defaults (CreationPolicy attribute reference; its Timeout: fmcluster.stacks.cfn.signal_timeout_s).
DEFAULT_SIGNAL_COUNT, DEFAULT_SIGNAL_TIMEOUT = 1, "PT5M"
#: How often the timer looks for signal timeouts (no request needs to arrive for one to fire).
TIMER_PERIOD_S = 0.2

#: Serializes every CloudFormation, EC2 and Auto Scaling request with the signal timer: moto's server runs each
#: request in a thread of its own and locks nothing but its backend lookup, and a timeout's rollback deletes
#: groups and terminates instances that a concurrent Describe* would iterate.
_LOCK = threading.RLock()
#: The signal waits the change set being executed (on this thread) registers as its resources are created.
_EXECUTING = threading.local()


def required_successes(count: int, percent: float | None) -> int:
    """SUCCESS signals a resource needs: `count`, or for an Auto Scaling group the MinSuccessfulInstancesPercent of
    its `count` instances, the percentage rounded to the nearest tenth and the instances up (CloudFormation's own
    example: 50 % of five instances needs three)."""
    if percent is None:
        return count
    return math.ceil(count * round(percent, 1) / 100 - 1e-9)


@dataclass
class SignalWait:
    """One resource created with a CreationPolicy ResourceSignal, waiting for its signals."""

    logical_id: str
    resource_type: str
    physical_id: str
    count: int
    percent: float | None  # MinSuccessfulInstancesPercent (Auto Scaling groups: default 100), None for others
    deadline: float  # time.monotonic() when its Timeout runs out
    signals: dict[str, str] = field(default_factory=dict)  # UniqueId → SUCCESS | FAILURE (its first signal)
    state: str = "waiting"  # waiting | complete | failed

    @staticmethod
    def of(logical_id: str, resource_json: dict[str, Any], physical_id: str) -> SignalWait:
        from fmcluster.stacks.cfn import signal_timeout_s

        policy = resource_json.get("CreationPolicy") or {}
        signal = policy.get("ResourceSignal") or {}
        rtype = resource_json["Type"]
        try:
            count = int(signal.get("Count", DEFAULT_SIGNAL_COUNT))
            timeout = signal_timeout_s(str(signal.get("Timeout", DEFAULT_SIGNAL_TIMEOUT)))
            percent: float | None = None
            if rtype == "AWS::AutoScaling::AutoScalingGroup":
                percent = float((policy.get("AutoScalingCreationPolicy") or {}).get("MinSuccessfulInstancesPercent",
                                                                                    100))
                if not 0 <= percent <= 100:
                    raise ValueError(f"MinSuccessfulInstancesPercent {percent:g} is not between 0 and 100")
        except (TypeError, ValueError) as err:
            raise ResourceFailed(logical_id, rtype, f"Invalid CreationPolicy: {err}") from err
        return SignalWait(logical_id, rtype, physical_id, count, percent, time.monotonic() + timeout)

    @property
    def successes(self) -> int:
        return sum(1 for status in self.signals.values() if status == "SUCCESS")

    @property
    def failures(self) -> int:
        return sum(1 for status in self.signals.values() if status == "FAILURE")

    @property
    def required(self) -> int:
        return required_successes(self.count, self.percent)

    def verdict(self, now: float) -> tuple[str, str]:
        """("complete" | "failed" | "waiting", CloudFormation's status reason for a failure)."""
        if self.percent is None:
            failed = next((uid for uid, status in self.signals.items() if status == "FAILURE"), None)
            if failed is not None:  # "A failure signal causes CloudFormation to immediately fail" (SignalResource)
                return "failed", f"Received FAILURE signal with UniqueId {failed}"
        elif self.count - self.failures < self.required:
            return "failed", (f"Received {self.failures} FAILURE signal(s) out of {self.count}. Unable to satisfy "
                              f"{round(self.percent, 1):g}% MinSuccessfulInstancesPercent requirement")
        if self.successes >= self.required and (self.successes + self.failures >= self.count or now >= self.deadline):
            return "complete", ""  # every instance answered (or the rest are deemed not created at the timeout)
        if now >= self.deadline:
            return "failed", (f"Failed to receive {self.required - self.successes} resource signal(s) within the "
                              "specified duration")
        return "waiting", ""


@dataclass
class StackWait:
    """A stack whose executed change set created resources that wait for signals: CREATE_IN_PROGRESS or
    UPDATE_IN_PROGRESS until every one completes, rolled back as soon as one fails."""

    stack: Any
    change_set: Any
    waits: list[SignalWait]
    previous_template: str
    previous_parameters: dict[str, Any]


#: Stack id → what it waits for.
_WAITING: dict[str, StackWait] = {}


def _awaits_signals(logical_id: str, resource_json: dict[str, Any], physical_id: str) -> bool:
    """Called as a change set creates a resource: one with a ResourceSignal starts waiting for its signals."""
    waits: list[SignalWait] | None = getattr(_EXECUTING, "waits", None)
    policy = resource_json.get("CreationPolicy")
    if waits is None or resource_json.get("Type") not in SIGNALLED_TYPES or not isinstance(policy, dict) \
            or "ResourceSignal" not in policy:
        return False
    waits.append(SignalWait.of(logical_id, resource_json, physical_id))
    return True


def _hold(stack: Any, change_set: Any, waits: list[SignalWait], previous_template: str,
          previous_parameters: dict[str, Any]) -> None:
    """moto ended the change set's execution with the stack *_COMPLETE: take that back while signals are awaited."""
    kind = change_set.change_set_type
    last = stack.events[-1] if stack.events else None
    if last is not None and last.logical_resource_id == stack.name and last.resource_status == f"{kind}_COMPLETE":
        stack.events.pop()
    stack.status = f"{kind}_IN_PROGRESS"
    change_set.execution_status = "EXECUTE_IN_PROGRESS"
    _WAITING[stack.stack_id] = StackWait(stack, change_set, waits, previous_template, previous_parameters)
    _evaluate(_WAITING[stack.stack_id], time.monotonic())  # a Count of 0 needs nothing


def _evaluate(held: StackWait, now: float) -> None:
    """Complete each resource that has its signals; fail (and roll back) at the first that cannot; once none waits,
    complete the stack."""
    stack = held.stack
    for wait in held.waits:
        if wait.state != "waiting":
            continue
        verdict, reason = wait.verdict(now)
        if verdict == "complete":
            wait.state = "complete"
            _resource_event(stack, wait.logical_id, wait.physical_id, wait.resource_type, "CREATE_COMPLETE")
        elif verdict == "failed":
            wait.state = "failed"
            _WAITING.pop(stack.stack_id, None)
            cancelled = [(w.logical_id, w.physical_id, w.resource_type) for w in held.waits if w.state == "waiting"]
            for other in held.waits:
                other.state = "failed" if other.state == "waiting" else other.state
            _roll_back(stack, held.change_set, ResourceFailed(wait.logical_id, wait.resource_type, reason),
                       held.previous_template, held.previous_parameters, created=True, cancelled=cancelled)
            return
    if all(w.state == "complete" for w in held.waits):
        _WAITING.pop(stack.stack_id, None)
        kind = held.change_set.change_set_type
        stack.output_map = stack._create_output_map()
        stack.description = stack.template_dict.get("Description")
        stack.status = f"{kind}_COMPLETE"
        stack._add_stack_event(f"{kind}_COMPLETE")
        held.change_set.execution_status = "EXECUTE_COMPLETE"


def _timer() -> None:
    """Signal timeouts fire with nobody calling in, as on AWS: a deploy that stopped polling still finds the stack
    rolled back when it looks again."""
    while True:
        time.sleep(TIMER_PERIOD_S)
        with _LOCK:
            now = time.monotonic()
            for held in list(_WAITING.values()):
                try:
                    _evaluate(held, now)
                except Exception:  # noqa: BLE001 - the timer must outlive one stack's broken rollback
                    traceback.print_exc()


def forget_waits(stack_id: str) -> None:
    """A stack deleted while it waits: nothing waits for its signals any more."""
    with _LOCK:
        _WAITING.pop(stack_id, None)


def _resource_state(stack: Any, logical_id: str) -> str:
    """A resource's status as CloudFormation reports it (the stack's own for moto's resources)."""
    held = _WAITING.get(stack.stack_id)
    wait = next((w for w in held.waits if w.logical_id == logical_id), None) if held else None
    if wait is not None:
        return "CREATE_IN_PROGRESS" if wait.state == "waiting" else "CREATE_COMPLETE"
    status = str(stack.status)
    return status.replace("_IN_PROGRESS", "_COMPLETE") if held is not None else status


def install_signal_waits() -> None:
    """SignalResource, CreationPolicy waits and their timer (fix 8)."""
    from moto.autoscaling.responses import AutoScalingResponse
    from moto.cloudformation import models
    from moto.cloudformation import responses as cfn_responses
    from moto.cloudformation.exceptions import ValidationError
    from moto.cloudformation.responses import CloudFormationResponse
    from moto.core.responses import EmptyResult
    from moto.ec2.responses import EC2Response

    def locked(original: Any) -> Any:
        def call_action(self: Any) -> Any:
            with _LOCK:
                return original(self)
        return call_action

    for response in (CloudFormationResponse, EC2Response, AutoScalingResponse):
        setattr(response, "call_action", locked(response.call_action))

    def signal_resource(self: Any) -> Any:
        stack = self.cloudformation_backend.get_stack(self._get_param("StackName"))
        logical_id, unique_id = self._get_param("LogicalResourceId"), self._get_param("UniqueId")
        status = self._get_param("Status")
        resource = stack.resource_map._resource_json_map.get(logical_id)
        if resource is None:
            raise ValidationError(logical_id, message=f"Resource {logical_id} does not exist for stack {stack.name}")
        if status not in ("SUCCESS", "FAILURE"):
            raise ValidationError(logical_id, message=f"Status {status!r} is not SUCCESS or FAILURE")
        held = _WAITING.get(stack.stack_id)
        wait = next((w for w in held.waits if w.logical_id == logical_id and w.state == "waiting"), None) \
            if held else None
        if held is None or wait is None:
            state = _resource_state(stack, logical_id)
            raise ValidationError(logical_id, message=f"Resource {logical_id} is in {state} state and cannot be "
                                                      "signaled")
        if unique_id not in wait.signals:  # each UniqueId counts once: its first signal
            wait.signals[unique_id] = status
            stack.events.append(models.Event(stack.stack_id, stack.name, logical_id, wait.physical_id,
                                             resource.get("Type", ""), "CREATE_IN_PROGRESS",
                                             f"Received {status} signal with UniqueId {unique_id}", None))
            _evaluate(held, time.monotonic())
        return EmptyResult()

    setattr(CloudFormationResponse, "signal_resource", signal_resource)

    original_list = CloudFormationResponse.list_stack_resources

    def list_stack_resources(self: Any) -> Any:
        listed: Any = original_list(self)
        stack = self.cloudformation_backend.get_stack(self._get_param("StackName"))
        for summary in listed.result["StackResourceSummaries"]:  # moto says CREATE_COMPLETE for every one
            summary["ResourceStatus"] = _resource_state(stack, summary["LogicalResourceId"]) \
                if stack.stack_id in _WAITING else summary["ResourceStatus"]
        return listed

    setattr(CloudFormationResponse, "list_stack_resources", list_stack_resources)

    original_dto = cfn_responses.StackResourceDTO.__init__

    def resource_dto(self: Any, stack: Any, resource: Any) -> None:
        original_dto(self, stack, resource)
        if stack.stack_id in _WAITING:
            self.resource_status = _resource_state(stack, str(self.logical_resource_id))

    setattr(cfn_responses.StackResourceDTO, "__init__", resource_dto)
    threading.Thread(target=_timer, name="signal-timeouts", daemon=True).start()


#: What the stand-in's Service Quotas answer for an EC2 quota nobody set (RequestServiceQuotaIncrease sets one).
EMULATOR_EC2_QUOTA = 100000.0


def install_capacity_stand_ins() -> None:
    """EC2 capacity reservations and Capacity Blocks, and Service Quotas for EC2 (fix 9)."""
    import json
    import uuid
    from datetime import datetime, timedelta, timezone

    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses import EC2Response
    from moto.servicequotas.exceptions import NoSuchResource
    from moto.servicequotas.models import ServiceQuotasBackend
    from moto.servicequotas.responses import ServiceQuotasResponse

    reservations: dict[str, dict[str, Any]] = {}  # id → the reservation as DescribeCapacityReservations shows it
    offerings: dict[str, dict[str, Any]] = {}
    quotas: dict[tuple[str, str, str], float] = {}  # (region, service, quota code) → value

    def now() -> datetime:
        return datetime.now(timezone.utc)

    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:17]}"

    def when(value: Any) -> datetime | None:
        if not value:
            return None
        parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)

    def shown(item: dict[str, Any]) -> dict[str, Any]:
        state = item["State"]
        if state not in ("cancelled",):
            start, end = item.get("StartDate"), item.get("EndDate")
            state = ("expired" if end is not None and end <= now() else
                     "scheduled" if start is not None and start > now() else "active")
        return {**item, "State": state}

    def reservation(self: Any, instance_type: str, zone: str, count: int, kind: str, start: datetime,
                    end: datetime | None, platform: str) -> dict[str, Any]:
        item = {"CapacityReservationId": new_id("cr"), "OwnerId": self.current_account,
                "InstanceType": instance_type, "InstancePlatform": platform, "AvailabilityZone": zone,
                "Tenancy": "default", "TotalInstanceCount": count, "AvailableInstanceCount": count,
                "EbsOptimized": True, "EphemeralStorage": False, "State": "active", "StartDate": start,
                "EndDateType": "limited" if end else "unlimited", "InstanceMatchCriteria": "targeted",
                "CreateDate": now(), "ReservationType": kind, "Tags": []}
        if end is not None:
            item["EndDate"] = end
        item["CapacityReservationArn"] = (f"arn:aws:ec2:{self.region}:{self.current_account}:capacity-reservation/"
                                          f"{item['CapacityReservationId']}")
        reservations[item["CapacityReservationId"]] = item
        return item

    def create_capacity_reservation(self: Any) -> Any:
        self.error_on_dryrun()
        item = reservation(self, self._get_param("InstanceType"), self._get_param("AvailabilityZone"),
                           int(self._get_param("InstanceCount")), "default", now(), when(self._get_param("EndDate")),
                           self._get_param("InstancePlatform") or "Linux/UNIX")
        return ActionResult({"CapacityReservation": shown(item)})

    def describe_capacity_reservations(self: Any) -> Any:
        wanted = self._get_param("CapacityReservationIds", [])
        for rid in wanted:
            if rid not in reservations:
                raise EC2ClientError("InvalidCapacityReservationId.NotFound",
                                     f"The capacity reservation ID '{rid}' does not exist")
        found = [shown(r) for r in reservations.values()
                 if (not wanted or r["CapacityReservationId"] in wanted) and r["AvailabilityZone"].startswith(self.region)]
        return ActionResult({"CapacityReservations": found})

    def cancel_capacity_reservation(self: Any) -> Any:
        rid = self._get_param("CapacityReservationId")
        if rid not in reservations:
            raise EC2ClientError("InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{rid}' does not exist")
        reservations[rid]["State"] = "cancelled"
        return ActionResult({"Return": True})

    def describe_capacity_block_offerings(self: Any) -> Any:
        hours = int(self._get_param("CapacityDurationHours"))
        start = when(self._get_param("StartDateRange")) or now()
        offer = {"CapacityBlockOfferingId": new_id("cb"), "InstanceType": self._get_param("InstanceType"),
                 "AvailabilityZone": f"{self.region}a", "InstanceCount": int(self._get_param("InstanceCount")),
                 "StartDate": start, "EndDate": start + timedelta(hours=hours), "CapacityBlockDurationHours": hours,
                 "UpfrontFee": "0.00", "CurrencyCode": "USD", "Tenancy": "default"}
        offerings[offer["CapacityBlockOfferingId"]] = offer
        return ActionResult({"CapacityBlockOfferings": [offer]})

    def purchase_capacity_block(self: Any) -> Any:
        offer = offerings.get(self._get_param("CapacityBlockOfferingId"))
        if offer is None:
            raise EC2ClientError("InvalidParameterValue", "unknown Capacity Block offering")
        item = reservation(self, offer["InstanceType"], offer["AvailabilityZone"], offer["InstanceCount"],
                           "capacity-block", offer["StartDate"], offer["EndDate"],
                           self._get_param("InstancePlatform") or "Linux/UNIX")
        return ActionResult({"CapacityReservation": shown(item)})

    for name, fn in (("create_capacity_reservation", create_capacity_reservation),
                     ("describe_capacity_reservations", describe_capacity_reservations),
                     ("cancel_capacity_reservation", cancel_capacity_reservation),
                     ("describe_capacity_block_offerings", describe_capacity_block_offerings),
                     ("purchase_capacity_block", purchase_capacity_block)):
        setattr(EC2Response, name, fn)

    moto_get_quota = ServiceQuotasBackend.get_service_quota

    def quota(region: str, service: str, code: str) -> dict[str, Any]:
        value = quotas.get((region, service, code), EMULATOR_EC2_QUOTA)
        return {"ServiceCode": service, "QuotaCode": code, "QuotaName": f"{code} (fmcluster emulator stand-in)",
                "Value": value, "Unit": "None", "Adjustable": True, "GlobalQuota": False,
                "QuotaArn": f"arn:aws:servicequotas:{region}::{service}/{code}"}

    def get_service_quota(self: Any, service_code: str, quota_code: str) -> dict[str, Any]:
        if service_code == "ec2":
            return quota(self.region_name, service_code, quota_code)
        return dict(moto_get_quota(self, service_code, quota_code))

    def request_service_quota_increase(self: Any) -> str:
        params = json.loads(self.body)
        service, code = str(params.get("ServiceCode")), str(params.get("QuotaCode"))
        if service != "ec2":
            raise NoSuchResource
        quotas[(self.region, service, code)] = float(params["DesiredValue"])
        return json.dumps({"RequestedQuota": {"Id": new_id("req"), "ServiceCode": service, "QuotaCode": code,
                                              "DesiredValue": float(params["DesiredValue"]), "Status": "APPROVED"}})

    setattr(ServiceQuotasBackend, "get_service_quota", get_service_quota)
    setattr(ServiceQuotasResponse, "request_service_quota_increase", request_service_quota_increase)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    install_fidelity_fixes()
    install_delete_fixes()
    install_launch_fixes()
    install_output_fixes()
    install_scaling_fixes()
    install_signal_waits()
    install_capacity_stand_ins()
    from fmcluster.providers.local.emulator_hyperpod import install_hyperpod_stand_in

    install_hyperpod_stand_in()
    from moto.server import main as moto_main

    moto_main(["-H", args.host, "-p", str(args.port)])


if __name__ == "__main__":
    main()
