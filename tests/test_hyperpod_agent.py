"""The local HyperPod agent stand-in (fmcluster/providers/local/hyperpod_agent.py) runs a group's lifecycle script as
HyperPod does: the bundle of LifeCycleConfig.SourceS3Uri staged under /tmp/<bucket>/<prefix>/ and OnCreate run by bash
from there, as its working directory, with SAGEMAKER_RESOURCE_CONFIG_PATH naming the resource config (docs/local-nodes.md,
"HyperPod stand-in"). Here the S3 client is a stand-in that copies a folder, and the staging root a temporary one."""

from __future__ import annotations

from pathlib import Path

import pytest

from fmcluster.providers.local import hyperpod_agent


def test_hyperpod_stages_the_bundle_under_tmp_by_bucket_and_prefix() -> None:
    assert hyperpod_agent.STAGING_ROOT == Path("/tmp")
    assert hyperpod_agent.staging_dir("s3://tenant-data/hyperpod/lifecycle/") == Path("/tmp/tenant-data/hyperpod/lifecycle")
    assert hyperpod_agent.staging_dir("s3://b/p") == Path("/tmp/b/p")


def test_on_create_runs_from_the_staged_bundle_with_the_resource_config_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "bucket-content"
    bundle.mkdir()
    seen = tmp_path / "seen"
    (bundle / "on_create.sh").write_text(f'#!/bin/bash\npwd > {seen}\necho "$SAGEMAKER_RESOURCE_CONFIG_PATH" >> {seen}\n')
    s3 = tmp_path / "fmcluster-s3"
    # `fmcluster-s3 --region R sync s3://bucket/prefix/ FOLDER`: the bucket's content copied into FOLDER.
    s3.write_text(f'#!/bin/sh\n[ "$3" = sync ] && cp -R {bundle}/. "$5"\n')
    s3.chmod(0o755)
    monkeypatch.setattr(hyperpod_agent, "STAGING_ROOT", tmp_path / "tmp")
    monkeypatch.setattr(hyperpod_agent, "S3_CLIENT", str(s3))
    monkeypatch.setattr(hyperpod_agent, "PROVISION_LOG", tmp_path / "provision" / "provisioning.log")
    code = hyperpod_agent.run_lifecycle({"region": "us-east-2", "life_cycle_config": {
        "SourceS3Uri": "s3://tenant-data/hyperpod/lifecycle/", "OnCreate": "on_create.sh"}})
    assert code == 0
    assert seen.read_text().splitlines() == [str(tmp_path / "tmp" / "tenant-data" / "hyperpod" / "lifecycle"),
                                             str(hyperpod_agent.RESOURCE_CONFIG)]
    assert "on_create.sh exited 0" in (tmp_path / "provision" / "provisioning.log").read_text()
