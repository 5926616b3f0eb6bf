"""A scheduler is its folder plus one registry line (issue 41): the layers below the registry find what a scheduler
hands them through its folder (fmcluster.capabilities.SCHEDULER_FOLDERS), never by importing it by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT
from fmcluster import validation
from fmcluster.capabilities import SCHEDULER_FOLDERS, SCHEDULERS

SRC = ROOT / "src" / "fmcluster"


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def test_every_scheduler_row_names_its_folder() -> None:
    assert set(SCHEDULER_FOLDERS) == set(SCHEDULERS)
    for name, folder in SCHEDULER_FOLDERS.items():
        assert folder.parent == SRC / "schedulers" and folder.name == name.replace("-", "_"), name


def test_validation_imports_no_scheduler_and_not_the_registry() -> None:
    imported = _imported_modules(SRC / "validation.py")
    assert not {m for m in imported if m.startswith("fmcluster.schedulers")}, imported


def test_a_schedulers_rules_are_found_through_its_folder() -> None:
    for name, folder in SCHEDULER_FOLDERS.items():
        rules = validation.scheduler_rules(name)
        assert (rules is not None) == (folder / "rules.py").is_file(), name
        if rules is not None:
            assert rules.__name__ == f"fmcluster.schedulers.{folder.name}.rules"
            assert callable(rules.check_tenant)
    assert validation.scheduler_rules("k8s") is None and validation.scheduler_rules(None) is None


def test_a_section_of_another_scheduler_is_refused_generically() -> None:
    """Every scheduler with its own section (capabilities.yml's own_section) gets the same rule, by its row."""
    owners = {caps.own_section: name for name, caps in SCHEDULERS.items() if caps.own_section}
    assert owners, "no scheduler has a section of its own: this test checks nothing"
    for section, owner in owners.items():
        for tenant_scheduler in sorted(set(SCHEDULERS) - {owner}):
            added: list[tuple[tuple[str | int, ...], str, str]] = []

            class Out:
                def add(self, path: tuple[str | int, ...], message: str, fix: str) -> None:
                    added.append((path, message, fix))

            validation._check_foreign_sections(Out(), {"scheduler": tenant_scheduler, section: {}},  # type: ignore[arg-type]
                                               ("tenant",))
            assert added == [(("tenant", section), f"only scheduler {owner} reads this section, not {tenant_scheduler!r}",
                              f"remove the section, or set scheduler: {owner}")]


def test_the_schemas_scheduler_enum_is_filled_from_the_scheduler_folders_not_written_there() -> None:
    import json

    from fmcluster.paths import SCHEMA_PATH

    raw = json.loads(SCHEMA_PATH.read_text())["properties"]["tenant"]["properties"]["scheduler"]
    assert "enum" not in raw and "description" not in raw, "the scheduler names are written once: their folders"
    loaded = validation.load_schema()["properties"]["tenant"]["properties"]["scheduler"]
    assert loaded["enum"] == list(SCHEDULERS)
    for name, caps in SCHEDULERS.items():
        assert caps.summary and f"`{name}`: {caps.summary}" in loaded["description"], name


def test_model_and_tasks_name_no_scheduler() -> None:
    """The model's `Scheduler` type and `invoke new-tenant --help` take the names from the folders too."""
    def names_in(tree: ast.AST) -> set[str]:
        return {node.value for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)} & set(SCHEDULERS)

    model = ast.parse((SRC / "model.py").read_text())
    [alias] = [node for node in model.body if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "Scheduler" for t in node.targets)]
    assert not names_in(alias.value)
    assert not names_in(ast.parse((ROOT / "tasks.py").read_text()))


def test_a_schedulers_node_tags_live_in_its_folder_and_travel_in_its_discovery_entry() -> None:
    """nodes.py keeps only fmcluster's own tags; ParallelCluster's are its folder's, handed over as data."""
    from fmcluster.nodes import FMCLUSTER_TAGS, NodeTags
    from fmcluster.schedulers.parallelcluster.stand_in import NODE_TYPES
    from fmcluster.schedulers.parallelcluster.tags import NODE_TAGS

    assert not {node.value for node in ast.walk(ast.parse((SRC / "nodes.py").read_text()))
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and "parallelcluster" in node.value}
    assert NodeTags.from_manifest(NODE_TAGS.as_manifest()) == NODE_TAGS
    assert NodeTags.from_manifest(None) is FMCLUSTER_TAGS
    assert {NODE_TAGS.role_of({NODE_TAGS.role: t}) for t in NODE_TYPES.values()} == {"controller", "login", "compute"}
    with pytest.raises(ValueError, match="node_tags"):
        NodeTags.from_manifest({"role": "x", "roles": {"Head": "boss"}, "queue": "q"})
