"""A bytecode cache for modules imported from zip archives: Ansible's AnsiballZ module payloads.

Every task of a converge runs its module as `python AnsiballZ_<module>.py`, which imports ansible.module_utils
from a zip written for that task. Python keeps no bytecode for zip archives, and its zipimporter (3.10-3.12)
compiles each module twice: once when the import system asks for the module's file name, once to run it. That
is most of the half CPU-second a task costs on a node, and most of a node's converge (BENCHMARKS.md). This hook
compiles each distinct source once per node and keeps the code object under the cache folder, keyed by the
module's path inside the archive and its source: a changed source is a new key, never a stale entry.

The node agent installs it for the Ansible runs it starts (fmcluster/node/startup/sitecustomize.py, first on their
PYTHONPATH). The cache is used only when the folder is this user's own and nobody else may write it.
"""

from __future__ import annotations

import _imp
import hashlib
import marshal
import os
import stat
import sys
import zipimport
from functools import lru_cache
from types import CodeType

#: Where the compiled modules are kept (root's, mode 0700).
CACHE_DIR = os.environ.get("FMCLUSTER_BYTECODE_CACHE", "/var/cache/fmcluster/bytecode")


@lru_cache(maxsize=None)
def _usable(folder: str) -> bool:
    """The folder exists (made if need be), is this user's own and writable by nobody else (asked once a process)."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        info = os.stat(folder)
    except OSError:
        return False
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


class CachingZipImporter(zipimport.zipimporter):
    """zipimporter whose modules are compiled once per source, and not compiled to learn their file name."""

    def _inner_path(self, fullname: str) -> str:
        name = fullname.rpartition(".")[2]
        return self.prefix + name + (os.sep + "__init__.py" if self.is_package(fullname) else ".py")

    def get_filename(self, fullname: str) -> str:
        try:
            if self.get_source(fullname) is not None:
                return self.archive + os.sep + self._inner_path(fullname)
        except (ImportError, OSError, UnicodeDecodeError):
            pass
        return str(super().get_filename(fullname))

    def get_code(self, fullname: str) -> CodeType:
        try:
            source = self.get_source(fullname)
        except (ImportError, OSError, UnicodeDecodeError):
            source = None
        if source is None:  # bytecode only, or not ours to read: as zipimport does
            return super().get_code(fullname)
        inner = self._inner_path(fullname)
        filename = self.archive + os.sep + inner
        key = hashlib.sha256(f"{sys.implementation.cache_tag}\0{inner}\0{source}".encode("utf-8", "surrogatepass"))
        cached = os.path.join(CACHE_DIR, key.hexdigest() + ".bin")
        if _usable(CACHE_DIR):
            try:
                with open(cached, "rb") as handle:
                    code = marshal.load(handle)
                if isinstance(code, CodeType):
                    # Tracebacks name this payload, as zipimport's code would (CPython's own fix for cached code).
                    fix_filename = getattr(_imp, "_fix_co_filename", None)
                    if fix_filename is not None:
                        fix_filename(code, filename)
                    return code
            except (OSError, EOFError, ValueError, TypeError):
                pass
        code = compile(source, filename, "exec", dont_inherit=True)
        if _usable(CACHE_DIR):
            partial = f"{cached}.{os.getpid()}"
            try:
                with open(partial, "wb") as handle:
                    marshal.dump(code, handle)
                os.replace(partial, cached)
            except OSError:
                pass
        return code


def install() -> None:
    """Put CachingZipImporter in place of zipimport's path hook (and forget zip importers already made)."""
    sys.path_hooks[:] = [CachingZipImporter if hook is zipimport.zipimporter else hook for hook in sys.path_hooks]
    for entry, finder in list(sys.path_importer_cache.items()):
        if type(finder) is zipimport.zipimporter:
            del sys.path_importer_cache[entry]
