"""Scheduler parallelcluster: the tenant (+ network/storage stack outputs) renders to a ParallelCluster 3 cluster
config — golden files for a P5 and a Trn1 queue, the security-relevant shape, values as data, and the stacks that
stay fmcluster's (network, storage with the node policy; no cluster stack).

Regenerate the golden files after an intended change: FMCLUSTER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_parallelcluster_config.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fmcluster.model import load_spec, load_tenant
from fmcluster.schedulers.parallelcluster.config import (
    CUSTOM_ACTION_KEY, placeholder_outputs, render_cluster_config, to_yaml, write_cluster_config,
)
from fmcluster.schedulers.parallelcluster.rendered import ClusterConfig
from fmcluster.schedulers.parallelcluster.schema import ToolMissing, check_configs
from fmcluster.stacks.checks import check_stacks
from fmcluster.stacks.render import load_cfn_yaml
from scheduler_stacks import render_stacks

from conftest import venv_tool

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "parallelcluster"
TRN1_OUTPUTS: dict[str, str] = yaml.safe_load((GOLDEN / "trn1-outputs.yml").read_text())


def p5() -> ClusterConfig:
    """The bundled tenant pclab before any stack exists: every stack output a placeholder."""
    return render_cluster_config(load_tenant("pclab", ROOT))


def trn1() -> ClusterConfig:
    """A Trainium tenant with the outputs its stacks wrote: nothing left to stand in."""
    return render_cluster_config(load_spec(GOLDEN / "trn1-tenant.yml"), TRN1_OUTPUTS)


def queue(cfg: ClusterConfig, name: str) -> dict[str, Any]:
    return next(q for q in cfg.data["Scheduling"]["SlurmQueues"] if q["Name"] == name)


@pytest.mark.parametrize("name,render", [("p5", p5), ("trn1", trn1)])
def test_rendered_config_matches_its_golden_file(name: str, render: Any) -> None:
    golden = GOLDEN / f"{name}.cluster-config.yaml"
    text = to_yaml(render())
    if os.environ.get("FMCLUSTER_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"rendered config differs from {golden}; see the module docstring"


def test_p5_queue_gets_efa_gpudirect_reservation_static_nodes_and_no_placement_group() -> None:
    gpu = queue(p5(), "gpu")
    (resource,) = gpu["ComputeResources"]
    assert resource["InstanceType"] == "p5.48xlarge" and resource["MinCount"] == resource["MaxCount"] == 8
    assert resource["Efa"] == {"Enabled": True, "GdrSupport": True}
    assert resource["CapacityReservationTarget"] == {"CapacityReservationId": "cr-0123456789abcdef0"}
    assert gpu["CapacityType"] == "ONDEMAND"
    # In a reservation: explicitly out of the placement group (ParallelCluster's EfaPlacementGroupValidator wants
    # it explicit; PlacementGroupCapacityReservationValidator warns against an unrelated group).
    assert gpu["Networking"]["PlacementGroup"] == {"Enabled": False}
    assert gpu["HealthChecks"] == {"Gpu": {"Enabled": True}}


def test_trainium_queue_has_efa_without_gpudirect_and_no_gpu_health_check() -> None:
    trn = queue(trn1(), "trn")
    assert trn["ComputeResources"][0]["Efa"] == {"Enabled": True, "GdrSupport": False}
    assert "HealthChecks" not in trn


def test_an_efa_queue_without_a_reservation_uses_the_network_stacks_placement_group() -> None:
    tenant = load_tenant("pclab", ROOT)
    object.__setattr__(tenant.queues[0], "capacity_reservation_id", None)
    gpu = queue(render_cluster_config(tenant), "gpu")
    assert gpu["Networking"]["PlacementGroup"] == {"Enabled": True,
                                                   "Name": placeholder_outputs(tenant)["PlacementGroupName"]}
    assert "CapacityReservationTarget" not in gpu["ComputeResources"][0]


def test_cpu_queue_has_neither_efa_nor_placement_group() -> None:
    cpu = queue(p5(), "cpu")
    assert "Efa" not in cpu["ComputeResources"][0] and "PlacementGroup" not in cpu["Networking"]
    assert len(cpu["Networking"]["AdditionalSecurityGroups"]) == 1, "the node group only, no EFA group"


def test_capacity_block_queue_gets_capacity_type_and_no_placement_group() -> None:
    tenant = load_tenant("pclab", ROOT)
    gpu = tenant.queues[0]
    object.__setattr__(gpu, "capacity_reservation_type", "capacity-block")  # the key another change adds to the model
    cfg = render_cluster_config(tenant)
    rendered = queue(cfg, "gpu")
    assert rendered["CapacityType"] == "CAPACITY_BLOCK"
    assert "PlacementGroup" not in rendered["Networking"], "a Capacity Block places its instances itself"
    assert rendered["ComputeResources"][0]["CapacityReservationTarget"]["CapacityReservationId"] == gpu.capacity_reservation_id


def test_default_queue_comes_first_because_parallelcluster_makes_the_first_queue_the_default_partition() -> None:
    tenant = load_tenant("pclab", ROOT)
    object.__setattr__(tenant.queues[1], "default", True)
    cfg = render_cluster_config(tenant)
    assert [q["Name"] for q in cfg.data["Scheduling"]["SlurmQueues"]] == ["cpu", "gpu"]
    assert cfg.tenant_key(("Scheduling", "SlurmQueues", 0, "Name")) == (("tenant", "queues", 1, "name"), None)


def test_nothing_is_open_to_the_world_and_storage_is_ours() -> None:
    cfg = p5()
    assert "0.0.0.0/0" not in to_yaml(cfg), "ParallelCluster's default AllowedIps is 0.0.0.0/0; fmcluster always sets it"
    assert cfg.data["HeadNode"]["Ssh"]["AllowedIps"] == "10.1.0.0/16"
    assert cfg.data["LoginNodes"]["Pools"][0]["Ssh"]["AllowedIps"] == "203.0.113.0/24"
    storage = {s["Name"]: s for s in cfg.data["SharedStorage"]}
    assert set(storage["lustre"]["FsxLustreSettings"]) == {"FileSystemId"}, "ours, by id: ParallelCluster creates none"
    assert set(storage["home"]["FsxOpenZfsSettings"]) == {"VolumeId"}
    assert cfg.data["HeadNode"]["LocalStorage"]["RootVolume"]["Encrypted"] is True


def test_every_node_runs_the_fmcluster_bootstrap_through_on_node_configured() -> None:
    cfg = trn1()
    bucket = TRN1_OUTPUTS["DataBucketName"]
    actions = [cfg.data["HeadNode"]["CustomActions"]] + [q["CustomActions"] for q in cfg.data["Scheduling"]["SlurmQueues"]]
    for action in actions:
        assert action["OnNodeConfigured"]["Script"] == f"s3://{bucket}/{CUSTOM_ACTION_KEY}"
        assert action["OnNodeConfigured"]["Args"][:3] == [f"FMCLUSTER_BUCKET={bucket}", "FMCLUSTER_REGION=us-east-2",
                                                          "FMCLUSTER_ORG=trnlab"]
    assert "LoginNodes" not in cfg.data, "login.count 0: no login pool"


def test_slurm_accounting_only_when_configured() -> None:
    assert p5().data["Scheduling"]["SlurmSettings"]["Database"]["UserName"] == "slurm"
    assert "Database" not in trn1().data["Scheduling"]["SlurmSettings"]


def test_unknown_outputs_are_marked_placeholders_listed_in_the_header() -> None:
    cfg = p5()
    assert set(cfg.placeholders) == {"PrivateSubnetId", "PublicSubnetId", "EfaSecurityGroupId", "NodeSecurityGroupId",
                                     "DataBucketName", "LustreFileSystemId", "HomeVolumeId",
                                     "NodeBootstrapPolicyArn", "HeadNodeBootstrapPolicyArn", "AccountingDatabaseUri",
                                     "AccountingPasswordSecretArn", "AccountingClientSecurityGroupId"}, \
        "no PlacementGroupName: the EFA queue is in a reservation; the accounting database is the storage stack's"
    text = to_yaml(cfg)
    assert "# PLACEHOLDERS" in text
    for name, value in cfg.placeholders.items():
        assert f"#   {name}: {value}" in text and value in text.split("# PLACEHOLDERS")[1]
    assert trn1().placeholders == {} and "PLACEHOLDERS" not in to_yaml(trn1())


def test_emulator_outputs_fill_what_they_can_and_the_rest_stays_marked() -> None:
    """provider local: moto creates no FSx and no placement group, so those outputs stay placeholders."""
    outputs = {k: v for k, v in TRN1_OUTPUTS.items() if k not in ("LustreFileSystemId", "PlacementGroupName")}
    outputs["PlacementGroupName"] = ""  # how the cluster stack parameter reads a missing output
    tenant = load_spec(GOLDEN / "trn1-tenant.yml")
    cfg = render_cluster_config(tenant, outputs)
    assert set(cfg.placeholders) == {"LustreFileSystemId"}, "its EFA queue is in a reservation: no placement group"
    object.__setattr__(tenant.queues[0], "capacity_reservation_id", None)
    assert set(render_cluster_config(tenant, outputs).placeholders) == {"LustreFileSystemId", "PlacementGroupName"}


def test_plan_writes_the_config_under_generated(tmp_path: Path) -> None:
    path = write_cluster_config(p5(), tmp_path)
    assert path == tmp_path / "inventories" / "pclab" / "generated" / "cluster-config.yaml"
    assert yaml.safe_load(path.read_text()) == p5().data
    mtime = path.stat().st_mtime_ns
    write_cluster_config(p5(), tmp_path)
    assert path.stat().st_mtime_ns == mtime, "unchanged config: file untouched"


HOSTILE = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(bucket=HOSTILE, subnet=HOSTILE, policy=HOSTILE)
def test_stack_outputs_are_data_whatever_they_hold(bucket: str, subnet: str, policy: str) -> None:
    """Values are data: no output can add a key, a list item or a document to the config."""
    outputs = {**TRN1_OUTPUTS, "DataBucketName": bucket, "PrivateSubnetId": subnet, "NodeBootstrapPolicyArn": policy}
    cfg = render_cluster_config(load_spec(GOLDEN / "trn1-tenant.yml"), outputs)
    reloaded = yaml.safe_load(to_yaml(cfg))
    assert reloaded == cfg.data
    assert reloaded["HeadNode"]["Networking"]["SubnetId"] == subnet
    assert reloaded["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Args"][0] == f"FMCLUSTER_BUCKET={bucket}"


def test_every_tenant_value_in_the_config_knows_its_tenant_key() -> None:
    cfg = p5()
    spec = yaml.safe_load((ROOT / "inventories/pclab/group_vars/all/tenant.yml").read_text())["tenant"]

    def lookup(key: tuple[str | int, ...]) -> Any:
        node: Any = {"tenant": spec}
        for part in key:
            node = node[part]
        return node

    for at, key in [(("Scheduling", "SlurmQueues", 0, "ComputeResources", 0, "MinCount"), ("tenant", "queues", 0, "count")),
                    (("Scheduling", "SlurmQueues", 1, "Name"), ("tenant", "queues", 1, "name")),
                    (("HeadNode", "InstanceType"), ("tenant", "controller", "instance_type")),
                    (("LoginNodes", "Pools", 0, "Count"), ("tenant", "login", "count")),
                    (("SharedStorage", 1, "MountDir"), ("tenant", "storage", "openzfs", "mount_point")),
                    (("Scheduling", "SlurmSettings", "Database", "UserName"),
                     ("tenant", "parallelcluster", "accounting", "user_name"))]:
        assert cfg.tenant_key(at) == (key, None)
        value: Any = cfg.data
        for part in at:
            value = value[part]
        assert value == lookup(key)
    assert cfg.tenant_key(("HeadNode", "Networking", "SubnetId")) == (None, "PrivateSubnetId")
    # pclab asks for accounting without naming a database: the storage stack's database and generated secret.
    assert cfg.tenant_key(("Scheduling", "SlurmSettings", "Database", "Uri")) == (None, "AccountingDatabaseUri")
    assert cfg.tenant_key(("Scheduling", "SlurmSettings", "Database", "PasswordSecretArn")) == \
        (None, "AccountingPasswordSecretArn")
    assert cfg.tenant_key(("HeadNode", "Networking", "AdditionalSecurityGroups", 1)) == \
        (None, "AccountingClientSecurityGroupId")


# --- the stacks that stay ours ---------------------------------------------------------------------

def test_parallelcluster_tenant_has_network_and_storage_stacks_and_no_cluster_stack() -> None:
    assert [s.key for s in render_stacks(load_tenant("pclab", ROOT))] == ["network", "storage"]


def test_storage_stack_holds_the_node_policies_scoped_to_the_bootstrap_prefixes_reports_and_own_secrets() -> None:
    storage = next(s for s in render_stacks(load_tenant("pclab", ROOT)) if s.key == "storage")
    body = load_cfn_yaml(storage.body)
    secret = "arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:fmcluster/"
    for name, secrets, describe in (
            ("NodeBootstrapPolicy", ["munge-key"], "ec2:DescribeInstances"),
            ("HeadNodeBootstrapPolicy", ["grafana-admin-password", "munge-key"],
             ["ec2:DescribeAvailabilityZones", "ec2:DescribeInstances", "ec2:DescribeTags"])):
        statements = {s["Sid"]: s for s in body["Resources"][name]["Properties"]["PolicyDocument"]["Statement"]}
        assert statements["ReadBootstrap"]["Action"] == "s3:GetObject"
        assert [r["Fn::Sub"] for r in statements["ReadBootstrap"]["Resource"]] == [
            "${DataBucket.Arn}/fmcluster/bootstrap/*", "${DataBucket.Arn}/fmcluster/manifest/*"]
        assert statements["WriteReports"]["Action"] == "s3:PutObject"
        assert [[r["Fn::Join"][1][0]["Fn::Sub"], r["Fn::Join"][1][1]] for r in statements["WriteReports"]["Resource"]] \
            == [["${DataBucket.Arn}", "/fmcluster/report/${aws:userid}/i-*" + suffix] for suffix in (".json", ".log")]
        # the org is tenant data: a Join part
        assert [r["Fn::Join"][1] for r in statements["ReadOwnSecrets"]["Resource"]] == [
            [{"Fn::Sub": secret}, "pclab", f"/{n}-??????"] for n in secrets], name
        assert statements["FindClusterNodes"]["Action"] == describe, "Describe calls only"
        assert all("*" not in str(s["Action"]) for s in statements.values())
        assert f"{name}Arn" in body["Outputs"]
    assert "HomeVolumeId" in body["Outputs"]
    assert not check_stacks(render_stacks(load_tenant("pclab", ROOT)))
    other = next(s for s in render_stacks(load_tenant("stockmark", ROOT)) if s.key == "storage")
    assert not {"NodeBootstrapPolicy", "HeadNodeBootstrapPolicy"} & set(load_cfn_yaml(other.body)["Resources"]), \
        "other schedulers: unchanged"


def test_the_head_node_gets_the_head_node_policy_and_every_other_node_the_node_policy() -> None:
    cfg = trn1()
    assert cfg.data["HeadNode"]["Iam"]["AdditionalIamPolicies"][0]["Policy"] == TRN1_OUTPUTS["HeadNodeBootstrapPolicyArn"]
    for queue in cfg.data["Scheduling"]["SlurmQueues"]:
        assert queue["Iam"]["AdditionalIamPolicies"][0]["Policy"] == TRN1_OUTPUTS["NodeBootstrapPolicyArn"]


@pytest.mark.slow
def test_cfn_lint_accepts_the_parallelcluster_tenant_stacks(tmp_path: Path) -> None:
    files = []
    for stack in render_stacks(load_tenant("pclab", ROOT)):
        path = tmp_path / f"{stack.name}.yaml"
        path.write_text(stack.body)
        files.append(str(path))
    run = subprocess.run([venv_tool("cfn-lint"), *files], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.slow
def test_pclab_stacks_rehearse_on_the_emulator_and_their_outputs_fill_the_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """provider local: the emulator (moto) really creates the node policy; what it does not create stays marked.
    On local the stand-in's cluster stack follows (fmcluster.schedulers.parallelcluster.stand_in)."""
    from fmcluster.providers.local import EMULATOR_IMAGE_PARAMETER
    from scheduler_stacks import deploy_stacks, destroy_stacks
    from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator

    shutil.copytree(ROOT / "inventories" / "pclab", tmp_path / "inventories" / "pclab",
                    ignore=shutil.ignore_patterns("generated"))
    spec = tmp_path / "inventories/pclab/group_vars/all/tenant.yml"
    spec.write_text(spec.read_text().replace("provider: aws", "provider: local"))
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    try:
        tenant = load_tenant("pclab")
        endpoint = ensure_emulator("pclab", tmp_path).endpoint
        result = deploy_stacks(tenant, endpoint, image_parameter=lambda path: EMULATOR_IMAGE_PARAMETER,
                               out=lambda line: None)
        assert result.ok, result.stacks
        assert [s.name for s in result.stacks] == ["fmc-pclab-network", "fmc-pclab-storage", "fmc-pclab-cluster"]
        assert result.outputs["NodeBootstrapPolicyArn"].startswith("arn:aws:iam::")
        assert ("NodeBootstrapPolicy", "AWS::IAM::ManagedPolicy") not in result.not_created.get("fmc-pclab-storage", [])
        cfg = render_cluster_config(tenant, result.outputs)
        assert set(cfg.placeholders) == {"LustreFileSystemId", "HomeVolumeId", "AccountingPasswordSecretArn"}, \
            ("FSx and a template's secret are what moto does not give (pclab's EFA queue is in a reservation: no "
             "placement group)", result.not_created)
        # The same template as on AWS: moto does create the RDS instance, so its endpoint is a real output here.
        assert result.outputs["AccountingDatabaseUri"].endswith(".rds.amazonaws.com")
        try:
            (report,) = check_configs([cfg])
        except ToolMissing:
            report = None  # tests/test_parallelcluster_schema.py says so; the stacks part above still ran
        assert report is None or report.ok, report
        assert destroy_stacks(tenant, endpoint, confirm=None, out=lambda line: None).ok
    finally:
        stop_emulator("pclab", tmp_path)


