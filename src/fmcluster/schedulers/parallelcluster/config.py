"""Tenant + network/storage stack outputs → an AWS ParallelCluster 3 cluster config.

The config is built as data and dumped with PyYAML, never templated as text: no tenant value can change
its structure. Every value that comes from the tenant spec is recorded with the tenant key it came from
(`provenance`), so a finding of ParallelCluster's schema names the tenant file, line and key; values that
come from stack outputs are recorded with the output's name (`sources`).

Offline (`invoke plan` before the stacks exist, or outputs the emulator does not produce) the outputs are
unknown: each is rendered as a clearly marked placeholder in the form ParallelCluster's schema accepts
(`subnet-planprivate000000`, `fs-planlustre0000000`, ...), listed in `placeholders` and in the file header.

What the config holds (docs/parallelcluster.md):
- HeadNode: the controller type in the private subnet, SSH only from the VPC (ParallelCluster's default is
  0.0.0.0/0), an optional key pair, encrypted gp3 root volume, IMDSv2;
- LoginNodes: one pool when login.count > 0 (public subnet and ssh_ingress_cidr when set, else private/VPC);
- one SlurmQueue per tenant queue, the default queue first (ParallelCluster's default partition), with one
  ComputeResource of the queue's instance type, MinCount = MaxCount = count (static nodes, as on the other
  schedulers), EFA and GPUDirect RDMA where the catalog says so, the tenant's placement group for EFA
  queues without a reservation, the capacity reservation (a queue in a reservation or Capacity Block: no
  placement group; the reservation is already placed);
- SharedStorage: fmcluster's own FSx for Lustre (FileSystemId) and OpenZFS home (VolumeId);
- SlurmSettings: Slurm accounting (Database) when `parallelcluster.accounting` is set (the tenant's database, or
  the storage stack's when it names none: its outputs, and its client group on the head node); QueueUpdateStrategy
  DRAIN so an update never kills running jobs;
- Tags, the node policies of the storage stack (bootstrap bundle, own report, own secrets: one for the head
  node, one for login and compute nodes) and SSM on every node, and CustomActions/OnNodeConfigured on head, login and compute nodes that run the fmcluster node
  bootstrap (node_files/on-node-configured.sh), so Ansible still lays NCCL, exporters and the
  acceptance jobs over what ParallelCluster installs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fmcluster import baked, nccl
from fmcluster.model import Queue, Tenant
from fmcluster.schedulers.parallelcluster.offline_aws import answers
from fmcluster.schedulers.parallelcluster.rendered import ClusterConfig, ConfigPath
from fmcluster.schedulers.parallelcluster.settings import settings_of
from fmcluster.paths import generated_dir, tenant_dir, write_fresh
from fmcluster.stacks.first_boot import first_boot_script

#: The OnNodeConfigured script: its argument check in the repository, followed by the first-boot script every
#: node runs (src/fmcluster/node/boot/node-user-data.sh); the deploy uploads the two as one object inside the bootstrap prefix.
CUSTOM_ACTION_SOURCE = Path(__file__).resolve().parent / "node_files" / "on-node-configured.sh"
CUSTOM_ACTION_KEY = "fmcluster/bootstrap/pcluster-on-node-configured.sh"
CONFIG_FILE = "cluster-config.yaml"
SSM_POLICY = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
HEAD_ROOT_GIB = 200


def custom_action_script() -> bytes:
    """What ParallelCluster downloads and runs as OnNodeConfigured: the argument check, then the same first
    boot as every other fmcluster node."""
    return CUSTOM_ACTION_SOURCE.read_bytes() + b"\n" + first_boot_script().encode()


def on_node_configured_settings(*, bucket: Any, region: Any, org: str, role: str,
                                queue: str | None) -> list[tuple[str, Any]]:
    """OnNodeConfigured's Args as (name, value): the node boot's FMCLUSTER_* settings. bucket and region are
    strings, or CloudFormation references in the local stand-in's user data."""
    settings = [("FMCLUSTER_BUCKET", bucket), ("FMCLUSTER_REGION", region), ("FMCLUSTER_ORG", org),
                ("FMCLUSTER_ROLE", role)]
    return settings + ([("FMCLUSTER_QUEUE", queue)] if queue is not None else [])


