"""The fmcluster package has no import cycle, counting the imports hidden inside functions.

A function-level import only postpones a cycle: the two modules still cannot be understood, tested or moved
apart. The graph is built from the source with `ast` (nothing is imported): every `import` statement anywhere in
a module — at the top, inside a function, a class or a branch — except those under `if TYPE_CHECKING:`, which
never run. `from pkg import name` points at the submodule `pkg.name` when there is one, else at `pkg`; relative
imports are resolved against the importing module's package. A cycle is a strongly connected component of more
than one module, or a module importing itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "fmcluster"


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(src: Path, package: str) -> dict[str, Path]:
    return {module_name(path, src): path for path in sorted((src / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree, at any depth, except the bodies of `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path], package: str) -> set[str]:
    """The package's modules that `name` (stored at `path`) imports."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()

    def add(candidate: str) -> None:
        # `import a.b.c` names the module a.b.c; the parent packages it also runs are not dependencies of
        # the importer's code (counting them would make every package __init__ that re-exports a submodule
        # look cyclic).
        while candidate and candidate not in modules:
            candidate = candidate.rpartition(".")[0]
        if candidate:
            targets.add(candidate)

    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == package or alias.name.startswith(package + "."):
                    add(alias.name)
            continue
        if node.level:
            base_parts = name.split(".") if is_package else name.split(".")[:-1]
            base_parts = base_parts[: len(base_parts) - (node.level - 1)]
            base = ".".join(base_parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if not (base == package or base.startswith(package + ".")):
            continue
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            add(submodule if submodule in modules else base)
    return targets


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    modules = package_modules(src, package)
    return {name: imports_of(name, path, modules, package) for name, path in modules.items()}


def reachable(graph: dict[str, set[str]], roots: set[str]) -> set[str]:
    """The modules `roots` import, directly or through others, the roots included."""
    seen: set[str] = set()
    work = list(roots)
    while work:
        module = work.pop()
        if module not in seen:
            seen.add(module)
            work.extend(graph.get(module, ()))
    return seen


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the graph is a few hundred modules; recursion depth is not the point)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    return sorted(
        component
        for component in strongly_connected(graph)
        if len(component) > 1 or component[0] in graph[component[0]]
    )


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    edges = [f"    {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return f"  cycle over {len(component)} module(s): {', '.join(component)}\n" + "\n".join(edges)


def test_fmcluster_has_no_import_cycle_counting_function_level_imports() -> None:
    graph = import_graph()
    assert len(graph) > 50, "the graph builder found too few modules; is SRC right?"
    found = cycles(graph)
    assert not found, "import cycles (move the shared code into a module both can import):\n" + "\n".join(
        describe(graph, component) for component in found
    )


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_function_level_import_counts_as_an_edge(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "def f() -> None:\n    from pkg.a import thing\n",
        },
    )
    assert cycles(import_graph(src, "pkg")) == [["pkg.a", "pkg.b"]]


def test_relative_imports_resolve_and_from_package_import_submodule_names_the_submodule(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .sub import c\n",
            "pkg/sub/__init__.py": "from . import c\nfrom .. import top\n",
            "pkg/sub/c.py": "from ..top import VALUE\n",
            "pkg/top.py": "import pkg.sub.c as cc\nVALUE = 1\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg"] == {"pkg.sub.c"}
    assert graph["pkg.sub"] == {"pkg.sub.c", "pkg.top"}
    assert graph["pkg.sub.c"] == {"pkg.top"}
    assert graph["pkg.top"] == {"pkg.sub.c"}
    assert cycles(graph) == [["pkg.sub.c", "pkg.top"]]


def test_a_name_imported_from_a_package_points_at_the_package(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import helper\nNAME = 1\n",
            "pkg/a.py": "def helper() -> None:\n    from pkg import NAME\n",
        },
    )
    assert cycles(import_graph(src, "pkg")) == [["pkg", "pkg.a"]]


def test_a_self_import_is_a_cycle(tmp_path: Path) -> None:
    src = _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "def f() -> None:\n    import pkg.a\n"})
    assert cycles(import_graph(src, "pkg")) == [["pkg.a"]]


def test_type_checking_imports_do_not_count(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",
        },
    )
    assert cycles(import_graph(src, "pkg")) == []


@pytest.mark.parametrize("module", ["fmcluster.lifecycle", "fmcluster.stacks.render", "fmcluster.doctor.detect"])
def test_the_graph_sees_the_real_modules(module: str) -> None:
    assert module in import_graph()


def test_the_stacks_import_no_provider() -> None:
    """fmcluster.stacks sits below the providers: what a provider's substrate is (the local AWS emulator lives in
    fmcluster.providers.local) reaches the stacks as values their callers hand in, an endpoint and how its APIs
    answer (fmcluster.capabilities.ApiCapabilities), never as an import."""
    graph = import_graph()
    upward = sorted(f"{module} -> {target}" for module, targets in graph.items() if module.startswith("fmcluster.stacks")
                    for target in targets if target.startswith("fmcluster.providers"))
    assert not upward, "hand the provider's part in from above instead:\n" + "\n".join(upward)
