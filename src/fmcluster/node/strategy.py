"""Which Ansible strategy runs a play: Mitogen's where it is installed (versions.yml node_toolchain `mitogen`).

Standard library only, so that the operator's test runs can ask without importing the node agent (boto3 and all)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path


def mitogen_env() -> dict[str, str]:
    """Ansible settings that run the play with Mitogen's strategy: a task's module runs in an interpreter kept for
    the play instead of a payload packed, written and started per task, the cost that dominates a converge. Empty
    when this Python lacks it."""
    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None or not spec.submodule_search_locations:
        return {}
    package = Path(next(iter(spec.submodule_search_locations)))
    return {"ANSIBLE_STRATEGY_PLUGINS": str(package / "plugins" / "strategy"), "ANSIBLE_STRATEGY": "mitogen_linear"}


def mitogen_unless_chosen(environ: Mapping[str, str]) -> dict[str, str]:
    """Mitogen's settings for the tests' plays, unless `environ` already chooses a strategy (ANSIBLE_STRATEGY=linear
    compares with Ansible's own)."""
    return {} if "ANSIBLE_STRATEGY" in environ else mitogen_env()
