"""Provider local, scheduler pcs: what stands in for AWS Parallel Computing Service.

No PCS runs offline: no emulator answers `AWS::PCS::Cluster`, `ComputeNodeGroup` or `Queue`, and PCS's controller
(slurmctld, slurmdbd) runs in AWS's account. So the *substrate* is stood in, never its answers, as for a scheduler
whose service makes the whole cluster (its folder's stand_in.py): the cluster stack is fmcluster's slurm-ec2 stack
(the controller instance, one auto scaling group for the login nodes and one per queue, as PCS's node groups are
one per queue plus the login fleet), whose instances carry the tags PCS's launch templates give them
(`fmcluster:org`, `fmcluster:role`, `fmcluster:queue`, which discovery reads), and whose user data is the one shell
part of PCS's MIME user data: fmcluster's first boot, unchanged. The tag PCS itself adds to every instance it
launches, `aws:pcs:compute-node-group-id` (README.md, "Sources"), is not on them: the `aws:` prefix is AWS's own, which
CloudFormation refuses in a template (cfn-lint E3024), and fmcluster reads it nowhere. Slurm and munge, which PCS's controller and the agent on PCS's image run on AWS,
are installed by fmcluster's own roles here (the manifest says so: `fmcluster_capabilities.slurm_owner`), with
fmcluster's controller node as the Slurm controller. `STOOD_IN` is what the deploy's summary says about it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fmcluster.model import Tenant
from fmcluster.schedulers.pcs import template as pcs
from fmcluster.schedulers.slurm_ec2 import template as slurm_ec2
from fmcluster.stacks.templates import ClusterTemplate, UserData

#: What PCS does on AWS that the local stand-in does with fmcluster's own pieces, and what is the same.
STOOD_IN = (
    "AWS PCS's own on AWS, stood in locally: the PCS cluster and its Slurm controller in AWS's account (here "
    "slurmctld and slurmdbd on fmcluster's controller node, from fmcluster's roles), the compute node groups and "
    "queues (here fmcluster's slurm-ec2 stack: one auto scaling group for the login nodes and one per queue, "
    "instances tagged as PCS's launch templates tag them, without PCS's own aws:pcs:compute-node-group-id tag), "
    "PCS's agent and Slurm 25.11 on PCS's image (here Debian's Slurm and munge from fmcluster's roles; compute nodes "
    "configless as on PCS, login nodes with a written slurm.conf where PCS runs sackd), the MIME merge of the user "
    "data (here its shell part is the whole user data). Not rehearsed here: PCS's registration of each node and its "
    "node replacement (invoke replace refuses, as on AWS). The same on both: fmcluster's first boot and its node "
    "bootstrap, the partitions named after the queues, NCCL, exporters, Prometheus and acceptance."
)

def role_tags(group: slurm_ec2.NodeGroup) -> dict[str, str]:
    """The tags PCS's launch templates give an instance (template.py: fmcluster's role and queue)."""
    return pcs.role_tags(group.role, group.queue)


def build(tenant: Tenant, user_data: UserData) -> dict[str, Any]:
    """The local stand-in's cluster stack (provider local only). No node signals: on PCS none does (the launch
    templates' user data names no signal resource), and PCS replaces its own nodes, so no repair statements.
    pcs.node_groups refuses what PCS's template refuses (a queue named controller or login)."""
    pcs.node_groups(tenant)
    return slurm_ec2.build(tenant, user_data, role_tags, signals=False, summary="local stand-in for AWS PCS",
                           repair=False)


#: The stand-in's stack, made of slurm-ec2's launch templates: it takes the same AMI and Capacity Block parameters.
STAND_IN_TEMPLATE = ClusterTemplate(source=Path(__file__), build=build, image_parameters=slurm_ec2.image_parameters,
                                    capacity_parameters=slurm_ec2.capacity_parameters)
