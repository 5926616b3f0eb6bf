"""What ParallelCluster adds to fmcluster's storage stack (fmcluster.stacks.templates.storage), handed over by
`ParallelCluster.storage_parts`: the managed policies its nodes get through the cluster config's
Iam/AdditionalIamPolicies (there is no cluster stack of ours for them to live in), the OpenZFS root volume id
ParallelCluster mounts the shared home by, and the Slurm accounting database fmcluster creates when the tenant asks
for accounting without naming a database."""

from __future__ import annotations

import ipaddress
from typing import Any

from fmcluster.model import Tenant
from fmcluster.schedulers.parallelcluster.settings import settings_of
from fmcluster.stacks.cfn import Fn, GetAtt, Ref, Sub
from fmcluster.stacks.templates import StorageParts
from fmcluster.stacks.templates.common import (
    BOOTSTRAP_PREFIX, MANIFEST_PREFIX, alert_publish_statements, container_pull_statements, output, own_report_keys,
    remote_write_statements, resource_tags, secret_arns, secrets_of, trusted_index_statement,
)
from fmcluster.stacks.templates.storage import RETAIN


def storage_parts(tenant: Tenant) -> StorageParts:
    """The node policies (and the shared home's volume id) always; the accounting database and what it needs when
    the tenant's `parallelcluster.accounting` asks fmcluster to create it."""
    resources: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    for name, roles in PARALLELCLUSTER_POLICIES.items():
        resources[name] = parallelcluster_node_policy(tenant, roles)
        outputs[f"{name}Arn"] = output(
            f"Managed policy the ParallelCluster {'head node' if 'controller' in roles else 'login and compute nodes'}"
            " get (Iam/AdditionalIamPolicies).", Ref(name))
    if tenant.storage.openzfs is not None:
        outputs["HomeVolumeId"] = output(
            "Root volume of the OpenZFS shared home; ParallelCluster mounts OpenZFS by volume id.",
            GetAtt("OpenZfsFileSystem", "RootVolumeId"))
    settings = settings_of(tenant)
    if settings is None or settings.accounting is None or not settings.accounting.created:
        return StorageParts(resources, outputs)
    db_resources, db_outputs = accounting_database(tenant, settings.accounting.user_name)
    return StorageParts(
        {**resources, **db_resources}, {**outputs, **db_outputs},
        conditions={"ClusterZoneListedFirst": Fn("Equals", [
            Fn("Select", [0, Fn("GetAZs", "")]), tenant.availability_zone])},
        lint_exceptions=(("W3010", "the accounting database sits in the cluster's zone, the tenant's explicit choice"),))


#: What a ParallelCluster node's fmcluster bootstrap reads from the bucket.
PARALLELCLUSTER_NODE_READ = (BOOTSTRAP_PREFIX, MANIFEST_PREFIX)
#: The managed policies of the ParallelCluster nodes (logical id → the fmcluster roles it serves): the head node
#: is fmcluster's controller; login and compute nodes, where users run code, get less.
PARALLELCLUSTER_POLICIES = {"HeadNodeBootstrapPolicy": ("controller",), "NodeBootstrapPolicy": ("login", "compute")}


