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
    options = role_defaults.options(role_defaults.load_spec(role / "meta" / "argument_specs.yml"))
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
        name: {"type": "raw", "description": f"What {name} is.",
               "default": role_defaults.Unsafe(value) if "{{" in str(value) else value} for name, value in values.items()}
    text = role_defaults.render("x", spec)
    assert text is not None and yaml.safe_load(text) == values
    assert f'x_template: "{template}"' in text and "# What x_folded is.\nx_folded: >-\n" in text
    assert text.splitlines()[1] == role_defaults.HEADER and all(len(line) <= 160 for line in text.splitlines())


def test_a_template_default_must_be_tagged_unsafe_or_ansible_renders_it_when_it_checks_the_play(tmp_path: Path) -> None:
    """ansible renders a role's whole argument spec before it validates the play's values: an untagged template
    naming a variable the play has not set (yet) fails the role at its first task, whatever the play passes."""
    import json
    import os
    import subprocess

    from conftest import venv_tool

    meta = tmp_path / "roles" / "probe" / "meta"
    meta.mkdir(parents=True)
    (tmp_path / "roles" / "probe" / "tasks").mkdir()
    (tmp_path / "roles" / "probe" / "tasks" / "main.yml").write_text("- ansible.builtin.debug:\n    msg: ran\n")
    play = tmp_path / "play.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  roles: [probe]\n")

    def run(tag: str) -> subprocess.CompletedProcess[str]:
        (meta / "argument_specs.yml").write_text(
            "argument_specs:\n  main:\n    short_description: Probe.\n    options:\n      probe_x:\n        type: bool\n"
            f"        default: {tag}\"{{{{ fmcluster_capabilities.real_accelerators }}}}\"\n        description: X.\n")
        env = {**os.environ, "ANSIBLE_ROLES_PATH": str(tmp_path / "roles"), "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
        return subprocess.run([venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", "probe_x=true",
                               str(play)], env=env, capture_output=True, text=True, timeout=120)

    untagged, tagged = run(""), run("!unsafe ")
    assert untagged.returncode != 0 and "fmcluster_capabilities" in untagged.stdout
    assert tagged.returncode == 0, tagged.stdout[-2000:]
    assert json.loads(tagged.stdout)["stats"]["localhost"]["failures"] == 0
    tagged_spec = role_defaults.load_spec(meta / "argument_specs.yml")
    (meta / "argument_specs.yml").write_text((meta / "argument_specs.yml").read_text().replace("!unsafe ", ""))
    with pytest.raises(ValueError, match="tag it `!unsafe`"):
        role_defaults.render("probe", role_defaults.load_spec(meta / "argument_specs.yml"))
    assert role_defaults.render("probe", tagged_spec) is not None