# --- provider local: the stand-in for the ParallelCluster service ----------------------------------

def test_local_stand_in_instances_carry_parallelclusters_tags_and_run_the_configs_on_node_configured() -> None:
    """pcdemo (provider local): the stand-in's stack tags instances the way ParallelCluster does, and each node's
    user data runs the OnNodeConfigured script the rendered config names, with exactly that config's Args."""
    from fmcluster.schedulers.parallelcluster.tags import NODE_TAGS
    from fmcluster.stacks.render import user_data_text

    tenant = load_tenant("pcdemo", ROOT)
    stacks = render_stacks(tenant)
    assert [s.key for s in stacks] == ["network", "storage", "cluster"]
    resources = load_cfn_yaml(stacks[2].body)["Resources"]
    cfg = render_cluster_config(tenant, {"DataBucketName": "BUCKET"})
    expected = {
        "ControllerLaunchTemplate": ("HeadNode", None, cfg.data["HeadNode"]),
        "LoginLaunchTemplate": ("LoginNode", None, cfg.data["LoginNodes"]["Pools"][0]),
        "QueueCpuLaunchTemplate": ("Compute", "cpu", queue(cfg, "cpu")),
    }
    for logical, (node_type, queue_name, section) in expected.items():
        data = resources[logical]["Properties"]["LaunchTemplateData"]
        (instance_tags,) = [t["Tags"] for t in data["TagSpecifications"] if t["ResourceType"] == "instance"]
        tags = {t["Key"]: t["Value"] for t in instance_tags}
        assert tags["parallelcluster:node-type"] == node_type and tags["fmcluster:org"] == "pcdemo"
        assert tags.get("parallelcluster:queue-name") == queue_name
        assert NODE_TAGS.role_of(tags) is not None and "fmcluster:role" not in tags
        script = user_data_text(data["UserData"]).replace("${DataBucketName}", "BUCKET").replace(
            "${AWS::Region}", tenant.region)
        action = section["CustomActions"]["OnNodeConfigured"]
        assert "s3://$bucket/$key" in script and f"key={CUSTOM_ACTION_KEY}" in script
        assert action["Script"] == f"s3://BUCKET/{CUSTOM_ACTION_KEY}"
        assert script.rstrip().endswith('exec bash "$action" ' + " ".join(action["Args"])), script
    for group in ("LoginGroup", "QueueCpuGroup"):
        assert "CreationPolicy" not in resources[group], "ParallelCluster's OnNodeConfigured signals no stack"
    assert not check_stacks(stacks)


