"""The verdict gates on the catalog's floors and names the likely cause of every failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from fmcluster.acceptance.expectation import expectation_for
from fmcluster.acceptance.parser import parse_file
from fmcluster.acceptance.verdict import judge, render
from fmcluster.catalog import load_catalog

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"


def verdict(name: str, instance: str = "p5.48xlarge", nodes: int = 2, override: float | None = None,
            collective: str | None = "all_reduce"):
    return judge(parse_file(FIXTURES / name), expectation_for(load_catalog()[instance], nodes, override,
                                                              collective=collective))


@pytest.mark.parametrize(
    ("name", "instance", "nodes", "collective"),
    [
        ("p5_1node_all_reduce_ok.log", "p5.48xlarge", 1, "all_reduce"),
        ("p5_2node_all_reduce_ok.log", "p5.48xlarge", 2, "all_reduce"),
        ("p5_4node_all_reduce_ok.log", "p5.48xlarge", 4, "all_reduce"),
        ("p5_16node_all_reduce_ok.log", "p5.48xlarge", 16, "all_reduce"),
        ("p4d_2node_all_reduce_ok.log", "p4d.24xlarge", 2, "all_reduce"),
        ("p5_2node_all_gather_ok.log", "p5.48xlarge", 2, "all_gather"),
        ("p5_2node_interleaved.log", "p5.48xlarge", 2, "all_reduce"),
    ],
)
def test_healthy_runs_pass_and_state_the_baseline(name: str, instance: str, nodes: int, collective: str) -> None:
    v = verdict(name, instance, nodes, collective=collective)
    assert v.passed, render(v)
    assert ("healthy clusters show ~" in v.baseline or f"no public {collective} floor exists" in v.baseline
            or "(published: " in v.baseline)
    assert v.busbw_gbps is not None and f"measured {v.busbw_gbps:.2f} GB/s" in v.baseline


def test_bandwidth_right_answer_names_floor_expected_figure_and_source() -> None:
    v = verdict("p5_2node_all_reduce_ok.log")
    assert "floor 250 GB/s" in v.baseline and "~437 GB/s at 1 GiB on 2 node(s)" in v.baseline
    assert "ParallelCluster" in v.baseline and "REFERENCE.md" in v.baseline
    assert v.busbw_gbps is not None and 430 < v.busbw_gbps < 450


@pytest.mark.parametrize(
    ("name", "nodes", "code", "words"),
    [
        ("p5_2node_socket_fallback.log", 2, "socket_fallback", "plugin was not loaded"),
        ("p5_2node_provider_tcp.log", 2, "provider_not_efa", "'tcp' provider"),
        ("p5_2node_wrong_data.log", 2, "wrong_data", "64 MiB"),
        ("p5_4node_killed_mid_run.log", 4, "killed", "TIME LIMIT"),
        ("p5_2node_truncated.log", 2, "truncated", "after 32 MiB"),
        ("p5_2node_ranks_not_wired.log", 2, "ranks_not_wired", "independent"),
        ("p5_2node_launch_failed.log", 2, "plugin_init_failed", "aws-ofi-nccl failed"),
        ("p5_2node_gdr_off.log", 2, "below_floor", "GPUDirect RDMA is off"),
    ],
)
def test_each_failure_shape_fails_with_its_cause(name: str, nodes: int, code: str, words: str) -> None:
    v = verdict(name, nodes=nodes)
    assert not v.passed
    assert v.failures[0].code == code, render(v)
    assert words in v.failures[0].message
    assert v.failures[0].fix


def test_gdr_off_alone_is_a_warning_when_bandwidth_is_above_the_floor() -> None:
    v = verdict("p5_2node_gdr_off.log", override=100)
    assert v.passed and [f.code for f in v.findings] == ["gdr_off"]


def test_a_slow_run_explained_by_configuration_blames_no_node() -> None:
    v = verdict("p5_2node_gdr_off.log")
    assert v.codes == ("gdr_off", "below_floor") and not v.blames_node
    assert verdict("p5_2node_socket_fallback.log").blames_node is False


def test_a_slow_run_with_no_visible_cause_blames_a_node_so_bisection_runs() -> None:
    v = verdict("p5_2node_all_reduce_ok.log", override=460)
    assert v.failures[0].code == "below_floor" and v.blames_node


def test_a_tenant_override_replaces_the_catalog_floor() -> None:
    v = verdict("p5_2node_all_reduce_ok.log", override=460)
    assert not v.passed and v.expectation is not None and v.expectation.floor_from == "tenant override"
    assert "floor 460 GB/s (tenant override; the catalog's is 250)" in v.baseline
    assert "under the floor of 460 GB/s" in v.cause
    assert "no configuration problem is visible" in v.cause


def test_floors_depend_on_the_node_count_class_from_the_catalog() -> None:
    p5 = load_catalog()["p5.48xlarge"]
    assert expectation_for(p5, 1).min_busbw_gbps == 300
    assert expectation_for(p5, 16).min_busbw_gbps == 250
    assert expectation_for(p5, 2).expected_ranks == 16
    assert (expectation_for(p5, 1).transport, expectation_for(p5, 2).transport) == ("nvlink", "efa")


def test_socket_is_expected_on_instances_without_efa() -> None:
    v = verdict("p5_2node_socket_fallback.log", instance="c5.2xlarge")
    assert not any(f.code == "socket_fallback" for f in v.findings)


def test_rank_count_mismatch_fails() -> None:
    v = verdict("p5_2node_all_reduce_ok.log", nodes=4)
    assert [f.code for f in v.failures] == ["rank_count", "host_count"]


def test_the_docs_table_of_codes_is_generated_from_the_registry_and_current() -> None:
    """docs/acceptance.md lists every finding code with its severity, blame and source once: generated from CODES."""
    import re

    from fmcluster.acceptance import docs
    from fmcluster.acceptance.verdict import CODES

    page = docs.page_path().read_text()
    assert docs.render_page(page) == page, "run: .venv/bin/python -m fmcluster.acceptance.docs"
    assert sorted(re.findall(r"^\| `(\w+)` \| (?:fail|warn)", page, re.M)) == sorted(CODES)
    assert all(info.source and info.when and info.severity.split()[0] in ("fail", "warn") for info in CODES.values())
    assert all(info.blames_node for info in CODES.values() if info.explained_by_configuration)
