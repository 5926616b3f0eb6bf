"""What EC2's instance metadata service hands an instance, stood in: its instance profile's role as a session named
by the instance id, so the node's caller identity (aws:userid) is "<role id>:<instance id>" as on AWS.

The local substrate has no IMDS. At first boot it asks the emulator's STS for exactly the session EC2 would give
(AssumeRole of the role in the instance's profile, RoleSessionName = the instance id) and hands it to the user
data's environment, where fmcluster-bootstrap passes it on to the node's agent and daemons (node.env, root only).
Every node so has its own identity, and its own report key (the role policy's fmcluster/report/${aws:userid}).

The profile is the one the instance was launched with, found the way it was declared: the instance's own
IamInstanceProfile when EC2 (the emulator) records it; else its launch template, reached through its Auto Scaling
group or, for an instance the cluster stack declares itself (the controller), through that stack's resource.
No profile found is an error: on AWS such a node would have no credentials at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fmcluster.providers.local.hosts import SubstrateError
from fmcluster.stacks.render import load_cfn_yaml

Client = Callable[[str], Any]
#: How long the session lasts: longer than any local rehearsal (STS allows a role session up to 12 hours).
SESSION_SECONDS = 12 * 3600


def _template_profile(ec2: Any, template_id: str, version: str) -> str:
    versions = ec2.describe_launch_template_versions(LaunchTemplateId=template_id, Versions=[version or "$Default"])
    data = (versions.get("LaunchTemplateVersions") or [{}])[0].get("LaunchTemplateData", {})
    profile = data.get("IamInstanceProfile") or {}
    return str(profile.get("Arn") or profile.get("Name") or "")


def _group_template(client: Client, group: str) -> tuple[str, str] | None:
    found = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    if not found:
        return None
    spec = found[0].get("LaunchTemplate") or \
        (found[0].get("MixedInstancesPolicy") or {}).get("LaunchTemplate", {}).get("LaunchTemplateSpecification") or {}
    return (str(spec["LaunchTemplateId"]), str(spec.get("Version", ""))) if spec.get("LaunchTemplateId") else None


def _stack_template(client: Client, stack: str, instance_id: str) -> tuple[str, str] | None:
    """The launch template the stack's own AWS::EC2::Instance resource names (the controller), if `stack` declares
    the instance."""
    cloudformation = client("cloudformation")
    physical: dict[str, str] = {}
    try:
        pages = list(cloudformation.get_paginator("list_stack_resources").paginate(StackName=stack))
    except cloudformation.exceptions.ClientError:  # no such stack
        return None
    for page in pages:
        physical.update({r["LogicalResourceId"]: r.get("PhysicalResourceId", "")
                         for r in page["StackResourceSummaries"]})
    logical = next((name for name, value in physical.items() if value == instance_id), None)
    if logical is None:
        return None
    body = cloudformation.get_template(StackName=stack)["TemplateBody"]
    template = body if isinstance(body, dict) else load_cfn_yaml(body)
    spec = template["Resources"][logical].get("Properties", {}).get("LaunchTemplate") or {}
    reference = spec.get("LaunchTemplateId")
    template_id = physical.get(reference["Ref"], "") if isinstance(reference, dict) and "Ref" in reference \
        else str(reference or "")
    return (template_id, str(spec.get("Version", ""))) if template_id else None


def instance_profile(instance: dict[str, Any], client: Client, stacks: Sequence[str]) -> str:
    """The ARN (or name) of the instance profile `instance` was launched with; raises SubstrateError if none.
    `stacks`: the tenant's stacks, where an instance without a group is declared (EC2 tags such an instance
    aws:cloudformation:stack-name; the emulator does not)."""
    recorded = (instance.get("IamInstanceProfile") or {}).get("Arn")
    if recorded:
        return str(recorded)
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    where = None
    if tags.get("aws:autoscaling:groupName"):
        where = _group_template(client, tags["aws:autoscaling:groupName"])
    else:
        declared = [tags["aws:cloudformation:stack-name"]] if tags.get("aws:cloudformation:stack-name") else stacks
        where = next((found for stack in declared
                      if (found := _stack_template(client, stack, instance["InstanceId"])) is not None), None)
    profile = _template_profile(client("ec2"), *where) if where else ""
    if not profile:
        raise SubstrateError(f"instance {instance['InstanceId']} has no instance profile (none recorded, none in its "
                             "launch template): on AWS its node would have no credentials; the cluster stack must "
                             "give it one")
    return profile


def role_session(instance: dict[str, Any], client: Client, stacks: Sequence[str]) -> dict[str, str]:
    """The environment of `instance`'s role session: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN."""
    profile = instance_profile(instance, client, stacks)
    iam = client("iam")
    profiles = [p for page in iam.get_paginator("list_instance_profiles").paginate()
                for p in page["InstanceProfiles"] if profile in (p["Arn"], p["InstanceProfileName"])]
    roles = profiles[0]["Roles"] if profiles else []
    if len(roles) != 1:
        raise SubstrateError(f"instance profile {profile} of instance {instance['InstanceId']} holds "
                             f"{len(roles)} roles, not one: EC2 would refuse to launch with it")
    session = client("sts").assume_role(RoleArn=roles[0]["Arn"], RoleSessionName=instance["InstanceId"],
                                        DurationSeconds=SESSION_SECONDS)
    credentials = session["Credentials"]
    return {"AWS_ACCESS_KEY_ID": credentials["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": credentials["SecretAccessKey"],
            "AWS_SESSION_TOKEN": credentials["SessionToken"]}

