"""Prometheus text exposition for node_exporter's textfile collector (written atomically: the collector must
never read half a file)."""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Mapping, Tuple, Union

Number = Union[int, float]


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labels(pairs: Mapping[str, str]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{escape(str(v))}"' for k, v in pairs.items()) + "}"


class Exposition:
    """Metric families in the order first declared, each with HELP and TYPE once."""

    def __init__(self) -> None:
        self.families: Dict[str, Tuple[str, str, List[str]]] = {}

    def add(self, name: str, help_text: str, value: Number, label_pairs: Mapping[str, str] | None = None,
            kind: str = "gauge") -> None:
        family = self.families.setdefault(name, (help_text, kind, []))
        family[2].append(f"{name}{labels(label_pairs or {})} {_number(value)}")

    def declare(self, name: str, help_text: str, kind: str = "gauge") -> None:
        self.families.setdefault(name, (help_text, kind, []))

    def render(self) -> str:
        out: List[str] = []
        for name, (help_text, kind, samples) in self.families.items():
            if not samples:
                continue
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(out) + "\n"


def _number(value: Number) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def write_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def lines(items: Iterable[str]) -> str:
    return "\n".join(items) + "\n"
