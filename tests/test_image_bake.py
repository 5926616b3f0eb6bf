"""`invoke image` for real (issue 40, slow tier; run it under `flock /tmp/fmc-heavy.lock`): a small local tenant's
cpu image is baked from the pristine one, a host booted from it runs a first boot's install steps (the
bootstrap's install stages and site.yml --tags install) and dpkg installs nothing, and nothing of the tenant's
substrate is left (host, namespace, mount, package source)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fmcluster import baked
from fmcluster.model import Tenant, load_tenant
from fmcluster.providers.local import bake, layers
from localtenant import make_root, substrate_leftovers

pytestmark = pytest.mark.slow
ORG = "bakeslow"
VPC = "10.246.0.0/16"  # no other test's range


@pytest.fixture(scope="module")
def tenant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenant]:
    if os.geteuid() != 0:
        pytest.skip("local hosts need root (namespaces, mounts)")
    root = make_root(tmp_path_factory.mktemp("bake"), ORG, VPC, queues={"cpu": 1})
    try:
        yield load_tenant(ORG, root)
    finally:
        shutil.rmtree(layers.baked_root(ORG), ignore_errors=True)


@pytest.fixture(scope="module")
def made(tenant: Tenant) -> bake.Bake:
    return bake.bake(tenant, "cpu", print)


def test_the_bake_keeps_a_current_layer_and_its_record(made: bake.Bake) -> None:
    record = made.record
    assert baked.read_record(layers.record_path(ORG, "cpu")) == record
    assert (Path(record.layer) / "rootfs" / "usr/sbin/slurmd").is_file()  # an install task's package
    assert (Path(record.layer) / "rootfs" / baked.IMAGE_MARKER.lstrip("/")).is_file()
    assert layers.status(ORG, "cpu", record.commit).usable
    for gone in ("etc/munge/munge.key", "var/lib/fmcluster", "etc/fmcluster", "etc/cloud/cloud-init.disabled",
                 "usr/sbin/policy-rc.d", "var/log/dpkg.log"):
        assert not (Path(record.layer) / "rootfs" / gone).exists(), gone
    assert not list((Path(record.layer) / "rootfs" / "etc/ssh").glob("ssh_host_*"))
    assert substrate_leftovers(ORG) == []
    assert not [line for line in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
                if "apt-cacher-ng" in line and "10.246." in line]


def test_a_host_booted_from_it_installs_nothing(made: bake.Bake, tenant: Tenant) -> None:
    checked = bake.check(tenant, "cpu", print)
    assert checked.image.startswith(f"baked {made.record.digest}")
    assert checked.installed == {}, f"the baked image lacks what its install steps installed: {checked.installed}"
    print(f"bake {made.record.seconds:.0f}s ({'; '.join(made.lines)}); install steps on the baked image "
          f"{checked.seconds:.0f}s ({'; '.join(checked.lines)})")
    assert substrate_leftovers(ORG) == []
