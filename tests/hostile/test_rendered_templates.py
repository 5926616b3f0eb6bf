"""Validation counts subnet addresses the way the rendered launch templates spend them, so "the VPC is too
small" is refused before AWS refuses it. An `efa` interface takes a private IPv4 address, an `efa-only` one
does not (EC2 user guide, "Create and attach an EFA")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fmcluster.catalog import load_catalog
from fmcluster.model import TenantInvalid, load_tenant
from scheduler_stacks import render_stacks
from fmcluster.validation import addresses_per_node
from hostile_helpers import base_doc, load_cfn, write_tenant


def test_addresses_per_node_match_the_interfaces_the_launch_templates_attach() -> None:
    catalog = load_catalog()
    cluster = next(s for s in render_stacks(load_tenant("stockmark")) if s.key == "cluster")
    templates = {name: r for name, r in load_cfn(cluster.body)["Resources"].items()
                 if r["Type"] == "AWS::EC2::LaunchTemplate"}
    assert templates
    for name, resource in templates.items():
        data = resource["Properties"]["LaunchTemplateData"]
        addressed = [nic for nic in data["NetworkInterfaces"] if nic.get("InterfaceType") != "efa-only"]
        assert len(addressed) == addresses_per_node(catalog[data["InstanceType"]]), \
            f"{name}: validation.addresses_per_node disagrees with the rendered interfaces (see EFA_ONLY_AFTER_CARD_0)"


@pytest.mark.parametrize("vpc,fits", [("10.0.0.0/23", True), ("10.0.0.0/24", False), ("172.16.0.0/16", True)])
def test_a_hundred_and_twenty_p5_nodes_need_a_slash_23_vpc(tmp_path: Path, vpc: str, fits: bool) -> None:
    """One address per P5 node (efa on card 0, efa-only on the rest): 120 nodes outgrow a /24's private half."""
    doc = base_doc("stockmark")
    doc["tenant"]["queues"][0]["count"] = 120
    doc["tenant"]["network"]["vpc_cidr"] = vpc
    write_tenant(tmp_path, yaml.safe_dump(doc))
    if fits:
        load_tenant("acme", tmp_path)
        return
    with pytest.raises(TenantInvalid) as raised:
        load_tenant("acme", tmp_path)
    assert "use a /23 VPC or larger" in raised.value.render()
