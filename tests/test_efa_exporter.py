"""The EFA exporter turns the efa driver's sysfs hw_counters into Prometheus metrics."""

from __future__ import annotations

import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import efa_sysfs  # noqa: E402

from fmcluster.health import efa_exporter as exporter  # noqa: E402


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    return efa_sysfs.build(tmp_path / "sys")


def _samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_every_efa_port_counter_is_exported_with_device_and_port_labels(sysfs: Path) -> None:
    samples = _samples(exporter.render(sysfs))
    for device in ("rdmap16s27", "rdmap32s27"):
        for counter in efa_sysfs.EFA_PORT_COUNTERS:
            key = f'efa_{counter}_total{{device="{device}",port="1"}}'
            assert samples[key] == efa_sysfs.counter_value(device, counter), key


def test_the_brief_s_counters_have_their_expected_metric_names(sysfs: Path) -> None:
    text = exporter.render(sysfs)
    for name in ("efa_tx_bytes_total", "efa_rx_bytes_total", "efa_rdma_read_bytes_total",
                 "efa_rdma_write_bytes_total", "efa_retrans_pkts_total", "efa_rdma_read_wr_err_total",
                 "efa_rdma_write_wr_err_total", "efa_impaired_remote_conn_events_total"):
        assert f"# TYPE {name} counter" in text


def test_devices_of_other_drivers_and_the_lifespan_file_are_ignored(sysfs: Path) -> None:
    text = exporter.render(sysfs)
    assert "mlx5_0" not in text
    assert "lifespan" not in text
    assert _samples(text)["efa_devices"] == 2


def test_a_node_without_efa_exports_zero_devices_and_no_counters(tmp_path: Path) -> None:
    samples = _samples(exporter.render(tmp_path / "does-not-exist"))
    assert samples == {"efa_devices": 0, "efa_exporter_read_errors": 0}


def test_an_unreadable_counter_is_counted_as_a_read_error_and_the_rest_still_exported(sysfs: Path) -> None:
    (sysfs / "rdmap16s27" / "ports" / "1" / "hw_counters" / "tx_bytes").write_text("garbage\n")
    samples = _samples(exporter.render(sysfs))
    assert samples["efa_exporter_read_errors"] == 1
    assert 'efa_tx_bytes_total{device="rdmap16s27",port="1"}' not in samples
    assert 'efa_tx_bytes_total{device="rdmap32s27",port="1"}' in samples


def test_a_counter_added_by_a_newer_driver_is_exported_under_the_same_rule(sysfs: Path) -> None:
    (sysfs / "rdmap16s27" / "ports" / "1" / "hw_counters" / "new_counter").write_text("7\n")
    assert _samples(exporter.render(sysfs))['efa_new_counter_total{device="rdmap16s27",port="1"}'] == 7


def test_the_exposition_passes_promtool_check_metrics(sysfs: Path) -> None:
    result = subprocess.run(["promtool", "check", "metrics"], input=exporter.render(sysfs),
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_http_server_serves_the_same_metrics_on_slash_metrics(sysfs: Path) -> None:
    server = exporter.serve("127.0.0.1", 0, sysfs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert response.read().decode() == exporter.render(sysfs)
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
