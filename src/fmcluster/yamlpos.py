"""YAML loading that remembers where each key was written, so errors can name the line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KeyPath = tuple[str | int, ...]


class YamlSyntaxError(Exception):
    def __init__(self, path: Path, line: int | None, detail: str) -> None:
        super().__init__(f"{path}:{line}: {detail}" if line else f"{path}: {detail}")
        self.path = path
        self.line = line
        self.detail = detail


@dataclass
class LoadedYaml:
    path: Path
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, key_path: KeyPath) -> int | None:
        """Line of the deepest existing ancestor of key_path (1-based)."""
        probe = tuple(key_path)
        while probe:
            if probe in self.lines:
                return self.lines[probe]
            probe = probe[:-1]
        return self.lines.get((), None)


def _to_python(node: yaml.Node, here: KeyPath, lines: dict[KeyPath, int], loader: yaml.SafeLoader) -> Any:
    lines[here] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in result:
                raise YamlSyntaxError(Path("?"), key_node.start_mark.line + 1, f"duplicate key '{key}'")
            child = (*here, key)
            lines[child] = key_node.start_mark.line + 1
            result[key] = _to_python(value_node, child, lines, loader)
            lines[child] = key_node.start_mark.line + 1
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(item, (*here, i), lines, loader) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load(path: Path) -> LoadedYaml:
    """Load one YAML document with a line number for every key path. Raises YamlSyntaxError."""
    text = path.read_text(encoding="utf-8")
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        lines: dict[KeyPath, int] = {}
        data = None if root is None else _to_python(root, (), lines, loader)
    except YamlSyntaxError as err:
        raise YamlSyntaxError(path, err.line, err.detail) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        raise YamlSyntaxError(path, line, f"{err.context or ''} {err.problem or ''}".strip()) from None
    except yaml.YAMLError as err:
        raise YamlSyntaxError(path, None, str(err)) from None
    finally:
        loader.dispose()
    return LoadedYaml(path=path, data=data, lines=lines)
