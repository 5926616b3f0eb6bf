"""Provider `aws`: a real AWS account. EC2 boots the instances (each runs its user data); nothing stands in."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fmcluster.capabilities import PROVIDERS, ProviderCapabilities
from fmcluster.catalog import InstanceType
from fmcluster.containers import ContainerRegistry
from fmcluster.images import Contract
from fmcluster.model import Tenant
from fmcluster.nodes import Node
from fmcluster.providers import (BootResult, NoEndpoint, Out, Route, controller_contract, known_nodes, operator_argv,
                                 operator_key_path, route_to)
from fmcluster.stacks import aws

#: Share of an instance's nominal memory given to Slurm (RealMemory): 95 %, leaving the OS its room (AWS's Slurm
#: cluster tool schedules 95 % of the memory EC2 advertises by default, its SchedulableMemory).
MEMORY_SHARE = 0.95
#: What a Session Manager route needs on the operator's machine: the AWS CLI and the plugin it hands the session to.
SESSION_NEEDS = ("aws", "session-manager-plugin")
SESSION_INSTALL = ("install the Session Manager plugin: https://docs.aws.amazon.com/systems-manager/latest/userguide/"
                   "session-manager-working-with-install-plugin.html")


class AwsProvider:
    boot_timeout_s = 5400.0
    plan_starts_endpoint = True  # the endpoint is AWS itself: nothing to start
    node_image: str | None = None  # nodes boot their launch template's (or the scheduler's) image
    name = "aws"
    capabilities: ProviderCapabilities = PROVIDERS["aws"]

    def shared_cores(self) -> int | None:
        return None  # every instance has its own

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant

    def endpoint(self, start: bool, out: Out) -> str | None:
        if not aws.has_credentials(self.tenant.region):
            raise NoEndpoint("no AWS credentials found (boto3's usual chain: AWS_PROFILE, environment, ~/.aws, "
                             "instance role); nothing was created or changed. `invoke plan` works offline.", False)
        return None

    def boot(self, endpoint: str | None, out: Out) -> BootResult:
        return BootResult(notes=["EC2 boots every instance of the cluster stack; each runs its user data "
                                 "(src/fmcluster/node/boot/node-user-data.sh → node-bootstrap.sh)"])

    def image_parameter(self, path: str) -> str:
        return path

    def queue_resources(self, instance: InstanceType) -> dict[str, Any]:
        resources: dict[str, Any] = {"cpus": instance.vcpus,
                                     "real_memory_mb": int(instance.memory_gib * 1024 * MEMORY_SHARE)}
        if instance.accelerator == "cuda" and instance.accelerators_per_node > 0:
            n = instance.accelerators_per_node
            resources["gres"] = f"gpu:{n}"
            resources["gres_files"] = f"/dev/nvidia[0-{n - 1}]" if n > 1 else "/dev/nvidia0"
        return resources

    def manifest_vars(self) -> dict[str, Any]:
        # The instances reach Grafana's package repository (this machine and the local substrate do not).
        return {"grafana_install": True}

    def container_registry(self, outputs: Mapping[str, str]) -> ContainerRegistry | None:
        host = outputs.get("ContainerRegistry")
        return ContainerRegistry(host, what="the account's ECR, through the instance role") if host else None

    def route(self, node: Node) -> Route:
        from fmcluster.schedulers.registry import scheduler_for
        from fmcluster.stacks.outputs import read_stack_outputs

        def session(target: Node) -> tuple[str, ...]:
            # The Session Manager plugin on the operator's machine, the AWS-StartSSHSession document on the node.
            instance = scheduler_for(self.tenant).session_target(target, read_stack_outputs(self.tenant.org))
            return ("aws", "ssm", "start-session", "--region", self.tenant.region, "--target", instance,
                    "--document-name", "AWS-StartSSHSession", "--parameters", "portNumber=%p")
        return route_to(node, known_nodes(self.tenant.org), operator_key_path(self.tenant.org), self.login_user(), session,
                        session_needs=SESSION_NEEDS, session_install=SESSION_INSTALL)


    def client_argv(self, node: Node) -> list[str]:
        return operator_argv(self.route(node), operator_key_path(self.tenant.org), self.login_user(),
                             self.contract().slurm_bin_dir)

    def contract(self) -> Contract:
        return controller_contract(self.tenant, self.node_image)

    def login_user(self) -> str:
        """The account the EC2 key pair lands in: the default user of the image the controller boots."""
        return self.contract().default_user

    def console_output(self, endpoint: str | None, node: Node) -> str:
        ec2 = aws.client("ec2", self.tenant.region, endpoint, self.capabilities.apis)
        output = ec2.get_console_output(InstanceId=node.instance_id, Latest=True).get("Output", "")
        return "\n".join(str(output).splitlines()[-30:])

    def stand_in_secrets(self, endpoint: str | None, out: Out) -> None:
        """On AWS the tenant makes its own secrets (the deploy checks them: fmcluster.publish.missing_tenant_secrets)."""

    def substrate_notes(self) -> list[str]:
        return []

    def teardown(self, out: Out) -> None:
        return None

    def halt(self, node: str, out: Out) -> None:
        raise RuntimeError("on AWS, stop or reboot the instance with EC2 (aws ec2 reboot-instances); "
                           "fmcluster does not power off instances it did not create directly")
