"""Baked node images (issue 40): the digest names what an image is made of, a stale image is never booted, and
the record and a node's first-boot installs read back as written."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

import pytest

from conftest import ROOT
from fmcluster import baked
from fmcluster.providers.local import bake, layers


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A copy of what the install set is read from: roles, playbooks, versions.yml."""
    for part in ("roles", "playbooks"):
        shutil.copytree(ROOT / part, tmp_path / part)
    (tmp_path / baked.VERSIONS_FILE).parent.mkdir(parents=True)
    shutil.copy(ROOT / baked.VERSIONS_FILE, tmp_path / baked.VERSIONS_FILE)
    return tmp_path


def test_the_digest_follows_the_install_set_and_nothing_else(tree: Path) -> None:
    before = baked.digest("pristine1", "cpu", tree)
    assert baked.digest("pristine1", "cpu", tree) == before  # stable
    assert baked.digest("pristine2", "cpu", tree) != before  # another pristine image
    assert baked.digest("pristine1", "gpu", tree) != before  # another kind
    munge = tree / "roles/munge/tasks/main.yml"
    text = munge.read_text()
    # A task that only configures (not tagged install) changes no image.
    munge.write_text(text.replace("- name: Check that the node's bootstrap left the tenant's munge key",
                                  "- name: Check that the bootstrap left the tenant's munge key"))
    assert baked.digest("pristine1", "cpu", tree) == before
    # An install task's change does.
    munge.write_text(text.replace("    name: munge\n", "    name: [munge, libmunge2]\n", 1))
    assert baked.digest("pristine1", "cpu", tree) != before
    munge.write_text(text)
    versions = tree / baked.VERSIONS_FILE
    versions.write_text(versions.read_text() + "\nextra_pin_for_the_test: 1\n")
    assert baked.digest("pristine1", "cpu", tree) != before


def _record(digest: str = "abc123", layer: str = "/nowhere") -> baked.Record:
    return baked.Record("bake40", "cpu", digest, "p1", "0" * 40, {"slurm": "22.05"}, "2026-12-06T07:00:00+00:00",
                        512 * 2**20, layer, 95.0)


def test_a_stale_or_missing_image_is_never_usable() -> None:
    assert not baked.status(None, "abc123", False).usable
    stale = baked.status(_record("old999"), "abc123", True)
    assert not stale.usable and "STALE" in stale.note and "invoke image" in stale.note
    gone = baked.status(_record(), "abc123", False)
    assert not gone.usable and "gone" in gone.note
    current = baked.status(_record(), "abc123", True)
    assert current.usable and "abc123" in current.note and "512 MiB" in current.note


