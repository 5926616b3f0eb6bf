"""Capacity reservations in the AWS emulator for the tenants the tests deploy (fmcluster.capacity checks them)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any


def reserve(ec2: Any, instance_type: str, zone: str, count: int, kind: str = "default",
            start: datetime | None = None, hours: int = 24 * 7) -> str:
    """A reservation in the emulator (an On-Demand Capacity Reservation, or a Capacity Block bought from an
    offering starting at `start`); its id."""
    if kind == "capacity-block":
        offer = ec2.describe_capacity_block_offerings(
            InstanceType=instance_type, InstanceCount=count, CapacityDurationHours=hours,
            StartDateRange=start or datetime.now(timezone.utc) - timedelta(minutes=5))["CapacityBlockOfferings"][0]
        made = ec2.purchase_capacity_block(CapacityBlockOfferingId=offer["CapacityBlockOfferingId"],
                                           InstancePlatform="Linux/UNIX")
    else:
        made = ec2.create_capacity_reservation(InstanceType=instance_type, InstancePlatform="Linux/UNIX",
                                               AvailabilityZone=zone, InstanceCount=count)
    return str(made["CapacityReservation"]["CapacityReservationId"])


def point_tenant_at(spec: Path, old_id: str, new_id: str) -> None:
    """Rewrite the tenant file's reservation id (the emulator makes its own ids)."""
    text = spec.read_text()
    assert old_id in text, (spec, old_id)
    spec.write_text(re.sub(re.escape(old_id), new_id, text))


def reserve_what_the_tenant_names(ec2: Any, tenant: Any, spec: Path) -> None:
    """For each queue's reservation, one in the emulator that matches it; the tenant file then names it."""
    for queue in tenant.queues:
        if queue.capacity_reservation_id:
            rid = reserve(ec2, queue.instance.name, tenant.availability_zone, queue.count,
                          queue.capacity_reservation_type)
            point_tenant_at(spec, queue.capacity_reservation_id, rid)
