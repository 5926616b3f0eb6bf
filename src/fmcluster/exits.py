"""Every exit code fmcluster's commands return: one table for `invoke`, the `fmcluster` CLI and every command.

One meaning per code, the same for every command, so that a script or a timer can act on the number without
knowing which command ran. No other module defines an exit code (tests/test_exits.py); the table in README.md
("Exit codes") is rendered from this one (`markdown_table`). The node's own program (`fmcluster-health`, run by
slurmd as prolog/epilog/health check) speaks Slurm's convention instead and is not covered here.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """An exit code and, in its docstring (`ExitCode.X.__doc__`), what it tells the operator."""

    def __new__(cls, value: int, doc: str) -> ExitCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.__doc__ = " ".join(doc.split())
        return member

    OK = 0, (
        "Done; for a check (acceptance, doctor, nodes, validate): positive evidence that all is well.")

    FAILED = 1, (
        "The command ran and what it did or checked failed: a step, a stack, a node unhealthy, an acceptance "
        "verdict of fail, doctor's findings, or a check that could not run (fail closed: never a pass without "
        "it). Read the output above the exit for the step and its evidence.")

    INVALID = 2, (
        "The input was refused before anything changed: an invalid tenant spec (every problem is listed with its "
        "fix), a value the scheduler's own checks refuse (its service's schema), a capacity refusal, an unknown option value, a log that "
        "cannot be read, or a node `invoke replace` does not replace. Fix the input and run again.")

    NOT_READY = 3, (
        "There is nothing to act on yet: no AWS endpoint (no credentials, or the local emulator is not running), "
        "nothing deployed or published, no nodes known, no controller, or Slurm cannot be used. Deploy first "
        "(`invoke deploy --org=X`), or check credentials.")

    CANCELLED = 4, (
        "The operator declined the confirmation (`invoke destroy` without --yes): nothing was deleted.")

    NOT_JUDGED = 5, (
        "A job log was read and nothing in it failed, but there was nothing to judge it against (`fmcluster "
        "acceptance parse` without an instance type, or a Neuron log): give --instance-type or --org.")


#: The acceptance verdict's status → the exit code of a command that reports it (`fmcluster acceptance parse`).
VERDICT_EXITS = {"pass": ExitCode.OK, "fail": ExitCode.FAILED, "not_judged": ExitCode.NOT_JUDGED}


def meaning(code: ExitCode) -> str:
    """What the code tells the operator, in one line (its docstring)."""
    return code.__doc__ or ""


def markdown_table() -> str:
    """The README's table of exit codes (tests/test_exits.py keeps the two equal)."""
    rows = ["| exit | name | meaning |", "|---|---|---|"]
    rows += [f"| {code.value} | `{code.name}` | {meaning(code)} |" for code in ExitCode]
    return "\n".join(rows) + "\n"