def test_the_record_reads_back_and_a_broken_one_names_its_file(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    path.write_text(_record().to_json())
    assert baked.read_record(path) == _record()
    assert baked.read_record(tmp_path / "none.json") is None
    path.write_text("{}")
    with pytest.raises(ValueError, match=str(path)):
        baked.read_record(path)


def test_the_local_hosts_boot_the_baked_layer_only_while_it_is_current(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FMCLUSTER_IMAGE_CACHE", str(tmp_path))
    monkeypatch.setattr(layers, "install_digest", lambda ref, kind: "abc123")
    pristine = tmp_path / "pristine"
    assert layers.lowerdir("bake40", "cpu", "ref", pristine)[0] == str(pristine)  # nothing baked
    layer = layers.layer_dir("bake40", "cpu", "abc123")
    (layer / "rootfs").mkdir(parents=True)
    (layer / ".complete").write_text("{}")
    layers.record_path("bake40", "cpu").write_text(_record(layer=str(layer)).to_json())
    lower, found = layers.lowerdir("bake40", "cpu", "ref", pristine)
    assert lower == f"{layer / 'rootfs'}:{pristine}" and found.usable
    monkeypatch.setattr(layers, "install_digest", lambda ref, kind: "new456")  # a role's install task changed
    lower, found = layers.lowerdir("bake40", "cpu", "ref", pristine)
    assert lower == str(pristine) and "STALE" in found.note


def test_what_must_not_be_baked_leaves_the_layer(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    for path in ("etc/machine-id", "etc/ssh/ssh_host_ed25519_key", "var/lib/apt/lists/deb.debian.org_InRelease",
                 "var/log/dpkg.log", "var/lib/fmcluster/report.json", "etc/fmcluster/secrets/munge-key",
                 "etc/munge/munge.key", "var/lib/cloud/instance/boot-finished", "etc/cloud/cloud-init.disabled",
                 "usr/sbin/policy-rc.d", "usr/sbin/slurmd", "opt/fmcluster/venv-abc/bin/python", "etc/munge/keep"):
        (upper / path).parent.mkdir(parents=True, exist_ok=True)
        (upper / path).write_text("x")
    bake._clean_layer(upper)
    left = sorted(str(p.relative_to(upper)) for p in upper.rglob("*") if p.is_file())
    assert left == ["etc/munge/keep", "opt/fmcluster/venv-abc/bin/python", "usr/sbin/slurmd"]


def test_first_boot_installs_read_from_dpkg_log() -> None:
    log = ("2026-12-06 06:00:00 install old:amd64 <none> 1.0\n"
           "2026-12-06 07:10:00 startup packages configure\n"
           "2026-12-06 07:10:01 install munge:amd64 <none> 0.5.15-2\n"
           "2026-12-06 07:10:02 status installed libc-bin:amd64 2.36-9\n"  # a trigger's run: nothing installed
           "2026-12-06 07:10:03 upgrade curl:amd64 7.88.1-10 7.88.1-10+deb12u8\n")
    assert baked.installed_since(log, datetime(2026, 12, 6, 7, 0)) == {"munge": "0.5.15-2", "curl": "7.88.1-10+deb12u8"}
    assert baked.installed_since(log, datetime(2026, 12, 6, 8, 0)) == {}
    assert baked.installed_summary({}) == "nothing installed at first boot"
    assert baked.installed_summary({"munge": "1"}).startswith("1 package(s) installed at first boot: munge")


def test_a_node_says_which_image_it_booted(tmp_path: Path) -> None:
    marker = tmp_path / "image.json"
    assert baked.booted_image(marker).startswith("pristine")
    marker.write_text(_record().to_json())
    assert baked.booted_image(marker) == f"baked abc123 (cpu, commit {'0' * 12})"


def test_the_deploy_line_says_the_image_and_what_first_boot_installed() -> None:
    from fmcluster.nodes import Node
    from fmcluster.reports import NodeStatus

    node = Node("ip-10-244-0-10", "10.244.0.10", "compute", "cpu", "i-0", "c5.2xlarge")
    report = {"ref": "0" * 40, "seconds": 30, "changed": 40, "image": "baked abc123 (cpu, commit 000000000000)",
              "first_boot_installed": {}}
    assert NodeStatus(node, report, "converged").line().endswith(
        "; image baked abc123 (cpu, commit 000000000000), nothing installed at first boot")
    report = {**report, "image": "pristine (no baked image)", "first_boot_installed": {"munge": "0.5.15-2"}}
    assert "image pristine (no baked image), 1 package(s) installed at first boot: munge" in \
        NodeStatus(node, report, "converged").line()
    assert "image" not in NodeStatus(node, {"ref": "0" * 40}, "converged").line()  # an older node's report


def test_the_agent_reads_this_boots_installs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.node import agent

    log = tmp_path / "dpkg.log"
    log.write_text("2000-01-01 00:00:00 install image-build:amd64 <none> 1\n"
                   f"{datetime.now():%Y-%m-%d %H:%M:%S} install munge:amd64 <none> 0.5.15-2\n")
    assert agent.first_boot_installs(log) == {"munge": "0.5.15-2"}
    assert agent.first_boot_installs(tmp_path / "none.log") == {}


def test_the_deploy_summary_says_whether_the_baked_image_is_booted(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.model import load_tenant
    from fmcluster.providers.local import LocalProvider
    from localtenant import make_root

    monkeypatch.setenv("FMCLUSTER_IMAGE_CACHE", str(tmp_path / "cache"))
    tenant = load_tenant("bakenote", make_root(tmp_path, "bakenote", "10.247.0.0/16"))
    provider = LocalProvider(tenant)
    assert not [n for n in provider.substrate_notes() if n.startswith("baked image")]  # none baked: nothing said
    layers.baked_root("bakenote").mkdir(parents=True)
    layers.record_path("bakenote", "cpu").write_text(_record("old999").to_json())
    monkeypatch.setattr(layers, "install_digest", lambda ref, kind: "abc123")
    said = [n for n in provider.substrate_notes() if n.startswith("baked image for cpu nodes")]
    assert len(said) == 1 and "STALE" in said[0]