def operator_key_name(tenant: Tenant) -> str:
    """The key pair on the head and login nodes: the tenant's own, else the operator key the deploy imports
    (fmcluster.access), through which the deploy's monitoring and acceptance checks reach the nodes."""
    settings = settings_of(tenant)
    return settings.ssh_key_name if settings and settings.ssh_key_name else f"fmcluster-{tenant.org}"


#: How long ParallelCluster gives a compute node's whole bootstrap, OnNodeConfigured included
#: (DevSettings/Timeouts/ComputeNodeBootstrapTimeout; its user data runs the bootstrap under `timeout`, and the cookbook
#: makes it clustermgtd's node_replacement_timeout and Slurm's ResumeTimeout): the hour slurm-ec2's CreationPolicy
#: gives a first boot, instead of ParallelCluster's default (2,100 s in 3.16, pcluster/constants.py
#: NODE_BOOTSTRAP_TIMEOUT; https://docs.aws.amazon.com/parallelcluster/latest/ug/DevSettings-v3.html).
BOOTSTRAP_TIMEOUT_S = 3600
#: The head node's own share of its bootstrap: its cookbook's init and config, then its OnNodeConfigured (the
#: controller's first boot, Prometheus and Grafana included), given the same hour as a compute node's.
HEAD_NODE_OWN_S = 3600
#: HeadNodeBootstrapTimeout (the head node's CloudFormation wait condition). The head node signals only after its
#: cookbook's finalize, which runs after OnNodeConfigured, first (re)starts supervisord and with it clustermgtd (so the
#: static compute nodes are launched only then), and waits until every static node is up
#: (aws-parallelcluster-cookbook: cookbooks/aws-parallelcluster-entrypoints/recipes/finalize.rb,
#: aws-parallelcluster-platform/recipes/finalize.rb, aws-parallelcluster-slurm/recipes/finalize/finalize_head_node.rb,
#: wait_static_fleet_running in aws-parallelcluster-slurm/libraries/helpers.rb; the order in pcluster's
#: templates/cluster_stack.py: shellRunPostInstall before chefFinalize). So the head node's window holds its own
#: share and then a compute node's whole bootstrap: with both at one hour, a GPU node still inside its own hour
#: failed the cluster once the head node's hour, begun before that node was launched, ran out.
HEAD_NODE_BOOTSTRAP_TIMEOUT_S = HEAD_NODE_OWN_S + BOOTSTRAP_TIMEOUT_S

def cluster_name(tenant: Tenant) -> str:
    """ParallelCluster's cluster (and its CloudFormation stack): fmc-<org>-cluster, beside our other stacks.
    At most 36 characters (org ≤ 24), under ParallelCluster's 40 with Slurm accounting."""
    return f"{tenant.stack_prefix}-cluster"


def compute_resource_name(queue: Queue) -> str:
    """p5.48xlarge → p5-48xlarge (ParallelCluster names: lower-case letters, digits, hyphens)."""
    return queue.instance.name.replace(".", "-")


def _padded(prefix: str, word: str, length: int, fill: str = "0") -> str:
    return prefix + (word + fill * length)[:length]


def placeholder_outputs(tenant: Tenant) -> dict[str, str]:
    """Stack output → the marked placeholder rendered while it is unknown (forms ParallelCluster accepts)."""
    return {
        "PrivateSubnetId": _padded("subnet-", "planprivate", 17),
        "PublicSubnetId": _padded("subnet-", "planpublic", 17),
        "EfaSecurityGroupId": _padded("sg-", "planefa", 17),
        "NodeSecurityGroupId": _padded("sg-", "plannode", 17),
        "PlacementGroupName": f"{tenant.stack_prefix}-network-PLACEHOLDER",
        "DataBucketName": f"{tenant.stack_prefix}-storage-databucket-placeholder",
        "LustreFileSystemId": _padded("fs-", "planlustre", 17),
        "HomeVolumeId": _padded("fsvol-", "", 17),  # hex only: zeros
        "NodeBootstrapPolicyArn": f"arn:aws:iam::000000000000:policy/{tenant.stack_prefix}-storage-NodeBootstrapPolicy-PLACEHOLDER",
        "HeadNodeBootstrapPolicyArn":
            f"arn:aws:iam::000000000000:policy/{tenant.stack_prefix}-storage-HeadNodeBootstrapPolicy-PLACEHOLDER",
        "AccountingDatabaseUri": f"{tenant.stack_prefix}-accounting-placeholder.rds.amazonaws.com:3306",
        "AccountingPasswordSecretArn": f"arn:aws:secretsmanager:{tenant.region}:000000000000:secret:"
                                       f"{tenant.stack_prefix}-accounting-PLACEHOLDER",
        "AccountingClientSecurityGroupId": _padded("sg-", "planaccounting", 17),
    }


