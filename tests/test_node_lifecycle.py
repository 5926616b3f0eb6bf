"""`invoke nodes` and `invoke replace` (fmcluster.lifecycle): what each node needs, and asking the scheduler for a
new one. The XID path runs from a recorded kernel log to the replacement request; the Auto Scaling group's
replacement runs against moto's server (the emulator the local provider uses), the calls' shapes against
botocore's own service models. The whole drain → nodes → replace → rejoin path on a live cluster is in
tests/test_cluster_e2e.py."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fmcluster.capabilities import Capabilities, capabilities
from fmcluster.health import data, engine, slurm, triage
from fmcluster.lifecycle import ClusterView, LifecycleError, NodeLine, Replacer, auto_replacements, node_lines, render_lines
from fmcluster.nodes import Node
from fmcluster.schedulers.hyperpod.scheduler import HYPERPOD_REPLACE_REASON, hyperpod_replace_command
from fmcluster.schedulers.slurm_ec2.scheduler import asg_replace
from health_helpers import Recorded, healthy_answers, p5_config
from slurm_outputs import node_block, show_node

RULES = triage.Rules(data.checks_doc(), data.xid_doc())
REGION = "us-east-1"
CONTROLLER = Node("ip-10-0-0-10", "10.0.0.10", "controller", None, "i-0c0000000000000aa", "m5.2xlarge")
LOGIN = Node("ip-10-0-1-10", "10.0.1.10", "login", None, "i-0c0000000000000bb", "m5.large")


def gpu(n: int) -> Node:
    return Node(f"ip-10-0-128-{n}", f"10.0.128.{n}", "compute", "gpu", f"i-0c00000000000010{n}", "p5.48xlarge")


def view_of(blocks: list[str], reports: dict[str, dict[str, Any]] | None = None) -> ClusterView:
    """What the controller answers: `scontrol show node`, and the triage of it with the nodes' reports."""
    text = show_node(*blocks)
    return ClusterView({n.name: n for n in slurm.parse_show_node(text)}, triage.unhealthy_nodes(text, RULES, reports))


def xid_report(tmp: Path, kmsg: str) -> dict[str, Any]:
    """The node program's interval run on a p5 node whose kernel log is the recorded `kmsg`."""
    return engine.run_checks(p5_config(tmp, kmsg=kmsg, efa_count=2), "interval", gpu(1).name,
                             Recorded(healthy_answers())).as_dict()


# --- XID triage: from the kernel log to the replacement --------------------------------------------------------
def test_an_xid_79_drains_the_gpu_node_and_invoke_nodes_asks_for_its_replacement(tmp_path: Path) -> None:
    report = xid_report(tmp_path, "kmsg-xid79.txt")
    assert report["reason"].startswith("fmcluster-health: xid: ") and "79" in report["reason"]
    view = view_of([node_block(gpu(1).name, "IDLE+DRAIN", report["reason"], partitions="gpu"),
                    node_block(gpu(2).name, partitions="gpu")], {gpu(1).name: report})
    lines = {ln.node: ln for ln in node_lines([CONTROLLER, gpu(1), gpu(2)], view)}
    assert (lines[gpu(1).name].state, lines[gpu(1).name].check, lines[gpu(1).name].action,
            lines[gpu(1).name].xids) == ("drained", "xid", "replace", [79])
    assert not lines[gpu(2).name].unhealthy and lines[CONTROLLER.name].state == "-"
    assert auto_replacements(list(lines.values()), compute_count=4) == ([gpu(1).name], "")


def test_an_xid_13_is_the_application_s_and_leaves_the_node_in_service(tmp_path: Path) -> None:
    report = xid_report(tmp_path, "kmsg-xid13.txt")
    assert report["healthy"] is True
    view = view_of([node_block(gpu(1).name, partitions="gpu")], {gpu(1).name: report})
    (line,) = node_lines([gpu(1)], view)
    assert (line.state, line.unhealthy) == ("idle", False)
    assert auto_replacements([line], compute_count=4) == ([], "")


