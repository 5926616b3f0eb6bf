"""NVIDIA evidence: the XML log of `nvidia-smi -q -x`, `dcgmi discovery -l` and `dcgmi diag -j`.

One `nvidia-smi -q -x` run answers the GPU count, remapped rows, ECC and clock event (throttle) reasons, so a
health run asks the driver once. Element names follow nvsmi_device_v12.dtd; drivers before R530 call the
throttle reasons `clocks_throttle_reasons` / `clocks_throttle_reason_*`, later ones `clocks_event_reasons` /
`clocks_event_reason_*`: both are read.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from fmcluster.health.model import Unreadable

#: Clock event reasons that mean the hardware is holding the GPU down (not the software power cap or idling).
HW_SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


@dataclass
class Gpu:
    bus_id: str
    index: str
    name: str
    uuid: str
    ecc_mode: str  # Enabled | Disabled | N/A
    uncorrectable: Dict[str, int]  # volatile uncorrectable ECC counters by kind
    remap_pending: Optional[bool]
    remap_failure: Optional[bool]
    remapped_uncorrectable: Optional[int]
    slowdowns: List[str] = field(default_factory=list)  # active hardware slowdown reasons


@dataclass
class SmiLog:
    attached: int
    driver: str
    gpus: List[Gpu]


def _text(node: Optional[ET.Element], path: str, default: str = "") -> str:
    if node is None:
        return default
    found = node.find(path)
    return (found.text or "").strip() if found is not None and found.text is not None else default


def _int(text: str) -> Optional[int]:
    match = re.match(r"^\s*(\d+)", text)
    return int(match.group(1)) if match else None


def _yes_no(text: str) -> Optional[bool]:
    low = text.strip().lower()
    return True if low == "yes" else False if low == "no" else None


def parse_smi_xml(text: str) -> SmiLog:
    """Parse `nvidia-smi -q -x`. Raises Unreadable when it is not the driver's XML log."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as err:
        raise Unreadable(f"nvidia-smi -q -x printed no XML log ({err})") from None
    if root.tag != "nvidia_smi_log":
        raise Unreadable(f"nvidia-smi -q -x printed <{root.tag}>, not <nvidia_smi_log>")
    attached = _int(_text(root, "attached_gpus", ""))
    gpus = []
    for element in root.findall("gpu"):
        uncorrectable: Dict[str, int] = {}
        volatile = element.find("ecc_errors/volatile")
        if volatile is not None:
            for counter in volatile:
                if "uncorrectable" in counter.tag:
                    value = _int(counter.text or "")
                    if value is not None:  # "N/A" where the GPU does not count this kind
                        uncorrectable[counter.tag] = value
        remap = element.find("remapped_rows")
        reasons = element.find("clocks_event_reasons")
        prefix = "clocks_event_reason_"
        if reasons is None:
            reasons = element.find("clocks_throttle_reasons")
            prefix = "clocks_throttle_reason_"
        slowdowns = [r for r in HW_SLOWDOWN_REASONS if _text(reasons, prefix + r).lower() == "active"]
        gpus.append(Gpu(
            bus_id=element.get("id", "") or _text(element, "pci/pci_bus_id"),
            index=_text(element, "minor_number"),
            name=_text(element, "product_name"),
            uuid=_text(element, "uuid"),
            ecc_mode=_text(element, "ecc_mode/current_ecc", "N/A"),
            uncorrectable=uncorrectable,
            remap_pending=_yes_no(_text(remap, "remapped_row_pending")) if remap is not None else None,
            remap_failure=_yes_no(_text(remap, "remapped_row_failure")) if remap is not None else None,
            remapped_uncorrectable=_int(_text(remap, "remapped_row_unc")) if remap is not None else None,
            slowdowns=slowdowns,
        ))
    return SmiLog(attached=attached if attached is not None else len(gpus), driver=_text(root, "driver_version"),
                  gpus=gpus)


def parse_dcgm_discovery(text: str) -> int:
    """GPUs `dcgmi discovery -l` lists ("8 GPUs found." or "1 GPU found.")."""
    match = re.search(r"^\s*(\d+)\s+GPUs?\s+found", text, re.M)
    if not match:
        raise Unreadable("dcgmi discovery -l printed no 'N GPUs found.' line")
    return int(match.group(1))


@dataclass
class DiagFailure:
    category: str
    test: str
    gpu: str
    message: str


def parse_dcgm_diag(text: str) -> tuple[List[str], List[DiagFailure]]:
    """(tests run, failures) from `dcgmi diag -r N -j`. DCGM 3 names the top object "DCGM GPU Diagnostic",
    DCGM 4 "DCGM Diagnostic"; a document with neither, or no test at all, is Unreadable (fail closed)."""
    try:
        doc: Any = json.loads(text)
    except ValueError as err:
        raise Unreadable(f"dcgmi diag -j printed no JSON ({err})") from None
    diag = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic") if isinstance(doc, dict) else None
    if not isinstance(diag, dict) or not diag.get("test_categories"):
        raise Unreadable("dcgmi diag -j printed no test_categories (the diagnostic did not run)")
    ran: List[str] = []
    failures: List[DiagFailure] = []
    for category in diag["test_categories"]:
        for test in category.get("tests", []):
            ran.append(str(test.get("name", "?")))
            for result in test.get("results", []):
                if str(result.get("status", "")).lower() != "fail":
                    continue
                warnings = [str(w.get("warning", "")) for w in result.get("warnings", []) if isinstance(w, dict)]
                info = result.get("info", "")
                message = "; ".join(w for w in warnings if w) or (info if isinstance(info, str) else "; ".join(info))
                failures.append(DiagFailure(str(category.get("category", "?")), str(test.get("name", "?")),
                                            str(result.get("gpu_id", result.get("gpu_ids", ""))), message))
    if not ran:
        raise Unreadable("dcgmi diag -j reported no test")
    return ran, failures
