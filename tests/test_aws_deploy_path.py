"""The AWS tenants' deploy, run against the emulator up to node boot: the calls `invoke deploy --org=stockmark`
and `--org=neuronlab` make on AWS (secrets, key pair, stacks, bundle, manifest, lifecycle scripts) are the ones
the local rehearsal makes, and every node would receive the same first-boot contract.

The provider is the real `aws` one; only its endpoint is the emulator's (the stand-in is the endpoint, never an
API answer). EC2 "boots" nothing here: what 16 P5 (slurm-ec2) and 8 Trn1 (HyperPod) nodes would run is read from
what the emulator holds — instances' user data, the lifecycle prefix, the manifest, the secrets.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from capacity_helpers import reserve_what_the_tenant_names
from conftest import ROOT
from signalling import NodesSignal
from fmcluster.model import load_tenant
from fmcluster.stacks.api import TEMPLATES_PREFIX
from fmcluster.stacks.changesets import MAX_TEMPLATE_BODY
from fmcluster.stacks.render import first_boot_script
from scheduler_stacks import render_stacks

pytestmark = pytest.mark.slow
USER_DATA_SCRIPT = first_boot_script()


class EmulatedAws:
    """The aws provider with the emulator as its endpoint, and so the emulator's APIs (its capabilities: AWS's, but
    for how the APIs answer). EC2 boots the instances and each node's first boot signals its group (CreationPolicy):
    no node runs here, so `nodes` (tests/signalling.py) sends those signals when the deploy boots while the cluster
    stack waits."""

    def __init__(self, tenant: Any, endpoint: str, nodes: NodesSignal | None = None) -> None:
        from fmcluster.capabilities import EMULATOR_APIS
        from fmcluster.providers.aws import AwsProvider

        self._real = AwsProvider(tenant)
        self._endpoint = endpoint
        self.nodes = nodes or NodesSignal(tenant.region, endpoint)
        self.name, self.boot_timeout_s = "aws", self._real.boot_timeout_s
        self.capabilities = replace(self._real.capabilities, apis=EMULATOR_APIS)

    def endpoint(self, start: bool, out: Any) -> str:
        return self._endpoint

    def boot(self, endpoint: str | None, out: Any) -> Any:
        self.nodes()
        return self._real.boot(endpoint, out)

    def image_parameter(self, path: str) -> str:
        # The emulator ships no DLAMI parameters; which image the nodes boot is not what this test checks.
        from fmcluster.providers.local import EMULATOR_IMAGE_PARAMETER

        return EMULATOR_IMAGE_PARAMETER

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.fixture
def deployed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, list[str]]]:
    from fmcluster.deploy import Deploy
    from fmcluster.model import load_tenant
    from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator

    org: str = request.param
    root = tmp_path / "root"
    shutil.copytree(ROOT / "inventories" / org, root / "inventories" / org)
    previous = os.environ.get("FMCLUSTER_ROOT")
    os.environ["FMCLUSTER_ROOT"] = str(root)
    emulator = ensure_emulator(org, root)
    try:
        from fmcluster.stacks import aws

        # The capacity pre-flight asks EC2 for the reservations the tenant names: the emulator holds matching ones.
        named = load_tenant(org)
        reserve_what_the_tenant_names(aws.client("ec2", named.region, emulator.endpoint), named,
                                      root / "inventories" / org / "group_vars" / "all" / "tenant.yml")
        tenant = load_tenant(org)
        # The secrets the tenant makes itself (monitoring.smtp's relay login), as it would before deploying: the
        # deploy refuses before any change when one is missing (fmcluster.publish.missing_tenant_secrets).
        from fmcluster.manifest import secret_id
        from fmcluster.publish import tenant_named_secrets

        secretsmanager = aws.client("secretsmanager", tenant.region, emulator.endpoint)
        for _key, name in tenant_named_secrets(tenant):
            secretsmanager.create_secret(Name=secret_id(org, name), SecretString=f"tenant-made-{name}")
        lines: list[str] = []
        deploy = Deploy(tenant, out=lines.append)
        deploy.provider = EmulatedAws(tenant, emulator.endpoint)  # type: ignore[assignment]
        # validate, endpoint, capacity, access, stacks (which publishes for the nodes), cluster where it is the stack's,
        # and boot where EC2 lists the instances (the emulator does not create a HyperPod cluster, so there is
        # nothing to list for it; `pcluster create-cluster` needs AWS itself)
        steps = deploy.steps()[:{"slurm-ec2": 7, "hyperpod": 6, "parallelcluster": 5}[tenant.scheduler]]
        for name, step in steps:
            outcome = step()
            assert outcome.status != "failed", (name, outcome, "\n".join(lines[-30:]))
        yield deploy, lines
    finally:
        stop_emulator(org, root)
        os.environ["FMCLUSTER_ROOT"] = previous or str(ROOT)


def _manifest(deploy: Any) -> dict[str, Any]:
    s3 = deploy.client("s3")
    body = s3.get_object(Bucket=deploy.outputs["DataBucketName"], Key="fmcluster/manifest/cluster.json")["Body"].read()
    loaded: dict[str, Any] = json.loads(body)
    return loaded


def _secret_values(deploy: Any) -> dict[str, str]:
    sm = deploy.client("secretsmanager")
    names = [s["Name"] for s in sm.list_secrets()["SecretList"]]
    return {name: sm.get_secret_value(SecretId=name)["SecretString"] for name in names}


@pytest.mark.parametrize("deployed", ["stockmark"], indirect=True)
def test_sixteen_p5_nodes_would_boot_the_same_bootstrap_with_the_tenant_s_bucket_region_and_group(
        deployed: tuple[Any, list[str]]) -> None:
    from fmcluster.publish import pinned_commit

    deploy, lines = deployed
    ec2 = deploy.client("ec2")
    instances = [i for r in ec2.describe_instances(Filters=[{"Name": "tag:fmcluster:org", "Values": ["stockmark"]}])
                 ["Reservations"] for i in r["Instances"]]
    by_role: dict[str, list[Any]] = {}
    for instance in instances:
        role = {t["Key"]: t["Value"] for t in instance["Tags"]}["fmcluster:role"]
        by_role.setdefault(role, []).append(instance)
    assert {k: len(v) for k, v in by_role.items()} == {"controller": 1, "login": 1, "compute": 16}
    assert {i["InstanceType"] for i in by_role["compute"]} == {"p5.48xlarge"}
    assert {i["KeyName"] for i in instances} == {"fmcluster-stockmark"}
    bucket = deploy.outputs["DataBucketName"]
    # The controller has no CreationPolicy (it is an instance, created first and kept): nothing to signal.
    signal = {"controller": "''", "login": "LoginGroup", "compute": "QueueGpuGroup"}
    queue = {"controller": "''", "login": "''", "compute": "gpu"}
    for role, group in by_role.items():
        for instance in group:
            raw = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
            user_data = base64.b64decode(raw["UserData"]["Value"]).decode()
            exports = user_data[user_data.index("export "):user_data.index(USER_DATA_SCRIPT)]
            assert exports == (f"export FMCLUSTER_BUCKET={bucket}\nexport FMCLUSTER_REGION=ap-northeast-1\n"
                               "export FMCLUSTER_ORG=stockmark\nexport FMCLUSTER_STACK=fmc-stockmark-cluster\n"
                               f"export FMCLUSTER_ROLE={role}\nexport FMCLUSTER_QUEUE={queue[role]}\n"
                               f"export FMCLUSTER_SIGNAL_RESOURCE={signal[role]}\n")
            assert user_data.startswith("#!/bin/bash\n") and user_data.endswith(USER_DATA_SCRIPT)
    s3 = deploy.client("s3")
    listed = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="fmcluster/")["Contents"])
    wheels = [k for k in listed if k.startswith("fmcluster/bootstrap/wheelhouse/")]
    # A template over CloudFormation's inline limit went by TemplateURL, from the bucket; the others inline.
    large = [f"{TEMPLATES_PREFIX}fmc-stockmark-{s.key}.yaml" for s in render_stacks(load_tenant("stockmark", ROOT))
             if len(s.body.encode()) > MAX_TEMPLATE_BODY]
    assert [k for k in listed if k.startswith(TEMPLATES_PREFIX)] == large
    assert [k for k in listed if k not in wheels and k not in large] == [
        "fmcluster/bootstrap/converge.env", "fmcluster/bootstrap/fmcluster-s3", "fmcluster/bootstrap/node-bootstrap.sh",
        "fmcluster/bootstrap/repo.bundle", "fmcluster/manifest/cluster.json", "fmcluster/manifest/index.json"]
    # ...and every node would run them only as the deploy's: the index lists each, the SSM parameter names the index
    # (issue 42: nodes verify what they execute).
    index = s3.get_object(Bucket=bucket, Key="fmcluster/manifest/index.json")["Body"].read()
    objects = json.loads(index)["objects"]
    assert sorted(objects) == [k for k in listed if k not in large and not k.endswith("index.json")]
    for key, sha256 in objects.items():
        assert hashlib.sha256(s3.get_object(Bucket=bucket, Key=key)["Body"].read()).hexdigest() == sha256, key
    parameter = deploy.client("ssm").get_parameter(Name="/fmcluster/stockmark/bootstrap-index-sha256")["Parameter"]
    assert parameter["Value"] == hashlib.sha256(index).hexdigest()
    # The toolchain the nodes build at first boot travels with the bundle: pip and every pin, as wheels.
    assert any("/pip-" in k for k in wheels) and any("/ansible_core-" in k for k in wheels)
    env = s3.get_object(Bucket=bucket, Key="fmcluster/bootstrap/converge.env")["Body"].read().decode()
    assert f"FMCLUSTER_REF={pinned_commit()}\n" in env and "FMCLUSTER_PLAYBOOK=playbooks/site.yml\n" in env
    manifest = _manifest(deploy)
    assert manifest["ref"] == pinned_commit() and manifest["discovery"] == {"kind": "ec2", "tag": "fmcluster:org"}
    gpu = manifest["groups"]["queues"]["gpu"]
    assert gpu["resources"] == {"cpus": 192, "real_memory_mb": int(2048 * 1024 * 0.95), "gres": "gpu:8",
                                "gres_files": "/dev/nvidia[0-7]"}
    assert gpu["instance"]["efa_interfaces"] == 32
    assert manifest["secrets"] == {
        "munge-key": {"id": "fmcluster/stockmark/munge-key", "roles": ["controller", "login", "compute"]},
        "grafana-admin-password": {"id": "fmcluster/stockmark/grafana-admin-password", "roles": ["controller"]},
        # the tenant's own (monitoring.smtp: its alert mail relay's credentials), read by the controller alone
        "smtp-username": {"id": "fmcluster/stockmark/smtp-username", "roles": ["controller"]},
        "smtp-password": {"id": "fmcluster/stockmark/smtp-password", "roles": ["controller"]}}
    assert manifest["vars"]["prometheus_node_discovery"]["kind"] == "ec2"
    assert manifest["vars"]["munge_key_src"] == "/etc/fmcluster/secrets/munge-key"
    secrets = _secret_values(deploy)
    # The deploy makes its own secrets; the tenant's own (the relay's credentials) are the tenant's to create.
    assert sorted(s for s in secrets if not secrets[s].startswith("tenant-made-")) == [
        "fmcluster/stockmark/grafana-admin-password", "fmcluster/stockmark/munge-key"]
    assert len(secrets["fmcluster/stockmark/munge-key"]) >= 32
    shown = "\n".join(lines) + json.dumps(manifest)
    assert not any(value in shown for value in secrets.values()), "a secret value was printed or published"


@pytest.mark.parametrize("deployed", ["stockmark"], indirect=True)
def test_every_node_the_deploy_lists_is_found_by_the_same_discovery_the_nodes_run(
        deployed: tuple[Any, list[str]]) -> None:
    from fmcluster.manifest import assemble_inventory
    from fmcluster.nodes import discover

    deploy, _ = deployed
    manifest = _manifest(deploy)
    nodes = discover(manifest["discovery"], deploy.client, "stockmark")
    assert len(nodes) == 18 and [n.role for n in nodes][:2] == ["controller", "login"]
    inventory = assemble_inventory(manifest, nodes)["all"]
    assert len(inventory["vars"]["slurm_nodes"]) == 16
    assert inventory["vars"]["slurm_controller_hostname"] == nodes[0].name
    assert sorted(inventory["children"]["compute"]["children"]["queue_gpu"]["hosts"]) == \
        sorted(n.name for n in nodes if n.role == "compute")


@pytest.mark.parametrize("deployed", ["neuronlab"], indirect=True)
def test_eight_trn1_hyperpod_nodes_would_run_the_same_first_boot_script_through_the_lifecycle(
        deployed: tuple[Any, list[str]]) -> None:
    from fmcluster.stacks.render import load_cfn_yaml

    deploy, lines = deployed
    bucket = deploy.outputs["DataBucketName"]
    s3 = deploy.client("s3")
    lifecycle = {o["Key"].rsplit("/", 1)[1]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read().decode()
                 for o in s3.list_objects_v2(Bucket=bucket, Prefix="hyperpod/lifecycle/")["Contents"]}
    assert lifecycle["node-user-data.sh"] == USER_DATA_SCRIPT
    assert lifecycle["on_create.sh"] == (ROOT / "src/fmcluster/schedulers/hyperpod/node_files" / "on_create.sh").read_text()
    assert 'exec bash "$here/node-user-data.sh"' in lifecycle["on_create.sh"]
    assert (f"FMCLUSTER_BUCKET={bucket}\nFMCLUSTER_REGION=us-east-2\nFMCLUSTER_ORG=neuronlab\n"
            "FMCLUSTER_STACK=fmc-neuronlab-cluster\n") in lifecycle["fmcluster-lifecycle.env"]
    cluster = next(s for s in render_stacks(deploy.tenant) if s.key == "cluster")
    groups = {g["InstanceGroupName"]: g for g in next(
        r for r in load_cfn_yaml(cluster.body)["Resources"].values()
        if r["Type"] == "AWS::SageMaker::Cluster")["Properties"]["InstanceGroups"]}
    trn1 = next(g for g in groups.values() if g["InstanceType"] == "ml.trn1.32xlarge")
    assert trn1["InstanceCount"] == 8
    assert {k: v for k, v in trn1["LifeCycleConfig"].items() if k != "SourceS3Uri"} == {"OnInitComplete": "on_create.sh"}
    manifest = _manifest(deploy)
    assert manifest["discovery"]["kind"] == "hyperpod"
    assert manifest["discovery"]["groups"][trn1["InstanceGroupName"]] == "compute"
    assert manifest["vars"]["prometheus_node_discovery"] == {"kind": "inventory"}
    assert manifest["secrets"]["munge-key"]["id"] == "fmcluster/neuronlab/munge-key"
    secrets = _secret_values(deploy)
    assert not any(value in "\n".join(lines) for value in secrets.values())
    from fmcluster.nodes import discover

    # The emulator's HyperPod stand-in made the cluster: the discovery the manifest names finds its 10 nodes.
    found = discover(manifest["discovery"], deploy.client, "neuronlab")
    assert [n.role for n in found].count("compute") == 8 and [n.role for n in found][:2] == ["controller", "login"]


@pytest.mark.parametrize("deployed", ["pclab"], indirect=True)
def test_parallelcluster_nodes_would_fetch_the_same_first_boot_through_on_node_configured(
        deployed: tuple[Any, list[str]]) -> None:
    """Up to `pcluster create-cluster` (which needs AWS itself): the bundle, the manifest and the
    OnNodeConfigured script are in the bucket before ParallelCluster would make a node, and the config
    rendered from the deployed stacks names that script with the tenant's settings."""
    from fmcluster.schedulers.parallelcluster.config import CUSTOM_ACTION_KEY, custom_action_script, render_cluster_config

    deploy, _ = deployed
    bucket = deploy.outputs["DataBucketName"]
    s3 = deploy.client("s3")
    listed = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="fmcluster/")["Contents"])
    assert CUSTOM_ACTION_KEY in listed and "fmcluster/bootstrap/node-bootstrap.sh" in listed
    assert s3.get_object(Bucket=bucket, Key=CUSTOM_ACTION_KEY)["Body"].read() == custom_action_script()
    assert custom_action_script().endswith(USER_DATA_SCRIPT.encode())
    manifest = _manifest(deploy)
    assert manifest["discovery"] == {"kind": "ec2", "tag": "fmcluster:org", "node_tags": {
        "role": "parallelcluster:node-type", "roles": {"HeadNode": "controller", "LoginNode": "login", "Compute": "compute"},
        "queue": "parallelcluster:queue-name"}}
    assert manifest["vars"]["fmcluster_capabilities"]["slurm_owner"] == "scheduler", "ParallelCluster's own Slurm on AWS"
    config = render_cluster_config(deploy.tenant, deploy.outputs).data
    action = config["Scheduling"]["SlurmQueues"][0]["CustomActions"]["OnNodeConfigured"]
    assert action["Script"] == f"s3://{bucket}/{CUSTOM_ACTION_KEY}"
    assert action["Args"] == [f"FMCLUSTER_BUCKET={bucket}", "FMCLUSTER_REGION=us-east-1", "FMCLUSTER_ORG=pclab",
                              "FMCLUSTER_ROLE=compute", "FMCLUSTER_QUEUE=gpu"]
    assert config["HeadNode"]["Ssh"]["KeyName"] == "fmcluster-pclab", "the key the deploy imported"
    assert config["HeadNode"]["Iam"]["AdditionalIamPolicies"][0]["Policy"] == deploy.outputs["HeadNodeBootstrapPolicyArn"]