# --- Slurm accounting: the database fmcluster creates when the tenant names none ----------------------------

def _own_database(tmp_path: Path) -> Any:
    spec = tmp_path / "tenant.yml"
    spec.write_text((ROOT / "inventories/pclab/group_vars/all/tenant.yml").read_text().replace(
        "    accounting:\n      user_name: slurm\n",
        "    accounting:\n      uri: slurmdb.example.internal:3306\n      user_name: slurm\n"
        "      password_secret_arn: arn:aws:secretsmanager:us-east-1:123456789012:secret:fmcluster/pclab/slurmdb-AbCdEf\n"))
    return load_spec(spec)


def test_accounting_without_a_database_creates_rds_that_only_the_head_node_reaches(tmp_path: Path) -> None:
    tenant = load_tenant("pclab", ROOT)
    storage = next(s for s in render_stacks(tenant) if s.key == "storage")
    res = load_cfn_yaml(storage.body)["Resources"]
    db = res["AccountingDatabase"]
    assert db["Type"] == "AWS::RDS::DBInstance" and db["DeletionPolicy"] == "Snapshot"
    props = db["Properties"]
    assert props["Engine"] == "mysql" and props["StorageEncrypted"] is True and props["PubliclyAccessible"] is False
    assert props["MasterUserPassword"] == {"Fn::Sub": "{{resolve:secretsmanager:${AccountingDatabaseSecret}}}"}, \
        "the password is Secrets Manager's, generated; never a literal"
    assert res["AccountingDatabaseSecret"]["Properties"]["GenerateSecretString"] == {
        "PasswordLength": 32, "ExcludePunctuation": True}
    (ingress,) = res["AccountingDatabaseSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert ingress == {"SourceSecurityGroupId": {"Ref": "AccountingClientSecurityGroup"}, "IpProtocol": "tcp",
                       "FromPort": 3306, "ToPort": 3306, "Description": "slurmdbd on the head node"}
    assert check_stacks([storage]) == []
    # The config points at it, and only the head node carries the client group.
    cfg = render_cluster_config(tenant, {"AccountingDatabaseUri": "db.example:3306", "AccountingPasswordSecretArn":
                                         "arn:aws:secretsmanager:us-east-1:111122223333:secret:x-AbCdEf",
                                         "AccountingClientSecurityGroupId": "sg-0123456789abcdef0"})
    assert cfg.data["Scheduling"]["SlurmSettings"]["Database"] == {
        "Uri": "db.example:3306", "UserName": "slurm",
        "PasswordSecretArn": "arn:aws:secretsmanager:us-east-1:111122223333:secret:x-AbCdEf"}
    assert "sg-0123456789abcdef0" in cfg.data["HeadNode"]["Networking"]["AdditionalSecurityGroups"]
    others = [cfg.data["LoginNodes"]["Pools"][0], *cfg.data["Scheduling"]["SlurmQueues"]]
    assert all("sg-0123456789abcdef0" not in o["Networking"]["AdditionalSecurityGroups"] for o in others)
    folder = tmp_path / "cfn"
    folder.mkdir()
    (folder / "storage.yaml").write_text(storage.body)
    run = subprocess.run([venv_tool("cfn-lint"), "--regions", tenant.region, "--include-checks", "I", "--",
                          str(folder / "storage.yaml")], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_tenant_naming_its_own_database_gets_no_rds_and_its_values_in_the_config(tmp_path: Path) -> None:
    tenant = _own_database(tmp_path)
    storage = next(s for s in render_stacks(tenant) if s.key == "storage")
    assert "AccountingDatabase" not in load_cfn_yaml(storage.body)["Resources"]
    database = render_cluster_config(tenant).data["Scheduling"]["SlurmSettings"]["Database"]
    assert database["Uri"] == "slurmdb.example.internal:3306"


def test_a_database_uri_without_its_secret_is_refused(tmp_path: Path) -> None:
    from fmcluster.model import TenantInvalid

    spec = tmp_path / "tenant.yml"
    spec.write_text((ROOT / "inventories/pclab/group_vars/all/tenant.yml").read_text().replace(
        "      user_name: slurm\n", "      user_name: slurm\n      uri: slurmdb.example.internal:3306\n"))
    with pytest.raises(TenantInvalid) as refused:
        load_spec(spec)
    (problem,) = refused.value.problems
    assert problem.key == "tenant.parallelcluster.accounting.uri" and "password_secret_arn as well" in problem.fix


def test_the_config_gives_on_node_configured_the_hour_slurm_ec2_gives_a_first_boot() -> None:
    """GPU nodes run the whole first boot inside OnNodeConfigured: ParallelCluster's default (2,100 s) would fail them."""
    from fmcluster.schedulers.parallelcluster.config import BOOTSTRAP_TIMEOUT_S, render_cluster_config
    from fmcluster.schedulers.registry import scheduler_for

    tenant = load_tenant("pclab", ROOT)
    timeouts = render_cluster_config(tenant).data["DevSettings"]["Timeouts"]
    assert timeouts["ComputeNodeBootstrapTimeout"] == BOOTSTRAP_TIMEOUT_S == 3600
    assert scheduler_for(tenant).first_boot_window == ("ParallelCluster's ComputeNodeBootstrapTimeout (the config's)",
                                                       3600.0)


def test_the_head_node_s_window_holds_its_own_bootstrap_and_then_a_compute_node_s() -> None:
    """The head node's wait condition is signalled after its cookbook's finalize, which runs after its OnNodeConfigured,
    starts clustermgtd (supervisord) only then, and waits for every static compute node (the cookbook's
    finalize_head_node.rb: wait_static_fleet_running). Compute nodes are launched only once the head node's own work is
    done, so its window must hold that work and a compute node's whole window; with both at one hour a compute node
    inside its own hour failed the whole cluster. The deploy waits longer than that for the cluster."""
    import inspect

    from fmcluster.schedulers.parallelcluster import operations
    from fmcluster.schedulers.parallelcluster.config import HEAD_NODE_OWN_S, render_cluster_config

    for org in ("pclab", "pcdemo"):
        timeouts = render_cluster_config(load_tenant(org, ROOT)).data["DevSettings"]["Timeouts"]
        assert timeouts["HeadNodeBootstrapTimeout"] >= HEAD_NODE_OWN_S + timeouts["ComputeNodeBootstrapTimeout"], org
        assert HEAD_NODE_OWN_S >= 1800  # the cookbook's own config and the controller's converge, never squeezed
        # CloudFormation's wait condition takes at most 12 hours (AWS::CloudFormation::WaitCondition, Timeout)
        assert timeouts["HeadNodeBootstrapTimeout"] <= 43200
        waited = inspect.signature(operations.wait).parameters["timeout_s"].default
        assert waited > timeouts["HeadNodeBootstrapTimeout"] + 1800, "the deploy gives up before ParallelCluster does"


def test_slurm_s_task_prolog_carries_the_nccl_environment_as_on_the_other_schedulers() -> None:
    """The nccl role writes the NCCL environment as a Slurm TaskProlog on every compute node of a cluster with an
    accelerator or EFA queue; ParallelCluster's slurm.conf names none, so the config adds it (TaskProlog is not in
    ParallelCluster's CustomSlurmSettings deny-list) at the path the manifest gives the role. A cluster of plain CPU
    queues gets none, as its nodes write none."""
    from fmcluster.schedulers.parallelcluster.config import render_cluster_config
    from localtenant import manifest_for

    tenant = load_tenant("pclab", ROOT)
    settings = render_cluster_config(tenant).data["Scheduling"]["SlurmSettings"]
    manifest = manifest_for(tenant)
    assert settings["CustomSlurmSettings"] == [{"TaskProlog": manifest["vars"]["nccl_task_prolog_path"]}]
    assert all("nccl" in group["vars"]["fmcluster_accelerator_roles"] for group in manifest["groups"]["queues"].values())
    cpu_only = load_tenant("pcdemo", ROOT)
    assert "CustomSlurmSettings" not in render_cluster_config(cpu_only).data["Scheduling"]["SlurmSettings"]
    assert "nccl_task_prolog_path" not in manifest_for(cpu_only)["vars"]