def parallelcluster_node_policy(tenant: Tenant, roles: tuple[str, ...]) -> dict[str, Any]:
    """AWS ParallelCluster nodes get this through Iam/AdditionalIamPolicies of the cluster config fmcluster
    renders: the fmcluster node bootstrap's needs from the bucket, its own report, the secrets the node agent
    reads on nodes of these roles and finding the cluster's instances; nothing else (ParallelCluster adds what
    its own agents need). The stack of our own that ParallelCluster's cluster sits beside holds it, since there
    is no cluster stack of ours."""
    bucket = Sub("${DataBucket.Arn}")
    head = "controller" in roles
    # The node agent finds itself and the cluster's nodes by their tags; Prometheus's EC2 discovery on the head
    # node lists them too (Describe* cannot be resource-scoped).
    describe = ["ec2:DescribeAvailabilityZones", "ec2:DescribeInstances", "ec2:DescribeTags"] if head \
        else "ec2:DescribeInstances"
    return {"Type": "AWS::IAM::ManagedPolicy", "Properties": {
        "Description": f"{tenant.stack_prefix} ParallelCluster {'head node' if head else 'login and compute nodes'}: "
                       "fmcluster bootstrap (read), its own report (write), its own secrets",
        "PolicyDocument": {"Version": "2012-10-17", "Statement": [
            {"Sid": "ListBootstrapPrefixes", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": GetAtt("DataBucket", "Arn"),
             "Condition": {"StringLike": {"s3:prefix": [f"{p}*" for p in PARALLELCLUSTER_NODE_READ]}}},
            {"Sid": "ReadBootstrap", "Effect": "Allow", "Action": "s3:GetObject",
             "Resource": [Sub(f"${{DataBucket.Arn}}/{p}*") for p in PARALLELCLUSTER_NODE_READ]},
            {"Sid": "WriteReports", "Effect": "Allow", "Action": "s3:PutObject", "Resource": own_report_keys(bucket)},
            {"Sid": "ReadOwnSecrets", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
             "Resource": secret_arns(tenant.org, secrets_of(tenant, roles))},
            trusted_index_statement(tenant.org),
            {"Sid": "FindClusterNodes", "Effect": "Allow", "Action": describe, "Resource": "*"},
            # Users' images from the tenant's ECR (docs/containers.md).
            *container_pull_statements(tenant),
            # Prometheus on the head node: remote write to the tenant's Amazon Managed Prometheus, if any; its
            # Alertmanager: the tenant's SNS receivers, if any.
            *(remote_write_statements(tenant) if head else []),
            *(alert_publish_statements(tenant) if head else []),
        ]},
    }}


#: The database fmcluster creates for Slurm accounting when the tenant names none (ParallelCluster: MySQL 8 or a
#: compatible engine). Small: slurmdbd's load is one row per job step.
ACCOUNTING_ENGINE, ACCOUNTING_CLASS, ACCOUNTING_GIB, ACCOUNTING_PORT = "mysql", "db.t4g.medium", 20, 3306
ACCOUNTING_BACKUP_DAYS = 7
#: Data outlives the stack: deleting or replacing the database leaves a final snapshot.
SNAPSHOT = {"DeletionPolicy": "Snapshot", "UpdateReplacePolicy": "Snapshot"}


def database_subnet_cidr(vpc_cidr: str) -> str:
    """The second subnet RDS requires (a DB subnet group spans two zones): the /24 after the public subnet."""
    vpc = ipaddress.ip_network(vpc_cidr)
    lower, _ = vpc.subnets(prefixlen_diff=1)
    candidates = lower.subnets(new_prefix=max(24, lower.prefixlen + 2))
    next(candidates)  # the public subnet's
    return str(next(candidates))


