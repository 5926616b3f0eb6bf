"""Baked images are kept and rotated (issue 40): the newest `baked_images.keep` of each kind (tenant setting, default in
the schema), and every one the cluster boots; older ones are removed with their records; `invoke destroy` and
`invoke status` say what is kept, what it costs (data/prices.yml) and whether it is current.

Offline: the records, the rule, the local layers (hosts stood in by their state). The AWS removal (DeregisterImage,
DeleteSnapshot) runs against the emulator in tests/test_baked_aws.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from fmcluster import baked
from fmcluster.model import BakedImages, load_tenant
from fmcluster.paths import SCHEMA_PATH
from fmcluster.providers.local import layers
from fmcluster.providers.local.hosts import Host

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FMCLUSTER_IMAGE_CACHE", str(tmp_path / "images"))
    return tmp_path / "images"


def record(kind: str, layer: str, hour: int, digest: str = "abc123abc123", org: str = "stockmark",
           size: int = 8 * 2**30) -> baked.Record:
    return baked.Record(org, kind, digest, "pristine", COMMIT, {}, f"2026-12-07T{hour:02d}:00:00+00:00", size, layer,
                        60.0)


def removed_by(calls: list[str]) -> object:
    def remove(rec: baked.Record) -> list[str]:
        calls.append(rec.layer)
        return [f"deregistered {rec.layer}"]
    return remove


def test_keep_is_a_tenant_setting_whose_default_lives_in_the_schema() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())["properties"]["tenant"]["properties"]["baked_images"]
    default = schema["properties"]["keep"]["default"]
    assert load_tenant("stockmark").baked_images.keep == default == BakedImages().keep
    assert schema["properties"]["keep"]["minimum"] == 1  # the current image is never rotated away


def test_a_new_record_keeps_the_one_it_replaces_and_the_same_image_recorded_again_is_one(cache: Path) -> None:
    baked.write_record(record("gpu", "ami-01", 1))
    baked.write_record(record("gpu", "ami-02", 2))
    baked.write_record(record("gpu", "ami-02", 3))  # the same AMI again (an unchanged image stack): no second record
    assert [(r.layer, r.created[11:13]) for _, r in baked.kept_records("stockmark", "gpu")] == [("ami-02", "03"),
                                                                                                ("ami-01", "01")]
    assert baked.read_record(baked.record_path("stockmark", "gpu")) == record("gpu", "ami-02", 3)


def test_older_images_beyond_keep_are_removed_with_their_records_but_one_the_cluster_boots_is_kept(
        cache: Path) -> None:
    for hour, ami in enumerate(("ami-01", "ami-02", "ami-03", "ami-04"), start=1):
        baked.write_record(record("gpu", ami, hour))
    baked.write_record(record("cpu", "ami-c1", 1))
    calls: list[str] = []
    lines = baked.rotate("stockmark", "gpu", 2, {"ami-01"}, removed_by(calls))  # type: ignore[arg-type]
    assert calls == ["ami-02"]
    assert [r.layer for _, r in baked.kept_records("stockmark", "gpu")] == ["ami-04", "ami-03", "ami-01"]
    assert [r.layer for _, r in baked.kept_records("stockmark", "cpu")] == ["ami-c1"]  # another kind: untouched
    assert any("kept gpu image ami-01" in line and "the cluster still boots it" in line for line in lines), lines
    assert any(line.startswith("removed gpu image ami-02") and "deregistered ami-02" in line for line in lines), lines
    # once the cluster boots another, the next rotation removes it; keep 1 leaves the current one alone
    lines = baked.rotate("stockmark", "gpu", 1, set(), removed_by(calls))  # type: ignore[arg-type]
    assert calls == ["ami-02", "ami-03", "ami-01"]
    assert [r.layer for _, r in baked.kept_records("stockmark", "gpu")] == ["ami-04"]


def test_an_image_that_cannot_be_removed_keeps_its_record_for_the_next_rotation(cache: Path) -> None:
    baked.write_record(record("gpu", "ami-01", 1))
    baked.write_record(record("gpu", "ami-02", 2))

    def refuse(rec: baked.Record) -> list[str]:
        raise RuntimeError("UnauthorizedOperation")
    lines = baked.rotate("stockmark", "gpu", 1, set(), refuse)
    assert [r.layer for _, r in baked.kept_records("stockmark", "gpu")] == ["ami-02", "ami-01"]
    assert any("could not remove gpu image ami-01 (UnauthorizedOperation)" in line and "tries again" in line
               for line in lines), lines


def test_an_unreadable_record_refuses_rotation_and_a_new_record_never_silently_treats_it_as_none(cache: Path) -> None:
    baked.write_record(record("gpu", "ami-01", 1))
    baked.write_record(record("gpu", "ami-02", 2))
    broken = next(baked.previous_dir("stockmark").glob("gpu-*.json"))
    broken.write_text("{not json")
    with pytest.raises(ValueError, match=f"{broken}: not a baked image record.*remove it"):
        baked.rotate("stockmark", "gpu", 1, set(), lambda rec: [])
    baked.record_path("stockmark", "gpu").write_text("[]")
    with pytest.raises(ValueError, match="not a baked image record"):
        baked.write_record(record("gpu", "ami-03", 3))


def test_destroy_says_each_kept_image_its_size_and_its_monthly_snapshot_cost_from_the_priced_data(
        cache: Path, tmp_path: Path) -> None:
    price = baked.snapshot_price()
    assert price.source.startswith("https://aws.amazon.com/ebs/pricing") and price.usd > 0
    baked.write_record(record("gpu", "ami-01", 1, size=100 * 2**30))
    baked.write_record(record("gpu", "ami-02", 2, size=100 * 2**30))
    baked.write_record(record("cpu", "ami-c1", 1, size=50 * 2**30))
    lines = baked.kept_lines("stockmark", baked.Price(0.05, "us-east-1", "https://aws.amazon.com/ebs/pricing/"))
    assert [line.split()[3] for line in lines[:-1]] == ["ami-c1", "ami-02", "ami-01"]
    assert "100.0 GiB of EBS snapshots at most, about $5.00 a month" in lines[1]
    assert lines[-1] == ("baked images' snapshots: about $12.50 a month at most, at us-east-1's $0.05/GB-month "
                         "(https://aws.amazon.com/ebs/pricing/); deregister an AMI and delete its snapshots to stop it")
    # a price file that lost its entry: said with the file, the key and the fix
    (tmp_path / "prices.yml").write_text("schema_version: 1\n")
    with pytest.raises(ValueError, match="prices.yml: ebs_snapshot_standard: .*restore the entry"):
        baked.snapshot_price(tmp_path / "prices.yml")


def test_status_lists_each_kinds_images_with_commit_age_use_and_staleness(cache: Path) -> None:
    baked.write_record(record("gpu", "ami-01", 1, digest="old000old000"))
    baked.write_record(record("gpu", "ami-02", 9, digest="new111new111"))
    baked.write_record(record("trainium", "ami-t1", 9))
    now = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
    lines = baked.status_lines("stockmark", {"gpu": "new111new111", "cpu": "c"}, {"ami-01"}, now)
    assert lines == [
        "gpu: ami-02 commit 0123456789ab, built 3 h ago, install set new111new111: current; not booted by the cluster",
        "gpu: ami-01 (previous) commit 0123456789ab, built 11 h ago, install set old000old000: STALE (install set now "
        "new111new111); the cluster boots it",
        "trainium: ami-t1 commit 0123456789ab, built 3 h ago, install set abc123abc123: no such nodes now; not booted "
        "by the cluster"]
    assert baked.status_lines("nobody", {}, set()) == ["no baked images recorded (`invoke image` bakes them)"]
    assert baked.age("2026-12-07T11:59:30", now) == "30 s"  # a record without a zone: UTC, as they are written


def host(image: str) -> Host:
    return Host("demo", "i-1", "node", "10.0.0.5", "ns", "veth", {"image": image})


def test_local_layers_rotate_and_one_a_running_host_boots_stays(cache: Path) -> None:
    root = layers.baked_root("demo")
    for hour, digest in enumerate(("aaaa", "bbbb", "cccc"), start=1):
        layer = layers.layer_dir("demo", "cpu", digest)
        (layer / "rootfs").mkdir(parents=True)
        baked.write_record(record("cpu", str(layer), hour, digest=digest, org="demo", size=2**20))
    oldest, middle, newest = (layers.layer_dir("demo", "cpu", d) for d in ("aaaa", "bbbb", "cccc"))
    running = [host(f"{oldest}/rootfs:/var/cache/pristine/rootfs"), host("/var/cache/pristine/rootfs")]
    assert layers.layers_in_use(running) == {str(oldest)}
    lines = layers.rotate_layers("demo", "cpu", 1, running)
    assert sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith("cpu-")) == ["cpu-aaaa",
                                                                                                  "cpu-cccc"]
    assert not middle.exists() and newest.exists()
    assert any(f"removed {middle} (1 MiB)" in line for line in lines), lines


def test_a_record_naming_a_folder_outside_the_tenants_layers_is_never_removed(cache: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    baked.write_record(record("cpu", str(elsewhere), 1, org="demo"))
    baked.write_record(record("cpu", str(layers.layer_dir("demo", "cpu", "cccc")), 2, org="demo"))
    lines = layers.rotate_layers("demo", "cpu", 1, [])
    assert elsewhere.is_dir()
    assert any(f"could not remove cpu image {elsewhere}" in line and "is not a cpu layer of 'demo'" in line
               for line in lines), lines


def test_invoke_status_says_each_recorded_image_and_whether_it_is_current_for_this_commit(cache: Path) -> None:
    from fmcluster.commands.image_stack import image_status
    from fmcluster.publish import SOURCE_ROOT, pinned_commit
    from fmcluster.schedulers.registry import scheduler_for
    from fmcluster.stacks.templates import image

    tenant = load_tenant("stockmark")
    assert image_status(tenant, None, reachable=False) == [
        "baked images of 'stockmark': no baked images recorded (`invoke image` bakes them)"]
    found = image.kind_images(tenant, scheduler_for(tenant))["gpu"]
    now = baked.committed_digest(pinned_commit(), "gpu", image.pristine(found), SOURCE_ROOT)
    baked.write_record(record("gpu", "ami-01", 1, digest="old000old000"))
    baked.write_record(record("gpu", "ami-02", 2, digest=now))
    lines = image_status(tenant, None, reachable=False)
    assert lines[0] == "baked images of 'stockmark' (keep 2 per kind):"
    assert lines[1].startswith(f"  gpu: ami-02 commit {COMMIT[:12]}, built ") and \
        lines[1].endswith(f"install set {now}: current; not booted by the cluster")
    assert f"gpu: ami-01 (previous) commit {COMMIT[:12]}" in lines[2] and f"STALE (install set now {now})" in lines[2]
    assert lines[3] == "  (AWS's APIs are not reachable: which AMI the cluster boots is not known)"
    # an unreadable record is said, not skipped
    baked.record_path("stockmark", "gpu").write_text("{")
    [said] = image_status(tenant, None, reachable=False)
    assert "cannot say" in said and "not a baked image record" in said


def test_invoke_status_on_the_local_substrate_says_which_layer_its_hosts_boot(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.commands.image_stack import image_status
    from fmcluster.providers.local import hosts

    layer = layers.layer_dir("demo", "cpu", "cccc")
    baked.write_record(record("cpu", str(layer), 1, digest="cccc", org="demo"))
    monkeypatch.setattr(layers, "install_digest", lambda ref, kind: "cccc")
    monkeypatch.setattr(hosts, "load_hosts", lambda org: [host(f"{layer}/rootfs:/pristine/rootfs")])
    lines = image_status(load_tenant("demo"), None, reachable=False)
    assert lines[1].startswith(f"  cpu: {layer} commit") and lines[1].endswith(
        "install set cccc: current; the cluster boots it"), lines
    assert len(lines) == 2  # the hosts are this machine's: known without the emulator