class _Render:
    def __init__(self, tenant: Tenant, outputs: dict[str, str], baked_amis: Mapping[str, str] | None = None) -> None:
        self.tenant = tenant
        self.baked_amis = dict(baked_amis or {})
        self.outputs = {k: v for k, v in outputs.items() if v}  # an empty output (emulator) is no value
        self.stand_ins = placeholder_outputs(tenant)
        self.used: dict[str, str] = {}
        self.cfg = ClusterConfig(tenant.org, cluster_name(tenant), tenant.region, tenant.spec_path, {})

    def output(self, name: str, at: ConfigPath) -> str:
        self.cfg.sources[at] = name
        if name in self.outputs:
            return self.outputs[name]
        self.used[name] = self.stand_ins[name]
        return self.stand_ins[name]

    def key(self, at: ConfigPath, *tenant_key: str | int) -> None:
        self.cfg.provenance[at] = ("tenant", *tenant_key)

    def custom_actions(self, at: ConfigPath, role: str, queue: str | None = None) -> dict[str, Any]:
        bucket = self.output("DataBucketName", (*at, "OnNodeConfigured"))
        args = [f"{name}={value}" for name, value in on_node_configured_settings(
            bucket=bucket, region=self.tenant.region, org=self.tenant.org, role=role, queue=queue)]
        return {"OnNodeConfigured": {"Script": f"s3://{bucket}/{CUSTOM_ACTION_KEY}", "Args": args}}

    def image(self, at: ConfigPath, accelerator: str) -> dict[str, Any]:
        """`Image: {CustomAmi}` of a node group whose kind has a baked image (`baked_amis`), else nothing: the group
        boots ParallelCluster's official AMI of `Image.Os`. Per group, never the cluster-wide Image.CustomAmi, which
        every group without its own would inherit, a CPU image on GPU nodes included."""
        ami = self.baked_amis.get(baked.image_kind(accelerator))
        if ami is None:
            return {}
        self.key((*at, "Image", "CustomAmi"), "baked_images")
        return {"Image": {"CustomAmi": ami}}

    def iam(self, at: ConfigPath, head: bool = False) -> dict[str, Any]:
        # The head node is fmcluster's controller (its secrets, Prometheus's discovery); the others get less.
        name = "HeadNodeBootstrapPolicyArn" if head else "NodeBootstrapPolicyArn"
        policy = self.output(name, (*at, "AdditionalIamPolicies", 0))
        return {"AdditionalIamPolicies": [{"Policy": policy}, {"Policy": SSM_POLICY}]}

    def render(self) -> ClusterConfig:
        t, s = self.tenant, settings_of(self.tenant)
        if s is None:
            raise ValueError(f"tenant '{t.org}' has scheduler {t.scheduler}, not parallelcluster")
        data: dict[str, Any] = {"Region": t.region}
        self.key(("Region",), "region")
        self.key(("ClusterName",), "org")  # the cluster name (not a config key) is fmc-<org>-cluster
        data["Image"] = {"Os": s.os}
        self.key(("Image",), "parallelcluster", "os")
        data["Imds"] = {"ImdsSupport": "v2.0"}
        data["HeadNode"] = self.head_node()
        if t.login is not None and t.login_count > 0:
            data["LoginNodes"] = {"Pools": [self.login_pool()]}
        data["Scheduling"] = self.scheduling()
        data["SharedStorage"] = self.shared_storage()
        data["Tags"] = [{"Key": k, "Value": v} for k, v in t.tags.items()]
        # OnNodeConfigured runs the whole first boot (toolchain, converge, on GPU nodes NCCL and the nccl-tests build):
        # ParallelCluster's default would fail GPU nodes that fit slurm-ec2's signal window; and the head node waits
        # for the static compute nodes inside its own window (HEAD_NODE_BOOTSTRAP_TIMEOUT_S).
        data["DevSettings"] = {"Timeouts": {"HeadNodeBootstrapTimeout": HEAD_NODE_BOOTSTRAP_TIMEOUT_S,
                                            "ComputeNodeBootstrapTimeout": BOOTSTRAP_TIMEOUT_S}}
        self.key(("Tags", 0), "org")
        self.key(("Tags", 1), "programme")
        self.cfg.data = data
        self.cfg.placeholders = dict(sorted(self.used.items()))
        self.cfg.offline_answers = answers(t, self.cfg)
        return self.cfg

    def head_node(self) -> dict[str, Any]:
        t, s = self.tenant, settings_of(self.tenant)
        assert s is not None
        h: ConfigPath = ("HeadNode",)
        self.key(h, "controller")
        self.key((*h, "InstanceType"), "controller", "instance_type")
        ssh: dict[str, Any] = {"AllowedIps": t.network.vpc_cidr, "KeyName": operator_key_name(t)}
        self.key((*h, "Ssh", "AllowedIps"), "network", "vpc_cidr")
        self.key((*h, "Ssh", "KeyName"), *(("parallelcluster", "ssh_key_name") if s.ssh_key_name else ("org",)))
        groups = [self.output("NodeSecurityGroupId", (*h, "Networking", "AdditionalSecurityGroups", 0))]
        if s.accounting is not None and s.accounting.created:
            # The one node that reaches the accounting database the storage stack created (slurmdbd runs here).
            groups.append(self.output("AccountingClientSecurityGroupId", (*h, "Networking", "AdditionalSecurityGroups", 1)))
        return {
            "InstanceType": t.controller.name,
            "Networking": {
                "SubnetId": self.output("PrivateSubnetId", (*h, "Networking", "SubnetId")),
                "AdditionalSecurityGroups": groups,
            },
            "Ssh": ssh,
            "LocalStorage": {"RootVolume": {"Size": HEAD_ROOT_GIB, "Encrypted": True, "VolumeType": "gp3"}},
            "Imds": {"Secured": True},
            **self.image(h, t.controller.accelerator),
            "Iam": self.iam((*h, "Iam"), head=True),
            "CustomActions": self.custom_actions((*h, "CustomActions"), "controller"),
        }

    def login_pool(self) -> dict[str, Any]:
        t = self.tenant
        assert t.login is not None
        p: ConfigPath = ("LoginNodes", "Pools", 0)
        self.key(p, "login")
        self.key((*p, "InstanceType"), "login", "instance_type")
        self.key((*p, "Count"), "login", "count")
        public = t.network.ssh_ingress_cidr is not None
        subnet = self.output("PublicSubnetId" if public else "PrivateSubnetId", (*p, "Networking", "SubnetIds", 0))
        self.key((*p, "Ssh", "AllowedIps"), "network", "ssh_ingress_cidr" if public else "vpc_cidr")
        return {
            "Name": "login",
            "InstanceType": t.login.name,
            "Count": t.login_count,
            "Networking": {
                "SubnetIds": [subnet],
                "AdditionalSecurityGroups": [
                    self.output("NodeSecurityGroupId", (*p, "Networking", "AdditionalSecurityGroups", 0))],
            },
            # No KeyName: since ParallelCluster 3.15 login nodes take the head node's key (its schema refuses one).
            "Ssh": {"AllowedIps": t.network.ssh_ingress_cidr or t.network.vpc_cidr},
            **self.image(p, t.login.accelerator),
            "Iam": self.iam((*p, "Iam")),
            "CustomActions": self.custom_actions((*p, "CustomActions"), "login"),
        }

    def scheduling(self) -> dict[str, Any]:
        t, s = self.tenant, settings_of(self.tenant)
        assert s is not None
        settings: dict[str, Any] = {"QueueUpdateStrategy": "DRAIN"}
        if s.accounting is not None:
            a, at = s.accounting, ("Scheduling", "SlurmSettings", "Database")
            self.key(at, "parallelcluster", "accounting")
            if a.created:  # the storage stack's database and generated secret
                uri = self.output("AccountingDatabaseUri", (*at, "Uri"))
                secret = self.output("AccountingPasswordSecretArn", (*at, "PasswordSecretArn"))
            else:
                assert a.uri is not None and a.password_secret_arn is not None
                uri, secret = a.uri, a.password_secret_arn
                for key, name in (("Uri", "uri"), ("PasswordSecretArn", "password_secret_arn")):
                    self.key((*at, key), "parallelcluster", "accounting", name)
            database = {"Uri": uri, "UserName": a.user_name, "PasswordSecretArn": secret}
            if a.database_name:
                database["DatabaseName"] = a.database_name
            settings["Database"] = database
            for key, name in (("UserName", "user_name"), ("DatabaseName", "database_name")):
                self.key((*at, key), "parallelcluster", "accounting", name)
        # The NCCL environment fmcluster computes reaches every task through Slurm's TaskProlog, which the nccl role
        # writes on every compute node of a cluster with an accelerator or EFA queue (during OnNodeConfigured, before
        # the cookbook's finalize starts slurmd). ParallelCluster's slurm.conf names no TaskProlog, so it is added
        # as a custom setting (not in ParallelCluster's deny-list, validators/slurm_settings_validator.py); without
        # it the environment reached login shells on the nodes, never a job.
        prolog = nccl.cluster_vars([q.instance.name for q in t.queues]).get("slurm_task_prolog")
        if prolog:
            settings["CustomSlurmSettings"] = [{"TaskProlog": prolog}]
            self.key(("Scheduling", "SlurmSettings", "CustomSlurmSettings"), "queues")
        # ParallelCluster's first queue is Slurm's default partition.
        default = t.default_queue
        ordered = [default] + [q for q in t.queues if q is not default]
        queues = []
        for i, queue in enumerate(ordered):
            queues.append(self.queue(i, queue, t.queues.index(queue)))
        return {"Scheduler": "slurm", "SlurmSettings": settings, "SlurmQueues": queues}

    def queue(self, i: int, queue: Queue, ti: int) -> dict[str, Any]:
        q: ConfigPath = ("Scheduling", "SlurmQueues", i)
        cr: ConfigPath = (*q, "ComputeResources", 0)
        self.key(q, "queues", ti)
        self.key((*q, "Name"), "queues", ti, "name")
        self.key(cr, "queues", ti, "instance_type")
        for name in ("MinCount", "MaxCount"):
            self.key((*cr, name), "queues", ti, "count")
        capacity_block = getattr(queue, "capacity_reservation_type", "default") == "capacity-block"
        if capacity_block or queue.capacity_reservation_id:
            self.key((*q, "CapacityType"), "queues", ti, "capacity_reservation_type")
            self.key((*cr, "CapacityReservationTarget"), "queues", ti, "capacity_reservation_id")
        instance = queue.instance
        groups: list[str] = []
        if instance.has_efa:
            groups.append(self.output("EfaSecurityGroupId", (*q, "Networking", "AdditionalSecurityGroups", len(groups))))
        groups.append(self.output("NodeSecurityGroupId", (*q, "Networking", "AdditionalSecurityGroups", len(groups))))
        networking: dict[str, Any] = {
            "SubnetIds": [self.output("PrivateSubnetId", (*q, "Networking", "SubnetIds", 0))],
            "AdditionalSecurityGroups": groups,
        }
        # A queue that launches into a reservation stays out of the placement group, as on slurm-ec2: an existing
        # reservation cannot be moved into a new group (ParallelCluster's PlacementGroupCapacityReservationValidator
        # warns of insufficient-capacity errors), and a Capacity Block places its instances itself.
        if instance.has_efa and not capacity_block and not queue.capacity_reservation_id:
            pg = self.output("PlacementGroupName", (*q, "Networking", "PlacementGroup", "Name"))
            networking["PlacementGroup"] = {"Enabled": True, "Name": pg}
        elif instance.has_efa and not capacity_block:
            # ParallelCluster wants an EFA queue's choice explicit (EfaPlacementGroupValidator), and then warns
            # that this is "expected when using a capacity reservation with its own placement group".
            networking["PlacementGroup"] = {"Enabled": False}
            self.key((*q, "Networking", "PlacementGroup"), "queues", ti, "capacity_reservation_id")
        resource: dict[str, Any] = {
            "Name": compute_resource_name(queue),
            "InstanceType": instance.name,
            "MinCount": queue.count,
            "MaxCount": queue.count,
        }
        if instance.has_efa:
            # GdrSupport: GPUDirect RDMA over EFA, NVIDIA GPU types only (the Neuron stack does its own).
            resource["Efa"] = {"Enabled": True, "GdrSupport": instance.accelerator == "cuda"}
            self.key((*cr, "Efa"), "queues", ti, "instance_type")
        if queue.capacity_reservation_id:
            resource["CapacityReservationTarget"] = {"CapacityReservationId": queue.capacity_reservation_id}
        out: dict[str, Any] = {"Name": queue.name, "CapacityType": "CAPACITY_BLOCK" if capacity_block else "ONDEMAND"}
        out["Networking"] = networking
        out["ComputeResources"] = [resource]
        out["ComputeSettings"] = {"LocalStorage": {"RootVolume": {
            "Size": 500 if instance.accelerator != "none" else 100, "Encrypted": True, "VolumeType": "gp3"}}}
        if instance.accelerator == "cuda":
            out["HealthChecks"] = {"Gpu": {"Enabled": True}}  # ParallelCluster's DCGM check before each job
        out.update(self.image(q, instance.accelerator))
        out["Iam"] = self.iam((*q, "Iam"))
        out["CustomActions"] = self.custom_actions((*q, "CustomActions"), "compute", queue.name)
        return out

    def shared_storage(self) -> list[dict[str, Any]]:
        t = self.tenant
        storage = [{
            "Name": "lustre",
            "StorageType": "FsxLustre",
            "MountDir": t.storage.lustre.mount_point,
            "FsxLustreSettings": {"FileSystemId": self.output("LustreFileSystemId", ("SharedStorage", 0, "FsxLustreSettings"))},
        }]
        self.key(("SharedStorage", 0), "storage", "lustre")
        self.key(("SharedStorage", 0, "MountDir"), "storage", "lustre", "mount_point")
        if t.storage.openzfs is not None:
            storage.append({
                "Name": "home",
                "StorageType": "FsxOpenZfs",
                "MountDir": t.storage.openzfs.mount_point,
                "FsxOpenZfsSettings": {"VolumeId": self.output("HomeVolumeId", ("SharedStorage", 1, "FsxOpenZfsSettings"))},
            })
            self.key(("SharedStorage", 1), "storage", "openzfs")
            self.key(("SharedStorage", 1, "MountDir"), "storage", "openzfs", "mount_point")
        return storage


