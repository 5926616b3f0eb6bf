"""Log findings that depend on what the instance has (EFA interfaces), read from the catalog
(src/fmcluster/data/instances.yml), never guessed: the instance type given (--instance-type), the org's one GPU
instance type (--org), or the platform aws-ofi-nccl names in the log (`NET/OFI Running on p5.48xlarge platform`).
When none says it, the finding is kept and a note says the instance's facts are not known."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fmcluster.acceptance.model import ParsedLog
from fmcluster.catalog import InstanceType
from fmcluster.doctor.detect import Finding
from fmcluster.doctor.knowledge import Entry
from fmcluster.doctor.logscan import Hit

NIC_ENTRY = "efa-nic-count"
#: Entries whose findings say EFA is missing or unused: expected on an instance type without EFA.
EFA_ENTRIES = ("ofi-plugin-not-loaded", "efa-devices-not-visible", "libfabric-provider-not-efa")


@dataclass(frozen=True)
class Known:
    instance: InstanceType | None
    how: str
    """Where the instance type came from, or why it is not known."""
    given: bool = False
    """Given by the user (--instance-type, --org), not inferred from the log: only then are NIC counts judged (a
    container may be given a share of the node's EFA interfaces on purpose)."""


def resolve(catalog: Mapping[str, InstanceType], instance_type: str | None, org_types: list[str],
            log: ParsedLog) -> Known:
    """The instance the log ran on, as far as the command line, the org or the log itself say."""
    if instance_type:
        return Known(catalog[instance_type], f"--instance-type {instance_type}", given=True)
    accelerated = sorted({t for t in org_types if t in catalog and catalog[t].needs_fabric})
    if len(accelerated) == 1:
        return Known(catalog[accelerated[0]], f"the org's only accelerated queue type, {accelerated[0]}", given=True)
    platform = log.network.platform
    if platform is not None and platform in catalog:
        return Known(catalog[platform], f"aws-ofi-nccl's 'Running on {platform} platform' line")
    why = (f"the org has several accelerated instance types ({', '.join(accelerated)})" if accelerated
           else "no --instance-type or --org was given and the log names no platform")
    return Known(None, why)


def nic_finding(log: ParsedLog, known: Known, entry: Entry) -> Finding | None:
    """aws-ofi-nccl found another number of EFA NICs than the instance type has (a process per line)."""
    instance = known.instance
    if instance is None or not instance.efa_interfaces or not known.given:
        return None
    odd = [Hit(p.host or "?", f"aws-ofi-nccl found {n} NIC(s) (pid {p.pid}); {instance.name} has "
               f"{instance.efa_interfaces} EFA interfaces ({known.how})")
           for p in log.processes for n in p.nics if n != instance.efa_interfaces]
    return Finding(entry, tuple(odd[:5])) if odd else None


def apply(found: list[Finding], log: ParsedLog, known: Known, entries: Mapping[str, Entry],
          benchmark: bool) -> tuple[list[Finding], list[str]]:
    """The findings with the instance's facts applied, and notes saying what was assumed or dropped."""
    notes: list[str] = []
    efa = [f for f in found if f.entry.id in EFA_ENTRIES]
    if known.instance is not None and not known.instance.has_efa and efa:
        found = [f for f in found if f not in efa]
        notes.append(f"{', '.join(sorted(f.entry.id for f in efa))} not shown: {known.instance.name} has no EFA, "
                     f"so libfabric finding no EFA device is expected ({known.how})")
    elif known.instance is None and (efa or log.processes):
        notes.append(f"whether this instance has EFA, and how many interfaces, is not known: {known.how}; give "
                     "--instance-type (or --org) to judge the EFA findings and NIC counts")
    if not benchmark and NIC_ENTRY in entries and not any(f.entry.id == NIC_ENTRY for f in found):
        nics = nic_finding(log, known, entries[NIC_ENTRY])
        found = found + ([nics] if nics else [])
    return found, notes
