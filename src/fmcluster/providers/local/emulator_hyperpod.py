"""The AWS emulator's stand-in for SageMaker HyperPod (emulator_server fix 10): AWS::SageMaker::Cluster, made.

moto 5.1's CloudFormation skips AWS::SageMaker::Cluster, and its SageMaker API (CreateCluster, ListClusterNodes,
DescribeClusterNode) keeps nodes that are names only: no address, no instance, nothing runs. What HyperPod does
when it creates a cluster is stood in here as a *substrate*, never as an answer made up for a caller:

- per instance group, InstanceCount instances are launched into the cluster's VpcConfig subnet with its security
  groups (HyperPod attaches its instances' interfaces to the customer's VPC), tagged with the cluster's Tags (the
  local provider gives each a host, as it does every instance of the tenant);
- each instance runs with its group's ExecutionRole, through an instance profile the stand-in makes for it (HyperPod
  hands its instances that role's credentials; the local hosts' metadata service reads them from a profile);
- each instance's user data is the HyperPod agent stand-in (fmcluster/providers/local/hyperpod_agent.py) with what
  HyperPod's agent has on the instance: the cluster's resource config (/opt/ml/config/resource_config.json), the
  group's LifeCycleConfig, its SlurmConfig and a munge key shared by the cluster. It lays out the Slurm HyperPod's
  AMI ships under /opt/slurm, writes slurm.conf on the controller group as HyperPod's agent does, then downloads
  SourceS3Uri and runs the group's script there (OnInitComplete after starting that Slurm, as HyperPod does; OnCreate
  with Slurm left to the script), as root, as HyperPod runs a lifecycle script;
- SageMaker's DescribeCluster, ListClusterNodes and DescribeClusterNode answer from those instances: the node id is
  the instance id, PrivatePrimaryIp and PrivateDnsHostname are its, its status follows the instance's state.

What differs from HyperPod (docs/local-nodes.md, "HyperPod stand-in"): the instances are EC2 instances of the
emulator's account (HyperPod's live in a service account, invisible to DescribeInstances); every node's role
session is named after its instance (HyperPod names one 'SageMaker' session per group); no deep health checks,
NodeRecovery or node replacement; an update of the cluster (a new InstanceCount) is refused, not applied.
The bucket rule moto adds (SourceS3Uri must start with s3://sagemaker-) is not the API's: its documented pattern is
`(https|s3)://([^/]+)/?(.*)`; the prefix is what the *managed* instance policy can read (fmcluster's execution role
grants its own bucket), so the stand-in does not refuse other buckets.
"""

from __future__ import annotations

import base64
import json
import secrets
import shlex
from datetime import datetime
from pathlib import Path
from typing import Any

#: The HyperPod agent stand-in each instance runs (standard library only: it runs before anything is installed).
AGENT = Path(__file__).resolve().parent / "hyperpod_agent.py"
#: Where the agent and its settings are written on the instance.
AGENT_PATH = "/var/lib/fmcluster-hyperpod/agent.py"
SETTINGS_PATH = "/var/lib/fmcluster-hyperpod/settings.json"
S3_CLIENT = "/usr/local/sbin/fmcluster-s3"
#: The image id the stand-in's instances carry (HyperPod boots its own AMI; the local hosts boot the local image).
IMAGE_ID = "ami-0hyperpod0standin0"
#: Tag naming the cluster an instance belongs to (so a reader of DescribeInstances can tell the stand-in's apart).
CLUSTER_TAG = "sagemaker:cluster-name"
GROUP_TAG = "sagemaker:instance-group-name"


#: The keys of an instance in HyperPod's resource config, and no other: InstanceName ("<group>-<index>"), InstanceId,
#: CustomerIpAddress (its address in the customer's VPC) and AgentIpAddress (HyperPod's agent network, which the local
#: hosts have not) (awsome-distributed-ai, 5.sagemaker-hyperpod/tools/devops-agent/docs/hyperpod-mental-model.md, "Key
#: config files"). No hostname: a lifecycle script that needs one derives it, as HyperPod's slurm.conf does.
RESOURCE_CONFIG_INSTANCE_KEYS = ("InstanceName", "InstanceId", "CustomerIpAddress", "AgentIpAddress")


def resource_config(cluster_name: str, cluster_arn: str, groups: list[dict[str, Any]]) -> dict[str, Any]:
    """/opt/ml/config/resource_config.json as HyperPod writes it on every instance: the cluster and each instance
    group with its instances (InstanceName, InstanceId, CustomerIpAddress: the address in the customer's VPC, which
    lifecycle scripts match against their own; AWS's lifecycle samples read these keys)."""
    return {"ClusterConfig": {"ClusterArn": cluster_arn, "ClusterName": cluster_name},
            "InstanceGroups": [{"Name": g["name"], "InstanceType": g["instance_type"],
                                "Instances": [{"InstanceName": f"{g['name']}-{index}", "InstanceId": i["id"],
                                               "CustomerIpAddress": i["address"]}
                                              for index, i in enumerate(g["instances"], start=1)]}
                               for g in groups]}


