"""Hostile values for `health.repair` (the controller's repair agent's budgets, model.Repair): every bad value is
refused by `invoke validate` with the exact reason, the file and the line of the key, its key path and the fix,
never a traceback; the edges the agent can work with are accepted and reach the model as written.

The budgets are what keeps the agent from replacing nodes in a loop (docs/health.md), so a value that silently
disables them is refused too: a window under an hour forgets each replacement about as soon as its successor has
settled (the schema's `minimum: 1`), and a breaker share of 0 would open on any failure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fmcluster.model import Repair, load_tenant
from hostile_helpers import ROOT, SPEC_REL, assert_refused, spec_text, validate, write_tenant

P = "tenant.health.repair"
SCHEMA = json.loads((ROOT / "src/fmcluster/data/tenant.schema.json").read_text())
HEALTH = SCHEMA["properties"]["tenant"]["properties"]["health"]["properties"]
REPAIR = HEALTH["repair"]
# The fix of a wrong type or range ends with the key's own description, as the schema words it.
DESCRIBED = {key: spec["description"] for key, spec in REPAIR["properties"].items()}
DEMO = (ROOT / "inventories/demo/group_vars/all/tenant.yml").read_text().replace("org: demo", "org: acme")
ONE_LINE = "write the value on one line, with printable characters only"
KNOWN = "remove it or use one of: backoff_seconds, breaker_share, enabled, reboots_per_node, replacements_per_queue, window_hours"
DIGITS = "no spec number needs more than 15 digits: check for a typo"
DECIMAL = "write the number in plain decimal digits (e.g. 8, 16, 90), or quote it if you meant text"


@dataclass(frozen=True)
class Case:
    id: str
    key: str  # below tenant.health.repair ('' for the section itself)
    value: Any  # the Python value written by yaml.safe_dump, or RAW text for the lines under `repair:`
    message: str
    fix: str
    raw: bool = False

    @property
    def path(self) -> str:
        return f"{P}.{self.key}" if self.key else P

    def text(self) -> str:
        if self.raw:
            return DEMO + "  health:\n    repair:\n" + "".join(f"      {line}\n" for line in self.value.splitlines())
        if not self.key:
            return spec_text(lambda t: t.setdefault("health", {}).__setitem__("repair", self.value))
        return spec_text(lambda t: t.setdefault("health", {}).setdefault("repair", {}).__setitem__(self.key, self.value))


def whole(key: str, low: int, high: int) -> str:
    return f"use a whole number from {low} to {high}. {DESCRIBED[key]}"


def typed(key: str, kind: str) -> str:
    return f"write {kind}. {DESCRIBED[key]}"


CASES = [
    # --- reboots_per_node: 0..10 reboots of one node in the window -----------------------------------------------
    Case("reboots-negative", "reboots_per_node", -1, "-1 is out of range", whole("reboots_per_node", 0, 10)),
    Case("reboots-11", "reboots_per_node", 11, "11 is out of range", whole("reboots_per_node", 0, 10)),
    Case("reboots-int64", "reboots_per_node", 2**63,
         "YAML syntax error: the number '9223372036854775808' has more than 15 digits", DIGITS),
    Case("reboots-decimal", "reboots_per_node", 1.0, "1.0 is a decimal number, expected a whole number",
         "write 1, without the decimal point"),
    Case("reboots-text", "reboots_per_node", "1", "'1' is text, expected a whole number",
         typed("reboots_per_node", "a whole number")),
    Case("reboots-bool", "reboots_per_node", True, "True is a true/false value, expected a whole number",
         typed("reboots_per_node", "a whole number")),
    Case("reboots-list", "reboots_per_node", [1], "[1] is a list, expected a whole number",
         typed("reboots_per_node", "a whole number")),
    Case("reboots-null", "reboots_per_node", None, "the value is empty (null), expected a whole number",
         typed("reboots_per_node", "a whole number")),
    Case("reboots-hex", "reboots_per_node", "reboots_per_node: 0x10",
         "YAML syntax error: '0x10' is not a decimal number: YAML 1.1 reads it as a hexadecimal number, e.g. 0x10 is 16",
         DECIMAL, raw=True),
    # --- replacements_per_queue: 0..100 in the window ------------------------------------------------------------
    Case("replacements-negative", "replacements_per_queue", -1, "-1 is out of range",
         whole("replacements_per_queue", 0, 100)),
    Case("replacements-101", "replacements_per_queue", 101, "101 is out of range",
         whole("replacements_per_queue", 0, 100)),
    Case("replacements-fraction", "replacements_per_queue", 2.5, "2.5 is a decimal number, expected a whole number",
         typed("replacements_per_queue", "a whole number")),
    Case("replacements-mapping", "replacements_per_queue", {"cpu": 1}, "{'cpu': 1} is a mapping, expected a whole number",
         typed("replacements_per_queue", "a whole number")),
    # --- window_hours: 1..720 (under an hour the budgets stop no loop) ----------------------------------------------
    Case("window-zero", "window_hours", 0, "0 is out of range", f"use a number from 1 to 720. {DESCRIBED['window_hours']}"),
    Case("window-half-hour", "window_hours", 0.5, "0.5 is out of range",
         f"use a number from 1 to 720. {DESCRIBED['window_hours']}"),
    Case("window-negative", "window_hours", -1, "-1 is out of range",
         f"use a number from 1 to 720. {DESCRIBED['window_hours']}"),
    Case("window-721", "window_hours", 721, "721 is out of range",
         f"use a number from 1 to 720. {DESCRIBED['window_hours']}"),
    Case("window-inf", "window_hours", "window_hours: .inf", "inf is not a finite number, expected a number",
         typed("window_hours", "a number"), raw=True),
    Case("window-overflow", "window_hours", "window_hours: 1.0e+309", "inf is not a finite number, expected a number",
         typed("window_hours", "a number"), raw=True),
    Case("window-with-unit", "window_hours", "24h", "'24h' is text, expected a number", typed("window_hours", "a number")),
    Case("window-bool", "window_hours", True, "True is a true/false value, expected a number",
         typed("window_hours", "a number")),
    # --- backoff_seconds: 0..86400 ------------------------------------------------------------------------------
    Case("backoff-negative", "backoff_seconds", -5, "-5 is out of range", whole("backoff_seconds", 0, 86400)),
    Case("backoff-over-a-day", "backoff_seconds", 86401, "86401 is out of range", whole("backoff_seconds", 0, 86400)),
    Case("backoff-30-digits", "backoff_seconds", 10**30,
         "YAML syntax error: the number '1000000000000000000000000000000' has more than 15 digits", DIGITS),
    Case("backoff-fraction", "backoff_seconds", 60.5, "60.5 is a decimal number, expected a whole number",
         typed("backoff_seconds", "a whole number")),
    Case("backoff-scientific", "backoff_seconds", "backoff_seconds: 1e3", "'1e3' is text, expected a whole number",
         typed("backoff_seconds", "a whole number"), raw=True),
    # --- breaker_share: (0, 1] ----------------------------------------------------------------------------------
    Case("breaker-zero", "breaker_share", 0, "0 is out of range",
         f"use a number above 0 and up to 1. {DESCRIBED['breaker_share']}"),
    Case("breaker-negative", "breaker_share", -0.5, "-0.5 is out of range",
         f"use a number above 0 and up to 1. {DESCRIBED['breaker_share']}"),
    Case("breaker-over-one", "breaker_share", 1.5, "1.5 is out of range",
         f"use a number above 0 and up to 1. {DESCRIBED['breaker_share']}"),
    Case("breaker-percent", "breaker_share", "50%", "'50%' is text, expected a number", typed("breaker_share", "a number")),
    Case("breaker-nan", "breaker_share", "breaker_share: .nan", "nan is not a finite number, expected a number",
         typed("breaker_share", "a number"), raw=True),
    Case("breaker-null", "breaker_share", None, "the value is empty (null), expected a number",
         typed("breaker_share", "a number")),
    Case("breaker-newline-injection", "breaker_share", "0.5\nenabled: false",
         "'0.5\\nenabled: false' contains a control character (U+000A)", ONE_LINE),
    # --- enabled: a YAML boolean ----------------------------------------------------------------------------------
    Case("enabled-one", "enabled", 1, "1 is a whole number, expected true or false", typed("enabled", "true or false")),
    Case("enabled-quoted-true", "enabled", "true", "'true' is text, expected true or false",
         typed("enabled", "true or false")),
    Case("enabled-null", "enabled", None, "the value is empty (null), expected true or false",
         typed("enabled", "true or false")),
    Case("enabled-trailing-newline", "enabled", "true\n", "'true\\n' contains a control character (U+000A)", ONE_LINE),
    Case("enabled-twice", "enabled", "enabled: true\nenabled: false", "YAML syntax error: duplicate key 'enabled'",
         "keep one of them", raw=True),
    # --- keys and the section itself -------------------------------------------------------------------------------
    Case("unknown-key", "max_parallel", 2, "unknown key 'max_parallel'", KNOWN),
    Case("unknown-key-case", "Enabled", True, "unknown key 'Enabled' — did you mean 'enabled'?", KNOWN),
    Case("unknown-key-newline", "'x\\nfix: rm -rf /'", None, "unknown key 'x\\nfix: rm -rf /'", KNOWN),
    Case("section-null", "", None, "the value is empty (null), expected a mapping",
         f"write its keys indented under it. {REPAIR['description']}"),
    Case("section-text", "", "off", "'off' is text, expected a mapping",
         f"write its keys indented under it. {REPAIR['description']}"),
    Case("section-list", "", [], "[] is a list, expected a mapping",
         f"write its keys indented under it. {REPAIR['description']}"),
]


def _text(case: Case) -> str:
    if case.id == "unknown-key-newline":  # the key itself carries the newline (and a fake fix line)
        return spec_text(lambda t: t.setdefault("health", {}).__setitem__("repair", {"x\nfix: rm -rf /": 1}))
    return case.text()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_repair_value_is_refused_with_file_line_key_and_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  case: Case) -> None:
    text = _text(case)
    write_tenant(tmp_path, text)
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, case.path)
    found = re.fullmatch(re.escape(SPEC_REL) + r":(\d+): " + re.escape(f"{case.path}: {case.message}\n    fix: {case.fix}")
                         + r"\n1 problem; nothing was deployed or changed\.", output)
    assert found, output
    leaf = case.key or "repair"
    if leaf.isidentifier():  # the line named is the key's own
        assert f"{leaf}:" in text.splitlines()[int(found.group(1)) - 1], (found.group(1), text)
    assert output.count("\n    fix: ") == 1 and "rm -rf /\n" not in output  # one fix, and no injected line


ACCEPTED: list[tuple[str, str, Repair]] = [
    ("empty-section", "{}", Repair()),
    ("no-reboots-no-replacements", "{reboots_per_node: 0, replacements_per_queue: 0}",
     Repair(reboots_per_node=0, replacements_per_queue=0)),
    ("the-bounds", "{reboots_per_node: 10, replacements_per_queue: 100, window_hours: 1, backoff_seconds: 0, "
                   "breaker_share: 1}",
     Repair(reboots_per_node=10, replacements_per_queue=100, window_hours=1, backoff_seconds=0, breaker_share=1)),
    ("the-other-bounds", "{window_hours: 720, backoff_seconds: 86400, breaker_share: 0.01}",
     Repair(window_hours=720, backoff_seconds=86400, breaker_share=0.01)),
    ("yaml-1.1-off", "{enabled: off}", Repair(enabled=False)),
]


@pytest.mark.parametrize(("label", "section", "expected"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_the_edges_the_agent_works_with_are_accepted_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                label: str, section: str, expected: Repair) -> None:
    write_tenant(tmp_path, DEMO + f"  health:\n    repair: {section}\n")
    code, output = validate(tmp_path, monkeypatch)
    assert code == 0, output
    assert load_tenant("acme", tmp_path).health.repair == expected


def test_the_window_s_bound_says_why_in_the_schema_and_the_readme() -> None:
    window = REPAIR["properties"]["window_hours"]
    assert window["minimum"] == 1 and "exclusiveMinimum" not in window
    assert "replacement loop" in window["description"]
    assert window["description"] in (ROOT / "README.md").read_text()


def test_there_are_at_least_35_refused_repair_cases() -> None:
    assert len(CASES) >= 35 and len({c.id for c in CASES}) == len(CASES)
