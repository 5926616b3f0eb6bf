"""ParallelCluster boots a recorded baked image as `CustomAmi` (issue 40): per node group of the image's kind (head
node, login pool, queue), never the cluster-wide `Image.CustomAmi` every other group would inherit; a stale record is
refused before the config is rendered, never swapped for the official AMI; the local stand-in boots its hosts' layers.

What writes such a record (a bake on ParallelCluster's official AMI) is not built yet: the records here are written
by hand, as `invoke image` writes them (fmcluster.baked.write_record).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fmcluster import baked
from fmcluster.model import load_tenant
from fmcluster.publish import SOURCE_ROOT, pinned_commit
from fmcluster.schedulers.parallelcluster.config import render_cluster_config
from fmcluster.schedulers.parallelcluster.custom_ami import baked_amis
from fmcluster.schedulers.parallelcluster.schema import ToolMissing, check_configs, tool_python
from fmcluster.images import load_images
from fmcluster.stacks.templates.image import pristine

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FMCLUSTER_IMAGE_CACHE", str(tmp_path / "images"))
    return tmp_path / "images"


def record(org: str, kind: str, digest: str, ami: str) -> baked.Record:
    return baked.Record(org, kind, digest, "pristine", COMMIT, {}, "2026-12-07T10:00:00+00:00", 0, ami, 60.0)


def test_each_node_group_of_a_baked_kind_boots_its_custom_ami_and_the_others_the_official_one() -> None:
    tenant = load_tenant("pclab")  # head node and login m5 (cpu), queues p5 (gpu) and m5 (cpu)
    plain = render_cluster_config(tenant).data
    gpu = render_cluster_config(tenant, baked_amis={"gpu": "ami-0gpu"})
    assert gpu.data["Image"] == plain["Image"] == {"Os": plain["Image"]["Os"]}  # no cluster-wide CustomAmi
    queues = {q["Name"]: q.get("Image") for q in gpu.data["Scheduling"]["SlurmQueues"]}
    assert {name: image for name, image in queues.items() if image} == {
        q.name: {"CustomAmi": "ami-0gpu"} for q in tenant.queues if q.instance.accelerator == "cuda"}
    assert "Image" not in gpu.data["HeadNode"] and "Image" not in gpu.data["LoginNodes"]["Pools"][0]
    # the provenance names the tenant setting, so a schema finding on it points at the tenant file
    index = next(i for i, q in enumerate(gpu.data["Scheduling"]["SlurmQueues"]) if q.get("Image"))
    assert gpu.tenant_key(("Scheduling", "SlurmQueues", index, "Image", "CustomAmi"))[0] == ("tenant", "baked_images")
    cpu = render_cluster_config(tenant, baked_amis={"cpu": "ami-0cpu"}).data
    assert cpu["HeadNode"]["Image"] == cpu["LoginNodes"]["Pools"][0]["Image"] == {"CustomAmi": "ami-0cpu"}
    assert {q["Name"] for q in cpu["Scheduling"]["SlurmQueues"] if q.get("Image")} == {
        q.name for q in tenant.queues if q.instance.accelerator == "none"}


def test_the_config_with_custom_amis_passes_parallelclusters_schema() -> None:
    try:
        tool_python()
    except ToolMissing:
        pytest.skip("no aws-parallelcluster tool environment (scripts/bootstrap.sh installs it)")
    cfg = render_cluster_config(load_tenant("pclab"), baked_amis={"cpu": "ami-0123456789abcdef0",
                                                                   "gpu": "ami-0fedcba9876543210"})
    [report] = check_configs([cfg])
    assert report.loaded_as == "SlurmClusterConfig" and report.ok, report
    # ParallelCluster reads its own tags on the AMI: one it did not build (or that was not built on its AMI) is warned
    # of, and creation fails (docs/node-convergence.md): what a bake on ParallelCluster's AMI must keep
    assert any(w.validator == "CustomAmiTagValidator" for w in report.warnings), report.warnings


def test_which_ami_a_kind_boots_follows_the_record_and_a_stale_one_is_refused(cache: Path) -> None:
    tenant = load_tenant("pclab")
    assert baked_amis(tenant, None) == ({}, [], [])  # nothing recorded: the official AMI everywhere
    official = load_images()[f"parallelcluster-{render_cluster_config(tenant).data['Image']['Os']}"]
    current = baked.committed_digest(pinned_commit(), "gpu", pristine(official), SOURCE_ROOT)
    baked.write_record(record("pclab", "gpu", current, "ami-0gpu"))
    chosen, refusals, lines = baked_amis(tenant, None)
    assert chosen == {"gpu": "ami-0gpu"} and refusals == []
    assert "gpu nodes: CustomAmi ami-0gpu" in lines[0] and "not checked offline" in lines[0]
    baked.write_record(record("pclab", "cpu", "old000old000", "ami-0stale"))
    chosen, refusals, _ = baked_amis(tenant, None)
    assert chosen == {"gpu": "ami-0gpu"}
    [refused] = refusals
    assert "tenant 'pclab': its cpu image ami-0stale" in refused and "--kind=cpu" in refused and "never booted" in refused


def test_the_local_stand_in_never_renders_a_layer_as_an_ami(cache: Path) -> None:
    tenant = load_tenant("pcdemo")  # provider local: its hosts boot the substrate's layers
    baked.write_record(record("pcdemo", "cpu", "abc123abc123", str(cache / "baked" / "pcdemo" / "cpu-abc123abc123")))
    assert baked_amis(tenant, None) == ({}, [], [])


def test_status_compares_a_parallelcluster_record_with_the_install_set_over_its_official_image(cache: Path) -> None:
    from fmcluster.commands.image_stack import image_status

    tenant = load_tenant("pclab")
    official = load_images()[f"parallelcluster-{render_cluster_config(tenant).data['Image']['Os']}"]
    current = baked.committed_digest(pinned_commit(), "gpu", pristine(official), SOURCE_ROOT)
    baked.write_record(record("pclab", "gpu", current, "ami-0gpu"))
    lines = image_status(tenant, None, reachable=False)
    assert lines[1].startswith("  gpu: ami-0gpu commit") and f"install set {current}: current" in lines[1], lines