def agent_user_data(settings: dict[str, Any], agent_source: str) -> str:
    """One instance's user data: write the agent and its settings, run it (cloud-init runs user data as root)."""
    from fmcluster.stacks.first_boot import s3_client_writer

    body = json.dumps(settings, indent=1, sort_keys=True)
    return "\n".join([
        "#!/bin/bash",
        "# fmcluster local stand-in for SageMaker HyperPod's agent (fmcluster.providers.local.emulator_hyperpod): what HyperPod",
        "# does on its instance before and while it runs the lifecycle script.",
        "set -euo pipefail",
        "install -d -m 0700 /var/lib/fmcluster-hyperpod",
        f"cat > {SETTINGS_PATH} <<'FMCLUSTER_SETTINGS'", body, "FMCLUSTER_SETTINGS",
        f"chmod 0600 {SETTINGS_PATH}",
        # HyperPod's AMI has the AWS CLI; the local image has not: the agent downloads with the first boot's client.
        s3_client_writer(S3_CLIENT).rstrip("\n"),
        f"cat > {AGENT_PATH} <<'FMCLUSTER_AGENT'", agent_source.rstrip("\n"), "FMCLUSTER_AGENT",
        f"exec python3 {AGENT_PATH} {shlex.quote(SETTINGS_PATH)}", ""])


