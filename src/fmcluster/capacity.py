"""The capacity pre-flight: before any stack changes, does the account have what the tenant asks for?

`invoke plan` and `invoke deploy` ask EC2 and Service Quotas (never assume):

- each queue's capacity reservation (`queues[].capacity_reservation_id`): it exists in the tenant's region, is
  of the kind the tenant says (`capacity_reservation_type`: an On-Demand Capacity Reservation or a Capacity
  Block for ML), is `active`, holds the queue's instance type in the tenant's zone for Linux/UNIX with default
  tenancy, has room for `count` instances (beside the tenant's own instances already in it), and does not end
  within END_MARGIN (a Capacity Block's instances are terminated before its end);
- the Service Quotas of the instance families whose instances are not in a reservation (controller, login,
  queues without one): the running On-Demand vCPU quota must hold their vCPUs (an On-Demand Capacity
  Reservation took its quota when it was made; a Capacity Block's instances do not count against it).

A refusal names the tenant file, line and key, and the fix (`validation.Problem`); the deploy stops before its
first change and plan before its change sets. Fail closed: an answer that cannot be read is a refusal too.
On provider `local` (and in tests) the calls go to the AWS emulator, where moto has neither capacity
reservations nor EC2 quotas: fmcluster's emulator stands them in (fmcluster.providers.local.emulator_server, fix 9),
and the pre-flight's lines say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from fmcluster.catalog import InstanceType
from fmcluster.model import Queue, Tenant
from fmcluster.validation import Problem, dotted
from fmcluster.yamlpos import KeyPath, load

#: Before a reservation's end, its nodes must already be gone: EC2 starts terminating a Capacity Block's
#: instances 30 minutes before its end time; Slurm needs time to drain before that (the scheduled scale-in of
#: the slurm-ec2 cluster stack acts at end − END_MARGIN). A reservation ending sooner than this is refused.
END_MARGIN = timedelta(hours=1)
#: Running On-Demand instance quotas of EC2 (Service Quotas, service code ec2), counted in vCPUs, by the
#: letters an instance family starts with; every other family is "Standard (A, C, D, H, I, M, R, T, Z)".
QUOTA_CODES: tuple[tuple[str, str, str], ...] = (
    ("trn", "L-2C3B7624", "Running On-Demand Trn instances"),
    ("inf", "L-1945791B", "Running On-Demand Inf instances"),
    ("dl", "L-6E869C2A", "Running On-Demand DL instances"),
    ("vt", "L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("p", "L-417A185B", "Running On-Demand P instances"),
    ("g", "L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("x", "L-7212CCBC", "Running On-Demand X instances"),
    ("f", "L-74FC7D96", "Running On-Demand F instances"),
)
STANDARD_QUOTA = ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances")
#: The nodes run Ubuntu (Linux/UNIX) with default tenancy: a reservation for anything else cannot take them.
PLATFORM, TENANCY = "Linux/UNIX", "default"
KIND_WORDS = {"default": "an On-Demand Capacity Reservation", "capacity-block": "a Capacity Block for ML"}


def quota_of(instance: InstanceType) -> tuple[str, str]:
    """(quota code, quota name) of the running On-Demand vCPU quota an instance type counts against."""
    for prefix, code, name in QUOTA_CODES:
        if instance.family.startswith(prefix):
            return code, name
    return STANDARD_QUOTA


@dataclass
class Preflight:
    """What the pre-flight found: refusals (each with its fix) and a line per thing it checked."""

    refusals: list[Problem] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    #: Capacity Block queue → when the slurm-ec2 cluster stack scales it in (its EndDate − END_MARGIN, UTC).
    scale_in: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.refusals


class _Check:
    def __init__(self, tenant: Tenant, now: datetime) -> None:
        self.tenant, self.now = tenant, now
        self.result = Preflight()
        self.loaded = load(tenant.spec_path)

    def refuse(self, key: KeyPath, message: str, fix: str) -> None:
        full = ("tenant", *key)
        self.result.refusals.append(Problem(self.tenant.spec_path, self.loaded.line_of(full), dotted(full), message, fix))

    def reservation(self, ec2: Any, index: int, queue: Queue, own_in_it: int) -> None:
        rid, t = queue.capacity_reservation_id, self.tenant
        assert rid is not None
        key: KeyPath = ("queues", index, "capacity_reservation_id")
        try:
            found = ec2.describe_capacity_reservations(CapacityReservationIds=[rid])["CapacityReservations"]
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            if code in ("InvalidCapacityReservationId.NotFound", "InvalidCapacityReservationId.Malformed"):
                self.refuse(key, f"EC2 has no capacity reservation {rid} in {t.region} for this account",
                            f"name a reservation of this account in {t.region} (aws ec2 describe-capacity-reservations "
                            f"--region {t.region}), or remove capacity_reservation_id to launch On-Demand")
            else:
                self.refuse(key, f"EC2 did not describe {rid}: {code or err}",
                            "allow ec2:DescribeCapacityReservations to the deploying identity and run again")
            return
        if len(found) != 1:
            self.refuse(key, f"EC2 answered {len(found)} reservations for {rid}", "check the id")
            return
        cr: dict[str, Any] = found[0]
        kind = str(cr.get("ReservationType") or "default")
        state, end = str(cr.get("State", "")), cr.get("EndDate")
        words = f"{KIND_WORDS.get(kind, kind)} {rid}"
        self.result.lines.append(
            f"queue {queue.name}: {words}, {state}, {cr.get('TotalInstanceCount')} × {cr.get('InstanceType')} in "
            f"{cr.get('AvailabilityZone')}, {cr.get('AvailableInstanceCount')} free"
            + (f", ends {end:%Y-%m-%d %H:%M %Z}" if isinstance(end, datetime) else ", no end date"))
        if kind != queue.capacity_reservation_type:
            self.refuse(("queues", index, "capacity_reservation_type"),
                        f"{rid} is {KIND_WORDS.get(kind, kind)}, the tenant says "
                        f"{KIND_WORDS.get(queue.capacity_reservation_type, queue.capacity_reservation_type)}",
                        f"set capacity_reservation_type: {kind} (a Capacity Block launches with market type "
                        "capacity-block, an On-Demand Capacity Reservation without)")
        if isinstance(end, datetime) and end <= self.now:
            self.refuse(key, f"{words} ended at {end:%Y-%m-%d %H:%M %Z} ({state})",
                        "name a current reservation (buy a new Capacity Block or create a reservation), or remove "
                        "capacity_reservation_id")
        elif state != "active":
            start = cr.get("StartDate")
            when = f" (starts {start:%Y-%m-%d %H:%M %Z})" if isinstance(start, datetime) and state == "scheduled" else ""
            self.refuse(key, f"{words} is {state}{when}; instances launch only into an active reservation",
                        "deploy once it is active, or name an active reservation")
        elif isinstance(end, datetime) and end - self.now < END_MARGIN:
            self.refuse(key, f"{words} ends at {end:%Y-%m-%d %H:%M %Z}, in less than {END_MARGIN}: its nodes "
                        "would be terminated while they boot", "extend it or name a later reservation")
        elif isinstance(end, datetime) and kind == "capacity-block":
            at = (end - END_MARGIN).astimezone(timezone.utc)
            self.result.scale_in[queue.name] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
            self.result.lines.append(f"queue {queue.name}: scaled in to 0 at {self.result.scale_in[queue.name]} "
                                     f"({END_MARGIN} before the block ends; slurm-ec2's scheduled action)")
        if cr.get("InstanceType") != queue.instance.name:
            self.refuse(("queues", index, "instance_type"),
                        f"{rid} holds {cr.get('InstanceType')}, queue {queue.name} asks for {queue.instance.name}",
                        f"set instance_type: {cr.get('InstanceType')}, or name a reservation of {queue.instance.name}")
        if cr.get("AvailabilityZone") != t.availability_zone:
            self.refuse(("availability_zone",),
                        f"{rid} (queue {queue.name}) is in {cr.get('AvailabilityZone')}, the cluster in {t.availability_zone}",
                        f"set availability_zone: {cr.get('AvailabilityZone')} (every node and file system moves "
                        "with it), or name a reservation in " + t.availability_zone)
        if cr.get("InstancePlatform", PLATFORM) != PLATFORM or cr.get("Tenancy", TENANCY) != TENANCY:
            self.refuse(key, f"{rid} is for {cr.get('InstancePlatform')} with {cr.get('Tenancy')} tenancy; the nodes "
                        f"run Ubuntu ({PLATFORM}) with {TENANCY} tenancy", f"name a {PLATFORM}, {TENANCY}-tenancy reservation")
        total, free = int(cr.get("TotalInstanceCount") or 0), int(cr.get("AvailableInstanceCount") or 0)
        if total < queue.count:
            self.refuse(("queues", index, "count"), f"{rid} holds {total} instances, queue {queue.name} asks for {queue.count}",
                        f"set count: {total} or less, or enlarge the reservation (On-Demand: aws ec2 "
                        f"modify-capacity-reservation --capacity-reservation-id {rid} --instance-count {queue.count})")
        elif free + own_in_it < queue.count:
            self.refuse(("queues", index, "count"),
                        f"{rid} has {free} free of {total} (this cluster runs {own_in_it} in it); queue {queue.name} "
                        f"needs {queue.count}", "free the reservation (other instances use it) or lower count")

    def quotas(self, quotas: Any) -> None:
        t = self.tenant
        needed: dict[tuple[str, str], int] = {}
        why: dict[tuple[str, str], list[str]] = {}
        groups: list[tuple[str, InstanceType, int]] = [("controller", t.controller, 1)]
        if t.login is not None:
            groups.append(("login", t.login, t.login_count))
        groups += [(f"queue {q.name}", q.instance, q.count) for q in t.queues if not q.capacity_reservation_id]
        for what, instance, count in groups:
            bucket = quota_of(instance)
            needed[bucket] = needed.get(bucket, 0) + instance.vcpus * count
            why.setdefault(bucket, []).append(f"{what} {count} × {instance.name}")
        for (code, name), vcpus in sorted(needed.items()):
            value = self.quota_value(quotas, code, name)
            if value is None:
                continue
            self.result.lines.append(f"quota {name} ({code}): {value:g} vCPUs; this cluster needs {vcpus} "
                                     f"({', '.join(why[(code, name)])}) outside reservations")
            if value < vcpus:
                self.refuse(("queues",), f"the account's '{name}' quota ({code}) in {t.region} is {value:g} vCPUs; "
                            f"{', '.join(why[(code, name)])} need {vcpus}",
                            f"request an increase (aws service-quotas request-service-quota-increase --service-code ec2 "
                            f"--quota-code {code} --desired-value {vcpus} --region {t.region}), or launch into a "
                            "capacity reservation")

    def quota_value(self, quotas: Any, code: str, name: str) -> float | None:
        try:
            try:
                quota = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
            except ClientError as err:
                if err.response.get("Error", {}).get("Code") != "NoSuchResourceException":
                    raise
                quota = quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
            return float(quota["Value"])
        except (ClientError, BotoCoreError, KeyError, TypeError, ValueError) as err:
            self.refuse(("queues",), f"Service Quotas did not answer '{name}' ({code}): {err}",
                        "allow servicequotas:GetServiceQuota to the deploying identity and run again")
            return None


def own_instances_in(ec2: Any, org: str) -> dict[str, int]:
    """Reservation id → how many of the tenant's running (or starting) instances are in it."""
    counts: dict[str, int] = {}
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[
        {"Name": "tag:fmcluster:org", "Values": [org]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    for page in pages:
        for reservation in page.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                rid = (instance.get("CapacityReservationId")
                       or instance.get("CapacityReservationSpecification", {}).get("CapacityReservationTarget", {})
                       .get("CapacityReservationId"))
                if rid:
                    counts[rid] = counts.get(rid, 0) + 1
    return counts


def preflight(tenant: Tenant, client: Callable[[str], Any], *, stand_in: str = "",
              now: datetime | None = None, instance_quotas: str | None = None) -> Preflight:
    """Check the tenant's reservations and quotas. `client(service)` gives a boto3 client (AWS or the emulator);
    `stand_in`: what answers in place of the account (the provider's `apis.capacity_stand_in`; "" the account
    itself), said under the lines; `instance_quotas`: the
    service whose quotas the nodes count against (the scheduler's `instance_quotas`; default its own)."""
    if instance_quotas is None:
        from fmcluster.schedulers.registry import scheduler_for

        instance_quotas = scheduler_for(tenant).instance_quotas
    check = _Check(tenant, now or datetime.now(timezone.utc))
    ec2 = client("ec2")
    reserved = [(i, q) for i, q in enumerate(tenant.queues) if q.capacity_reservation_id]
    if reserved:
        try:
            own = own_instances_in(ec2, tenant.org)
        except (ClientError, BotoCoreError) as err:
            check.refuse(("queues",), f"EC2 did not list the cluster's instances: {err}",
                         "allow ec2:DescribeInstances to the deploying identity and run again")
            own = {}
        for i, queue in reserved:
            check.reservation(ec2, i, queue, own.get(queue.capacity_reservation_id or "", 0))
    else:
        check.result.lines.append("no queue names a capacity reservation: every node launches On-Demand")
    if instance_quotas == "ec2":
        check.quotas(client("service-quotas"))
    else:
        check.result.lines.append(f"quotas: the nodes count against {instance_quotas}'s own quotas (per instance type), "
                                  "which this pre-flight does not read; the service refuses a launch beyond them")
    if stand_in:
        check.result.lines.append(stand_in)
    return check.result


def render(result: Preflight, out: Callable[[str], object], indent: str = "  ") -> None:
    for line in result.lines:
        out(f"{indent}{line}")
    for problem in result.refusals:
        out(problem.render())
