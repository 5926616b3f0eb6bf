"""Provider local, scheduler parallelcluster: what stands in for the ParallelCluster service.

No ParallelCluster runs offline (its cluster stack is made by its CLI with the AWS CDK and Lambda-backed
custom resources; its nodes are configured by its Chef cookbooks). So the *substrate* is stood in, never its
answers: the cluster stack is fmcluster's slurm-ec2 stack (controller instance, one auto scaling group per login
pool and queue) whose instances carry ParallelCluster's own tags and whose user data does what ParallelCluster
does once a node is configured: download the OnNodeConfigured script named in the rendered cluster config and
run it with that config's Args. From there every node runs the same first boot as on AWS. Slurm, munge and the
shared file systems, which ParallelCluster installs itself on AWS, are installed by fmcluster's own roles here
(the manifest says so: `fmcluster_capabilities.slurm_owner`). `STOOD_IN` is what the deploy's summary says about it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from fmcluster.model import Tenant
from fmcluster.schedulers.parallelcluster.config import CUSTOM_ACTION_KEY, cluster_name, on_node_configured_settings
from fmcluster.stacks import cfn
from fmcluster.stacks.first_boot import s3_client_writer
from fmcluster.schedulers.parallelcluster.tags import NODE_TAGS
from fmcluster.schedulers.slurm_ec2 import template as slurm_ec2
from fmcluster.stacks.templates import ClusterTemplate

#: What ParallelCluster itself does on AWS that the local stand-in does with fmcluster's own pieces.
STOOD_IN = (
    "ParallelCluster's own on AWS, stood in locally: the cluster stack and its instances (pcluster create-cluster;"
    " here fmcluster's slurm-ec2 stack, instances tagged as ParallelCluster tags them), Slurm, munge and the"
    " shared-storage mounts on every node (ParallelCluster's cookbooks; here fmcluster's roles), node replacement"
    " and compute-fleet scaling (clustermgtd; here the auto scaling groups). The same on both: the rendered cluster"
    " config checked by ParallelCluster's schema, the OnNodeConfigured script and its Args, the node bootstrap,"
    " NCCL, exporters, Prometheus and acceptance."
)

#: fmcluster's role → ParallelCluster's node type (its tags: tags.NODE_TAGS, read the other way by discovery).
NODE_TYPES: dict[str, str] = {role: node_type for node_type, role in NODE_TAGS.roles.items()}

_HEAD = """#!/bin/bash
# fmcluster local stand-in for AWS ParallelCluster (fmcluster.schedulers.parallelcluster.stand_in): ParallelCluster runs the
# cluster config's OnNodeConfigured once a node is configured; so does this, with the same script and Args.
set -euo pipefail
action=/var/lib/fmcluster/pcluster-on-node-configured.sh
install -d -m 0700 /var/lib/fmcluster
for try in 1 2 3 4 5 6 7 8 9 10; do
  /usr/local/sbin/fmcluster-s3 --region "$region" get "s3://$bucket/$key" "$action" && break
  [ "$try" = 10 ] && { echo "fmcluster: no OnNodeConfigured script at s3://$bucket/$key" >&2; exit 1; }
  sleep $((try * 3))
done
exec bash "$action\""""


def role_tags(tenant: Tenant) -> slurm_ec2.RoleTags:
    """The tags ParallelCluster puts on its instances (tags.NODE_TAGS, which discovery reads back)."""
    name = cluster_name(tenant)

    def tags(group: slurm_ec2.NodeGroup) -> dict[str, str]:
        found = {"parallelcluster:cluster-name": name, NODE_TAGS.role: NODE_TYPES[group.role]}
        if group.queue is not None:
            found[NODE_TAGS.queue] = group.queue.name
            found["parallelcluster:compute-resource-name"] = group.queue.instance.name.replace(".", "-")
        return found

    return tags


def user_data(*, org: str, role: str, queue: str, signal_resource: str) -> cfn.Fn:
    """One node's user data: fetch the OnNodeConfigured script and run it with the cluster config's Args.
    One Fn::Join: the tenant's values are shell-quoted literal parts, the bucket and region references."""
    settings = on_node_configured_settings(bucket=cfn.Ref("DataBucketName"), region=cfn.Ref("AWS::Region"),
                                           org=org, role=role, queue=queue or None)
    # ParallelCluster's image has the AWS CLI; the local image has not: the stand-in fetches with the first boot's
    # own S3 client, which it writes first.
    head = _HEAD.removeprefix("#!/bin/bash\n")
    head = head.replace("set -euo pipefail\n", "set -euo pipefail\n" + s3_client_writer("/usr/local/sbin/fmcluster-s3"), 1)
    parts: list[Any] = ["#!/bin/bash\nbucket=", cfn.Ref("DataBucketName"), "\nregion=", cfn.Ref("AWS::Region"),
                        f"\nkey={shlex.quote(CUSTOM_ACTION_KEY)}\n", head]
    for name, value in settings:
        parts += [f" {name}=", value] if not isinstance(value, str) else [" " + shlex.quote(f"{name}={value}")]
    parts.append("\n")
    return cfn.user_data(parts)


def build(tenant: Tenant) -> dict[str, Any]:
    """The local stand-in's cluster stack (provider local only)."""
    return slurm_ec2.build(tenant, user_data, role_tags(tenant), signals=False,
                           summary="local stand-in for AWS ParallelCluster", repair=False)  # it replaces its own


#: The stand-in's stack, made of slurm-ec2's launch templates: it takes the same AMI and Capacity Block parameters.
STAND_IN_TEMPLATE = ClusterTemplate(source=Path(__file__), build=lambda tenant, _user_data: build(tenant),
                                    image_parameters=slurm_ec2.image_parameters,
                                    capacity_parameters=slurm_ec2.capacity_parameters)