def install_hyperpod_stand_in() -> None:
    """Register AWS::SageMaker::Cluster with moto's CloudFormation, and answer SageMaker's cluster calls from its
    instances."""
    from moto.cloudformation import parsing
    from moto.core.common_models import CloudFormationModel
    from moto.ec2.models import ec2_backends
    from moto.ec2.utils import parse_user_data
    from moto.iam.models import iam_backends
    from moto.sagemaker import models as sagemaker_models
    from moto.sagemaker.utils import arn_formatter
    from moto.utilities.utils import get_partition

    def ec2_of(account: str, region: str) -> Any:
        return ec2_backends[account][region]

    class StandInNode(sagemaker_models.ClusterNode):
        """A HyperPod node that is an instance: its id, address and state are the instance's."""

        def __init__(self, cluster: StandInCluster, group: dict[str, Any], instance: Any) -> None:
            super().__init__(cluster.region_name, cluster.account_id, cluster.cluster_name,
                             group["InstanceGroupName"], group["InstanceType"], group["LifeCycleConfig"],
                             group["ExecutionRole"], instance.id, group.get("ThreadsPerCore"))
            self.instance = instance
            self.launch_time = datetime.now().strftime("%Y-%m-%d %H:%M:%S")

        def _status(self) -> dict[str, str]:
            state = self.instance.state
            status = {"pending": "Pending", "running": "Running"}.get(state, "ShuttingDown"
                                                                       if state == "shutting-down" else "Failure")
            return {"Status": status, "Message": f"instance {self.instance.id} is {state}"}

        def describe(self) -> dict[str, Any]:
            found: dict[str, Any] = super().describe()
            found["InstanceStatus"] = self._status()
            found["PrivatePrimaryIp"] = self.instance.private_ip
            found["PrivateDnsHostname"] = self.instance.private_dns_name.split(".", 1)[0]
            return found

        def summary(self) -> dict[str, Any]:
            found: dict[str, Any] = super().summary()
            found["InstanceStatus"] = self._status()
            return found

    class StandInCluster(sagemaker_models.Cluster, CloudFormationModel):
        """A HyperPod cluster whose instance groups are launched instances (the module's docstring)."""

        def __init__(self, name: str, account: str, region: str, properties: dict[str, Any]) -> None:
            # Not moto's __init__: its checks (an instance type list of its own, the s3://sagemaker- prefix) are
            # not the API's (the module's docstring).
            backend = sagemaker_models.sagemaker_backends[account][region]
            if name in backend.clusters:
                raise ValueError(f"Resource Already Exists: Cluster with name {name} already exists.")
            self.region_name, self.account_id, self.cluster_name = region, account, name
            self.arn = arn_formatter("cluster", name, account, region)
            self.vpc_config = properties.get("VpcConfig") or {}
            self.tags = properties.get("Tags") or []
            self.status, self.failure_message = "InService", ""
            self.creation_time = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            self.nodes: dict[str, Any] = {}
            self.profiles: list[str] = []
            self.instance_groups = [{**g, "CurrentCount": int(g["InstanceCount"]), "TargetCount": int(g["InstanceCount"])}
                                    for g in properties["InstanceGroups"]]
            for group in self.instance_groups:
                group.pop("InstanceCount", None)
            self._launch()
            backend.clusters[name] = self

        @property
        def physical_resource_id(self) -> str:
            return str(self.arn)

        @staticmethod
        def cloudformation_type() -> str:
            return "AWS::SageMaker::Cluster"

        @staticmethod
        def cloudformation_name_type() -> str:
            return "ClusterName"

        @classmethod
        def has_cfn_attr(cls, attr: str) -> bool:
            return attr in ("ClusterArn", "ClusterStatus", "CreationTime")

        def get_cfn_attribute(self, attribute_name: str) -> Any:
            values = {"ClusterArn": self.arn, "ClusterStatus": self.status, "CreationTime": self.creation_time}
            if attribute_name not in values:
                from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

                raise UnformattedGetAttTemplateException()
            return values[attribute_name]

        def _profile(self, group: dict[str, Any]) -> str:
            """An instance profile holding the group's ExecutionRole (how the local hosts' metadata service finds
            the role HyperPod gives the group's instances)."""
            iam = iam_backends[self.account_id][get_partition(self.region_name)]
            role_name = str(group["ExecutionRole"]).rsplit("/", 1)[1]
            name = f"{self.cluster_name}-{group['InstanceGroupName']}"[:128]
            profile = iam.create_instance_profile(name, "/sagemaker-hyperpod-stand-in/", [role_name])
            self.profiles.append(name)
            return str(profile.arn)

        def _launch(self) -> None:
            ec2 = ec2_of(self.account_id, self.region_name)
            subnet = next(iter(self.vpc_config.get("Subnets") or []), None)
            groups_ids = self.vpc_config.get("SecurityGroupIds") or []
            names = [ec2.get_security_group_from_id(g).name for g in groups_ids]
            tags = {t["Key"]: t["Value"] for t in self.tags}
            launched: list[tuple[dict[str, Any], list[Any]]] = []
            for group in self.instance_groups:
                profile = self._profile(group)
                instance_tags = {**tags, CLUSTER_TAG: self.cluster_name, GROUP_TAG: group["InstanceGroupName"]}
                reservation = ec2.run_instances(
                    IMAGE_ID, int(group["TargetCount"]), None, names,
                    instance_type=str(group["InstanceType"]).removeprefix("ml."), is_instance_type_default=False,
                    subnet_id=subnet,
                    tags={"instance": instance_tags}) if int(group["TargetCount"]) else None
                instances = list(reservation.instances) if reservation else []
                for instance in instances:
                    ec2.associate_iam_instance_profile(instance_id=instance.id, iam_instance_profile_name=None,
                                                       iam_instance_profile_arn=profile)
                    self.nodes[instance.id] = StandInNode(self, group, instance)
                launched.append((group, instances))
            config = resource_config(self.cluster_name, self.arn, [
                {"name": g["InstanceGroupName"], "instance_type": g["InstanceType"],
                 "instances": [{"id": i.id, "address": i.private_ip} for i in instances]} for g, instances in launched])
            munge_key = base64.b64encode(secrets.token_bytes(1024)).decode()
            slurm_groups = [{"name": g["InstanceGroupName"], **(g.get("SlurmConfig") or {})}
                            for g in self.instance_groups]
            source = AGENT.read_text(encoding="utf-8")
            for group, instances in launched:
                settings = {"resource_config": config, "instance_group": group["InstanceGroupName"],
                            "life_cycle_config": group["LifeCycleConfig"], "slurm_groups": slurm_groups,
                            "munge_key": munge_key, "region": self.region_name}
                user_data = base64.b64encode(agent_user_data(settings, source).encode()).decode()
                for instance in instances:
                    instance.user_data = parse_user_data(user_data)  # what RunInstances keeps of UserData

        def delete(self, account_id: str, region_name: str) -> None:
            ec2 = ec2_of(self.account_id, self.region_name)
            ids = [node.instance.id for node in self.nodes.values()]
            if ids:
                ec2.terminate_instances(ids)
            iam = iam_backends[self.account_id][get_partition(self.region_name)]
            for name in self.profiles:
                profile = iam.instance_profiles.get(name)
                if profile is not None:
                    profile.roles = []
                    iam.delete_instance_profile(name)
            sagemaker_models.sagemaker_backends[self.account_id][self.region_name].clusters.pop(self.cluster_name, None)

        @classmethod
        def create_from_cloudformation_json(cls, resource_name: str, cloudformation_json: Any, account_id: str,
                                            region_name: str, **kwargs: Any) -> StandInCluster:
            properties = cloudformation_json["Properties"]
            return cls(str(properties.get("ClusterName") or resource_name), account_id, region_name, properties)

        @classmethod
        def update_from_cloudformation_json(cls, original_resource: Any, new_resource_name: str,
                                            cloudformation_json: Any, account_id: str, region_name: str) -> Any:
            # Fail closed (the update fails and rolls back, emulator_server fix 4): HyperPod's UpdateCluster adds or
            # removes instances of a group, which the stand-in does not do.
            raise NotImplementedError("the HyperPod stand-in does not update a cluster (UpdateCluster): destroy and "
                                      "deploy again to change its instance groups")

        @classmethod
        def delete_from_cloudformation_json(cls, resource_name: str, cloudformation_json: Any, account_id: str,
                                            region_name: str) -> None:
            backend = sagemaker_models.sagemaker_backends[account_id][region_name]
            name = str(resource_name).rsplit("/", 1)[-1]
            cluster = backend.clusters.get(name)
            if isinstance(cluster, StandInCluster):
                cluster.delete(account_id, region_name)

    parsing.get_model_map.cache_clear()
    parsing.get_name_type_map.cache_clear()
