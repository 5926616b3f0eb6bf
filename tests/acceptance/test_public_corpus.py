"""Real nccl-tests output from public repositories and issues (tests/fixtures/nccl/public/): the parser reads every
file, and the gate's verdict on each is the one its sidecar (`<name>.source.json`) writes down with a reason.

The sidecar names the source (repository, path and commit, or the issue), the licence, how the file was trimmed
and what a human expert would conclude. These files disagreed with the generated fixtures in three ways, each
fixed and pinned here: a log pasted indented (Markdown) lost its footer and read as truncated, older aws-ofi-nccl
names its platform by family (`P4d`), and a run that hung in NCCL's set-up was called "never started".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fmcluster.acceptance.expectation import expectation_for, resolve_expectation
from fmcluster.acceptance.parser import parse_file
from fmcluster.acceptance.verdict import Verdict, judge, render
from fmcluster.catalog import load_catalog

PUBLIC = Path(__file__).resolve().parent.parent / "fixtures" / "nccl" / "public"
LOGS = sorted(PUBLIC.glob("*.log"))


def _sidecar(log: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(log.with_suffix(".source.json").read_text())
    return data


def _cases() -> list[tuple[str, dict[str, Any]]]:
    return [(log.name, case) for log in LOGS for case in _sidecar(log)["expected"]]


def _judge(name: str, case: dict[str, Any]) -> Verdict:
    log = parse_file(PUBLIC / name)
    catalog = load_catalog()
    if case["instance_type"] is None:
        found = resolve_expectation(log, catalog)
        return judge(log, found.expectation, not_judged_reason=found.reason)
    per_node = case.get("ranks_per_node")
    return judge(log, expectation_for(catalog[case["instance_type"]], case["nodes"], ranks_per_node=per_node))


def test_the_corpus_covers_the_classes_the_issue_names() -> None:
    assert len(LOGS) >= 6
    shows = " ".join(_sidecar(log)["shows"] for log in LOGS).lower()
    for words in ("healthy 2x p4d", "socket", "wrong results", "hung", "killed mid-run", "nccl_debug=info",
                  "all_gather"):
        assert words in shows, words


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_every_public_log_names_its_source_and_is_read(log: Path) -> None:
    side = _sidecar(log)
    assert side["source"].get("url") or side["source"].get("note"), log.name
    assert side["licence"] and side["trimmed"] and side["shows"] and side["expected"], log.name
    for case in side["expected"]:
        assert case["why"], log.name
    parsed = parse_file(log)
    # read: a table (or, for the hung run, the header and rank list), never garbled lines
    assert parsed.rows or parsed.rank_lines_seen, log.name
    assert parsed.garbled_lines == 0 and parsed.unreadable_sizes == (), log.name


@pytest.mark.parametrize(("name", "case"), _cases(), ids=lambda x: x if isinstance(x, str) else
                         f"{x['instance_type']}x{x['nodes']}")
def test_the_verdict_is_the_experts(name: str, case: dict[str, Any]) -> None:
    v = _judge(name, case)
    assert v.status == case["status"], f"{name}: {case['why']}\n{render(v)}"
    failed = {f.code for f in v.failures}
    assert set(case["codes"]) <= failed, f"{name}: {case['codes']} not all in {sorted(failed)}\n{render(v)}"
    if case["status"] != "fail":
        assert not failed, render(v)


def test_an_indented_log_keeps_its_footer_and_table() -> None:
    log = parse_file(PUBLIC / "p5_2node_eks_excerpt.log")
    assert log.completed and log.tables == 1 and log.avg_busbw_gbps == pytest.approx(79.9352)
    assert log.row_at(1 << 30) is not None


def test_an_old_plugin_names_its_platform_by_family() -> None:
    log = parse_file(PUBLIC / "p4d_2node_efa_info_eks.log")
    assert log.network.platform == "P4d"
    found = resolve_expectation(log, load_catalog())
    assert found.expectation is not None and found.expectation.instance_type == "p4d.24xlarge"
    assert "printed as the family P4d" in found.reason


def test_every_rank_of_the_healthy_efa_run_is_seen_on_efa() -> None:
    log = parse_file(PUBLIC / "p4d_2node_efa_info_eks.log")
    assert len(log.processes) == 16 and all(p.providers == ("efa",) for p in log.processes)
    assert {rt.transport for rt in log.rank_transports} == {"AWS Libfabric"}
    assert log.network.gdr is True and log.hosts == ("nccl-tests-efa-16-worker-0", "nccl-tests-efa-16-worker-1")


def test_a_hang_in_set_up_is_not_called_never_started() -> None:
    v = _judge("hang_at_init_gtx1080ti.log", {"instance_type": None, "nodes": None})
    assert v.codes[0] == "truncated" and "never started" not in v.cause and "set up" in v.cause


# floors of the other collectives (data/nccl_profiles.yml `collective_floors`) --------------------------------
def test_all_gather_and_reduce_scatter_floors_come_from_published_figures() -> None:
    exp = expectation_for(load_catalog()["p5.48xlarge"], 2)
    for collective in ("all_gather", "reduce_scatter"):
        floor, source, origin = exp.floor_for(collective, 16)
        assert origin == "published" and floor == pytest.approx(250 * 370 / 480, abs=0.01)
        assert "AWS ParallelCluster" in source and "nccl-tests/issues/212" in source


def test_collectives_without_a_public_figure_keep_a_floor_marked_derived() -> None:
    exp = expectation_for(load_catalog()["p5.48xlarge"], 2)
    for collective in ("alltoall", "broadcast", "sendrecv"):
        floor, source, origin = exp.floor_for(collective, 16)
        assert origin == "derived" and source.startswith("derived: 0.125 x the") and floor is not None


def test_every_collective_has_a_floor_rule_with_a_cited_source() -> None:
    from fmcluster.acceptance.expectation import COLLECTIVES, collective_floors

    rules = collective_floors()
    assert set(rules) == set(COLLECTIVES) - {"all_reduce"}
    assert all(r.source.count("https://") >= 1 and r.basis in ("published", "derived") for r in rules.values())



def test_the_time_cells_rounding_is_allowed_for_and_no_more() -> None:
    """A real sub-µs in-place time ('0.22') is 2.3% coarse; a 10% disagreement at the same time still fails."""
    from fmcluster.acceptance.parser import parse_text

    head = (PUBLIC / "rtx3090_1rank_inplace_noop.log").read_text().split("           8  ")[0]
    ok = ("       16384          4096     float     sum      -1     5.47    3.00    0.00      0     0.22   72.87"
          "    0.00      0\n")
    bad = ok.replace("   72.87 ", "   81.50 ")
    foot = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0\n"
    assert "non_physical" not in judge(parse_text(head + ok + foot), None).codes
    assert "non_physical" in judge(parse_text(head + bad + foot), None).codes


@pytest.mark.parametrize(("name", "case"), [c for c in _cases() if c[1].get("ranks_per_node") is None],
                         ids=lambda x: x if isinstance(x, str) else f"{x['instance_type']}x{x['nodes']}")
def test_the_cli_and_doctor_say_the_same_of_each_public_log(name: str, case: dict[str, Any],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """One code path: `fmcluster acceptance parse` exits as the expert's verdict says, and doctor --log agrees."""
    from fmcluster.cli import main
    from fmcluster.doctor.report import diagnose_log
    from fmcluster.exits import ExitCode

    args = ["acceptance", "parse", "--json", str(PUBLIC / name)]
    if case["instance_type"]:
        args += ["--instance-type", case["instance_type"], "--nodes", str(case["nodes"])]
    code = main(args)
    out = json.loads(capsys.readouterr().out)
    assert (code, out["status"]) == ({"pass": ExitCode.OK, "fail": ExitCode.FAILED, "not_judged": ExitCode.NOT_JUDGED}[case["status"]], case["status"])
    if case["instance_type"] is None:
        assert diagnose_log(PUBLIC / name).acceptance == {"status": out["status"], "codes": out["codes"],
                                                          "cause": out["cause"]}