def test_the_table_shows_state_action_check_and_reason_of_every_node() -> None:
    reason = "fmcluster-health: slurmd: nothing answers on 10.0.128.2:6818 (connection refused)"
    view = view_of([node_block(gpu(1).name, partitions="gpu"),
                    node_block(gpu(2).name, "IDLE+DRAIN+NOT_RESPONDING", reason, partitions="gpu"),
                    node_block("ip-10-0-128-9", "DOWN+NOT_RESPONDING", "Not responding", by="slurm")])
    text = render_lines(node_lines([CONTROLLER, LOGIN, gpu(1), gpu(2)], view))
    rows = [line.split() for line in text.splitlines()]
    assert rows[0] == ["NODE", "ROLE", "STATE", "ACTION", "CHECK", "INSTANCE", "REASON"]
    assert rows[1][:3] == [CONTROLLER.name, "controller", "-"]
    assert rows[3][:3] == [gpu(1).name, "compute", "idle"] and rows[3][3] == gpu(1).instance_id
    assert rows[4][:6] == [gpu(2).name, "compute", "drained*", "drain", "slurmd", gpu(2).instance_id]
    assert text.splitlines()[4].endswith(reason)
    # A Slurm node no live instance stands behind is listed too: it should have left slurm.conf.
    assert rows[5][:4] == ["ip-10-0-128-9", "compute", "down", "replace"]
    assert text.splitlines()[5].endswith("Not responding")


def test_the_automatic_mode_replaces_at_most_a_quarter_of_the_compute_nodes_in_one_pass() -> None:
    def asking(n: int) -> NodeLine:
        return NodeLine(gpu(n).name, "compute", gpu(n).address, gpu(n).instance_id, "drained", "replace", "gpu-count",
                        "fmcluster-health: gpu-count: 7 of 8 GPUs visible")

    assert auto_replacements([asking(1), asking(2)], compute_count=8) == ([gpu(1).name, gpu(2).name], "")
    nodes, why = auto_replacements([asking(1), asking(2), asking(3)], compute_count=8)
    assert nodes == [] and "a shared cause is likelier" in why
    assert auto_replacements([asking(1)], compute_count=2) == ([gpu(1).name], "")  # at least one
    person = NodeLine(gpu(4).name, "compute", gpu(4).address, gpu(4).instance_id, "drained", "none", "",
                      "waiting for the vendor", "drained by a person")
    assert auto_replacements([person], compute_count=8) == ([], "")


# --- which node: a live compute node, named exactly ----------------------------------------------------------
class Tenantish:
    org, region, scheduler, provider = "acme", REGION, "slurm-ec2", "aws"

    @property
    def capabilities(self) -> Capabilities:
        return capabilities(self.provider, self.scheduler)


def replacer(scheduler: str = "slurm-ec2") -> Replacer:
    tenant: Any = Tenantish()
    tenant.scheduler = scheduler
    provider: Any = type("P", (), {"boot_timeout_s": 1.0})()
    return Replacer(tenant, provider, None, {})


@pytest.mark.parametrize("wanted", ["ip-10-0-128-1; touch /tmp/pwned", "ip-10-0-128-*", "", "../ip-10-0-128-1",
                                    "ip-10-0-128-1\nip-10-0-128-2", "$(reboot)"])
def test_a_node_that_is_not_exactly_a_live_node_is_refused(wanted: str) -> None:
    with pytest.raises(LifecycleError, match="no live node") as err:
        replacer().pick(wanted, [CONTROLLER, LOGIN, gpu(1)])
    assert err.value.code == 2 and gpu(1).name in str(err.value)


def test_a_node_is_found_by_name_address_or_instance_id() -> None:
    for wanted in (gpu(1).name, gpu(1).address, gpu(1).instance_id):
        assert replacer().pick(wanted, [CONTROLLER, gpu(1), gpu(2)]) == gpu(1)


def test_the_controller_and_login_nodes_are_not_replaced_by_this_command() -> None:
    with pytest.raises(LifecycleError, match="controller node: `invoke replace` replaces compute nodes only"):
        replacer().pick(CONTROLLER.name, [CONTROLLER, LOGIN, gpu(1)])
    with pytest.raises(LifecycleError, match="login node"):
        replacer().pick(LOGIN.address, [CONTROLLER, LOGIN, gpu(1)])


