"""One exit-code table (fmcluster.exits.ExitCode) for invoke, the `fmcluster` CLI and every command: one meaning per
code, each documented for the operator, and no other module defining codes of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fmcluster.commands.acceptance_cli import PARSE_EPILOG
from fmcluster.exits import VERDICT_EXITS, ExitCode, markdown_table, meaning

ROOT = Path(__file__).resolve().parent.parent
EXITS_MODULE = ROOT / "src" / "fmcluster" / "exits.py"
#: A constant that names an exit code: EXIT_FAILED, FAILED_EXIT, EXIT_CODES, NOT_READY_EXIT_CODE, ...
EXIT_NAME = re.compile(r"(?:^|_)EXIT(?:_|S?$)")


def python_files() -> list[Path]:
    return [ROOT / "tasks.py", *sorted((ROOT / "src" / "fmcluster").rglob("*.py"))]


def exit_constants(path: Path) -> list[str]:
    """Names of module- or class-level constants (upper case) in `path` that name an exit code, and enums of exit
    codes (an `...Exit...` class deriving from IntEnum)."""
    found: list[str] = []

    def scan(body: list[ast.stmt], where: str) -> None:
        for node in body:
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if "exit" in node.name.lower() and bases & {"IntEnum", "Enum", "IntFlag"}:
                    found.append(f"{where}{node.name}")
                scan(node.body, f"{where}{node.name}.")
            elif isinstance(node, (ast.If, ast.Try)):
                scan(node.body, where)
            for target in targets:
                if isinstance(target, ast.Name) and target.id.isupper() and EXIT_NAME.search(target.id):
                    found.append(f"{where}{target.id}")

    scan(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body, "")
    return found


def test_no_module_but_fmcluster_exits_defines_an_exit_code() -> None:
    offenders = {str(path.relative_to(ROOT)): names for path in python_files()
                 if path != EXITS_MODULE and (names := exit_constants(path))}
    assert not offenders, f"exit codes belong in src/fmcluster/exits.py (ExitCode): {offenders}"


def test_the_scan_would_see_an_exit_code_constant(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import enum\nEXIT_FAILED = 1\nOK = 0\nclass Exits(enum.IntEnum):\n    A = 1\n"
                      "class C:\n    NOT_READY_EXIT = 3\nexit_code = 2\n")
    assert exit_constants(module) == ["EXIT_FAILED", "Exits", "C.NOT_READY_EXIT"]


def test_every_code_has_its_own_number_and_a_meaning_for_the_operator() -> None:
    # An IntEnum member with a repeated value is silently an alias: two meanings would share one code.
    assert len(ExitCode.__members__) == len(list(ExitCode)), "two names share one exit code"
    assert ExitCode.OK == 0 and sorted(int(code) for code in ExitCode) == list(range(len(ExitCode)))
    for code in ExitCode:
        text = meaning(code)
        assert text and text != ExitCode.__doc__ and len(text) > 40, f"{code.name} says nothing to the operator"


def test_cancelled_not_ready_and_not_judged_are_told_apart() -> None:
    assert len({ExitCode.CANCELLED, ExitCode.NOT_READY, ExitCode.NOT_JUDGED}) == 3


def test_the_readme_table_is_the_enum() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert markdown_table() in readme, "README.md's 'Exit codes' table differs from fmcluster.exits; regenerate it " \
                                       "with fmcluster.exits.markdown_table()"


@pytest.mark.parametrize("status", sorted(VERDICT_EXITS))
def test_acceptance_parse_documents_the_code_of_each_verdict(status: str) -> None:
    code = VERDICT_EXITS[status]
    shown = status.replace("_", " ")
    assert re.search(rf"^  {int(code)}  {shown}:", PARSE_EPILOG, re.M), f"--help of parse: {shown} is not {int(code)}"
    doc = (ROOT / "docs" / "acceptance.md").read_text(encoding="utf-8")
    assert f"| {int(code)} | {shown} |" in doc


def test_acceptance_parse_documents_unreadable_as_invalid_input() -> None:
    assert re.search(rf"^  {int(ExitCode.INVALID)}  unreadable:", PARSE_EPILOG, re.M)
