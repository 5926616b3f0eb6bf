"""fmcluster's Grafana dashboards, defined as data and written as provisioning JSON files.

The grafana role ships the generated files (roles/grafana/files/dashboards/*.json); a test checks they
match this module and that every PromQL expression in them parses in a real Prometheus. Regenerate
with `invoke dashboards` after editing a panel here.

Every target carries `node` (the inventory hostname) from its file_sd target; `$node` is the
dashboard's node selector. Expected counts come from the instance catalog through
fmcluster_node_expected_* (node_exporter textfile), never from numbers typed here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fmcluster.paths import repo_root

DATASOURCE = {"type": "prometheus", "uid": "fmcluster-prometheus"}
SEL = 'node=~"$node"'


@dataclass(frozen=True)
class Panel:
    title: str
    exprs: tuple[tuple[str, str], ...]  # (PromQL, legend)
    kind: str = "timeseries"  # timeseries | stat | table
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


GPUS_EXPECTED = f'max by (node) (fmcluster_node_expected_accelerators{{accelerator="cuda", {SEL}}})'
GPUS_VISIBLE = f"count by (node) (DCGM_FI_DEV_GPU_TEMP{{{SEL}}})"
#: Nodes Prometheus has a dcgm target for: a GPU node whose image ships no container runtime has none by design
#: (fmcluster.monitoring.scrape_jobs), and its GPUs are not "missing" for want of an exporter.
DCGM_SCRAPED = f'count by (node) (up{{job="dcgm", {SEL}}})'

GPU_HEALTH = Dashboard(
    uid="fmcluster-gpu-health",
    title="fmcluster / GPU Health",
    description="XID errors, remapped rows, row-remap failures, throttling, ECC, NVLink and missing GPUs (dcgm-exporter).",
    panels=(
        Panel("GPUs missing compared with the catalog",
              ((f"({GPUS_EXPECTED} - on (node) {GPUS_VISIBLE}) > 0 or "
                f"(({GPUS_EXPECTED} > 0 unless on (node) {GPUS_VISIBLE}) and on (node) {DCGM_SCRAPED})",
                "{{node}}"),),
              kind="table", description="Catalog GPUs per node minus GPUs reporting to DCGM (a GPU off the bus disappears); "
                                        "nodes without a dcgm-exporter by design (image without a container runtime) "
                                        "are left out: plan lists them."),
        Panel("GPUs reporting vs catalog",
              ((GPUS_VISIBLE, "{{node}} reporting"), (GPUS_EXPECTED, "{{node}} catalog")), kind="table"),
        Panel("XID errors in the exporter's window, by code",
              ((f"sum by (node, gpu, xid) (DCGM_EXP_XID_ERRORS_COUNT{{{SEL}}}) > 0", "{{node}} GPU {{gpu}} XID {{xid}}"),),
              description="DCGM_EXP_XID_ERRORS_COUNT: counts repeated XIDs, unlike the last-value field."),
        Panel("Last XID error code per GPU",
              ((f"DCGM_FI_DEV_XID_ERRORS{{{SEL}}} > 0", "{{node}} GPU {{gpu}}"),), kind="table"),
        Panel("Uncorrectable remapped rows",
              ((f"max by (node, gpu) (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{SEL}}})", "{{node}} GPU {{gpu}}"),)),
        Panel("Correctable remapped rows",
              ((f"max by (node, gpu) (DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{SEL}}})", "{{node}} GPU {{gpu}}"),)),
        Panel("GPUs with a row-remap failure",
              ((f"count(DCGM_FI_DEV_ROW_REMAP_FAILURE{{{SEL}}} > 0) or vector(0)", "failed"),), kind="stat", width=6),
        Panel("GPUs with uncorrectable ECC errors (1h)",
              ((f"count(increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{SEL}}}[1h]) > 0) or vector(0)", "GPUs"),), kind="stat",
              width=6),
        Panel("Thermal violation (throttled time per second)",
              ((f"max by (node, gpu) (rate(DCGM_FI_DEV_THERMAL_VIOLATION{{{SEL}}}[$__rate_interval]))", "{{node}} GPU {{gpu}}"),)),
        Panel("Power violation (throttled time per second)",
              ((f"max by (node, gpu) (rate(DCGM_FI_DEV_POWER_VIOLATION{{{SEL}}}[$__rate_interval]))", "{{node}} GPU {{gpu}}"),)),
        Panel("GPU temperature",
              ((f"DCGM_FI_DEV_GPU_TEMP{{{SEL}}}", "{{node}} GPU {{gpu}}"),), unit="celsius"),
        Panel("GPU power draw",
              ((f"DCGM_FI_DEV_POWER_USAGE{{{SEL}}}", "{{node}} GPU {{gpu}}"),), unit="watt"),
        Panel("NVLink errors per second",
              ((f'sum by (node, gpu) (rate({{__name__=~"DCGM_FI_DEV_NVLINK_(CRC_FLIT|CRC_DATA|REPLAY|RECOVERY)_ERROR_COUNT_TOTAL", {SEL}}}[$__rate_interval]))',
                "{{node}} GPU {{gpu}}"),)),
        Panel("Firing GPU alerts",
              (('ALERTS{alertstate="firing", alertname=~"Gpu.*"}', "{{alertname}} {{node}}"),), kind="table"),
    ),
)

EFA_EXPECTED = f"max by (node) (fmcluster_node_expected_efa_interfaces{{{SEL}}})"

EFA_NETWORK = Dashboard(
    uid="fmcluster-efa-network",
    title="fmcluster / EFA and network",
    description="EFA hardware counters (fmcluster EFA exporter) and host network (node_exporter).",
    panels=(
        Panel("EFA devices vs catalog",
              ((f"max by (node) (efa_devices{{{SEL}}})", "{{node}} present"), (EFA_EXPECTED, "{{node}} catalog")),
              kind="table"),
        Panel("EFA transmit (bits/s)",
              ((f"sum by (node) (rate(efa_tx_bytes_total{{{SEL}}}[$__rate_interval])) * 8", "{{node}}"),), unit="bps"),
        Panel("EFA receive (bits/s)",
              ((f"sum by (node) (rate(efa_rx_bytes_total{{{SEL}}}[$__rate_interval])) * 8", "{{node}}"),), unit="bps"),
        Panel("RDMA read / write (bytes/s)",
              ((f"sum by (node) (rate(efa_rdma_read_bytes_total{{{SEL}}}[$__rate_interval]))", "{{node}} read"),
               (f"sum by (node) (rate(efa_rdma_write_bytes_total{{{SEL}}}[$__rate_interval]))", "{{node}} write")),
              unit="Bps"),
        Panel("Retransmitted packets (share of transmitted)",
              ((f"sum by (node, device) (rate(efa_retrans_pkts_total{{{SEL}}}[$__rate_interval])) / "
                f"sum by (node, device) (rate(efa_tx_pkts_total{{{SEL}}}[$__rate_interval]))", "{{node}} {{device}}"),),
              unit="percentunit"),
        Panel("RDMA work-request errors (1h)",
              ((f'sum by (node, device) (increase({{__name__=~"efa_rdma_(read|write)_wr_err_total", {SEL}}}[1h]))',
                "{{node}} {{device}}"),)),
        Panel("Unresponsive / impaired peers (1h)",
              ((f'sum by (node, device) (increase({{__name__=~"efa_(unresponsive_remote|impaired_remote_conn)_events_total", {SEL}}}[1h]))',
                "{{node}} {{device}}"),)),
        Panel("Received packets dropped per second",
              ((f"sum by (node, device) (rate(efa_rx_drops_total{{{SEL}}}[$__rate_interval]))", "{{node}} {{device}}"),)),
        Panel("Host network transmit (bits/s)",
              ((f'sum by (node) (rate(node_network_transmit_bytes_total{{device!="lo", {SEL}}}[$__rate_interval])) * 8', "{{node}}"),),
              unit="bps"),
        Panel("Host network receive (bits/s)",
              ((f'sum by (node) (rate(node_network_receive_bytes_total{{device!="lo", {SEL}}}[$__rate_interval])) * 8', "{{node}}"),),
              unit="bps"),
    ),
)

SLURM_SOURCE = ("fmcluster's Slurm metrics: a node_exporter textfile the controller writes from scontrol and "
                "squeue (roles/slurm_metrics).")

CLUSTER = Dashboard(
    uid="fmcluster-cluster-overview",
    title="fmcluster / Cluster and Slurm overview",
    description="Scrape health, nodes, alerts, CPU/memory, shared file systems and Slurm state.",
    panels=(
        Panel("Targets up per job", (("sum by (job) (up)", "{{job}} up"), ("count by (job) (up)", "{{job}} total")),
              kind="table"),
        Panel("Nodes down", (('count(up{job="node"} == 0) or vector(0)', "down"),), kind="stat", width=6),
        Panel("Firing alerts", (('count(ALERTS{alertstate="firing"}) or vector(0)', "firing"),), kind="stat", width=6),
        Panel("Nodes (what fmcluster deployed)", ((f"fmcluster_node_info{{{SEL}}}", "{{node}}"),), kind="table"),
        Panel("Alerts", (('ALERTS{alertstate="firing"}', "{{alertname}} {{node}}"),), kind="table"),
        Panel("CPU busy",
              ((f'1 - avg by (node) (rate(node_cpu_seconds_total{{mode="idle", {SEL}}}[$__rate_interval]))', "{{node}}"),),
              unit="percentunit"),
        Panel("Memory used",
              ((f"1 - node_memory_MemAvailable_bytes{{{SEL}}} / node_memory_MemTotal_bytes{{{SEL}}}", "{{node}}"),),
              unit="percentunit"),
        Panel("Load (1 min)", ((f"node_load1{{{SEL}}}", "{{node}}"),)),
        Panel("Shared file systems used (Lustre, NFS, ZFS)",
              ((f'1 - node_filesystem_avail_bytes{{fstype=~"lustre|nfs4?|zfs", {SEL}}} / '
                f'node_filesystem_size_bytes{{fstype=~"lustre|nfs4?|zfs", {SEL}}}', "{{node}} {{mountpoint}}"),),
              unit="percentunit"),
        Panel("Expected mounts missing",
              ((f"fmcluster_node_expected_mount{{{SEL}}} == 1 unless on (node, mountpoint, fstype) node_filesystem_size_bytes",
                "{{node}} {{mountpoint}}"),), kind="table"),
        Panel("Slurm nodes by state", (("sum by (state) (slurm_nodes)", "{{state}}"),),
              description=SLURM_SOURCE),
        Panel("Slurm jobs", (('sum by (state) (slurm_jobs{state=~"running|pending"})', "{{state}}"),),
              description=SLURM_SOURCE),
        Panel("Slurm queue depth (pending jobs) per partition",
              (('sum by (partition) (slurm_jobs{state="pending"})', "{{partition}}"),), description=SLURM_SOURCE),
        Panel("Slurm nodes out of service, with reasons", (("slurm_node_unavailable_info == 1", "{{slurm_node}}"),),
              kind="table", description=SLURM_SOURCE + " Drain reasons of the health checks: docs/health.md."),
        Panel("Health checks failing", (('fmcluster_health_check_failed{context="interval"} == 1', "{{node}} {{check}}"),),
              kind="table", width=24,
              description="The nodes' own health runs (Slurm's HealthCheckProgram; docs/health.md)."),
        Panel("Repairs (reboots, replacements, quarantines) per queue",
              (("sum by (kind, queue) (increase(fmcluster_repair_actions_total[1h]))", "{{kind}} {{queue}}"),),
              description="The controller's repair agent, per hour (docs/health.md, \"The repair agent\")."),
        Panel("Repair breaker, quarantined queues, nodes waiting",
              (("max(fmcluster_repair_breaker_open)", "breaker open"),
               ("sum(fmcluster_repair_quarantined)", "queues quarantined"),
               ("sum(fmcluster_repair_waiting_nodes)", "nodes waiting for a repair")),
              kind="stat",
              description="While the breaker is open nothing is repaired (too many nodes failed at once); a "
                          "quarantined queue gets no replacements until a person decides (`invoke nodes`)."),
    ),
)

DASHBOARDS = (GPU_HEALTH, EFA_NETWORK, CLUSTER)


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    refs = "ABCDEFGHIJ"
    body: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {},
        "targets": [
            {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": refs[i],
             **({"instant": True, "format": "table"} if panel.kind == "table" else {})}
            for i, (expr, legend) in enumerate(panel.exprs)
        ],
    }
    return body


def render(dashboard: Dashboard) -> dict[str, Any]:
    """The Grafana dashboard JSON model of one dashboard."""
    panels = []
    x = y = row_height = 0
    for pid, panel in enumerate(dashboard.panels, start=1):
        if x + panel.width > 24:
            x, y, row_height = 0, y + row_height, 0
        panels.append(_panel_json(panel, pid, x, y))
        x += panel.width
        row_height = max(row_height, panel.height)
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["fmcluster"],
        "editable": False,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "templating": {"list": [{
            "name": "node", "label": "node", "type": "query", "datasource": DATASOURCE,
            "query": {"query": 'label_values(up{job="node"}, node)', "refId": "node"},
            "definition": 'label_values(up{job="node"}, node)',
            "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        }]},
        "panels": panels,
    }


def dashboards_dir() -> Path:
    return repo_root() / "roles" / "grafana" / "files" / "dashboards"


def file_name(dashboard: Dashboard) -> str:
    return f"{dashboard.uid}.json"


def serialise(dashboard: Dashboard) -> str:
    return json.dumps(render(dashboard), indent=2, sort_keys=True) + "\n"


def write_all(target: Path | None = None) -> list[Path]:
    """Write every dashboard's JSON into the grafana role (or target); returns the paths written."""
    out = target or dashboards_dir()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for dashboard in DASHBOARDS:
        path = out / file_name(dashboard)
        path.write_text(serialise(dashboard))
        written.append(path)
    return written


def expressions() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) for every query of every dashboard."""
    return [(d.uid, p.title, expr) for d in DASHBOARDS for p in d.panels for expr, _ in p.exprs]


if __name__ == "__main__":
    for written in write_all():
        print(written)