# --- every class, from a real public log edited the same way -------------------------------------------------
#: The healthy 2x p4d EFA run (aws-samples/aws-efa-eks, see its .source.json) and its 1 GiB reference row.
HEALTHY = (PUBLIC / "p4d_2node_efa_info_eks.log").read_bytes()
ROW = b"  1073741824     268435456   float     sum    47392   22.66   42.48  5e-07    47420   22.64   42.46  5e-07"
RANK9 = b"[1,9]<stdout>:nccl-tests-efa-16-worker-1:26:"
EDITS: dict[str, tuple[bytes, str | None]] = {
    # class: (the real log edited, the finding that must fail it; None: it must still pass)
    "a row's busbw disagrees with its algbw": (HEALTHY.replace(ROW, ROW.replace(b"42.48", b"84.96", 1)), "non_physical"),
    "a non-finite figure": (HEALTHY.replace(ROW, ROW.replace(b"42.48", b"  nan", 1)), "non_finite"),
    "a figure above the fabric's ceiling": (HEALTHY.replace(ROW, ROW.replace(b"47392   22.66   42.48",
                                                                              b"  473 2270.0 4248.0", 1)), "non_physical"),
    "wrong data": (HEALTHY.replace(ROW, ROW.replace(b"5e-07    47420", b"    3    47420", 1)), "wrong_data"),
    "one rank's channel over sockets": (HEALTHY.replace(
        RANK9 + b"67 [1] NCCL INFO Channel 00 : 9[101d0] -> 0[101c0] [send] via NET/AWS Libfabric/1/GDRDMA",
        RANK9 + b"67 [1] NCCL INFO Channel 00 : 9[101d0] -> 0[101c0] [send] via NET/Socket/0"), "rank_off_efa"),
    "one rank's network is Socket, its channels still say Libfabric": (HEALTHY.replace(
        RANK9 + b"26 [1] NCCL INFO Using network AWS Libfabric", RANK9 + b"26 [1] NCCL INFO Using network Socket"),
        "rank_off_efa"),
    "a failure line in the middle": (HEALTHY.replace(ROW, ROW + b"\n[1,3]<stdout>:nccl-tests-efa-16-worker-0: Test NCCL "
                                                     b"failure common.cu:1000 'unhandled system error'", 1), "test_failure"),
    "the run cut before its footer": (HEALTHY[:HEALTHY.index(b"# Out of bounds")], "truncated"),
    "CRLF line ends and ANSI colours": (HEALTHY.replace(b"\n", b"\r\n").replace(ROW, b"\x1b[32m" + ROW + b"\x1b[0m"), None),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_each_class_fails_on_the_real_healthy_log_edited_to_show_it(name: str, tmp_path: Path) -> None:
    from fmcluster.acceptance.expectation import expectation_for
    from fmcluster.acceptance.parser import parse_file
    from fmcluster.acceptance.verdict import judge, render
    from fmcluster.catalog import load_catalog

    edited, code = EDITS[name]
    assert edited != HEALTHY or code is None, "the edit did not apply: the public log changed"
    log = tmp_path / "edited.log"
    log.write_bytes(edited)
    v = judge(parse_file(log), expectation_for(load_catalog()["p4d.24xlarge"], 2))
    if code is None:
        assert v.passed, render(v)
    else:
        assert not v.passed and code in v.codes, render(v)
