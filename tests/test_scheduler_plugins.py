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


def test_a_schedulers_own_section_is_its_folders_and_follows_scheduler_in_the_schema() -> None:
    """data/tenant.schema.json holds no scheduler's section; load_schema places each folder's section.schema.json."""
    import json

    from fmcluster.paths import SCHEMA_PATH

    owners = {caps.own_section: name for name, caps in SCHEDULERS.items() if caps.own_section}
    assert owners, "no scheduler has a section of its own: this test checks nothing"
    raw = json.loads(SCHEMA_PATH.read_text())["properties"]["tenant"]["properties"]
    loaded = validation.load_schema()["properties"]["tenant"]["properties"]
    keys = list(loaded)
    assert keys[keys.index("scheduler") + 1:][:len(owners)] == list(owners)
    for section, owner in owners.items():
        assert section not in raw, f"{section} is written in data/tenant.schema.json, not only in its folder"
        fragment = json.loads((SCHEDULER_FOLDERS[owner] / "section.schema.json").read_text())
        fragment.pop("$defs", None)
        assert loaded[section] == fragment
    model = (SRC / "model.py").read_text()
    assert not {m for m in _imported_modules(SRC / "model.py") if m.startswith("fmcluster.schedulers")}
    assert not [section for section in owners if f'"{section}"' in model]


def _row(tmp_path: Path, **changes: object) -> Path:
    import yaml

    folder = tmp_path / "schedulers" / "ghost"
    folder.mkdir(parents=True)
    row = yaml.safe_load((SRC / "schedulers" / "slurm_ec2" / "capabilities.yml").read_text())
    (folder / "capabilities.yml").write_text(yaml.safe_dump({**row, "name": "ghost", **changes}))
    return folder


@pytest.mark.parametrize(("changes", "files", "refusal"), [
    ({"own_section": "ghost"}, {}, "own_section 'ghost' needs its schema"),
    ({"own_section": "ghost", "section_parser": "settings"}, {"section.schema.json": "{}", "settings.py": ""},
     "section_parser 'settings' is not `module:function`"),
    ({"own_section": "ghost", "section_parser": "absent:parse"}, {"section.schema.json": "{}"},
     "section_parser 'absent:parse' is not `module:function`"),
    ({"section_parser": "settings:parse"}, {"settings.py": ""}, "for its own_section"),
])
def test_a_row_whose_section_is_not_all_in_its_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 changes: dict[str, object], files: dict[str, str],
                                                                 refusal: str) -> None:
    from fmcluster import capabilities

    folder = _row(tmp_path, **changes)
    for name, text in files.items():
        (folder / name).write_text(text)
    monkeypatch.setattr(capabilities, "SCHEDULER_ROWS", tmp_path / "schedulers")
    with pytest.raises(ValueError, match="ghost/capabilities.yml") as refused:
        capabilities._scheduler_rows()
    assert refusal in str(refused.value)


@pytest.mark.parametrize(("section", "fragment", "refusal"), [
    ("storage", {"type": "object"}, "the tenant has a section 'storage' already"),
    ("ghost", {"type": "object", "$defs": {"node_role": {}}}, "$defs 'node_role' is defined already"),
])
def test_a_section_that_would_replace_the_cores_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          section: str, fragment: dict[str, object],
                                                          refusal: str) -> None:
    import dataclasses
    import json

    (tmp_path / "section.schema.json").write_text(json.dumps(fragment))
    ghost = dataclasses.replace(SCHEDULERS["slurm-ec2"], name="ghost", own_section=section)
    monkeypatch.setattr(validation, "SCHEDULERS", {"ghost": ghost})
    monkeypatch.setattr(validation, "SCHEDULER_FOLDERS", {"ghost": tmp_path})
    schema = json.loads(validation.SCHEMA_PATH.read_text())
    with pytest.raises(ValueError, match="section.schema.json") as refused:
        validation._add_scheduler_sections(schema)
    assert refusal in str(refused.value)
