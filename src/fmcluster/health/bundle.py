"""Pack the node modules of fmcluster.health into one executable zip application, byte for byte the same for
the same sources (fixed timestamps and modes, no compression), so the node_health role installs the program with
one idempotent copy instead of one task per module. Python runs and imports it as it is (zipimport); the first
line names the node's python3:

    python3 bundle.py --out fmcluster-health --python /usr/bin/python3 --modules model,probe,...
    ./fmcluster-health check --config ...                                    # on the node
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
PACKAGE_MARKER = '"""fmcluster\'s node health program only (fmcluster.health; the rest of fmcluster is not here)."""\n'
MAIN = "import sys\n\nfrom fmcluster.health.cli import main\n\nsys.exit(main())\n"
EPOCH = (1980, 1, 1, 0, 0, 0)


def _add(archive: zipfile.ZipFile, name: str, text: str) -> None:
    info = zipfile.ZipInfo(name, date_time=EPOCH)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_STORED
    archive.writestr(info, text.encode("utf-8"))


def build(out: Path, modules: Sequence[str], source: Path = HERE, python: str = "/usr/bin/python3") -> Path:
    """Write the zip application of `modules` (names of src/fmcluster/health/*.py) to `out`, run by `python`."""
    missing = [m for m in modules if not (source / f"{m}.py").is_file()]
    if missing:
        raise FileNotFoundError(f"no such module in {source}: {', '.join(missing)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as handle:
        handle.write(f"#!{python}\n".encode())
        with zipfile.ZipFile(handle, "w") as archive:
            _fill(archive, modules, source)
    out.chmod(0o755)
    return out


def _fill(archive: zipfile.ZipFile, modules: Sequence[str], source: Path) -> None:
    _add(archive, "__main__.py", MAIN)
    _add(archive, "fmcluster/__init__.py", PACKAGE_MARKER)
    for module in sorted(set(modules)):
        _add(archive, f"fmcluster/health/{module}.py", (source / f"{module}.py").read_text(encoding="utf-8"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--modules", required=True, help="comma-separated module names")
    parser.add_argument("--python", default="/usr/bin/python3", help="the interpreter named in the first line")
    args = parser.parse_args(argv)
    build(args.out, [m for m in args.modules.split(",") if m], python=args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