def accounting_database(tenant: Tenant, user: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Slurm accounting database for a ParallelCluster tenant that asks for accounting without naming a database:
    RDS MySQL in the private subnet (and a second zone's subnet, which a DB subnet group requires), reachable on
    3306 only from the accounting client group the head node alone carries, its master password generated by
    Secrets Manager (the secret string is the password, as ParallelCluster's PasswordSecretArn expects), never
    written anywhere."""
    az = tenant.availability_zone
    resources: dict[str, Any] = {
        # The head node's only (HeadNode/Networking/AdditionalSecurityGroups): slurmdbd's way to the database.
        "AccountingClientSecurityGroup": {"Type": "AWS::EC2::SecurityGroup", "Properties": {
            "GroupDescription": f"{tenant.stack_prefix} Slurm accounting clients (the head node only)",
            "VpcId": Ref("VpcId"),
            "SecurityGroupEgress": [{"CidrIp": Ref("VpcCidr"), "IpProtocol": "tcp", "FromPort": ACCOUNTING_PORT,
                                     "ToPort": ACCOUNTING_PORT, "Description": "MySQL to the accounting database"}],
            "Tags": resource_tags(tenant, "accounting-client")}},
        "AccountingDatabaseSecurityGroup": {"Type": "AWS::EC2::SecurityGroup", "Properties": {
            "GroupDescription": f"{tenant.stack_prefix} Slurm accounting database: MySQL from the head node only",
            "VpcId": Ref("VpcId"),
            "SecurityGroupIngress": [{"SourceSecurityGroupId": Ref("AccountingClientSecurityGroup"), "IpProtocol": "tcp",
                                      "FromPort": ACCOUNTING_PORT, "ToPort": ACCOUNTING_PORT,
                                      "Description": "slurmdbd on the head node"}],
            "SecurityGroupEgress": [{"CidrIp": Ref("VpcCidr"), "IpProtocol": "tcp", "FromPort": ACCOUNTING_PORT,
                                     "ToPort": ACCOUNTING_PORT, "Description": "Replies inside the VPC"}],
            "Tags": resource_tags(tenant, "accounting-db")}},
        "AccountingSecondSubnet": {"Type": "AWS::EC2::Subnet", "Properties": {
            "VpcId": Ref("VpcId"), "CidrBlock": database_subnet_cidr(tenant.network.vpc_cidr),
            # Any other zone of the region: the first listed one unless that is the cluster's.
            "AvailabilityZone": Fn("If", ["ClusterZoneListedFirst", Fn("Select", [1, Fn("GetAZs", "")]),
                                          Fn("Select", [0, Fn("GetAZs", "")])]),
            "Tags": resource_tags(tenant, "accounting-db")}},
        "AccountingDatabaseSubnetGroup": {"Type": "AWS::RDS::DBSubnetGroup", "Properties": {
            "DBSubnetGroupDescription": f"{tenant.stack_prefix} Slurm accounting database ({az} and one more zone)",
            "SubnetIds": [Ref("PrivateSubnetId"), Ref("AccountingSecondSubnet")],
            "Tags": resource_tags(tenant, "accounting-db")}},
        # Retained with the database's final snapshot, whose master password it holds.
        "AccountingDatabaseSecret": {"Type": "AWS::SecretsManager::Secret", **RETAIN, "Properties": {
            "Description": f"{tenant.stack_prefix} Slurm accounting database password (generated; ParallelCluster's "
                           "head node reads it)",
            "GenerateSecretString": {"PasswordLength": 32, "ExcludePunctuation": True},
            "Tags": resource_tags(tenant, "accounting-db")}},
        "AccountingDatabase": {"Type": "AWS::RDS::DBInstance", **SNAPSHOT, "Properties": {
            "Engine": ACCOUNTING_ENGINE, "DBInstanceClass": ACCOUNTING_CLASS,
            "AllocatedStorage": str(ACCOUNTING_GIB), "StorageType": "gp3", "StorageEncrypted": True,
            "AvailabilityZone": az, "MultiAZ": False, "PubliclyAccessible": False,
            "DBSubnetGroupName": Ref("AccountingDatabaseSubnetGroup"),
            "VPCSecurityGroups": [Ref("AccountingDatabaseSecurityGroup")], "Port": str(ACCOUNTING_PORT),
            "MasterUsername": user,
            "MasterUserPassword": Sub("{{resolve:secretsmanager:${AccountingDatabaseSecret}}}"),
            "BackupRetentionPeriod": ACCOUNTING_BACKUP_DAYS, "CopyTagsToSnapshot": True, "DeletionProtection": True,
            "AutoMinorVersionUpgrade": True, "Tags": resource_tags(tenant, "accounting-db")}},
    }
    outputs = {
        # The address alone: the database listens on ACCOUNTING_PORT, MySQL's and ParallelCluster's default. The long
        # form, because the attribute name has a dot (the emulator splits `!GetAtt A.B.C` at every dot).
        "AccountingDatabaseUri": output("Host of the Slurm accounting database (SlurmSettings/Database/Uri).",
                                        {"Fn::GetAtt": ["AccountingDatabase", "Endpoint.Address"]}),
        "AccountingPasswordSecretArn": output("Secret holding its generated password (Database/PasswordSecretArn).",
                                              Ref("AccountingDatabaseSecret")),
        "AccountingClientSecurityGroupId": output("Security group the head node carries to reach the database.",
                                                  Ref("AccountingClientSecurityGroup")),
    }
    return resources, outputs
