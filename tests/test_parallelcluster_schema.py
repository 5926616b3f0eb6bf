"""The rendered cluster configs are validated by ParallelCluster itself: the aws-parallelcluster package's
ClusterSchema and its offline validators, in the tool environment .tools/pcluster-venv (scripts/bootstrap.sh
installs it; CI runs the bootstrap). Its refusals come back as problems of the tenant file, line and key.

The checks share one subprocess where they can (module fixture): loading the package costs ~1 s, a config ~0.1 s.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fmcluster import commands
from fmcluster.model import load_spec, load_tenant
from fmcluster.schedulers.parallelcluster import rules
from fmcluster.schedulers.parallelcluster.config import render_cluster_config
from fmcluster.schedulers.parallelcluster.rendered import ClusterConfig
from fmcluster.schedulers.parallelcluster.schema import SchemaReport, ToolMissing, _offline_env, check_configs, tenant_problems, tool_python

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "parallelcluster"

try:
    TOOL_PYTHON: Path | None = tool_python()
except ToolMissing:
    TOOL_PYTHON = None
needs_tool = pytest.mark.skipif(
    TOOL_PYTHON is None,
    reason="the aws-parallelcluster tool environment .tools/pcluster-venv is not installed "
           "(`bash scripts/bootstrap.sh` installs it; CI runs the bootstrap, so these run there)")


def variant(cfg: ClusterConfig, change: Any) -> ClusterConfig:
    """The same config (and provenance) with its data changed the way a bad tenant value would change it."""
    other = copy.copy(cfg)
    other.data = copy.deepcopy(cfg.data)
    change(other.data)
    return other


def _queue(i: int, **values: Any) -> Any:
    return lambda d: d["Scheduling"]["SlurmQueues"][i].update(values)


def _resource(i: int, **values: Any) -> Any:
    return lambda d: d["Scheduling"]["SlurmQueues"][i]["ComputeResources"][0].update(values)


def _capacity_block_tenant() -> Any:
    tenant = load_tenant("pclab", ROOT)
    object.__setattr__(tenant.queues[0], "capacity_reservation_type", "capacity-block")
    return tenant


P5 = render_cluster_config(load_tenant("pclab", ROOT))
P5_BLOCK = render_cluster_config(_capacity_block_tenant())
#: What ParallelCluster says of an EFA queue kept out of the placement group because it is in a reservation: it
#: asks for the choice to be explicit, then warns that this "is expected when using a capacity reservation".
EXPECTED_WARNING = ("EfaPlacementGroupValidator", "This is expected when using a capacity reservation")
TRN1 = render_cluster_config(load_spec(GOLDEN / "trn1-tenant.yml"), yaml.safe_load((GOLDEN / "trn1-outputs.yml").read_text()))
CASES: dict[str, ClusterConfig] = {
    "p5": P5,
    "trn1": TRN1,
    "p5-capacity-block": P5_BLOCK,
    "min-count-x": variant(P5, _resource(0, MinCount="x")),
    "queue-named-default": variant(P5, _queue(1, Name="default")),
    "capacity-block-min-below-max": variant(P5_BLOCK, _resource(0, MinCount=2)),
    "efa-reservation-in-placement-group": variant(P5, lambda d: d["Scheduling"]["SlurmQueues"][0]["Networking"].update(
        PlacementGroup={"Enabled": True, "Name": "fmc-pclab-network-PLACEHOLDER"})),
}


@pytest.fixture(scope="module")
def reports() -> dict[str, SchemaReport]:
    if TOOL_PYTHON is None:
        pytest.skip("no tool environment")
    return dict(zip(CASES, check_configs(list(CASES.values()))))


@needs_tool
@pytest.mark.parametrize("name", ["p5", "trn1", "p5-capacity-block"])
def test_rendered_config_loads_as_slurm_cluster_config(reports: dict[str, SchemaReport], name: str) -> None:
    report = reports[name]
    assert report.loaded_as == "SlurmClusterConfig" and report.ok, report
    assert report.pcluster_version.startswith("3.16."), "bootstrap.sh pins aws-parallelcluster 3.16.x"
    assert all(w.validator == EXPECTED_WARNING[0] and EXPECTED_WARNING[1] in w.message for w in report.warnings), \
        report.warnings


@needs_tool
def test_golden_files_are_what_the_schema_accepted() -> None:
    for name, cfg in (("p5", P5), ("trn1", TRN1)):
        assert yaml.safe_load((GOLDEN / f"{name}.cluster-config.yaml").read_text()) == cfg.data


@needs_tool
def test_min_count_x_is_refused_with_its_field_path_and_mapped_to_the_tenant_count(
        reports: dict[str, SchemaReport]) -> None:
    report = reports["min-count-x"]
    assert report.loaded_as is None and not report.ok
    (error,) = report.errors
    assert error.path == ("Scheduling", "SlurmQueues", 0, "ComputeResources", 0, "MinCount")
    assert error.message == "Not a valid integer."
    (problem,) = tenant_problems(CASES["min-count-x"], report)
    spec = (ROOT / "inventories/pclab/group_vars/all/tenant.yml").read_text().splitlines()
    assert problem.key == "tenant.queues[0].count" and "count: 8" in spec[problem.line - 1]
    assert "Scheduling/SlurmQueues[0]/ComputeResources[0]/MinCount: Not a valid integer." in problem.message


@needs_tool
def test_parallelclusters_offline_validators_run_and_name_the_tenant_key(reports: dict[str, SchemaReport]) -> None:
    report = reports["queue-named-default"]
    assert report.loaded_as == "SlurmClusterConfig", "the schema loads it; ParallelCluster's NameValidator refuses it"
    (error,) = report.errors
    assert error.validator == "NameValidator" and "forbidden to use 'default'" in error.message
    (problem,) = tenant_problems(CASES["queue-named-default"], report)
    assert problem.key == "tenant.queues[1].name"


@needs_tool
def test_capacity_block_needs_static_nodes(reports: dict[str, SchemaReport]) -> None:
    (error,) = reports["capacity-block-min-below-max"].errors
    assert error.validator == "ComputeResourceSizeValidator" and "Capacity Block" in error.message
    (problem,) = tenant_problems(CASES["capacity-block-min-below-max"], reports["capacity-block-min-below-max"])
    assert problem.key == "tenant.queues[0].count"


@needs_tool
def test_fmcluster_rules_mirror_parallelclusters_own_numbers() -> None:
    """A ParallelCluster upgrade that moves a limit fails here instead of drifting from rules.py."""
    probe = ("import inspect, json; from pcluster import constants as c; from pcluster.validators import cluster_validators as v\n"
             "print(json.dumps({'name_regex': v.NAME_REGEX, 'name_max': v.NAME_MAX_LENGTH, 'queues': c.MAX_NUMBER_OF_QUEUES,"
             " 'resources': c.MAX_NUMBER_OF_COMPUTE_RESOURCES_PER_CLUSTER, 'oses': c.SUPPORTED_OSES,"
             " 'mount_dir_rule': inspect.getsource(v.SharedStorageMountDirValidator)}))")
    run = subprocess.run([str(TOOL_PYTHON), "-c", probe], capture_output=True, text=True, env=_offline_env(), check=True)
    theirs = json.loads(run.stdout)
    assert (theirs["name_regex"], theirs["name_max"]) == (rules.NAME_REGEX.pattern, rules.NAME_MAX_LENGTH)
    assert (theirs["queues"], theirs["resources"]) == (rules.MAX_QUEUES, rules.MAX_COMPUTE_RESOURCES_PER_CLUSTER)
    section = json.loads((ROOT / "src/fmcluster/schedulers/parallelcluster/section.schema.json").read_text())
    ours = section["properties"]["os"]["enum"]
    assert set(ours) <= set(theirs["oses"])
    assert all(f'"{d}"' in theirs["mount_dir_rule"] for d in rules.RESERVED_MOUNT_DIRS)


@needs_tool
def test_invoke_validate_runs_parallelclusters_schema_for_a_parallelcluster_tenant() -> None:
    lines: list[str] = []
    assert commands.validate("pclab", out=lines.append) == 0, "\n".join(lines)
    assert any("ParallelCluster 3.16" in line and "as SlurmClusterConfig" in line for line in lines), lines
    assert any("pcluster create-cluster --dryrun true" in line for line in lines), "says what only AWS can check"


@needs_tool
def test_invoke_plan_writes_the_cluster_config_and_checks_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(ROOT / "inventories" / "pclab", tmp_path / "inventories" / "pclab")
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    from fmcluster import commands as top

    monkeypatch.setattr("fmcluster.stacks.aws.has_credentials", lambda region: False)  # offline, whatever ~/.aws holds
    assert top.plan("pclab") == 0
    out = capsys.readouterr().out
    written = tmp_path / "inventories" / "pclab" / "generated" / "cluster-config.yaml"
    assert yaml.safe_load(written.read_text()) == P5.data
    assert "placeholders for stack outputs not known yet (no stacks deployed)" in out
    assert "as SlurmClusterConfig" in out
    assert sorted(p.name for p in (written.parent / "cfn").iterdir()) == [
        "fmc-pclab-network.parameters.json", "fmc-pclab-network.yaml",
        "fmc-pclab-storage.parameters.json", "fmc-pclab-storage.yaml"], "no cluster stack of ours"


def test_without_the_tool_environment_validate_fails_closed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FMCLUSTER_PCLUSTER_VENV", str(tmp_path / "absent"))
    lines: list[str] = []
    assert commands.validate("pclab", out=lines.append) == 1
    text = "\n".join(lines)
    assert "did not run" in text and "bash scripts/bootstrap.sh" in text and "NOT validated" in text


def test_the_schema_check_gets_no_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_PROFILE", "prod")
    env = _offline_env()
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"} & set(env)
    assert env["AWS_EC2_METADATA_DISABLED"] == "true" and env["AWS_SHARED_CREDENTIALS_FILE"] == "/dev/null"


def _bundled_parallelcluster_tenants() -> list[str]:
    found = []
    for spec in sorted((ROOT / "inventories").glob("*/group_vars/all/tenant.yml")):
        if yaml.safe_load(spec.read_text())["tenant"].get("scheduler") == "parallelcluster":
            found.append(spec.parents[2].name)
    return found


#: Validators whose question is about the account (does this exist, may this be launched): only AWS answers them.
ACCOUNT_QUESTIONS = {"AdditionalIamPolicyValidator", "AsyncTimedUrlValidator", "ComputeResourceLaunchTemplateValidator",
                     "ExistingFsxNetworkingValidator", "HeadNodeLaunchTemplateValidator",
                     "InstanceTypeBaseAMICompatibleValidator", "InstanceTypeValidator", "KeyPairValidator",
                     "PasswordSecretArnValidator", "SecurityGroupsValidator"}


@needs_tool
def test_every_bundled_parallelcluster_tenant_passes_every_offline_runnable_validator() -> None:
    orgs = _bundled_parallelcluster_tenants()
    assert {"pclab", "pcdemo"} <= set(orgs)
    configs = [render_cluster_config(load_tenant(org, ROOT)) for org in orgs]
    for org, report in zip(orgs, check_configs(configs)):
        assert report.ok, (org, report.errors)
        assert all(w.validator == EXPECTED_WARNING[0] and EXPECTED_WARNING[1] in w.message for w in report.warnings), \
            (org, report.warnings)
        # Everything else ran on fmcluster's answers: instance types, subnets, reservations, FSx, the image.
        assert {n.validator for n in report.needs_aws} <= ACCOUNT_QUESTIONS, (org, report.needs_aws)
        assert all(not n.call.startswith(("ec2.DescribeInstanceTypes", "ec2.DescribeSubnets",
                                          "ec2.DescribeCapacityReservations", "fsx.")) for n in report.needs_aws)


@needs_tool
def test_an_efa_queue_in_a_reservation_and_a_placement_group_draws_parallelclusters_warning(
        reports: dict[str, SchemaReport]) -> None:
    """What pclab rendered before: ParallelCluster's PlacementGroupCapacityReservationValidator, run on the
    reservation the tenant names (served from the tenant), warns of insufficient-capacity errors."""
    report = reports["efa-reservation-in-placement-group"]
    (warning,) = [w for w in report.warnings if w.validator == "PlacementGroupCapacityReservationValidator"]
    assert "insufficient capacity" in warning.message


def test_the_login_pools_subnet_has_a_way_out() -> None:
    """A login node in a subnet routed to the internet gateway reaches AWS only with a public address
    (ParallelCluster's login launch template asks for none: the subnet must map one); in a private subnet,
    through the NAT gateway. The offline answers are the rendered network stack's own."""
    for org in _bundled_parallelcluster_tenants():
        cfg = render_cluster_config(load_tenant(org, ROOT))
        if "LoginNodes" not in cfg.data:
            continue
        subnet = cfg.data["LoginNodes"]["Pools"][0]["Networking"]["SubnetIds"][0]
        answers = cfg.offline_answers
        (described,) = [s for s in answers["subnets"] if s["SubnetId"] == subnet]
        (table,) = [t for t in answers["route_tables"] if t["Associations"][0]["SubnetId"] == subnet]
        default = next(r for r in table["Routes"] if r["DestinationCidrBlock"] == "0.0.0.0/0")
        assert ("GatewayId" in default and described["MapPublicIpOnLaunch"]) or "NatGatewayId" in default, (org, table)
