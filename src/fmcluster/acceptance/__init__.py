"""Acceptance: collective-bandwidth runs through Slurm that gate the deploy and drain bad nodes.

The judging API, one for every caller (the deploy's gate, its bisection probes, `fmcluster acceptance
parse`, `invoke doctor`)::

    log = parse_file(path)                       # or parse_stream(lines): streaming, bounded memory
    exp = expectation_for(instance, nodes, ...)  # or resolve_expectation(log, catalog, ...) for a log at hand
    verdict = judge(log, exp)                    # .status pass/fail/not_judged, .findings (stable codes)
    log, verdict = judge_file(path, exp)         # both at once; an unreadable file fails, never passes

Modules: parser (log → ParsedLog) · expectation (catalog baselines → Expectation) · verdict (ParsedLog +
Expectation → Verdict; CODES lists every finding) · neuron (AWS Neuron's nccom-test: its output, bus factors,
NeuronCores per instance, public figures) · bench (the CPU stand-in for nccl-tests) · slurm (sbatch,
wait, drain) · bisect (pair tests → bad nodes) · results (per-run JSON + summary) · runner
(`run_acceptance(tenant)`, what the deploy flow calls).
"""

from fmcluster.acceptance.expectation import Expectation, NotJudgeable, expectation_for, resolve_expectation
from fmcluster.acceptance.model import ParsedLog, json_safe
from fmcluster.acceptance.parser import parse_file, parse_stream, parse_text
from fmcluster.acceptance.verdict import CODES, Finding, Verdict, judge, judge_file, render

__all__ = [
    "CODES", "Expectation", "Finding", "NotJudgeable", "ParsedLog", "Verdict", "expectation_for", "judge",
    "judge_file", "json_safe", "parse_file", "parse_stream", "parse_text", "render", "resolve_expectation",
]
