"""A GPU node serves again only after this boot's DCGM diagnostic at the tenant's level passed (issue 38).

`fmcluster-health boot` runs once per boot before slurmd starts (fmcluster-health-boot.service, GPU nodes only)
and records its verdict with the boot's id; the interval check `return-diag` that slurmd runs when it starts
(HealthCheckProgram) passes only on that record: of this boot, at the tenant's level or deeper, healthy. Fed
with recorded dcgmi outputs (no GPU here); the record and the boot id are real files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fmcluster.health import checks, cli, engine, node
from fmcluster.health.model import Report
from health_helpers import BOOT_ID, NODE, Recorded, diag_r2_pass, gpu_outputs, healthy_answers, p5_config


def interval(config: dict) -> tuple[str, str, str]:
    report = engine.run_checks(config, "interval", NODE, Recorded(healthy_answers()))
    result = next(r for r in report.results if r.check == "return-diag")
    return result.status, result.action, result.detail


def boot(config: dict, answers: dict) -> Report:
    return engine.run_checks(config, "boot", NODE, Recorded(answers), diag_level=config["return_diag_level"])


def record(config: dict) -> dict:
    return json.loads((Path(config["state_dir"]) / "boot.json").read_text())


def test_the_boot_run_passes_dcgm_level_2_and_its_record_lets_the_node_serve(tmp_path: Path) -> None:
    config = p5_config(tmp_path, efa_count=2, booted=False)
    assert interval(config)[0] == "fail"
    answers = {**healthy_answers(), ("dcgmi", "diag", "-r", "2", "-j"): (diag_r2_pass(), 0)}
    report = boot(config, answers)
    assert [(r.check, r.status) for r in report.results] == [("dcgm-deep", "pass")]
    assert report.results[0].detail == "DCGM sees 8 GPUs; dcgmi diag -r 2 passed 12 tests"
    assert record(config) == {"boot_id": BOOT_ID, "level": 2, "healthy": True, "reason": "",
                              "started": report.started}
    assert interval(config) == ("pass", "none", "this boot's DCGM diagnostic (level 2) passed")


def test_a_failed_boot_diagnostic_keeps_the_node_out_and_asks_for_a_reboot(tmp_path: Path) -> None:
    config = p5_config(tmp_path, efa_count=2, booted=False)
    failed = {**healthy_answers(), ("dcgmi", "diag", "-r", "2", "-j"): (gpu_outputs.fixture("dcgmi-diag-r1-fail.json"), 226)}
    report = boot(config, failed)
    assert not report.healthy and record(config)["healthy"] is False
    status, action, detail = interval(config)
    assert (status, action) == ("fail", "reboot")
    assert detail.startswith("the boot's diagnostic failed: fmcluster-health: dcgm-deep: dcgmi diag -r 2: "
                             "Page Retirement/Row Remap failed on GPU 2"), detail


def test_a_record_of_an_earlier_boot_does_not_count(tmp_path: Path) -> None:
    config = p5_config(tmp_path, efa_count=2)
    assert interval(config)[0] == "pass"
    (tmp_path / "boot_id").write_text("0e6a4d52-0000-4000-8000-000000000001\n")  # rebooted since
    status, action, detail = interval(config)
    assert (status, action) == ("fail", "reboot") and "of an earlier boot" in detail


@pytest.mark.parametrize("level, words", [(3, "ran at level 2, the tenant asks for 3")])
def test_a_shallower_diagnostic_than_the_tenant_asks_for_does_not_count(tmp_path: Path, level: int,
                                                                        words: str) -> None:
    config = p5_config(tmp_path, efa_count=2, return_diag_level=level)
    (Path(config["state_dir"]) / "boot.json").write_text(json.dumps(
        {"boot_id": BOOT_ID, "level": 2, "healthy": True, "reason": "", "started": 0}))
    assert words in interval(config)[2]


@pytest.mark.parametrize("content, words", [
    (None, "no return diagnostic recorded"),
    ("{not json", "is not JSON"),
    ('["a list"]', "of an earlier boot"),
    ('{"boot_id": "' + BOOT_ID + '", "level": 2}', "the boot's diagnostic failed: no reason recorded"),
])
def test_a_missing_or_unreadable_record_fails_closed(tmp_path: Path, content: str | None, words: str) -> None:
    config = p5_config(tmp_path, efa_count=2, booted=content is not None)
    if content is not None:
        (Path(config["state_dir"]) / "boot.json").write_text(content)
    status, _, detail = interval(config)
    assert status == "fail" and words in detail, detail


def test_the_boot_run_waits_as_long_as_the_level_takes_not_slurmd_s_60_s(tmp_path: Path) -> None:
    config = p5_config(tmp_path)
    assert engine.budget(config, "interval", 2) == 50
    assert engine.budget(config, "boot", 2) == 50 + 900
    assert engine.budget(config, "boot", 3) == 50 + 3600
    assert engine.budget(config, "diag", 4) == 50 + 10800


def test_the_boot_command_reads_the_tenant_s_level_from_the_config(tmp_path: Path) -> None:
    config = p5_config(tmp_path, efa_count=2, booted=False, return_diag_level=3,
                       commands={"dcgmi": ["false"]})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        assert node.run(str(path), "boot", NODE, False, [], out=sink) == 1
    assert record(config)["level"] == 3 and record(config)["healthy"] is False
    assert "dcgm-deep" in out.read_text()


def serving(config: dict, boot: str = BOOT_ID) -> tuple[str, bool]:
    """What `fmcluster-health boot-serving` leaves: the role runs it where the boot unit arrived while slurmd served."""
    return checks.write_serving_marker(config["state_dir"], boot)


def test_a_node_given_the_unit_while_serving_passes_on_this_boot_and_runs_the_diagnostic_at_the_next(
        tmp_path: Path) -> None:
    """An upgrade of a running cluster: the role installs fmcluster-health-boot.service on a node whose slurmd
    already started this boot. No diagnostic on busy GPUs, and return-diag must not drain it (every node of the
    upgrade at once would open the repair agent's breaker): it passes on this boot's serving marker and says so."""
    config = p5_config(tmp_path, efa_count=2, booted=False)
    assert interval(config)[:2] == ("fail", "reboot")
    path, written = serving(config)
    assert written and serving(config) == (path, False)  # a second converge writes nothing
    status, action, detail = interval(config)
    assert (status, action) == ("pass", "none"), detail
    assert detail == (f"fmcluster-health-boot.service was installed while this node served ({path}): no diagnostic "
                      "on busy GPUs; it runs at the next boot")
    (tmp_path / "boot_id").write_text("0e6a4d52-0000-4000-8000-000000000001\n")  # the next boot: the unit's turn
    status, action, detail = interval(config)
    assert (status, action) == ("fail", "reboot") and "no return diagnostic recorded" in detail, detail


def test_this_boot_s_record_decides_over_a_serving_marker(tmp_path: Path) -> None:
    """The marker never hides a verdict: a failed diagnostic of this boot keeps the node out whatever the marker."""
    config = p5_config(tmp_path, efa_count=2, booted=False)
    serving(config)
    (Path(config["state_dir"]) / "boot.json").write_text(json.dumps(
        {"boot_id": BOOT_ID, "level": 2, "healthy": False, "reason": "dcgm-deep: PCIe failed", "started": 0}))
    status, action, detail = interval(config)
    assert (status, action) == ("fail", "reboot") and "PCIe failed" in detail, detail


def test_the_boot_serving_command_writes_the_marker_of_the_boot_it_reads(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = p5_config(tmp_path, efa_count=2, booted=False)
    argv = ["boot-serving", f"--state-dir={config['state_dir']}", f"--boot-id-file={tmp_path / 'boot_id'}"]
    assert cli.main(argv) == 0 and capsys.readouterr().out.startswith("recorded ")
    assert cli.main(argv) == 0 and capsys.readouterr().out.startswith("unchanged ")
    assert json.loads((Path(config["state_dir"]) / "boot-serving.json").read_text()) == {"boot_id": BOOT_ID}
    assert interval(config)[0] == "pass"
