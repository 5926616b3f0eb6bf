"""Which accelerator and fabric roles a queue's nodes converge, with what they expect: decided once, from the catalog.

The generated inventory carries the result per queue group (playbooks/accelerators.yml maps nothing):
    fmcluster_accelerator_roles   the roles, in order: efa (EFA interfaces), nvidia_driver (CUDA), neuron (Trainium,
                                  after efa: its collectives use the EFA stack), nccl (any accelerator or EFA, and
                                  every compute node of a cluster that has one: Slurm's TaskProlog is cluster-wide)
    efa_expected_interfaces, nvidia_driver_expected_gpus, nvidia_driver_fabric_manager, neuron_expected_devices,
    nccl_tests_gpus_per_node      the queue's accelerators, for the nccl-tests build on its nodes
plus the queue's NCCL environment (fmcluster.nccl.queue_vars).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fmcluster import nccl
from fmcluster.catalog import InstanceType, load_catalog


#: NVIDIA Fabric Manager's unit (the nvidia-fabricmanager package; NVIDIA Fabric Manager User Guide, "systemctl start
#: nvidia-fabricmanager", https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html). On NVSwitch
#: systems the GPUs' NVLink is unusable until it runs, so the boot diagnostic waits for it.
FABRIC_MANAGER_UNIT = "nvidia-fabricmanager.service"


def accelerator_roles(instance: InstanceType, cluster_needs_fabric: bool) -> list[str]:
    return ((["efa"] if instance.has_efa else []) + (["nvidia_driver"] if instance.accelerator == "cuda" else [])
            + (["neuron"] if instance.accelerator == "neuron" else [])
            + (["nccl"] if instance.needs_fabric or cluster_needs_fabric else []))


def queue_vars(instance_type: str, cluster_instance_types: Sequence[str]) -> dict[str, Any]:
    """The group vars of one queue of `instance_type` in a cluster whose queues have `cluster_instance_types`."""
    instance = load_catalog()[instance_type]
    return {
        "fmcluster_accelerator_roles": accelerator_roles(instance, nccl.cluster_needs_fabric(cluster_instance_types)),
        "efa_expected_interfaces": instance.efa_interfaces,
        "nvidia_driver_expected_gpus": instance.accelerators_per_node if instance.accelerator == "cuda" else 0,
        "nvidia_driver_fabric_manager": instance.nvswitch,
        # The boot diagnostic (roles/node_health) runs after what the GPUs need to pass it.
        "node_health_boot_after": [FABRIC_MANAGER_UNIT] if instance.nvswitch else [],
        "neuron_expected_devices": instance.accelerators_per_node if instance.accelerator == "neuron" else 0,
        # nccl-tests is built on the queue's own nodes for its own accelerators (playbooks/acceptance-jobs.yml).
        "nccl_tests_gpus_per_node": instance.accelerators_per_node,
        **nccl.queue_vars(instance_type),
    }
