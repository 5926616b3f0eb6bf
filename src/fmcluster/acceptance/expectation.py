"""What a run must show to pass: the Expectation that `verdict.judge` holds a ParsedLog against.

`expectation_for(instance, nodes, ...)` builds it from the catalog's baselines (floor and public figures
of the run's node-count class at the reference size, the transport the run must use, the rank count);
the deploy's gate and its bisection probes call it with what they submitted. `resolve_expectation(log,
...)` is for a log at hand (`fmcluster acceptance parse`, `invoke doctor`): the instance type comes from
the caller, else the tenant's queue, else the type aws-ofi-nccl names in the log; when none is known the
log is not judged, and the reason says what to give.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fmcluster.acceptance.model import ParsedLog
from fmcluster.catalog import InstanceType, NodeClass, PublicFigure, node_class

Transport = Literal["efa", "nvlink", "socket"]
"""efa: inter-node traffic over aws-ofi-nccl's efa provider; nvlink: intra-node P2P/NVLS only (one GPU
node); socket: TCP (the CPU stand-in, or GPU instances without EFA)."""
TRANSPORT_WORDS: dict[Transport, str] = {
    "efa": "EFA (aws-ofi-nccl, provider efa)",
    "nvlink": "NVLink (P2P/NVLS within the node)",
    "socket": "TCP sockets",
}


class NotJudgeable(ValueError):
    """nccl-tests cannot judge this instance type (Neuron runs nccom-test, not nccl-tests)."""


@dataclass(frozen=True)
class Expectation:
    instance_type: str
    nodes: int
    node_class: NodeClass
    collective: str | None
    """all_reduce, all_gather, ...; None means "whatever the log ran" (a log judged on its own)."""
    message_bytes: int
    """The reference size: the row that must exist, be finite, correct, and at or above the floor."""
    min_busbw_gbps: float
    floor_from: str
    """"catalog" or "tenant override"."""
    floor_source: str
    catalog_floor_gbps: float
    public: tuple[PublicFigure, ...]
    """Public figures of this node-count class, any size: the verdict compares like with like."""
    transport: Transport
    expected_ranks: int | None
    require_data_check: bool = False
    """Fail (not just warn) when nccl-tests ran without data checks (-c 0)."""
    basis: str = ""
    """How the instance type and node count were chosen, when not given by the caller."""

    @property
    def gates_bandwidth(self) -> bool:
        """Floors are all_reduce floors: other collectives are checked, not gated on bandwidth."""
        return self.collective in (None, "all_reduce")


def transport_for(instance: InstanceType, nodes: int) -> Transport:
    if instance.accelerator == "cuda":
        if nodes <= 1:
            return "nvlink"
        return "efa" if instance.has_efa else "socket"
    return "socket"  # the CPU stand-in runs its own TCP ring, also on CPU instances that have EFA


def expectation_for(instance: InstanceType, nodes: int, override_gbps: float | None = None,
                    ranks_per_node: int | None = None, *, collective: str | None = "all_reduce",
                    require_data_check: bool = False, basis: str = "") -> Expectation:
    """The expectation for a run over `nodes` nodes of `instance` (tenant override replaces the floor)."""
    if instance.accelerator == "neuron":
        raise NotJudgeable(f"{instance.name} is a Neuron instance: nccl-tests does not apply (nccom-test "
                           "acceptance is not implemented yet)")
    if nodes < 1:
        raise ValueError(f"a run has at least one node, not {nodes}")
    acc = instance.acceptance
    floor = acc.floor(nodes)
    per_node = ranks_per_node if ranks_per_node is not None else (instance.accelerators_per_node or None)
    return Expectation(
        instance_type=instance.name,
        nodes=nodes,
        node_class=node_class(nodes),
        collective=collective,
        message_bytes=acc.reference_bytes,
        min_busbw_gbps=override_gbps if override_gbps is not None else floor.gbps,
        floor_from="tenant override" if override_gbps is not None else "catalog",
        floor_source=floor.source,
        catalog_floor_gbps=floor.gbps,
        public=acc.public_figures(nodes),
        transport=transport_for(instance, nodes),
        expected_ranks=per_node * nodes if per_node else None,
        require_data_check=require_data_check,
        basis=basis,
    )


@dataclass(frozen=True)
class Resolution:
    expectation: Expectation | None
    reason: str
    """How the expectation was found, or why there is none (what to give to get one)."""


def resolve_expectation(log: ParsedLog, catalog: dict[str, InstanceType], *, instance_type: str | None = None,
                        queues: dict[str, InstanceType] | None = None, queue: str | None = None,
                        nodes: int | None = None, override_gbps: float | None = None,
                        collective: str | None = None, require_data_check: bool = False,
                        ranks_per_node: int | None = None) -> Resolution:
    """The expectation for a log judged on its own. Raises KeyError for an instance type not in the catalog.

    `queues` maps a tenant's queue names to their instance types (`--org`); a queue is picked by `queue`,
    by being the only one, or by the log's hosts being named `<queue>-N`.
    """
    instance: InstanceType | None = None
    basis = ""
    if instance_type is not None:
        instance, basis = catalog[instance_type], "instance type given"
    elif queues:
        picked = queue
        if picked is None and len(queues) == 1:
            picked = next(iter(queues))
        if picked is None:
            named = {q for q in queues if log.hosts and all(h.startswith(f"{q}-") for h in log.hosts)}
            picked = named.pop() if len(named) == 1 else None
        if picked is None:
            return Resolution(None, f"the tenant has several queues ({', '.join(sorted(queues))}) and the log's hosts "
                                    "do not say which ran it; give --queue or --instance-type")
        if picked not in queues:
            return Resolution(None, f"the tenant has no queue {picked!r}; it has {', '.join(sorted(queues))}")
        instance, basis = queues[picked], f"the tenant's queue {picked}"
    elif log.network.platform:
        if log.network.platform not in catalog:
            return Resolution(None, f"the log says it ran on {log.network.platform}, which is not in the catalog; "
                                    "give --instance-type")
        instance, basis = catalog[log.network.platform], (
            f"instance type {log.network.platform} from aws-ofi-nccl's 'Running on ... platform' line")
    if instance is None:
        return Resolution(None, "no instance type to judge against: give --instance-type (or --org), or a log "
                                "with aws-ofi-nccl's 'NET/OFI Running on <type> platform' line (NCCL_DEBUG=INFO)")
    if nodes is None:
        seen = max(len(log.hosts), log.nccl_nodes or 0)
        if not seen:
            return Resolution(None, f"{instance.name} ({basis}), but the log names no hosts (`# Rank ... on HOST` "
                                    "lines) and NCCL printed no node count: give --nodes")
        nodes, basis = seen, f"{basis}; {seen} node(s) from the log"
    try:
        exp = expectation_for(instance, nodes, override_gbps, ranks_per_node, collective=collective,
                              require_data_check=require_data_check, basis=basis)
    except NotJudgeable as err:
        return Resolution(None, str(err))
    return Resolution(exp, basis)
