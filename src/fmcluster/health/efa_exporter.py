"""fmcluster EFA exporter: the Linux efa driver's hardware counters as Prometheus metrics.

Reads <sysfs-root>/<device>/ports/<port>/hw_counters/<counter> for every RDMA device bound to the
`efa` driver (the names the driver exports: tx_bytes, rx_bytes, rdma_read_bytes, rdma_write_wr_err,
retrans_pkts, impaired_remote_conn_events, ...) at each scrape and serves them on /metrics:

    efa_<counter>_total{device="rdmap16s27",port="1"} <value>
    efa_devices <number of EFA devices>

Counters the driver adds later are exported too (under the same naming rule); `lifespan` (the
driver's refresh period, not a counter) is skipped. Standard library only, like the rest of fmcluster-health (the
node_health role's program, whose `efa-exporter` command runs it with the node's python3); which devices are EFA is
fmcluster.health.efa's one answer, shared with the health check and the role's `efa-devices` probe.
"""

from __future__ import annotations

import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from fmcluster.health.efa import efa_devices

NOT_COUNTERS = frozenset({"lifespan"})

# Help text for the counters the efa driver documents; unknown counters get a generic one.
HELP = {
    "tx_bytes": "Bytes transmitted.",
    "tx_pkts": "Packets transmitted.",
    "rx_bytes": "Bytes received.",
    "rx_pkts": "Packets received.",
    "rx_drops": "Received packets dropped.",
    "send_bytes": "Bytes sent by SEND operations.",
    "send_wrs": "SEND work requests.",
    "recv_bytes": "Bytes received by RECV operations.",
    "recv_wrs": "RECV work requests.",
    "rdma_read_wrs": "RDMA read work requests.",
    "rdma_read_bytes": "Bytes read by RDMA read.",
    "rdma_read_wr_err": "RDMA read work requests that failed.",
    "rdma_read_resp_bytes": "Bytes served to remote RDMA reads.",
    "rdma_write_wrs": "RDMA write work requests.",
    "rdma_write_bytes": "Bytes written by RDMA write.",
    "rdma_write_wr_err": "RDMA write work requests that failed.",
    "rdma_write_recv_bytes": "Bytes received from remote RDMA writes.",
    "retrans_bytes": "Bytes retransmitted.",
    "retrans_pkts": "Packets retransmitted.",
    "retrans_timeout_events": "Retransmission timeouts.",
    "unresponsive_remote_events": "Events where a remote peer stopped responding.",
    "impaired_remote_conn_events": "Events where a connection to a remote peer was impaired.",
}

_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def read_counters(device: Path) -> tuple[dict[tuple[str, str], int], int]:
    """{(port, counter): value} for one device, and how many counter files could not be read."""
    values: dict[tuple[str, str], int] = {}
    errors = 0
    ports = device / "ports"
    if not ports.is_dir():
        return values, errors
    for port in sorted(ports.iterdir(), key=lambda p: p.name):
        hw = port / "hw_counters"
        if not hw.is_dir():
            continue
        for counter in sorted(hw.iterdir(), key=lambda p: p.name):
            if counter.name in NOT_COUNTERS or not counter.is_file():
                continue
            try:
                values[(port.name, counter.name)] = int(counter.read_text().strip())
            except (OSError, ValueError):
                errors += 1
    return values, errors


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric_name(counter: str) -> str:
    """Prometheus name of a driver counter: efa_<counter>_total."""
    return f"efa_{_UNSAFE.sub('_', counter)}_total"


def render(sysfs_root: Path) -> str:
    """The Prometheus text exposition of every EFA counter under sysfs_root."""
    devices = efa_devices(sysfs_root)
    samples: dict[str, list[tuple[str, str, int]]] = {}
    read_errors = 0
    for device in devices:
        values, errors = read_counters(device)
        read_errors += errors
        for (port, counter), value in values.items():
            samples.setdefault(counter, []).append((device.name, port, value))
    out = [
        "# HELP efa_devices EFA devices found on this node.",
        "# TYPE efa_devices gauge",
        f"efa_devices {len(devices)}",
        "# HELP efa_exporter_read_errors Counter files that could not be read in this scrape.",
        "# TYPE efa_exporter_read_errors gauge",
        f"efa_exporter_read_errors {read_errors}",
    ]
    for counter in sorted(samples):
        name = metric_name(counter)
        out.append(f"# HELP {name} {HELP.get(counter, f'EFA hardware counter {counter}.')}")
        out.append(f"# TYPE {name} counter")
        for device_name, port, value in samples[counter]:
            out.append(f'{name}{{device="{_escape(device_name)}",port="{_escape(port)}"}} {value}')
    return "\n".join(out) + "\n"


def make_handler(sysfs_root: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.split("?", 1)[0] == "/metrics":
                body = render(sysfs_root).encode()
                ctype = "text/plain; version=0.0.4; charset=utf-8"
                status = 200
            elif self.path == "/":
                body = b'<html><body><a href="/metrics">EFA hardware counters</a></body></html>\n'
                ctype = "text/html"
                status = 200
            else:
                body, ctype, status = b"not found\n", "text/plain", 404
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            return  # one line per scrape would only fill the log

    return Handler


def serve(address: str, port: int, sysfs_root: Path) -> ThreadingHTTPServer:
    """A ready HTTP server (call serve_forever() on it); separate so tests can run it in a thread."""
    return ThreadingHTTPServer((address, port), make_handler(sysfs_root))


def run(address: str, port: int, sysfs_root: Path, once: bool = False) -> int:
    """Serve the metrics until interrupted; `once`: print them and return."""
    if once:
        sys.stdout.write(render(sysfs_root))
        return 0
    server = serve(address, port, sysfs_root)
    print(f"fmcluster EFA exporter on {address}:{port}, {len(efa_devices(sysfs_root))} EFA device(s) under "
          f"{sysfs_root}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0
