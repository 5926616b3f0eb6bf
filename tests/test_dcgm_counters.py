"""fmcluster's DCGM counters CSV enables every DCGM field the alerts and dashboards use."""

from __future__ import annotations

import csv
import re

from monitoring_helpers import ROOT, RULES_FILE

CSV_FILE = ROOT / "roles" / "dcgm_exporter" / "files" / "fmcluster-counters.csv"
DASHBOARDS = ROOT / "roles" / "grafana" / "files" / "dashboards"


def _rows() -> list[list[str]]:
    lines = [line for line in CSV_FILE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return [[cell.strip() for cell in row] for row in csv.reader(lines)]


def _fields() -> set[str]:
    return {row[0] for row in _rows()}


def test_each_line_is_field_type_help_in_dcgm_exporter_s_format() -> None:
    for row in _rows():
        assert len(row) >= 3, row
        assert re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", row[0]), row
        assert row[1] in {"gauge", "counter", "label"}, row
        assert row[2], row


def test_the_health_fields_off_by_default_upstream_are_enabled() -> None:
    assert {"DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"} <= _fields()


def test_every_dcgm_metric_used_by_rules_or_dashboards_is_enabled() -> None:
    used = set(re.findall(r"DCGM_(?:FI|EXP)_[A-Z0-9_]+", RULES_FILE.read_text()))
    for path in DASHBOARDS.glob("*.json"):
        used |= set(re.findall(r"DCGM_(?:FI|EXP)_[A-Z0-9_]+", path.read_text()))
    # The NVLink error panels and alerts select these four with one __name__ regex.
    nvlink = re.compile(r"DCGM_FI_DEV_NVLINK_$")
    used = {name for name in used if not nvlink.match(name)}
    assert used - _fields() == set()


def test_no_field_dcgm_4_7_removed_is_listed() -> None:
    """DCGM 4.7.0 removed the PCIe throughput fields, and an exporter given one exits at start ("DCGM field
    \"DCGM_FI_DEV_PCIE_RX_THROUGHPUT\" (ID 201) is no longer supported", netdata/netdata#23964): the GPU nodes' DLAMIs
    run DCGM 4.7.0 (images.yml dcgm_version), so one such line would leave every GPU node without an exporter."""
    assert {"DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT"} & _fields() == set()
