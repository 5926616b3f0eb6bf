"""Network stack: VPC, a public and a private subnet in the tenant's zone, internet and NAT gateways,
an S3 gateway endpoint, the EFA / node / login security groups and the cluster placement group."""

from __future__ import annotations

import ipaddress
from typing import Any

from fmcluster.model import Tenant
from fmcluster.stacks.cfn import GetAtt, Ref, Sub
from fmcluster.stacks.templates.common import (
    TEMPLATE_VERSION, description, metadata, output, resource_tags, spec_file,
)

# AWS's (and the CDK's) rule that replaces a group's default allow-all egress with one matching nothing.
DISALLOW_ALL_EGRESS = {"CidrIp": "255.255.255.255/32", "IpProtocol": "icmp", "FromPort": 252, "ToPort": 86,
                       "Description": "Disallow all traffic (removes the default allow-all egress)"}


def subnets(vpc_cidr: str) -> tuple[str, str]:
    """Public: the first /24 (or the first quarter of a small VPC); private: the upper half."""
    vpc = ipaddress.ip_network(vpc_cidr)
    lower, upper = vpc.subnets(prefixlen_diff=1)
    public = next(lower.subnets(new_prefix=max(24, lower.prefixlen + 1)))
    return str(public), str(upper)


def build(tenant: Tenant) -> dict[str, Any]:
    public_cidr, private_cidr = subnets(tenant.network.vpc_cidr)
    az, prefix = tenant.availability_zone, tenant.stack_prefix
    ssh = tenant.network.ssh_ingress_cidr

    def tagged(name: str) -> list[dict[str, Any]]:
        return resource_tags(tenant, name)

    resources: dict[str, Any] = {
        "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {
            "CidrBlock": tenant.network.vpc_cidr, "EnableDnsSupport": True, "EnableDnsHostnames": True,
            "Tags": tagged("vpc")}},
        "InternetGateway": {"Type": "AWS::EC2::InternetGateway", "Properties": {"Tags": tagged("igw")}},
        "InternetGatewayAttachment": {"Type": "AWS::EC2::VPCGatewayAttachment", "Properties": {
            "VpcId": Ref("Vpc"), "InternetGatewayId": Ref("InternetGateway")}},
        # Its default route is the internet gateway, so an instance here reaches anything (AWS APIs, the NAT-less
        # way out) only with a public address: a node whose launch template asks for none (a scheduler's service may
        # launch its login nodes so) gets none unless the subnet maps one, and would boot unable to fetch its
        # bootstrap. Admission stays with the security groups (SSH from network.ssh_ingress_cidr only).
        "PublicSubnet": {"Type": "AWS::EC2::Subnet", "Properties": {
            "VpcId": Ref("Vpc"), "AvailabilityZone": az, "CidrBlock": public_cidr, "MapPublicIpOnLaunch": True,
            "Tags": tagged("public")}},
        "PrivateSubnet": {"Type": "AWS::EC2::Subnet", "Properties": {
            "VpcId": Ref("Vpc"), "AvailabilityZone": az, "CidrBlock": private_cidr, "Tags": tagged("private")}},
        "PublicRouteTable": {"Type": "AWS::EC2::RouteTable", "Properties": {
            "VpcId": Ref("Vpc"), "Tags": tagged("public")}},
        "PublicDefaultRoute": {"Type": "AWS::EC2::Route", "DependsOn": "InternetGatewayAttachment", "Properties": {
            "RouteTableId": Ref("PublicRouteTable"), "DestinationCidrBlock": "0.0.0.0/0",
            "GatewayId": Ref("InternetGateway")}},
        "PublicSubnetRouteTableAssociation": {"Type": "AWS::EC2::SubnetRouteTableAssociation", "Properties": {
            "SubnetId": Ref("PublicSubnet"), "RouteTableId": Ref("PublicRouteTable")}},
        "NatEip": {"Type": "AWS::EC2::EIP", "DependsOn": "InternetGatewayAttachment", "Properties": {
            "Domain": "vpc", "Tags": tagged("nat")}},
        "NatGateway": {"Type": "AWS::EC2::NatGateway", "Properties": {
            "AllocationId": GetAtt("NatEip", "AllocationId"), "SubnetId": Ref("PublicSubnet"), "Tags": tagged("nat")}},
        "PrivateRouteTable": {"Type": "AWS::EC2::RouteTable", "Properties": {
            "VpcId": Ref("Vpc"), "Tags": tagged("private")}},
        "PrivateDefaultRoute": {"Type": "AWS::EC2::Route", "Properties": {
            "RouteTableId": Ref("PrivateRouteTable"), "DestinationCidrBlock": "0.0.0.0/0",
            "NatGatewayId": Ref("NatGateway")}},
        "PrivateSubnetRouteTableAssociation": {"Type": "AWS::EC2::SubnetRouteTableAssociation", "Properties": {
            "SubnetId": Ref("PrivateSubnet"), "RouteTableId": Ref("PrivateRouteTable")}},
        # Data to and from the tenant bucket stays on the AWS network and pays no NAT charges.
        "S3GatewayEndpoint": {"Type": "AWS::EC2::VPCEndpoint", "Properties": {
            "VpcId": Ref("Vpc"), "VpcEndpointType": "Gateway", "ServiceName": Sub("com.amazonaws.${AWS::Region}.s3"),
            "RouteTableIds": [Ref("PrivateRouteTable"), Ref("PublicRouteTable")], "Tags": tagged("s3-endpoint")}},
        # EFA traffic: this group admits only itself, in and out, all protocols (EFA's requirement).
        # The inline egress rule is the "disallow all" placeholder; the real egress is EfaSelfEgress.
        "EfaSecurityGroup": {"Type": "AWS::EC2::SecurityGroup", "Properties": {
            "GroupDescription": f"{prefix} EFA: all traffic to and from members of this group only",
            "VpcId": Ref("Vpc"), "SecurityGroupEgress": [DISALLOW_ALL_EGRESS], "Tags": tagged("efa")}},
        "EfaSelfIngress": {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {
            "GroupId": Ref("EfaSecurityGroup"), "SourceSecurityGroupId": Ref("EfaSecurityGroup"),
            "IpProtocol": "-1", "Description": "EFA from members of this group"}},
        "EfaSelfEgress": {"Type": "AWS::EC2::SecurityGroupEgress", "Properties": {
            "GroupId": Ref("EfaSecurityGroup"), "DestinationSecurityGroupId": Ref("EfaSecurityGroup"),
            "IpProtocol": "-1", "Description": "EFA to members of this group"}},
        # Every node: outbound through NAT / the S3 endpoint, anything from other cluster nodes.
        "NodeSecurityGroup": {"Type": "AWS::EC2::SecurityGroup", "Properties": {
            "GroupDescription": f"{prefix} nodes: traffic between cluster nodes, outbound to AWS APIs",
            "VpcId": Ref("Vpc"),
            "SecurityGroupEgress": [{"CidrIp": "0.0.0.0/0", "IpProtocol": "-1",
                                     "Description": "Outbound through the NAT gateway and the S3 endpoint"}],
            "Tags": tagged("nodes")}},
        "NodeSelfIngress": {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {
            "GroupId": Ref("NodeSecurityGroup"), "SourceSecurityGroupId": Ref("NodeSecurityGroup"),
            "IpProtocol": "-1", "Description": "Cluster-internal traffic"}},
    }
    if ssh:
        # Login nodes: SSH from the tenant's own CIDR only (network.ssh_ingress_cidr).
        resources["LoginSecurityGroup"] = {"Type": "AWS::EC2::SecurityGroup", "Properties": {
            "GroupDescription": f"{prefix} login: SSH from {ssh}", "VpcId": Ref("Vpc"),
            "SecurityGroupIngress": [{"CidrIp": ssh, "IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                                      "Description": "SSH from network.ssh_ingress_cidr"}],
            "Tags": tagged("login")}}
    # Compute nodes of EFA queues without a capacity reservation are launched into it.
    resources["ClusterPlacementGroup"] = {"Type": "AWS::EC2::PlacementGroup", "Properties": {
        "Strategy": "cluster", "Tags": tagged("compute")}}

    outputs: dict[str, Any] = {
        "VpcId": output("The tenant VPC.", Ref("Vpc")),
        "VpcCidr": output("CIDR block of the tenant VPC.", GetAtt("Vpc", "CidrBlock")),
        "AvailabilityZone": output("The one availability zone the cluster runs in.", az),
        "PublicSubnetId": output("Public subnet (NAT gateway, login nodes).", Ref("PublicSubnet")),
        "PrivateSubnetId": output("Private subnet (controller, compute, file systems).", Ref("PrivateSubnet")),
        "EfaSecurityGroupId": output("Security group that admits only itself (EFA traffic).", Ref("EfaSecurityGroup")),
        "NodeSecurityGroupId": output("Security group of every node (cluster-internal traffic, outbound to AWS).",
                                      Ref("NodeSecurityGroup")),
    }
    if ssh:
        outputs["LoginSecurityGroupId"] = output("Security group admitting SSH from network.ssh_ingress_cidr.",
                                                 Ref("LoginSecurityGroup"))
    outputs["PlacementGroupName"] = output(
        "Cluster placement group for EFA queues.", Ref("ClusterPlacementGroup"))
    return {
        "AWSTemplateFormatVersion": TEMPLATE_VERSION,
        "Description": description(
            f"fmcluster {tenant.org} network: VPC with a public and a private subnet in {az}, internet and NAT "
            "gateways, an S3 gateway endpoint, the EFA security group (admits only itself), the node and login "
            f"security groups and the cluster placement group. Generated by fmcluster from {spec_file(tenant)}."),
        "Metadata": metadata(("W3010", "the availability zone is the tenant's explicit choice (capacity "
                                        "reservations are per zone)")),
        "Resources": resources,
        "Outputs": outputs,
    }
