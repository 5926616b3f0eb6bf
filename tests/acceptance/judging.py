"""What the false-pass tests share: judge a fixture log, and assert a failure with its code and words."""

from __future__ import annotations

from pathlib import Path

from fmcluster.acceptance.expectation import expectation_for
from fmcluster.acceptance.parser import parse_file
from fmcluster.acceptance.verdict import Verdict, judge, render
from fmcluster.catalog import load_catalog

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"


def verdict(name: str, instance: str = "p5.48xlarge", nodes: int = 2, **kw: object) -> Verdict:
    exp = expectation_for(load_catalog()[instance], nodes, **kw)  # type: ignore[arg-type]
    return judge(parse_file(FIXTURES / name), exp)


def fails_with(v: Verdict, code: str, *words: str) -> None:
    assert not v.passed, render(v)
    finding = next((f for f in v.failures if f.code == code), None)
    assert finding is not None, f"no {code} in {v.codes}\n{render(v)}"
    for w in words:
        assert w in finding.message, finding.message
