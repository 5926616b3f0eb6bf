"""Every role variable is documented twice, for two readers: a comment in defaults/main.yml (the operator) and
an entry in meta/argument_specs.yml (ansible, which then refuses a wrong type at the start of the play)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import ROOT

ROLES = sorted(p for p in (ROOT / "roles").iterdir() if (p / "defaults" / "main.yml").is_file())


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_default_has_an_argument_spec_and_every_argument_spec_a_default(role: Path) -> None:
    defaults = set(yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {})
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    assert defaults == set(specs["argument_specs"]["main"]["options"]), role.name


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_an_argument_spec_s_default_is_the_role_default_it_documents(role: Path) -> None:
    """The spec's `default` is documentation (ansible validates with it, the play reads defaults/main.yml): a
    spec may omit it, never disagree with it."""
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    options = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    disagree = {name: (spec["default"], defaults.get(name)) for name, spec in options.items()
                if "default" in spec and spec["default"] != defaults.get(name)}
    assert disagree == {}, f"{role.name}: argument_specs default vs defaults/main.yml: {disagree}"