def test_parallelcluster_nodes_are_replaced_by_parallelcluster_itself() -> None:
    with pytest.raises(LifecycleError, match="clustermgtd") as err:
        replacer("parallelcluster").replace(gpu(1).name)
    assert err.value.code == 2 and f"nodename={gpu(1).name} state=down" in str(err.value)
    with pytest.raises(LifecycleError, match="nodename=<node> state=down"):
        replacer("parallelcluster").replace("x'; reboot; '")


def test_hyperpod_is_asked_through_slurm_with_the_node_name_as_one_quoted_word() -> None:
    # HyperPod's own scontrol, by path (HyperPod's Slurm is the only one on its nodes), as root: the operator logs in
    # as the image's default user.
    assert hyperpod_replace_command("ip-10-0-128-1") == \
        f"sudo -n /opt/slurm/bin/scontrol update nodename=ip-10-0-128-1 state=fail reason={HYPERPOD_REPLACE_REASON}"
    assert hyperpod_replace_command("x; reboot") == \
        "sudo -n /opt/slurm/bin/scontrol update nodename='x; reboot' state=fail reason=Action:Replace"


def test_the_pinned_botocore_has_no_hyperpod_replace_api_so_the_slurm_path_is_used() -> None:
    """When botocore gains BatchReplaceClusterNodes, this fails: switch HyperPod to the API and test its shape."""
    import botocore.session

    operations = botocore.session.get_session().get_service_model("sagemaker").operation_names
    assert "BatchReplaceClusterNodes" not in operations and "BatchRebootClusterNodes" not in operations
    assert "BatchDeleteClusterNodes" in operations  # deletes, without a replacement: not what replace means


def test_the_auto_scaling_call_has_the_shape_of_autoscaling_s_service_model() -> None:
    import botocore.session
    from botocore.validate import validate_parameters

    model = botocore.session.get_session().get_service_model("autoscaling")
    validate_parameters({"InstanceId": "i-0c000000000000101", "ShouldDecrementDesiredCapacity": False},
                        model.operation_model("TerminateInstanceInAutoScalingGroup").input_shape)
    validate_parameters({"InstanceIds": ["i-0c000000000000101"]},
                        model.operation_model("DescribeAutoScalingInstances").input_shape)


# --- slurm-ec2: the Auto Scaling group launches the replacement (moto's server) -------------------------------
@pytest.fixture
def emulator() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def clients(endpoint: str) -> tuple[Any, Any]:
    import boto3

    kw: dict[str, Any] = {"region_name": REGION, "endpoint_url": endpoint, "aws_access_key_id": "emulator",
                          "aws_secret_access_key": "emulator"}
    return boto3.client("ec2", **kw), boto3.client("autoscaling", **kw)


