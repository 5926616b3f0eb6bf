"""The node agent's bytecode cache for Ansible's module payloads (fmcluster.node.bytecode_cache): a module imported
from a zip runs the same code, is compiled once per source whatever archive carries it, names its own archive in
tracebacks, and the cache is used only in a folder no one else may write."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from fmcluster.node.agent import AGENT_SRC, STARTUP_DIR, startup_path

PROBE = """
import sys, traceback, zipimport
sys.path.insert(0, sys.argv[1])
import pkg.mod
print(pkg.mod.__file__, type(sys.path_importer_cache[sys.argv[1]]).__name__, pkg.mod.answer())
try:
    pkg.mod.fail()
except ValueError:
    print(traceback.extract_tb(sys.exc_info()[2])[-1].filename)
"""


def payload(path: Path, answer: int = 42) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/__init__.py", "")
        archive.writestr("pkg/mod.py", f"def answer():\n    return {answer}\n\ndef fail():\n    raise ValueError('x')\n")
    return path


def probe(archive: Path, cache: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": startup_path(""), "FMCLUSTER_BYTECODE_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-c", PROBE, str(archive)], capture_output=True, text=True, env=env,
                          check=True)
    return done.stdout.split()


def test_a_module_from_a_zip_is_compiled_once_and_names_the_archive_it_came_from(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = probe(payload(tmp_path / "one.zip"), cache)
    assert first == [f"{tmp_path}/one.zip/pkg/mod.py", "CachingZipImporter", "42", f"{tmp_path}/one.zip/pkg/mod.py"]
    entries = sorted(cache.iterdir())
    assert len(entries) == 2 and oct(cache.stat().st_mode & 0o777) == "0o700"
    again = probe(payload(tmp_path / "two.zip"), cache)  # another task's payload, the same sources
    assert again == [f"{tmp_path}/two.zip/pkg/mod.py", "CachingZipImporter", "42", f"{tmp_path}/two.zip/pkg/mod.py"]
    assert sorted(cache.iterdir()) == entries, "the same sources are read from the cache, not compiled again"
    changed = probe(payload(tmp_path / "three.zip", answer=7), cache)
    assert changed[2] == "7" and len(list(cache.iterdir())) == 3, "a changed source is a new entry, never a stale one"


def test_a_cache_folder_others_may_write_is_not_used(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    assert probe(payload(tmp_path / "one.zip"), cache)[2] == "42"
    assert list(cache.iterdir()) == []


def test_the_agent_s_ansible_runs_start_with_the_cache_and_keep_what_the_agent_had() -> None:
    assert (STARTUP_DIR / "sitecustomize.py").is_file() and not (STARTUP_DIR / "__init__.py").exists()
    assert startup_path("/a:/b") == os.pathsep.join([str(STARTUP_DIR), str(AGENT_SRC), "/a", "/b"])
    assert startup_path(str(AGENT_SRC)) == os.pathsep.join([str(STARTUP_DIR), str(AGENT_SRC)])