@pytest.mark.slow
def test_a_node_whose_first_boot_fails_rolls_the_cluster_stack_back_and_the_deploy_names_it_first(
        tmp_path: Path) -> None:
    """Issue 35: one node's FAILURE signal fails its group (CreationPolicy, 100 % of three), CloudFormation rolls the
    whole cluster stack back and terminates the instances; the deploy's stacks step then names the node, its failed
    task and its log's end (its own report, in the storage stack's bucket, which the rollback leaves) before
    CloudFormation's reason, which names only the group. Nothing here is the local substrate's: the aws provider,
    the emulator as its endpoint, the node's report and signal as the agent files and sends them."""
    from datetime import datetime, timezone

    from fmcluster.deploy import Deploy
    from fmcluster.stacks import aws
    from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator

    org = "demo"
    root = tmp_path / "root"
    shutil.copytree(ROOT / "inventories" / org, root / "inventories" / org, ignore=shutil.ignore_patterns("generated"))
    previous = os.environ.get("FMCLUSTER_ROOT")
    os.environ["FMCLUSTER_ROOT"] = str(root)
    emulator = ensure_emulator(org, root)
    try:
        tenant = load_tenant(org)
        cf, ec2 = (aws.client(service, tenant.region, emulator.endpoint) for service in ("cloudformation", "ec2"))
        s3 = aws.client("s3", tenant.region, emulator.endpoint)
        failing: dict[str, str] = {}

        def status(logical_id: str, instance: str) -> str:
            if logical_id == "QueueCpuGroup" and not failing:
                failing["instance"] = instance  # the first compute node's first boot fails
            return "FAILURE" if failing.get("instance") == instance else "SUCCESS"

        def file_report(logical_id: str, instance: str, signalled: str) -> None:
            """What the node agent files before it signals FAILURE (fmcluster.node.agent: report, then signal)."""
            if signalled != "FAILURE":
                return
            bucket = next(o["OutputValue"] for o in cf.describe_stacks(StackName=f"fmc-{org}-storage")["Stacks"][0]
                          ["Outputs"] if o["OutputKey"] == "DataBucketName")
            (reservation,) = ec2.describe_instances(InstanceIds=[instance])["Reservations"]
            address = reservation["Instances"][0]["PrivateIpAddress"]
            failing["node"] = f"ip-{address.replace('.', '-')}"
            report = {"address": address, "trigger": "first-boot", "ok": False, "stage": "converge",
                      "error": "ansible-pull exited 2: task 'slurm : Install Slurm': Failed to fetch "
                               "http://deb.debian.org/debian/pool/main/s/slurm-wlm/slurmd.deb",
                      "node": failing["node"], "role": "compute", "queue": "cpu", "instance_id": instance,
                      "failed_tasks": [{"task": "slurm : Install Slurm",
                                        "msg": "Failed to fetch http://deb.debian.org/debian/pool/main/s/slurm-wlm"}],
                      "log_tail": ["TASK [slurm : Install Slurm] ****", f"fatal: [{failing['node']}]: FAILED! => "
                                   "{\"msg\": \"Failed to fetch\"}", "PLAY RECAP ****"],
                      "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            s3.put_object(Bucket=bucket, Key=f"fmcluster/report/AROAEXAMPLENODEROLE01:{instance}/{instance}.json",
                          Body=json.dumps(report).encode())

        lines: list[str] = []
        deploy = Deploy(tenant, out=lines.append)
        deploy.provider = EmulatedAws(tenant, emulator.endpoint,  # type: ignore[assignment]
                                      NodesSignal(tenant.region, emulator.endpoint, status, file_report))
        reports = deploy.run()
        assert [(r.name, r.outcome.status) for r in reports][-1] == ("stacks", "failed"), "\n".join(lines[-40:])
        outcome = reports[-1].outcome
        node, instance = failing["node"], failing["instance"]
        assert outcome.summary.startswith(f"{node} ({instance}): FAILED at converge: ansible-pull exited 2: task "
                                          "'slurm : Install Slurm'"), outcome.summary
        assert outcome.summary.endswith(
            "(the cluster stack then failed: QueueCpuGroup (AWS::AutoScaling::AutoScalingGroup) CREATE_FAILED: "
            "Received 1 FAILURE signal(s) out of 3. Unable to satisfy 100% MinSuccessfulInstancesPercent "
            "requirement)"), outcome.summary
        assert outcome.details[:4] == [
            "    failed task: slurm : Install Slurm: Failed to fetch http://deb.debian.org/debian/pool/main/s/slurm-wlm",
            "    | TASK [slurm : Install Slurm] ****",
            f"    | fatal: [{node}]: FAILED! => {{\"msg\": \"Failed to fetch\"}}",
            "    | PLAY RECAP ****"]
        assert outcome.details[-1] == f"fmc-{org}-cluster: failed ROLLBACK_COMPLETE"
        # What the person reads: the node and its task come first, right after the step says it failed.
        shown = lines.index(f"    failed: {outcome.summary} ({reports[-1].seconds:.1f}s)")
        assert lines[shown + 1] == f"      {outcome.details[0]}"
        # CloudFormation's side: the stack rolled back and every instance it made is terminated.
        assert cf.describe_stacks(StackName=f"fmc-{org}-cluster")["Stacks"][0]["StackStatus"] == "ROLLBACK_COMPLETE"
        made = [i for r in ec2.describe_instances(Filters=[{"Name": "tag:fmcluster:org", "Values": [org]}])
                ["Reservations"] for i in r["Instances"]]
        assert len(made) == 5 and {i["State"]["Name"] for i in made} == {"terminated"}, "controller, login, 3 cpu"
    finally:
        stop_emulator(org, root)
        os.environ["FMCLUSTER_ROOT"] = previous or str(ROOT)