def test_terminating_in_the_group_launches_a_new_instance_from_the_launch_template(emulator: str) -> None:
    from fmcluster.nodes import FMCLUSTER_TAGS, ec2_nodes

    ec2, autoscaling = clients(emulator)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.128.0/20")["Subnet"]["SubnetId"]
    user_data = base64.b64encode(b"#!/bin/bash\nexec /opt/fmcluster/bootstrap/node-bootstrap.sh\n").decode()
    tags = [{"Key": "fmcluster:org", "Value": "acme"}, {"Key": "fmcluster:role", "Value": "compute"},
            {"Key": "fmcluster:queue", "Value": "gpu"}]
    template = ec2.create_launch_template(LaunchTemplateName="fmc-acme-cluster-gpu", LaunchTemplateData={
        "ImageId": "ami-12c6146b", "InstanceType": "p5.48xlarge", "UserData": user_data,
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}]})["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="fmc-acme-cluster-GpuGroup", MinSize=2, MaxSize=2, DesiredCapacity=2,
        LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"}, VPCZoneIdentifier=subnet)
    before = ec2_nodes(ec2, "acme", FMCLUSTER_TAGS)
    assert len(before) == 2
    old = before[0]

    assert asg_replace(autoscaling, old.instance_id) == "fmc-acme-cluster-GpuGroup"

    after = ec2_nodes(ec2, "acme", FMCLUSTER_TAGS)
    (new,) = [n for n in after if n not in before]
    assert old.instance_id not in {n.instance_id for n in after} and len(after) == 2
    assert (new.role, new.queue, new.instance_type) == ("compute", "gpu", "p5.48xlarge")
    assert new.address != old.address and new.name != old.name  # a new instance: a new address, a new name
    group = autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"][0]
    assert group["DesiredCapacity"] == 2
    # The new instance boots what its launch template says: the one boot path.
    raw = ec2.describe_instance_attribute(InstanceId=new.instance_id, Attribute="userData")["UserData"]["Value"]
    assert raw == user_data
    # An instance outside any group has nothing to replace it: refused, nothing terminated.
    loose = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, SubnetId=subnet)["Instances"][0]
    with pytest.raises(RuntimeError, match="in no Auto Scaling group"):
        asg_replace(autoscaling, loose["InstanceId"])
    state = ec2.describe_instances(InstanceIds=[loose["InstanceId"]])["Reservations"][0]["Instances"][0]["State"]
    assert state["Name"] == "running"


# --- the tenant's opt-in --------------------------------------------------------------------------------------
def test_automatic_replacement_is_off_unless_the_tenant_opts_in(tmp_path: Path) -> None:
    from conftest import ROOT
    from fmcluster.model import TenantInvalid, load_spec

    demo = (ROOT / "inventories" / "demo" / "group_vars" / "all" / "tenant.yml").read_text()
    spec = tmp_path / "tenant.yml"
    spec.write_text(demo)
    assert load_spec(spec).health.auto_replace is False
    spec.write_text(demo + "  health:\n    auto_replace: true\n")
    assert load_spec(spec).health.auto_replace is True
    for bad, key in (("auto_replace: \"yes\"", "tenant.health.auto_replace"),
                     ("replace_everything: true", "replace_everything")):
        spec.write_text(demo + f"  health:\n    {bad}\n")
        with pytest.raises(TenantInvalid) as err:
            load_spec(spec)
        assert key in err.value.render(), err.value.render()


def test_nodes_slurm_names_as_parallelcluster_does_are_matched_to_their_instances_by_address() -> None:
    """ParallelCluster names Slurm nodes `<queue>-st-<resource>-<n>`; the instance's address is the NodeAddr."""
    reason = "fmcluster-health: slurmd: nothing answers on 10.0.128.2:6818 (connection refused)"
    view = view_of([node_block("gpu-st-p5-1", address=gpu(1).address, partitions="gpu"),
                    node_block("gpu-st-p5-2", "IDLE+DRAIN", reason, address=gpu(2).address, partitions="gpu")])
    lines = {ln.node: ln for ln in node_lines([CONTROLLER, gpu(1), gpu(2)], view)}
    assert sorted(lines) == sorted([CONTROLLER.name, gpu(1).name, gpu(2).name]), "no stray 'no live instance' line"
    assert (lines[gpu(1).name].state, lines[gpu(1).name].unhealthy) == ("idle", False)
    assert (lines[gpu(2).name].state, lines[gpu(2).name].check, lines[gpu(2).name].reason) == ("drained", "slurmd", reason)


@pytest.mark.parametrize("timeout", [-1.0, -600.0])
def test_a_replacement_budget_that_is_not_positive_is_refused_before_anything_is_asked(
        timeout: float, capsys: pytest.CaptureFixture[str]) -> None:
    """`invoke replace --timeout=S`: a negative budget is refused with the flag and what it must be, before the
    command reaches an endpoint or the published manifest (0 is the default, the provider's boot budget)."""
    from fmcluster.commands.cluster import replace
    from fmcluster.exits import ExitCode

    assert replace("demo", "ip-10-77-128-6", timeout) == ExitCode.INVALID
    assert capsys.readouterr().out == f"replace: --timeout={timeout:g} must be a positive number of seconds\n"
