"""A role variable is written once, in meta/argument_specs.yml (its type, default and description); the role's
defaults/main.yml is generated from it (`python -m fmcluster.role_defaults`), each default under its description
as the comment the operator reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from fmcluster import role_defaults

SPECS = sorted(p.parent.parent for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))


def test_every_role_s_defaults_file_is_what_its_argument_spec_generates() -> None:
    assert role_defaults.main(["--check"]) == 0, "run: .venv/bin/python -m fmcluster.role_defaults"


@pytest.mark.parametrize("role", SPECS, ids=lambda p: p.name)
def test_every_argument_spec_option_has_a_default(role: Path) -> None:
    """Ansible checks a play's values against the spec with the role's defaults among them, so a `required`
    option would never be missing: each option says what it is until the play sets it."""
    options = role_defaults.options(yaml.safe_load((role / "meta" / "argument_specs.yml").read_text()))
    assert [name for name, option in options.items() if "default" not in option] == [], role.name


def test_a_spec_without_defaults_generates_no_file_and_a_file_reads_back_as_its_spec(tmp_path: Path) -> None:
    spec = {"argument_specs": {"main": {"short_description": "Bare.", "options": {"bare_x": {"type": "str"}}}}}
    assert role_defaults.render("bare", spec) is None
    role = tmp_path / "bare" / "meta"
    role.mkdir(parents=True)
    (role / "argument_specs.yml").write_text(yaml.safe_dump(spec))
    assert role_defaults.generated(tmp_path) == {} and role_defaults.stale(tmp_path) == []

    template = "{{ lookup('ansible.builtin.file', role_path ~ '/x.yml') | from_yaml }}"
    values = {"x_template": template, "x_time": "00:20:00", "x_folded": "word " * 40 + "end",
              "x_lines": "{{ a\n   | b }}", "x_list": [{"path": "/", "min": 5}], "x_empty": {}, "x_yes": "yes"}
    spec["argument_specs"]["main"]["options"] = {
        name: {"type": "raw", "default": value, "description": f"What {name} is."} for name, value in values.items()}
    text = role_defaults.render("x", spec)
    assert text is not None and yaml.safe_load(text) == values
    assert f'x_template: "{template}"' in text and "# What x_folded is.\nx_folded: >-\n" in text
    assert text.splitlines()[1] == role_defaults.HEADER and all(len(line) <= 160 for line in text.splitlines())
