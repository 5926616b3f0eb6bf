"""What runs on a node is held to what the node has, by the import graph (nothing is imported here).

Two programs run there. The node agent (`python -m fmcluster.node`: first boot's converge, the timer's, the image's
install steps) runs in the node's venv, built from the bundle's wheelhouse of versions.yml `node_toolchain` and the
distributions those require. The health program (`fmcluster-health`, the node_health role's zip of the modules it
lists) runs with the image's own python3 and nothing else. Both run on the oldest Python an image boots
(versions.yml `node_toolchain_targets`). The operator's layers (stacks, commands, providers, schedulers) never reach a
node: a node module importing one would fail there, or drag the deploy's dependencies into the wheelhouse.
"""

from __future__ import annotations

import ast
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from conftest import ROOT
from test_import_graph import SRC, import_graph, package_modules, reachable

OPERATOR_LAYERS = ("fmcluster.stacks", "fmcluster.commands", "fmcluster.providers", "fmcluster.schedulers",
                   "fmcluster.deploy", "fmcluster.publish", "fmcluster.cli")


def _third_party(path: Path) -> set[str]:
    """Top-level names of what the module imports from outside the standard library and fmcluster."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.partition(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name not in ("fmcluster", "__future__")}


def _requirement_name(line: str) -> str | None:
    """The distribution a Requires-Dist line names, unless its marker leaves it out (an extra, an older Python)."""
    requirement = Requirement(line)
    if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
        return None
    return requirement.name


def _importable_names(distributions: list[str]) -> set[str]:
    """Top-level import names of `distributions` and every distribution they require (read from this venv, which
    installs the same releases)."""
    by_distribution: dict[str, set[str]] = {}
    for name, owners in metadata.packages_distributions().items():
        for owner in owners:
            by_distribution.setdefault(owner.lower().replace("_", "-"), set()).add(name)
    seen: set[str] = set()
    work = [d.lower().replace("_", "-") for d in distributions]
    while work:
        dist = work.pop()
        if dist in seen:
            continue
        seen.add(dist)
        for requirement in metadata.requires(dist) or []:
            required = _requirement_name(requirement)
            if required:
                work.append(required.lower().replace("_", "-"))
    return {name for dist in seen for name in by_distribution.get(dist, set())}


def _versions() -> dict[str, object]:
    loaded = yaml.safe_load((SRC / "fmcluster/data/versions.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _oldest_python() -> tuple[int, int]:
    targets = _versions()["node_toolchain_targets"]
    assert isinstance(targets, list)
    oldest = min(tuple(int(part) for part in str(t["python"]).split(".")) for t in targets)
    return oldest[0], oldest[1]


def _agent_modules() -> set[str]:
    graph = import_graph()
    return reachable(graph, {m for m in graph if m == "fmcluster.node" or m.startswith("fmcluster.node.")})


def _health_program_modules() -> set[str]:
    listed = yaml.safe_load((ROOT / "roles/node_health/defaults/main.yml").read_text())["node_health_modules"]
    return {"fmcluster.health" if m == "__init__" else f"fmcluster.health.{m}" for m in listed}


def test_the_node_agent_imports_nothing_of_the_operator_s_layers() -> None:
    reached = sorted(m for m in _agent_modules() if m.startswith(OPERATOR_LAYERS))
    assert not reached, f"the node agent would import the operator's code on a node: {reached}"


def test_the_node_agent_imports_only_what_the_node_s_venv_holds() -> None:
    toolchain = _versions()["node_toolchain"]
    assert isinstance(toolchain, dict)
    allowed = _importable_names(list(toolchain))
    assert {"ansible", "ansible_runner", "boto3", "botocore", "yaml"} <= allowed  # the reading itself works
    paths = package_modules(SRC, "fmcluster")
    outside = {f"{module}: {name}" for module in _agent_modules() for name in _third_party(paths[module])
               if name not in allowed}
    assert not outside, f"not in the node's venv (versions.yml node_toolchain): {sorted(outside)}"


def test_the_health_program_is_the_standard_library_and_its_own_modules() -> None:
    """Every module the role packs, and every module they import, is in the zip; none needs more than python3."""
    packed = _health_program_modules()
    reached = reachable(import_graph(), packed)
    assert reached == packed, f"imported but not packed (roles/node_health node_health_modules): {sorted(reached - packed)}"
    paths = package_modules(SRC, "fmcluster")
    outside = {f"{module}: {sorted(_third_party(paths[module]))}" for module in packed if _third_party(paths[module])}
    assert not outside, f"the health program runs with the image's python3 alone: {sorted(outside)}"


@pytest.mark.parametrize("program", ["agent", "health"])
def test_node_code_parses_as_the_oldest_python_an_image_boots(program: str) -> None:
    modules = _agent_modules() if program == "agent" else _health_program_modules()
    paths = package_modules(SRC, "fmcluster")
    oldest = _oldest_python()
    for module in sorted(modules):
        ast.parse(paths[module].read_text(), filename=str(paths[module]), feature_version=oldest)


def test_a_module_the_graph_reaches_is_held_to_the_rule(tmp_path: Path) -> None:
    """The check sees an operator import hidden in a function of a node module (a guard that guards nothing fails)."""
    package = tmp_path / "fmcluster"
    (package / "node").mkdir(parents=True)
    (package / "stacks").mkdir()
    for init in (package, package / "node", package / "stacks"):
        (init / "__init__.py").write_text("")
    (package / "node" / "agent.py").write_text("def later():\n    from fmcluster.stacks import api\n")
    (package / "stacks" / "api.py").write_text("import jsonschema\n")
    graph = import_graph(tmp_path, "fmcluster")
    reached = reachable(graph, {"fmcluster.node.agent"})
    assert "fmcluster.stacks.api" in reached
    assert _third_party(package / "stacks" / "api.py") == {"jsonschema"}
