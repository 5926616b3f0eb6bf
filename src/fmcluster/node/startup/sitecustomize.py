"""Started with every Python of the node agent's Ansible runs (this folder is first on their PYTHONPATH): the
bytecode cache for Ansible's module payloads (fmcluster.node.bytecode_cache), then the interpreter's own
sitecustomize, which this one would otherwise hide."""

import importlib.machinery
import importlib.util
import os
import sys

try:
    from fmcluster.node.bytecode_cache import install
except Exception:  # noqa: BLE001 - no agent source here, or a Python it cannot run on: no cache, never a broken Python
    pass
else:
    install()

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _HERE])
if _spec is not None and _spec.loader is not None:
    _theirs = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_theirs)
