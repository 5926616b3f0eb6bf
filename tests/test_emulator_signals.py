"""CloudFormation's signals on the AWS emulator (fmcluster.providers.local.emulator_server, fix 8), against a real emulator
server process: a resource created with a CreationPolicy ResourceSignal waits for its signals, a FAILURE or the
Timeout fails it and rolls the stack back, with CloudFormation's own status reasons.

Each scenario creates its own small stack (a launch template, an auto scaling group or an instance, a security
group) through a change set, as the deploy does, and signals it as the nodes' bootstrap would (SignalResource, the
instance id as UniqueId).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fmcluster.stacks import aws
from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator
from fmcluster.stacks.cfn import signal_timeout_s
from fmcluster.providers.local.emulator_server import required_successes

REGION = "ap-northeast-1"
ORG = "t-signals"


# --- the arithmetic (no server) ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("count", "percent", "needed"), [
    (5, 50, 3),  # CloudFormation's own example: 50 % of five instances needs three
    (2, 50, 1), (3, 100, 3), (16, 93, 15), (10, 0, 0), (3, 66.64, 2), (3, 66.66, 3)])
def test_min_successful_instances_percent_is_rounded_to_a_tenth_then_up_to_whole_instances(
        count: int, percent: float, needed: int) -> None:
    assert required_successes(count, percent) == needed
    assert required_successes(count, None) == count


@pytest.mark.parametrize(("text", "seconds"), [("PT30M", 1800), ("PT1S", 1), ("PT1H30M", 5400), ("PT12H", 43200)])
def test_a_signal_timeout_is_an_iso_8601_duration_of_at_most_twelve_hours(text: str, seconds: float) -> None:
    assert signal_timeout_s(text) == seconds


@pytest.mark.parametrize("text", ["PT12H1S", "PT13H", "30M", "PT", "P1D", "PT5X"])
def test_other_timeouts_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        signal_timeout_s(text)


# --- against the emulator ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("signals")
    emulator = ensure_emulator(ORG, root)
    try:
        yield emulator.endpoint
    finally:
        stop_emulator(ORG, root)


class Aws:
    def __init__(self, endpoint: str) -> None:
        self.cf: Any = aws.client("cloudformation", REGION, endpoint)
        self.ec2: Any = aws.client("ec2", REGION, endpoint)
        self.autoscaling: Any = aws.client("autoscaling", REGION, endpoint)
        self.image = self.ec2.describe_images()["Images"][0]["ImageId"]

    def template(self, *, group: dict[str, Any] | None = None, instance: dict[str, Any] | None = None,
                 desired: int = 2) -> str:
        """A security group (what an update must keep), and a signalled group and/or instance."""
        resources: dict[str, Any] = {
            "Kept": {"Type": "AWS::EC2::SecurityGroup", "Properties": {"GroupDescription": "kept by a rollback"}},
            "Template": {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": {
                "ImageId": self.image, "InstanceType": "t3.micro"}}}}
        outputs: dict[str, Any] = {"KeptId": {"Value": {"Ref": "Kept"}}}
        if group is not None:
            resources["Group"] = {"Type": "AWS::AutoScaling::AutoScalingGroup", "CreationPolicy": group,
                                  "Properties": {"MinSize": str(desired), "MaxSize": str(desired),
                                                 "DesiredCapacity": str(desired),
                                                 "AvailabilityZones": [f"{REGION}a"],
                                                 "LaunchTemplate": {"LaunchTemplateId": {"Ref": "Template"},
                                                                    "Version": {"Fn::GetAtt": [
                                                                        "Template", "LatestVersionNumber"]}}}}
            outputs["GroupName"] = {"Value": {"Ref": "Group"}}
        if instance is not None:
            resources["Node"] = {"Type": "AWS::EC2::Instance", "CreationPolicy": instance,
                                 "Properties": {"ImageId": self.image, "InstanceType": "t3.micro"}}
        return json.dumps({"Resources": resources, "Outputs": outputs})

    def execute(self, name: str, body: str, kind: str = "CREATE") -> None:
        self.cf.create_change_set(StackName=name, ChangeSetName="cs", ChangeSetType=kind, TemplateBody=body)
        self.cf.execute_change_set(StackName=name, ChangeSetName="cs")
        self.cf.delete_change_set(StackName=name, ChangeSetName="cs")

    def status(self, name: str) -> str:
        return str(self.cf.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"])

    def wait(self, name: str, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while (status := self.status(name)).endswith("_IN_PROGRESS") and time.monotonic() < deadline:
            time.sleep(0.2)
        return status

    def resource(self, name: str, logical_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.cf.describe_stack_resource(StackName=name, LogicalResourceId=logical_id)[
            "StackResourceDetail"]
        return found

    def listed(self, name: str) -> dict[str, str]:
        return {r["LogicalResourceId"]: r["ResourceStatus"]
                for r in self.cf.list_stack_resources(StackName=name)["StackResourceSummaries"]}

    def members(self, name: str) -> list[str]:
        group = self.resource(name, "Group")["PhysicalResourceId"]
        (found,) = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
        return sorted(i["InstanceId"] for i in found["Instances"])

    def signal(self, name: str, logical_id: str, unique_id: str, status: str = "SUCCESS") -> None:
        self.cf.signal_resource(StackName=name, LogicalResourceId=logical_id, UniqueId=unique_id, Status=status)

    def events(self, name: str) -> list[dict[str, Any]]:
        return list(reversed(self.cf.describe_stack_events(StackName=name)["StackEvents"]))

    def states(self, ids: list[str]) -> set[str]:
        return {i["State"]["Name"] for r in self.ec2.describe_instances(InstanceIds=ids)["Reservations"]
                for i in r["Instances"]}


@pytest.fixture
def cloud(endpoint: str) -> Aws:
    return Aws(endpoint)


COUNT_TWO = {"ResourceSignal": {"Count": 2, "Timeout": "PT10M"}}

slow = pytest.mark.slow  # each scenario talks to a real emulator server (started once for the module)


@slow
def test_a_group_waits_for_two_success_signals_and_counts_a_unique_id_once(cloud: Aws) -> None:
    name = "signals-two-successes"
    cloud.execute(name, cloud.template(group=COUNT_TWO))
    assert cloud.status(name) == "CREATE_IN_PROGRESS"
    assert cloud.listed(name) == {"Kept": "CREATE_COMPLETE", "Template": "CREATE_COMPLETE",
                                  "Group": "CREATE_IN_PROGRESS"}
    assert cloud.resource(name, "Group")["ResourceStatus"] == "CREATE_IN_PROGRESS"
    assert not cloud.cf.describe_stacks(StackName=name)["Stacks"][0].get("Outputs"), "no outputs while waiting"
    first, second = cloud.members(name)
    cloud.signal(name, "Group", first)
    cloud.signal(name, "Group", first)  # the same node again: still one of two
    time.sleep(0.5)
    assert cloud.status(name) == "CREATE_IN_PROGRESS"
    cloud.signal(name, "Group", second)
    assert cloud.status(name) == "CREATE_COMPLETE"
    assert cloud.listed(name)["Group"] == "CREATE_COMPLETE"
    stack = cloud.cf.describe_stacks(StackName=name)["Stacks"][0]
    assert {o["OutputKey"] for o in stack["Outputs"]} == {"KeptId", "GroupName"}, "outputs once the stack completes"
    group_events = [(e["ResourceStatus"], e.get("ResourceStatusReason", "")) for e in cloud.events(name)
                    if e["LogicalResourceId"] == "Group"]
    assert group_events == [("CREATE_IN_PROGRESS", "Resource creation Initiated"),
                            ("CREATE_IN_PROGRESS", f"Received SUCCESS signal with UniqueId {first}"),
                            ("CREATE_IN_PROGRESS", f"Received SUCCESS signal with UniqueId {second}"),
                            ("CREATE_COMPLETE", "")]
    with pytest.raises(ClientError, match="Resource Group is in CREATE_COMPLETE state and cannot be signaled"):
        cloud.signal(name, "Group", first)
    with pytest.raises(ClientError, match="Resource Nothing does not exist for stack"):
        cloud.signal(name, "Nothing", first)


@slow
def test_one_failure_signal_fails_the_group_and_rolls_the_stack_back_terminating_its_instances(cloud: Aws) -> None:
    name = "signals-one-failure"
    cloud.execute(name, cloud.template(group=COUNT_TWO))
    members = cloud.members(name)
    cloud.signal(name, "Group", members[0])
    cloud.signal(name, "Group", members[1], "FAILURE")
    assert cloud.status(name) == "ROLLBACK_COMPLETE"
    failed = [e for e in cloud.events(name) if e["ResourceStatus"] == "CREATE_FAILED"]
    assert [(e["LogicalResourceId"], e["ResourceStatusReason"]) for e in failed] == [
        ("Group", "Received 1 FAILURE signal(s) out of 2. Unable to satisfy 100% MinSuccessfulInstancesPercent "
                  "requirement")]
    assert cloud.states(members) == {"terminated"}
    assert not any(set(members) & {i["InstanceId"] for i in g["Instances"]}
                   for g in cloud.autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]), "the group is gone"


@slow
def test_an_instance_fails_at_its_first_failure_signal(cloud: Aws) -> None:
    name = "signals-instance"
    cloud.execute(name, cloud.template(instance=COUNT_TWO))
    assert cloud.status(name) == "CREATE_IN_PROGRESS"
    node = cloud.resource(name, "Node")["PhysicalResourceId"]
    cloud.signal(name, "Node", node, "FAILURE")
    assert cloud.status(name) == "ROLLBACK_COMPLETE"
    (failed,) = [e for e in cloud.events(name) if e["ResourceStatus"] == "CREATE_FAILED"]
    assert failed["ResourceStatusReason"] == f"Received FAILURE signal with UniqueId {node}"
    assert cloud.states([node]) == {"terminated"}


@slow
def test_the_timeout_rolls_the_stack_back_with_nobody_polling(cloud: Aws) -> None:
    name = "signals-timeout"
    cloud.execute(name, cloud.template(group={"ResourceSignal": {"Count": 2, "Timeout": "PT1S"}}))
    members = cloud.members(name)
    executed = datetime.now(timezone.utc)
    time.sleep(3.0)  # no call reaches the emulator meanwhile: only its timer can roll the stack back
    asked = datetime.now(timezone.utc)
    assert cloud.status(name) == "ROLLBACK_COMPLETE"
    events = cloud.events(name)
    (failed,) = [e for e in events if e["ResourceStatus"] == "CREATE_FAILED"]
    assert failed["ResourceStatusReason"] == "Failed to receive 2 resource signal(s) within the specified duration"
    rolled = next(e for e in events if e["ResourceStatus"] == "ROLLBACK_COMPLETE")
    assert (rolled["Timestamp"] - executed).total_seconds() < 2.5 < (asked - executed).total_seconds(), \
        "rolled back when the timeout ran out, not when somebody looked"
    assert cloud.states(members) == {"terminated"}


@slow
def test_half_of_two_succeeding_is_enough_with_min_successful_instances_percent_50(cloud: Aws) -> None:
    name = "signals-half"
    cloud.execute(name, cloud.template(group={**COUNT_TWO,
                                              "AutoScalingCreationPolicy": {"MinSuccessfulInstancesPercent": 50}}))
    failing, succeeding = cloud.members(name)
    cloud.signal(name, "Group", failing, "FAILURE")
    assert cloud.status(name) == "CREATE_IN_PROGRESS", "one of two may still succeed"
    cloud.signal(name, "Group", succeeding)
    assert cloud.status(name) == "CREATE_COMPLETE"


@slow
def test_an_update_adding_a_signalled_group_rolls_back_on_failure_keeping_the_old_resources(cloud: Aws) -> None:
    name = "signals-update"
    cloud.execute(name, cloud.template())
    assert cloud.status(name) == "CREATE_COMPLETE", "nothing signalled: complete at once"
    kept = cloud.resource(name, "Kept")["PhysicalResourceId"]
    cloud.execute(name, cloud.template(group=COUNT_TWO), kind="UPDATE")
    assert cloud.status(name) == "UPDATE_IN_PROGRESS"
    members = cloud.members(name)
    cloud.signal(name, "Group", members[0], "FAILURE")
    assert cloud.status(name) == "UPDATE_ROLLBACK_COMPLETE"
    assert set(cloud.listed(name)) == {"Kept", "Template"} and cloud.resource(name, "Kept")["PhysicalResourceId"] == kept
    assert cloud.ec2.describe_security_groups(GroupIds=[kept])["SecurityGroups"], "the old resources are kept"
    assert cloud.states(members) == {"terminated"}
    reasons = [e.get("ResourceStatusReason") for e in cloud.events(name)]
    assert "The following resource(s) failed to create: [Group]." in reasons
    # The next update, with both nodes succeeding, completes.
    cloud.execute(name, cloud.template(group=COUNT_TWO), kind="UPDATE")
    for member in cloud.members(name):
        cloud.signal(name, "Group", member)
    assert cloud.status(name) == "UPDATE_COMPLETE"


def test_the_emulator_honours_creation_policy_and_still_lists_update_policy_as_ignored() -> None:
    from fmcluster.stacks.result import EMULATOR_IGNORED_ATTRIBUTES

    assert "CreationPolicy" not in EMULATOR_IGNORED_ATTRIBUTES and "UpdatePolicy" in EMULATOR_IGNORED_ATTRIBUTES


@slow
def test_the_first_boot_s_own_client_signals_as_the_agent_does(cloud: Aws, endpoint: str) -> None:
    """fmcluster/node/boot/fmcluster-s3 (Python's standard library alone): what node-bootstrap.sh's report_failure sends when a
    first boot fails before the agent (which has boto3) runs. Its FAILURE fails the group now, not at the Timeout."""
    import subprocess

    from fmcluster.paths import NODE_BOOT_DIR

    def client(*args: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/bin:/bin", "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "emulator",
               "AWS_SECRET_ACCESS_KEY": "emulator", "FMCLUSTER_REGION": REGION}
        return subprocess.run(["/usr/bin/python3", str(NODE_BOOT_DIR / "fmcluster-s3"), *args], capture_output=True,
                              text=True, env=env, timeout=60, check=False)

    name = "signals-first-boot-client"
    cloud.execute(name, cloud.template(group=COUNT_TWO))
    first, second = cloud.members(name)
    assert client("signal", name, "Group", first, "SUCCESS").returncode == 0
    assert cloud.status(name) == "CREATE_IN_PROGRESS"
    failed = client("signal", name, "Group", second, "FAILURE")
    assert failed.returncode == 0, failed.stderr
    assert cloud.status(name) == "ROLLBACK_COMPLETE"
    late = client("signal", name, "Group", second, "FAILURE")
    assert late.returncode == 1
    assert "HTTP 400 ValidationError: Resource Group is in ROLLBACK_COMPLETE state and cannot be signaled" in late.stderr
    assert client("signal", name, "Group", second, "MAYBE").returncode == 1
