"""The node health checks on a p5.48xlarge, fed with recorded nvidia-smi / dcgmi / kernel-log / sysfs outputs.

No GPU exists on this machine: these fixtures (tests/fixtures/gpu_outputs.py, tests/fixtures/gpu/) are shaped
from public real outputs, and every check is judged on them exactly as on a node. Each fault names the check a
drain reason carries and the action the node needs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fmcluster.health import engine
from fmcluster.health.model import Report
from health_helpers import NODE, Recorded, gpu_outputs, healthy_answers, p5_config


def run(config: dict, answers: dict, context: str = "interval") -> Report:
    return engine.run_checks(config, context, NODE, Recorded(answers))


def by_check(report: Report) -> dict[str, tuple[str, str, str]]:
    return {r.check: (r.status, r.action, r.detail) for r in report.results}


def test_a_healthy_p5_passes_every_check_that_runs_in_the_interval(tmp_path: Path) -> None:
    report = run(p5_config(tmp_path, efa_count=2), healthy_answers())
    results = by_check(report)
    assert report.healthy, report.reason()
    assert set(results) == {"munge", "mounts", "disk", "memory", "gpu-count", "xid", "row-remap", "ecc",
                            "gpu-throttle", "dcgm", "return-diag", "efa"}
    assert {status for status, _, _ in results.values()} == {"pass"}
    assert results["gpu-count"][2] == "8 of 8 GPUs visible (driver 535.183.01)"
    assert results["dcgm"][2] == "DCGM sees 8 GPUs; dcgmi diag -r 1 passed 9 tests"
    assert results["efa"][2] == "2 of 2 EFA devices, every port ACTIVE and LinkUp"


def test_the_prolog_runs_only_the_quick_gpu_checks(tmp_path: Path) -> None:
    report = run(p5_config(tmp_path, efa_count=2), healthy_answers(), context="prolog")
    assert [r.check for r in report.results] == ["gpu-count", "xid", "row-remap", "ecc"]


def test_a_missing_gpu_fails_gpu_count_and_asks_for_a_new_node(tmp_path: Path) -> None:
    seven = tuple(b for b in gpu_outputs.P5_BUS_IDS if b != "75")
    report = run(p5_config(tmp_path, efa_count=2), healthy_answers(gpu_outputs.smi_xml(present=seven)))
    assert by_check(report)["gpu-count"] == ("fail", "replace", "7 of 8 GPUs visible to the driver (1 missing)")
    assert report.reason() == "fmcluster-health: gpu-count: 7 of 8 GPUs visible to the driver (1 missing)"
    assert report.action == "replace"


def test_nvidia_smi_losing_a_gpu_is_a_missing_gpu_not_an_unknown(tmp_path: Path) -> None:
    answers = healthy_answers()
    answers[("nvidia-smi", "-q", "-x")] = ("", gpu_outputs.SMI_LOST_GPU[1], gpu_outputs.SMI_LOST_GPU[0])
    results = by_check(run(p5_config(tmp_path, efa_count=2), answers))
    assert results["gpu-count"][:2] == ("fail", "replace")
    assert "Unable to determine the device handle for GPU0000:75:00.0" in results["gpu-count"][2]
    # The checks that need the XML log cannot read it: they fail closed, saying so.
    assert results["row-remap"][0] == "fail" and "could not read the evidence" in results["row-remap"][2]


def test_xid_79_since_boot_drains_the_node_for_replacement(tmp_path: Path) -> None:
    report = run(p5_config(tmp_path, kmsg="kmsg-xid79.txt", efa_count=2), healthy_answers())
    status, action, detail = by_check(report)["xid"]
    assert (status, action) == ("fail", "replace")
    assert detail == "XID 79 on GPU 0000:75:00 (GPU has fallen off the bus): replace"
    assert report.reason().startswith("fmcluster-health: xid: XID 79 on GPU 0000:75:00")


def test_xid_13_and_the_cleanup_xids_after_it_need_nothing(tmp_path: Path) -> None:
    report = run(p5_config(tmp_path, kmsg="kmsg-xid13.txt", efa_count=2), healthy_answers())
    status, action, detail = by_check(report)["xid"]
    assert (status, action) == ("pass", "none") and report.healthy
    assert "XID 13 x2 (Graphics engine exception" in detail and "XID 45 x1" in detail


def test_an_xid_missing_from_the_table_drains_and_the_worst_action_wins(tmp_path: Path) -> None:
    status, action, detail = by_check(run(p5_config(tmp_path, kmsg="kmsg-xid63-unknown.txt", efa_count=2),
                                          healthy_answers()))["xid"]
    assert (status, action) == ("fail", "reboot")  # 63 reboot beats 149 (not in the table: drain)
    assert "XID 63 on GPU 0000:97:00" in detail and "XID 149 x1 (not in fmcluster's XID table; drain)" in detail


def test_an_xid_is_remembered_after_the_ring_buffer_overwrote_it(tmp_path: Path) -> None:
    config = p5_config(tmp_path, kmsg="kmsg-xid79.txt", efa_count=2)
    assert by_check(run(config, healthy_answers()))["xid"][0] == "fail"
    later = tmp_path / "kmsg-later.txt"  # the buffer moved on: only records after the last one read remain
    later.write_text("6,12,999000000,-;audit: type=1400 audit(1718270123.991:212): apparmor=\"STATUS\"\n")
    config["paths"]["kmsg"] = str(later)
    assert by_check(run(config, healthy_answers()))["xid"][:2] == ("fail", "replace")


def test_kernel_log_records_lost_before_they_were_read_fail_closed(tmp_path: Path) -> None:
    report = run(p5_config(tmp_path, kmsg="kmsg-wrapped.txt", efa_count=2), healthy_answers())
    status, action, detail = by_check(report)["xid"]
    assert (status, action) == ("fail", "drain")
    assert detail.startswith("kernel log records 0..4020 were overwritten before they were read")


def test_a_new_boot_starts_the_xid_record_afresh(tmp_path: Path) -> None:
    config = p5_config(tmp_path, kmsg="kmsg-xid79.txt", efa_count=2)
    run(config, healthy_answers())
    (tmp_path / "boot_id").write_text("0b6e2f8c-0000-4000-8000-000000000001\n")
    config["paths"]["kmsg"] = str(gpu_outputs.FIXTURES / "kmsg-clean.txt")
    assert by_check(run(config, healthy_answers()))["xid"][0] == "pass"


def test_an_unreadable_kernel_log_is_a_failure(tmp_path: Path) -> None:
    config = p5_config(tmp_path, efa_count=2)
    config["paths"]["kmsg"] = str(tmp_path / "no-such-kmsg")
    status, _, detail = by_check(run(config, healthy_answers()))["xid"]
    assert status == "fail" and "cannot read the kernel log" in detail


@pytest.mark.parametrize("fault, check, action, words", [
    ({"pending": "86"}, "row-remap", "reboot", "row remapping pending on GPU 00000000:86:00.0"),
    ({"failure": "97"}, "row-remap", "replace", "row remapping failed on GPU 00000000:97:00.0"),
    ({"dbe": "A8"}, "ecc", "reboot", "2 uncorrectable ECC error(s) since the driver loaded"),
    ({"ecc_off": "B9"}, "ecc", "drain", "ECC is not enabled on GPU 00000000:B9:00.0"),
    ({"slowdown": "CA"}, "gpu-throttle", "drain", "hw_slowdown, hw_thermal_slowdown"),
    ({"slowdown": "CA", "old_driver": True}, "gpu-throttle", "drain", "hw_thermal_slowdown"),
])
def test_gpu_memory_and_throttle_faults(tmp_path: Path, fault: dict, check: str, action: str, words: str) -> None:
    report = run(p5_config(tmp_path, efa_count=2), healthy_answers(gpu_outputs.smi_xml(**fault)))
    status, got_action, detail = by_check(report)[check]
    assert (status, got_action) == ("fail", action) and words in detail
    assert [r.check for r in report.failures] == [check]


def test_nvidia_smi_printing_something_else_than_its_xml_log_fails_closed(tmp_path: Path) -> None:
    results = by_check(run(p5_config(tmp_path, efa_count=2), healthy_answers("Segmentation fault\n")))
    assert results["ecc"][0] == "fail" and "printed no XML log" in results["ecc"][2]


def test_a_failed_dcgm_diagnostic_names_the_test_and_the_gpu(tmp_path: Path) -> None:
    answers = healthy_answers()
    answers[("dcgmi", "diag", "-r", "1", "-j")] = (gpu_outputs.fixture("dcgmi-diag-r1-fail.json"), 226)
    status, action, detail = by_check(run(p5_config(tmp_path, efa_count=2), answers))["dcgm"]
    assert (status, action) == ("fail", "drain")
    assert detail.startswith("dcgmi diag -r 1: Page Retirement/Row Remap failed on GPU 2: GPU 2 had uncorrectable")


@pytest.mark.parametrize("answer, words", [
    ((gpu_outputs.fixture("dcgmi-diag-empty.json"), 0), "printed no test_categories"),
    (("", 127), "gave no result"),
    ("timeout", "did not finish in time"),
])
def test_a_dcgm_diagnostic_that_did_not_run_fails_closed(tmp_path: Path, answer: tuple, words: str) -> None:
    answers = healthy_answers()
    answers[("dcgmi", "diag", "-r", "1", "-j")] = answer
    status, _, detail = by_check(run(p5_config(tmp_path, efa_count=2), answers))["dcgm"]
    assert status == "fail" and words in detail


def test_dcgm_not_installed_or_not_seeing_every_gpu_fails(tmp_path: Path) -> None:
    answers = {k: v for k, v in healthy_answers().items() if k[0] != "dcgmi"}
    status, _, detail = by_check(run(p5_config(tmp_path, efa_count=2), answers))["dcgm"]
    assert status == "fail" and "dcgmi is not installed" in detail
    answers = healthy_answers()
    answers[("dcgmi", "discovery", "-l")] = (gpu_outputs.fixture("dcgmi-discovery-8.txt").replace("8 GPUs", "7 GPUs"), 0)
    assert by_check(run(p5_config(tmp_path, efa_count=2), answers))["dcgm"][2] == "DCGM sees 7 of 8 GPUs"


def test_efa_devices_are_counted_against_the_catalog(tmp_path: Path) -> None:
    status, action, detail = by_check(run(p5_config(tmp_path), healthy_answers()))["efa"]
    assert (status, action) == ("fail", "replace")
    assert detail.startswith("2 of 32 EFA devices bound to the efa driver")


def test_an_efa_port_without_link_drains(tmp_path: Path) -> None:
    import efa_ports

    efa_ports.build(tmp_path / "sys", down=("rdmap32s27",))
    status, action, detail = by_check(run(p5_config(tmp_path, efa_count=2), healthy_answers()))["efa"]
    assert (status, action) == ("fail", "drain")
    assert detail == "EFA link not up: rdmap32s27/1 1: DOWN, 3: Disabled"


def test_the_efa_module_run_as_the_role_s_probe_lists_the_devices_the_check_finds(tmp_path: Path) -> None:
    """The efa_exporter role runs fmcluster/health/efa.py as a script (the node's python3, nothing of fmcluster on
    its path): it names the devices the health check and the exporter count, and no other RDMA device."""
    import subprocess

    from conftest import ROOT
    from fmcluster.health import efa
    import efa_ports

    ib = efa_ports.build(tmp_path)
    probe = subprocess.run(["python3", "-I", str(ROOT / "src/fmcluster/health/efa.py"), str(ib)], capture_output=True,
                           text=True, check=True, cwd=tmp_path)
    assert probe.stdout.split() == [d.name for d in efa.efa_devices(ib)] == ["rdmap16s27", "rdmap32s27"]


def test_on_provider_local_the_gpu_and_efa_checks_skip_and_say_why(tmp_path: Path) -> None:
    report = run(p5_config(tmp_path, real_accelerators=False), healthy_answers())
    skipped = {r.check: r.detail for r in report.results if r.status == "skip"}
    assert set(skipped) == {"gpu-count", "xid", "row-remap", "ecc", "gpu-throttle", "dcgm", "return-diag", "efa"}
    assert skipped["gpu-count"] == ("provider local: this namespace node has none of the 8 GPUs the catalog "
                                    "gives p5.48xlarge")
    assert skipped["efa"] == "provider local: this namespace node has none of the 32 EFA interfaces of p5.48xlarge"


def test_a_cpu_instance_skips_the_gpu_checks_by_the_catalog(tmp_path: Path) -> None:
    config = p5_config(tmp_path)
    config["facts"].update(instance_type="c5.2xlarge", accelerator="none", accelerators_per_node=0, efa_interfaces=0)
    skipped = {r.check: r.detail for r in run(config, healthy_answers()).results if r.status == "skip"}
    assert skipped["xid"] == "the instance catalog gives c5.2xlarge no NVIDIA GPU (accelerator none)"


@pytest.mark.parametrize("mountinfo, stat, words", [
    ("22 1 259:1 / / rw - ext4 /dev/nvme0n1p1 rw\n", ("lustre\n", 0), "/fsx is not mounted"),
    ("22 1 259:1 / / rw - ext4 /dev/nvme0n1p1 rw\n612 22 259:2 / /fsx rw - ext4 /dev/nvme1n1 rw\n", ("ext4\n", 0),
     "/fsx is ext4 (/dev/nvme1n1), not lustre"),
    (None, "timeout", "/fsx does not answer (stat did not finish in time)"),
])
def test_the_shared_file_system_must_be_mounted_and_answer(tmp_path: Path, mountinfo: str | None, stat: tuple,
                                                           words: str) -> None:
    config = p5_config(tmp_path, efa_count=2)
    if mountinfo is not None:
        (tmp_path / "mountinfo").write_text(mountinfo)
    answers = healthy_answers()
    answers[("stat", "-f")] = stat
    status, action, detail = by_check(run(config, answers))["mounts"]
    assert (status, action, detail) == ("fail", "drain", words)


def test_munge_rejected_by_slurmctld_names_the_key(tmp_path: Path) -> None:
    answers = healthy_answers()
    answers[("scontrol", "show", "node")] = ("", 1, "slurm_load_node error: Zero Bytes were transmitted or received\n")
    status, _, detail = by_check(run(p5_config(tmp_path, efa_count=2), answers))["munge"]
    assert status == "fail"
    assert detail.endswith("the munge key here differs from the controller's")


def test_munged_not_answering_fails_munge(tmp_path: Path) -> None:
    answers = healthy_answers()
    answers[("munge", "-n")] = ("", 6, 'munge: Error: Failed to access "/run/munge/munge.socket.2": No such file\n')
    status, _, detail = by_check(run(p5_config(tmp_path, efa_count=2), answers))["munge"]
    assert status == "fail" and detail.startswith("munged does not answer: munge exited 6")


def test_an_unreachable_slurmctld_is_not_blamed_on_munge(tmp_path: Path) -> None:
    answers = healthy_answers()
    answers[("scontrol", "show", "node")] = ("", 1, "slurm_load_node error: Unable to contact slurm controller (connect failure)\n")
    status, _, detail = by_check(run(p5_config(tmp_path, efa_count=2), answers))["munge"]
    assert status == "pass" and "slurmctld not asked" in detail


def test_less_memory_than_slurm_schedules_asks_for_a_new_node(tmp_path: Path) -> None:
    config = p5_config(tmp_path, efa_count=2)
    (tmp_path / "meminfo").write_text("MemTotal:       1048576000 kB\n")
    assert by_check(run(config, healthy_answers()))["memory"] == (
        "fail", "replace", "MemTotal 1024000 MiB is below Slurm's RealMemory 1992294 MiB (memory missing)")


def test_a_full_disk_drains(tmp_path: Path) -> None:
    config = p5_config(tmp_path, efa_count=2, disk=[{"path": str(tmp_path), "min_free_percent": 101}])
    status, action, detail = by_check(run(config, healthy_answers()))["disk"]
    assert (status, action) == ("fail", "drain") and "needs 0 MiB and 101%" in detail


def test_a_check_that_crashes_or_is_unknown_fails_closed(tmp_path: Path) -> None:
    from fmcluster.health import checks

    config = p5_config(tmp_path, efa_count=2)
    config["checks"] = [*config["checks"], {"name": "from-the-future", "title": "t", "scope": "node",
                                             "contexts": ["interval"], "when": [], "reads": "r",
                                             "on_failure": "drain", "source": "s"}]

    def boom(ctx: object) -> object:
        raise KeyError("oops")

    original = checks.REGISTRY["disk"]
    checks.REGISTRY["disk"] = boom  # type: ignore[assignment]
    try:
        results = by_check(run(config, healthy_answers()))
    finally:
        checks.REGISTRY["disk"] = original
    assert results["disk"] == ("fail", "drain", "the check crashed: KeyError: 'oops'")
    assert results["from-the-future"][0] == "fail" and "no check of that name" in results["from-the-future"][2]


def test_checks_after_the_time_budget_fail_instead_of_being_killed_silently(tmp_path: Path) -> None:
    config = p5_config(tmp_path, efa_count=2)
    config["timeouts"]["budget"] = 0
    report = run(config, healthy_answers())
    assert {r.status for r in report.results if r.check != "gpu-count"} <= {"fail"}
    assert by_check(report)["munge"][2] == "not run: the run's time budget was spent by earlier checks"


def test_the_report_round_trips_through_json(tmp_path: Path) -> None:
    report = run(p5_config(tmp_path, kmsg="kmsg-xid79.txt", efa_count=2), healthy_answers())
    again = Report.from_dict(json.loads(json.dumps(report.as_dict())))
    assert again.reason() == report.reason() and again.action == "replace"
    assert report.as_dict()["results"][5]["evidence"] == {"xids": {"79": ["0000:75:00"]}}