def render_cluster_config(tenant: Tenant, outputs: dict[str, str] | None = None,
                          baked_amis: Mapping[str, str] | None = None) -> ClusterConfig:
    """The tenant's ParallelCluster 3 config. `outputs`: the network and storage stacks' outputs (merged);
    each one missing is rendered as a marked placeholder and listed in `placeholders`. `baked_amis`: image kind →
    the baked AMI its node groups boot (`CustomAmi`; fmcluster.schedulers.parallelcluster.scheduler.baked_amis)."""
    return _Render(tenant, outputs or {}, baked_amis).render()


class _IndentedDumper(yaml.SafeDumper):
    """Block sequences indented under their key (how ParallelCluster's docs write configs; yamllint's default)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def to_yaml(cfg: ClusterConfig) -> str:
    """The config file: a header saying what generated it and which values are placeholders, then the data."""
    lines = [
        f"# generated by fmcluster (fmcluster.schedulers.parallelcluster.config) from inventories/{cfg.org}/group_vars/all/tenant.yml",
        "# and the network/storage stack outputs; edits will be reverted.",
        f"# AWS ParallelCluster 3 cluster config of cluster {cfg.cluster_name} (pcluster create-cluster -n {cfg.cluster_name}).",
    ]
    if cfg.placeholders:
        lines.append("# PLACEHOLDERS: these stack outputs are not known yet; the values below stand in for them")
        lines.append("# (same form, so ParallelCluster's schema checks the rest). `invoke deploy` renders the real ones.")
        lines += [f"#   {name}: {value}" for name, value in cfg.placeholders.items()]
    body = yaml.dump(cfg.data, Dumper=_IndentedDumper, sort_keys=False, default_flow_style=False, width=160,
                     allow_unicode=False)  # non-ASCII escaped: a raw NEL or LS would not read back
    return "\n".join(lines) + "\n" + body


def write_cluster_config(cfg: ClusterConfig, root: Path | None = None) -> Path:
    """inventories/<org>/generated/cluster-config.yaml (rewritten only when it changes)."""
    path = generated_dir(cfg.org, root) / CONFIG_FILE
    write_fresh(path, to_yaml(cfg), tenant_dir(cfg.org, root), if_changed=True)
    return path


