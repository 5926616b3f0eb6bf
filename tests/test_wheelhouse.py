"""The nodes' toolchain as wheels (fmcluster.wheelhouse): the pins install on every Python an image fmcluster boots
has, and a pin that does not is refused at deploy time naming the Python — not at boot on every node.

Resolving needs the package index (PyPI, which this project's machines reach); the built wheelhouse is cached
under .cache/wheelhouse/, so the contract test costs a download once per change of pins.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import ROOT
from fmcluster import versions, wheelhouse

pytestmark = pytest.mark.slow


def test_the_targets_are_the_catalogued_images_pythons() -> None:
    assert [t.python for t in wheelhouse.targets()] == ["3.10", "3.11", "3.12"]
    assert wheelhouse.Target("3.10", (2, 35)).platforms()[:2] == ["manylinux2014_x86_64", "manylinux_2_17_x86_64"]
    assert wheelhouse.Target("3.10", (2, 35)).platforms()[-1] == "manylinux_2_35_x86_64"


def test_the_node_pins_resolve_as_wheels_for_python_3_10_3_11_and_3_12() -> None:
    folder = wheelhouse.ensure(out=lambda _: None)
    names = {w.name.split("-")[0].lower().replace("_", "-") for w in folder.glob("*.whl")}
    assert {"ansible-core", "ansible-runner", "boto3", "pyyaml", "pip"} <= names
    for tag in ("cp310", "cp311", "cp312"):
        assert any(f"-{tag}-" in w.name for w in folder.glob("pyyaml-*.whl")), f"no PyYAML wheel for {tag}"


def test_the_wheelhouse_installs_with_no_index_as_a_node_installs_it(tmp_path: Path) -> None:
    folder = wheelhouse.ensure(out=lambda _: None)
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(target)  # as node-bootstrap.sh: `python3 -m venv --without-pip`
    pip_wheel = next(folder.glob("pip-*.whl"))
    done = subprocess.run([str(target / "bin" / "python"), f"{pip_wheel}/pip", "install", "-q", "--no-index",
                           "--no-cache-dir", "--find-links", str(folder), *versions.node_requirements()],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = subprocess.run([str(target / "bin" / "python"), "-c", "import ansible; print(ansible.__version__)"],
                           capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == versions.load()["node_toolchain"]["ansible-core"]


def test_a_pin_with_no_wheel_for_an_image_s_python_is_refused_naming_it(tmp_path: Path) -> None:
    # ansible-core 2.19 requires Python >= 3.11: the Ubuntu 22.04 images' 3.10 cannot install it.
    with pytest.raises(wheelhouse.WheelhouseError, match=r"cannot all be had as wheels for Python 3\.10 "):
        wheelhouse._download([sys.executable, "-m", "pip"], wheelhouse.Target("3.10", (2, 35)),
                             ["ansible-core==2.19.14"], tmp_path)


def test_the_bundle_carries_every_wheel_under_wheelhouse() -> None:
    folder = wheelhouse.ensure(out=lambda _: None)
    files = wheelhouse.bundle_files(folder)
    assert files and all(name.startswith("wheelhouse/") and name.endswith(".whl") for name in files)
    assert (ROOT / ".cache").is_dir()
