"""The local HyperPod agent stand-in (fmcluster/providers/local/hyperpod_agent.py) gives a lifecycle script what HyperPod
gives it: a resource config with HyperPod's keys alone, a slurm.conf naming nodes as HyperPod's does; and it runs the
script as HyperPod does: the bundle of LifeCycleConfig.SourceS3Uri staged under /tmp/<bucket>/<prefix>/, OnCreate run
by bash from there as its working directory, SAGEMAKER_RESOURCE_CONFIG_PATH naming the resource config
(docs/local-nodes.md, "HyperPod stand-in"). Here the S3 client is a stand-in that copies a folder, and the staging root
a temporary one."""

from __future__ import annotations

from pathlib import Path

import pytest

from fmcluster.providers.local import hyperpod_agent
from fmcluster.providers.local.emulator_hyperpod import AGENT, RESOURCE_CONFIG_INSTANCE_KEYS, resource_config


def test_the_emulator_writes_this_agent_onto_each_instance() -> None:
    assert AGENT == Path(hyperpod_agent.__file__).resolve() and AGENT.is_file()


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


def test_the_resource_config_holds_only_the_keys_hyperpod_writes() -> None:
    """No hostname in it (HyperPod writes none): a lifecycle script reading one would pass on the stand-in and fail
    on HyperPod. fmcluster's own lifecycle reads the group's Name and its instances' CustomerIpAddress."""
    config = resource_config("c", "arn:aws:sagemaker:us-east-2:123456789012:cluster/a1b2c3", [
        {"name": "controller", "instance_type": "ml.m5.xlarge", "instances": [{"id": "i-0a", "address": "10.1.0.10"}]},
        {"name": "cpu", "instance_type": "ml.c5.2xlarge", "instances": [{"id": "i-0b", "address": "10.1.0.12"}]}])
    for group in config["InstanceGroups"]:
        for instance in group["Instances"]:
            assert set(instance) <= set(RESOURCE_CONFIG_INSTANCE_KEYS), instance
    assert config["InstanceGroups"][1]["Instances"] == [
        {"InstanceName": "cpu-1", "InstanceId": "i-0b", "CustomerIpAddress": "10.1.0.12"}]


def test_the_stand_in_s_slurm_conf_names_nodes_as_hyperpod_does_from_their_customer_address() -> None:
    """HyperPod's slurm.conf: NodeName=ip-N-N-N-N from the CustomerIpAddress, the controller the same way."""
    config = resource_config("c", "arn", [
        {"name": "controller", "instance_type": "ml.m5.xlarge", "instances": [{"id": "i-0a", "address": "10.1.0.10"}]},
        {"name": "cpu", "instance_type": "ml.c5.2xlarge", "instances": [{"id": "i-0b", "address": "10.1.0.12"},
                                                                        {"id": "i-0c", "address": "10.1.0.13"}]}])
    conf = hyperpod_agent.slurm_conf({"resource_config": config, "slurm_groups": [
        {"name": "controller", "NodeType": "Controller"}, {"name": "cpu", "NodeType": "Compute", "PartitionNames": ["cpu"]}]})
    assert "SlurmctldHost=ip-10-1-0-10(10.1.0.10)" in conf.splitlines()
    assert "NodeName=ip-10-1-0-12 NodeAddr=10.1.0.12 " in conf
    assert "PartitionName=cpu Nodes=ip-10-1-0-12,ip-10-1-0-13 Default=YES" in conf


SETTINGS = {"instance_group": "", "region": "us-east-2", "munge_key": "",
            "slurm_groups": [{"name": "controller", "NodeType": "Controller"}, {"name": "login", "NodeType": "Login"},
                             {"name": "cpu", "NodeType": "Compute", "PartitionNames": ["cpu"]}],
            "resource_config": {"InstanceGroups": [
                {"Name": "controller", "Instances": [{"CustomerIpAddress": "10.1.0.10"}]},
                {"Name": "login", "Instances": [{"CustomerIpAddress": "10.1.0.11"}]},
                {"Name": "cpu", "Instances": [{"CustomerIpAddress": "10.1.0.12"}]}]}}


def stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, group: str, cycle: dict[str, str]) -> list[str]:
    """hyperpod_agent.main for `group` with the AMI's installation and the system calls recorded, not made: what it
    does, in order (the lifecycle's run included)."""
    import json

    done: list[str] = []
    settings = {**SETTINGS, "instance_group": group, "life_cycle_config": cycle}
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(settings))
    monkeypatch.setattr(hyperpod_agent, "RESOURCE_CONFIG", tmp_path / "resource_config.json")
    monkeypatch.setattr(hyperpod_agent, "install_ami_slurm", lambda s, kind: done.append(f"install {kind}"))
    monkeypatch.setattr(hyperpod_agent, "write", lambda p, text, mode=0o644: done.append(f"write {p}: {text.strip()}"))
    monkeypatch.setattr(hyperpod_agent, "run", lambda argv, **_: done.append(" ".join(argv)))
    monkeypatch.setattr(hyperpod_agent.subprocess, "run", lambda argv, **_: done.append(" ".join(argv)))
    monkeypatch.setattr(hyperpod_agent, "run_lifecycle",
                        lambda s: done.append("lifecycle " + hyperpod_agent.hook(s["life_cycle_config"])[0]) or 0)
    assert hyperpod_agent.main([str(path)]) == 0
    return [step for step in done if not step.startswith(f"write {tmp_path}")]  # the resource config it is given


ON_INIT_COMPLETE = {"SourceS3Uri": "s3://b/hyperpod/lifecycle/", "OnInitComplete": "on_create.sh"}


def test_with_on_init_complete_the_stand_in_starts_hyperpods_slurm_before_the_script(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """OnInitComplete runs "after HyperPod configures the default software on the instance": Slurm is up when the
    script starts (fmcluster's lifecycle only waits for it). Before, the stand-in left Slurm to the script, as
    OnCreate does, and fmcluster's script started it itself: an order HyperPod does not follow for OnInitComplete."""
    assert stand_in(monkeypatch, tmp_path, "controller", ON_INIT_COMPLETE) == [
        "install Controller", "systemctl enable --now slurmctld", "lifecycle OnInitComplete"]
    assert stand_in(monkeypatch, tmp_path, "cpu", ON_INIT_COMPLETE) == [
        "install Compute",
        'write /etc/systemd/system/slurmd.service.d/hyperpod-conf-server.conf: [Service]\n'
        'Environment="SLURMD_OPTIONS=--conf-server 10.1.0.10"',
        "systemctl daemon-reload", "systemctl enable slurmd", "systemctl restart slurmd", "lifecycle OnInitComplete"]
    assert stand_in(monkeypatch, tmp_path, "login", ON_INIT_COMPLETE)[-2:] == [
        "systemctl restart slurmd", "lifecycle OnInitComplete"]


def test_with_on_create_the_stand_in_leaves_slurm_to_the_script(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cycle = {"SourceS3Uri": "s3://b/hyperpod/lifecycle/", "OnCreate": "on_create.sh"}
    assert stand_in(monkeypatch, tmp_path, "cpu", cycle) == ["install Compute", "lifecycle OnCreate"]


def test_a_lifecycle_config_names_exactly_one_hook() -> None:
    assert hyperpod_agent.hook(ON_INIT_COMPLETE) == ("OnInitComplete", "on_create.sh")
    for cycle in ({"SourceS3Uri": "s3://b/"}, {**ON_INIT_COMPLETE, "OnCreate": "on_create.sh"}):
        with pytest.raises(ValueError, match="OnInitComplete, OnCreate"):
            hyperpod_agent.hook(cycle)
