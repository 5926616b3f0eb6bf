"""What EC2's instance metadata service hands an instance, stood in: its instance profile's role as a session named
by the instance id, so the node's caller identity (aws:userid) is "<role id>:<instance id>" as on AWS.

Each local host's IMDS stand-in (fmcluster.providers.local.imds) serves exactly the session EC2 would give (AssumeRole
of the role in the instance's profile, RoleSessionName = the instance id), asked of the emulator's STS when the host
is made. Every node so has its own identity, and its own report prefix (the role policy's fmcluster/report/${aws:userid}/).

The profile is the one the instance was launched with, found the way it was declared: the instance's own
IamInstanceProfile when EC2 (the emulator) records it; else its launch template, reached through its Auto Scaling
group or, for an instance the cluster stack declares itself (the controller), through that stack's resource.
No profile found is an error: on AWS such a node would have no credentials at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from fmcluster.providers.local.hosts import SubstrateError
from fmcluster.stacks.render import load_cfn_yaml

Client = Callable[[str], Any]
#: How long the session lasts: longer than any local rehearsal (STS allows a role session up to 12 hours).
SESSION_SECONDS = 12 * 3600


def _template_data(ec2: Any, template_id: str, version: str) -> dict[str, Any]:
    versions = ec2.describe_launch_template_versions(LaunchTemplateId=template_id, Versions=[version or "$Default"])
    return dict((versions.get("LaunchTemplateVersions") or [{}])[0].get("LaunchTemplateData", {}))


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


def launch_template_data(instance: dict[str, Any], client: Client, stacks: Sequence[str]) -> dict[str, Any]:
    """The LaunchTemplateData `instance` was launched from ({} when none is found). `stacks`: the tenant's stacks,
    where an instance without a group is declared (EC2 tags such an instance aws:cloudformation:stack-name; the
    emulator does not)."""
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    where = None
    if tags.get("aws:autoscaling:groupName"):
        where = _group_template(client, tags["aws:autoscaling:groupName"])
    else:
        declared = [tags["aws:cloudformation:stack-name"]] if tags.get("aws:cloudformation:stack-name") else stacks
        where = next((found for stack in declared
                      if (found := _stack_template(client, stack, instance["InstanceId"])) is not None), None)
    return _template_data(client("ec2"), *where) if where else {}


def instance_profile(instance: dict[str, Any], template: Mapping[str, Any]) -> str:
    """The ARN (or name) of the instance profile `instance` was launched with (its own, else its launch template's,
    `template`: launch_template_data's answer); raises SubstrateError if none."""
    recorded = (instance.get("IamInstanceProfile") or {}).get("Arn")
    if recorded:
        return str(recorded)
    profile = template.get("IamInstanceProfile") or {}
    found = str(profile.get("Arn") or profile.get("Name") or "")
    if not found:
        raise SubstrateError(f"instance {instance['InstanceId']} has no instance profile (none recorded, none in its "
                             "launch template): on AWS its node would have no credentials; the cluster stack must "
                             "give it one")
    return found


@dataclass(frozen=True)
class RoleSession:
    """What IMDS hands an instance for its profile: the profile, its role, and the role's session named by the
    instance id."""

    profile_arn: str
    profile_id: str
    role_name: str
    access_key_id: str
    secret_access_key: str
    token: str
    expiration: str  # ISO 8601, UTC ("Z")


def role_session(instance: dict[str, Any], client: Client, template: Mapping[str, Any]) -> RoleSession:
    """`instance`'s role session, as IMDS's iam/security-credentials/<role> answers it (`template`: its launch
    template's data)."""
    profile = instance_profile(instance, template)
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
    expiration = credentials["Expiration"]
    stamp = expiration.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if isinstance(expiration, datetime) \
        else str(expiration)
    return RoleSession(profiles[0]["Arn"], profiles[0]["InstanceProfileId"], roles[0]["RoleName"],
                       credentials["AccessKeyId"], credentials["SecretAccessKey"], credentials["SessionToken"], stamp)

