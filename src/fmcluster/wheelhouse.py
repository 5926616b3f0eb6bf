"""The nodes' toolchain as wheels: built here, shipped in the bootstrap bundle, installed there with no index.

A node's image has python3 and nothing of fmcluster's (src/fmcluster/data/images.yml). Its first boot builds
/opt/fmcluster/venv from the bundle's `wheelhouse/` with `pip install --no-index` (src/fmcluster/node/boot/node-bootstrap.sh),
so the wheelhouse must hold, for every Python an image fmcluster boots has, a wheel of every pinned
requirement and of everything they need, plus pip itself. pip resolves them here for each such Python and the
oldest glibc among the images (`--python-version/--platform/--only-binary=:all:`), so a pin that has no
release for an image's Python fails here, at deploy time, naming it — not at boot on 18 nodes.

The wheelhouse is cached under .cache/wheelhouse/<digest of what it is for>/ and only built again when the
pins, the Pythons or the platforms change.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fmcluster import versions
from fmcluster.paths import source_root

Out = Callable[[str], object]
COMPLETE = ".complete.json"


class WheelhouseError(RuntimeError):
    """A pin cannot be had as a wheel for one of the nodes' Pythons; the message names the pin and the Python."""


@dataclass(frozen=True)
class Target:
    """What a node's interpreter accepts: its Python version and the oldest glibc among the images using it."""

    python: str  # "3.10"
    glibc: tuple[int, int]  # (2, 35)

    def platforms(self) -> list[str]:
        """pip's --platform tags this interpreter takes, from manylinux2014 (glibc 2.17) up to its glibc."""
        major, minor = self.glibc
        return ["manylinux2014_x86_64"] + [f"manylinux_{major}_{m}_x86_64" for m in range(17, minor + 1)]


def targets() -> list[Target]:
    """The Pythons (and glibc) of every image the nodes boot, from versions.yml's node_toolchain_targets."""
    raw = versions.load()["node_toolchain_targets"]
    return [Target(str(t["python"]), (int(t["glibc"].split(".")[0]), int(t["glibc"].split(".")[1]))) for t in raw]


def requirements() -> list[str]:
    """What the wheelhouse must satisfy: the node toolchain's pins and pip itself."""
    return [*versions.node_requirements(), f"pip=={versions.load()['node_pip']}"]


def cache_dir(root: Path | None = None) -> Path:
    return (root or source_root()) / ".cache" / "wheelhouse"


def digest(reqs: Sequence[str], found: Sequence[Target]) -> str:
    what = {"requirements": list(reqs), "targets": [[t.python, list(t.glibc)] for t in found]}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _download(pip: Sequence[str], target: Target, reqs: Sequence[str], into: Path) -> None:
    argv = [*pip, "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
            "--implementation", "cp", "--python-version", target.python,
            *[arg for tag in target.platforms() for arg in ("--platform", tag)], "--dest", str(into), *reqs]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
        raise WheelhouseError(f"the node toolchain pins ({' '.join(reqs)}) cannot all be had as wheels for Python "
                              f"{target.python} (glibc {'.'.join(map(str, target.glibc))}): "
                              f"{lines[-1] if lines else f'pip exited {done.returncode}'}; pin versions that "
                              "publish wheels for every Python in versions.yml's node_toolchain_targets")


def ensure(root: Path | None = None, out: Out = print, pip: Sequence[str] | None = None) -> Path:
    """The wheelhouse folder for the current pins and targets, built (and cached) if need be."""
    reqs, found = requirements(), targets()
    folder = cache_dir(root) / digest(reqs, found)
    if (folder / COMPLETE).is_file():
        return folder
    pip = list(pip or [sys.executable, "-m", "pip"])
    out(f"  building the nodes' wheelhouse (Python {', '.join(t.python for t in found)}): {' '.join(reqs)}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-", dir=folder.parent) as tmp:
        for target in found:
            _download(pip, target, reqs, Path(tmp))
        (Path(tmp) / COMPLETE).write_text(json.dumps({"requirements": reqs, "targets": [t.python for t in found]}) + "\n")
        if not (folder / COMPLETE).is_file():  # another process may have built it meanwhile: keep that one
            shutil.rmtree(folder, ignore_errors=True)
            try:
                Path(tmp).rename(folder)
                Path(tmp).mkdir()  # TemporaryDirectory removes what it made
            except OSError:
                if not (folder / COMPLETE).is_file():
                    raise
    wheels = sorted(folder.glob("*.whl"))
    out(f"  wheelhouse ready: {len(wheels)} wheels, {sum(w.stat().st_size for w in wheels) / 1e6:.1f} MB ({folder})")
    return folder


def bundle_files(folder: Path) -> dict[str, Path]:
    """Bundle name → file of every wheel (`wheelhouse/<wheel>`)."""
    return {f"wheelhouse/{wheel.name}": wheel for wheel in sorted(folder.glob("*.whl"))}
