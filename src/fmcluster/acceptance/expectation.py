"""What a run must show to pass: the Expectation that `verdict.judge` holds a ParsedLog against.

`expectation_for(instance, nodes, ...)` builds it from the catalog's baselines (floor and public figures
of the run's node-count class at the reference size, the transport the run must use, the rank count);
the deploy's gate and its bisection probes call it with what they submitted. `resolve_expectation(log,
...)` is for a log at hand (`fmcluster acceptance parse`, `invoke doctor`): the instance type comes from
the caller, else the tenant's queue, else the type aws-ofi-nccl names in the log; when none is known the
log is not judged, and the reason says what to give.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from fmcluster.acceptance.model import Measurement, ParsedLog, SizeRow
from fmcluster.catalog import InstanceType, NodeClass, PublicFigure, node_class

Transport = Literal["efa", "nvlink", "socket", "neuron"]
"""efa: inter-node traffic over aws-ofi-nccl's efa provider; nvlink: intra-node P2P/NVLS only (one GPU
node); socket: TCP (the CPU stand-in, or GPU instances without EFA); neuron: Trainium's NeuronLink within an
instance and EFA between instances, which nccom-test's output does not show (not checked)."""
TRANSPORT_WORDS: dict[Transport, str] = {
    "efa": "EFA (aws-ofi-nccl, provider efa)",
    "nvlink": "NVLink (P2P/NVLS within the node)",
    "socket": "TCP sockets",
    "neuron": "NeuronLink within an instance, EFA between instances (nccom-test prints no transport)",
}
Tool = Literal["nccl-tests", "nccom-test"]


@dataclass(frozen=True)
class Collective:
    """What nccl-tests' busbw formula and the fabric's limits are for one collective (doc/PERFORMANCE.md)."""

    bus_factor: Callable[[int], float]
    """busbw = algbw x bus_factor(ranks)."""
    node_egress: Callable[[int, int], float]
    """Bytes each node must send across the network per byte of the op's size, for (nodes, ranks per node):
    the lower bound that caps algbw at node bandwidth / this (0: nothing must cross, e.g. one node)."""


def _ring(n: int) -> float:
    return (n - 1) / n if n > 0 else 0.0


# Bus factors are nccl-tests' own (doc/PERFORMANCE.md, "Summary", https://github.com/NVIDIA/nccl-tests/blob/master/
# doc/PERFORMANCE.md): AllReduce 2(n-1)/n; ReduceScatter, AllGather and AlltoAll (n-1)/n; Broadcast and Reduce 1.
COLLECTIVES: dict[str, Collective] = {
    # all_reduce: reduce-scatter then all-gather across nodes: 2(N-1)/N of the buffer leaves each node
    "all_reduce": Collective(lambda n: 2 * _ring(n), lambda nodes, g: 2 * _ring(nodes)),
    # all_gather / reduce_scatter: each node receives (sends) the other nodes' share: (N-1)/N
    "all_gather": Collective(_ring, lambda nodes, g: _ring(nodes)),
    "reduce_scatter": Collective(_ring, lambda nodes, g: _ring(nodes)),
    # alltoall: busbw = algbw x (n-1)/n (PERFORMANCE.md; AlltoAllGetBw in src/alltoall.cu), as all_gather; each of a
    # node's g ranks sends (N-1)/N of its buffer to other nodes, so the ceiling is g times lower than all_gather's
    "alltoall": Collective(_ring, lambda nodes, g: g * _ring(nodes)),
    # broadcast / reduce / sendrecv: the whole buffer crosses at least one node boundary once
    "broadcast": Collective(lambda n: 1.0, lambda nodes, g: 1.0 if nodes > 1 else 0.0),
    "reduce": Collective(lambda n: 1.0, lambda nodes, g: 1.0 if nodes > 1 else 0.0),
    "sendrecv": Collective(lambda n: 1.0, lambda nodes, g: 1.0 if nodes > 1 else 0.0),
    "gather": Collective(_ring, lambda nodes, g: _ring(nodes)),
    "scatter": Collective(_ring, lambda nodes, g: _ring(nodes)),
    "hypercube": Collective(_ring, lambda nodes, g: _ring(nodes)),
}
"""Every collective nccl-tests ships a `<name>_perf` binary for."""
CEILING_TOLERANCE = 0.05
"""Headroom over the computed ceiling before a busbw counts as non-physical (rounding, GB vs GiB slips)."""


def canonical_collective(name: str) -> str | None:
    """`all_reduce` for `all_reduce`, `all_reduce_perf` or `all_reduce_perf_mpi`; None for an unknown name."""
    base = name.strip().lower().removesuffix("_mpi").removesuffix("_perf")
    return base if base in COLLECTIVES else None


def collective_of_benchmark(benchmark: str | None) -> str | None:
    """The collective an nccl-tests binary runs (`all_gather_perf` -> `all_gather`); None when unknown."""
    return canonical_collective(benchmark) if benchmark else None


DTYPE_BYTES: dict[str, int] = {
    "int8": 1, "uint8": 1, "char": 1, "int32": 4, "uint32": 4, "int": 4, "int64": 8, "uint64": 8,
    "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4, "double": 8, "float64": 8,
    "f8e4m3": 1, "f8e5m2": 1,
}
"""Bytes per element of nccl-tests' type names (`test_typenames` in src/common.cu), and the CPU bench's."""


def collective_from_table(log: ParsedLog) -> str | None:
    """The collective a table that names none must be, when its shape proves it; else None.

    Only all_reduce is proved: a reduction (`redop` not `none`), no root (-1 or no `root` column: reduce has one)
    and count x element size = size on every row (reduce_scatter prints the per-rank count, n times smaller).
    """
    rows = [r for r in log.rows if r.count > 0]
    if not rows:
        return None
    for r in rows:
        width = DTYPE_BYTES.get(r.dtype)
        if r.redop in (None, "none") or r.root not in (None, -1) or width is None or r.count * width != r.size_bytes:
            return None
    return "all_reduce"


PER_RANK_COUNT = frozenset({"all_gather", "reduce_scatter", "alltoall"})
"""Collectives whose `count` column is each rank's share: nccl-tests computes their algbw from count x ranks x
element size (AllGatherGetBw, ReduceScatterGetBw, AlltoAllGetBw in src/*.cu), the others' from count x element
size. The printed size agrees, except where a share rounds down (alltoall's `count/nranks`, aligned to 16 bytes
since 2.13: a small row prints `8  0` and moves nothing, so its algbw is 0.00 at any time)."""


IN_PLACE_UNCHECKED = frozenset({"alltoall", "sendrecv"})
"""Collectives whose in-place half nccl-tests runs and times but never checks: their InitData sets `reportErrors =
in_place ? 0 : 1` ("We don't support in-place alltoall", src/alltoall.cu; the same in src/sendrecv.cu and
src/alltoallv.cu), and nccl-tests counts no in-place error of theirs. Since 2.13 (commit a0a1491, "Display N/A for
error count in AlltoAll in-place test") the in-place `#wrong` prints `N/A` even with -c 1; before, it printed the
unchecked buffer's figure (`1e+00` on a healthy 64-GPU run, github.com/NVIDIA/nccl-tests/issues/78). Their data are
judged by the out-of-place half alone: a row is correct when its out-of-place `#wrong` is 0, unchecked when that one
is N/A (-c 0), whatever the in-place cell says."""


def checked_halves(row: SizeRow, collective: str | None) -> tuple[Measurement, ...]:
    """The halves of a row whose check column nccl-tests fills for `collective` (the out-of-place one alone for
    IN_PLACE_UNCHECKED collectives, both otherwise, also when the collective is not known)."""
    return (row.out_of_place,) if collective in IN_PLACE_UNCHECKED else row.halves


def row_correct(row: SizeRow, collective: str | None) -> bool | None:
    """`SizeRow.correct` over the halves nccl-tests checks for `collective`: False if one is wrong or unreadable,
    None if one was not checked (N/A), True only when every checked half shows 0 wrong elements."""
    states = [m.correct for m in checked_halves(row, collective)]
    if False in states:
        return False
    if None in states:
        return None
    return True


def moved_bytes(collective: str | None, count: int, dtype: str, ranks: int | None) -> int | None:
    """The bytes nccl-tests divides by the time for a row's algbw, from its count column; None if not known."""
    width = DTYPE_BYTES.get(dtype)
    if collective is None or collective not in COLLECTIVES or width is None:
        return None
    if collective in PER_RANK_COUNT:
        return count * ranks * width if ranks else None
    return count * width


def bus_factor(collective: str, ranks: int) -> float | None:
    found = COLLECTIVES.get(collective)
    return found.bus_factor(ranks) if found and ranks > 0 else None


def ceiling_gbps(instance: InstanceType, collective: str, nodes: int, ranks: int) -> tuple[float, str] | None:
    """The highest busbw (GB/s) the hardware can carry for this run, and how it was derived; None if unknown.

    Across nodes: the node's network bandwidth (catalog `network_gbps`, AWS's published figure) caps algbw at
    bandwidth / (bytes each node must send per byte of the op), so busbw <= that x the bus factor. Within a
    node: the GPU's total NVLink bandwidth (catalog `nvlink_gbps`, both directions: NVLink SHARP's in-switch
    reduction lets all_reduce exceed one direction's figure, never both). The lower of the two applies.
    """
    found = COLLECTIVES.get(collective)
    if found is None or ranks < 1 or nodes < 1:
        return None
    bounds: list[tuple[float, str]] = []
    if instance.nvlink_gbps:
        bounds.append((float(instance.nvlink_gbps), f"NVLink {instance.nvlink_gbps:g} GB/s per GPU (both "
                       f"directions; {instance.nvlink_source})"))
    per_node = max(ranks // nodes, 1)
    egress = found.node_egress(nodes, per_node)
    if nodes > 1 and egress > 0 and instance.network_gbps:
        node_gbps = instance.network_gbps / 8
        bound = node_gbps / egress * found.bus_factor(ranks)
        bounds.append((bound, f"EFA {instance.network_gbps} Gbps = {node_gbps:g} GB/s per node (AWS instance "
                              f"specifications); {collective} must send {egress:.3g} B per byte across each node"))
    if not bounds:
        return None
    return min(bounds, key=lambda b: b[0])


class NotJudgeable(ValueError):
    """No benchmark fmcluster knows can judge this instance type (a Neuron type without a NeuronCore count)."""


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
    instance: InstanceType | None = None
    """The catalog entry: device model, EFA NIC count, network and NVLink bandwidth for the topology and
    physics checks, and for the floors of other collectives."""
    tool: Tool = "nccl-tests"
    """The benchmark that runs on this instance type: nccl-tests (CUDA, and the CPU stand-in's copy of its format)
    or AWS Neuron's nccom-test (Trainium)."""

    def floor_for(self, collective: str, ranks: int | None) -> tuple[float | None, str, str]:
        """(floor GB/s, where it comes from, "catalog"/"tenant override"/"derived") for `collective`; the floor is
        None where nothing to derive one from exists (the CPU stand-in's other collectives: no hardware ceiling;
        nccom-test's collectives but all_reduce: no public figure)."""
        if collective == "all_reduce":
            return self.min_busbw_gbps, self.floor_source, self.floor_from
        if self.tool == "nccom-test":
            return None, f"no public nccom-test {collective} figure or floor exists", "none"
        ranks = ranks or self.expected_ranks or 0
        ceiling = (ceiling_gbps(self.instance, collective, self.nodes, ranks)
                   if self.instance and self.transport != "socket" else None)
        if ceiling is None:
            return None, f"no public {collective} floor and no hardware ceiling to derive one from", "none"
        rule = collective_floors()[collective]
        if rule.basis == "published":
            floor = round(min(self.min_busbw_gbps * rule.factor, ceiling[0]), 2)
            origin = "published" if self.floor_from == "catalog" else self.floor_from
            return floor, (f"{rule.ratio_words} x the all_reduce floor {self.min_busbw_gbps:g} GB/s "
                           f"({self.floor_source}); the ratio: {rule.source}"), origin
        floor = round(ceiling[0] * rule.factor, 2)
        return floor, (f"derived: {rule.factor:g} x the {collective} ceiling {ceiling[0]:.1f} GB/s "
                       f"({ceiling[1]}); no public {collective} floor exists"), "derived"


@dataclass(frozen=True)
class CollectiveFloor:
    """How one collective's floor is set (data/nccl_profiles.yml `collective_floors`)."""

    basis: str
    """"published": the all_reduce floor x a public busbw ratio; "derived": a share of the collective's ceiling."""
    factor: float
    ratio_words: str
    """The ratio as the source gives it (`370/480`), for the verdict's sentence."""
    source: str


FLOOR_BASES = ("published", "derived")


@lru_cache(maxsize=1)
def collective_floors() -> dict[str, CollectiveFloor]:
    """Every collective's floor rule but all_reduce's; a missing or malformed entry is an error naming the key."""
    from fmcluster.nccl import NCCL_PROFILES_PATH, load_profiles

    raw = load_profiles()
    where = f"{NCCL_PROFILES_PATH}: collective_floors"
    table = raw.get("collective_floors")
    if not isinstance(table, dict):
        raise ValueError(f"{where} is missing; add one entry per collective but all_reduce")
    out: dict[str, CollectiveFloor] = {}
    for name in COLLECTIVES:
        if name == "all_reduce":
            continue
        entry = table.get(name)
        if not isinstance(entry, dict) or entry.get("basis") not in FLOOR_BASES:
            raise ValueError(f"{where}.{name}: needs basis: {' or '.join(FLOOR_BASES)}")
        source = entry.get("source")
        if source not in raw["sources"]:
            raise ValueError(f"{where}.{name}: source {source!r} is not in `sources`; cite one of them")
        if entry["basis"] == "published":
            ratio = entry.get("ratio") or {}
            num, den = ratio.get("numerator"), ratio.get("denominator")
            if not (isinstance(num, (int, float)) and isinstance(den, (int, float)) and 0 < num <= den):
                raise ValueError(f"{where}.{name}.ratio: needs numerator and denominator, 0 < numerator <= "
                                 "denominator (a floor above all_reduce's has no source)")
            factor, words = num / den, f"{num:g}/{den:g}"
        else:
            share = entry.get("share")
            if not (isinstance(share, (int, float)) and 0 < share < 1):
                raise ValueError(f"{where}.{name}.share: needs a share of the ceiling between 0 and 1")
            factor, words = float(share), f"{share:g}"
        out[name] = CollectiveFloor(entry["basis"], factor, words, " ".join(str(raw["sources"][source]).split()))
    return out


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
    if nodes < 1:
        raise ValueError(f"a run has at least one node, not {nodes}")
    if collective is not None and collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    acc = instance.acceptance
    floor = acc.floor(nodes)
    if instance.accelerator == "neuron":
        return _neuron_expectation(instance, nodes, override_gbps, ranks_per_node, collective, require_data_check,
                                   basis)
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
        instance=instance,
    )


def _neuron_expectation(instance: InstanceType, nodes: int, override_gbps: float | None, ranks_per_node: int | None,
                        collective: str | None, require_data_check: bool, basis: str) -> Expectation:
    """A Trainium run, judged on nccom-test's output: the catalog's floor (GB/s) at its reference size, the public
    nccom-test figures (fmcluster.acceptance.neuron), one worker per NeuronCore of each instance."""
    from fmcluster.acceptance import neuron

    cores = neuron.NEURON_CORES.get(instance.name)
    if cores is None:
        raise NotJudgeable(f"{instance.name} is a Neuron instance whose NeuronCore count fmcluster does not know: "
                           "nccom-test's rank count cannot be checked")
    acc = instance.acceptance
    floor = acc.floor(nodes)
    klass = node_class(nodes)
    per_node = ranks_per_node if ranks_per_node is not None else cores.per_node
    return Expectation(
        instance_type=instance.name,
        nodes=nodes,
        node_class=klass,
        collective=collective,
        message_bytes=acc.reference_bytes,
        min_busbw_gbps=override_gbps if override_gbps is not None else floor.gbps,
        floor_from="tenant override" if override_gbps is not None else "catalog",
        floor_source=floor.source,
        catalog_floor_gbps=floor.gbps,
        public=acc.public_figures(nodes) + neuron.public_figures(instance.name, klass),
        transport="neuron",
        expected_ranks=per_node * nodes,
        require_data_check=require_data_check,
        basis=basis,
        instance=instance,
        tool="nccom-test",
    )


def platform_instance(platform: str, catalog: dict[str, InstanceType]) -> str | None:
    """The catalog instance type aws-ofi-nccl's `Running on X platform` names, or None.

    Current plugins print the type (`p5.48xlarge`); older ones (seen in a public p4d log, NCCL 2.9) printed the
    family, capitalised (`P4d`): that names a type when exactly one catalog type has that family prefix.
    """
    if platform in catalog:
        return platform
    family = platform.lower()
    matches = [name for name in catalog if name.lower().split(".")[0] == family]
    return matches[0] if len(matches) == 1 else None


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
        platform_type = platform_instance(log.network.platform, catalog)
        if platform_type is None:
            return Resolution(None, f"the log says it ran on {log.network.platform}, which is not in the catalog; "
                                    "give --instance-type")
        printed = "" if platform_type == log.network.platform else f" (printed as the family {log.network.platform})"
        instance, basis = catalog[platform_type], (
            f"instance type {platform_type} from aws-ofi-nccl's 'Running on ... platform' line{printed}")
    if instance is None:
        return Resolution(None, "no instance type to judge against: give --instance-type (or --org), or a log "
                                "with aws-ofi-nccl's 'NET/OFI Running on <type> platform' line (NCCL_DEBUG=INFO)")
    command = log.nccom.command if log.nccom is not None else None
    if nodes is None and command is not None and command.nodes:
        nodes, basis = command.nodes, f"{basis}; {command.nodes} node(s) from the nccom-test command line (-N; 1 when absent)"
    if nodes is None:
        seen = max(len(log.hosts), log.nccl_nodes or 0)
        if not seen:
            if log.tool == "nccom-test":
                return Resolution(None, f"{instance.name} ({basis}), but the log does not show the nccom-test "
                                        "command line (`-N` nodes): give --nodes")
            return Resolution(None, f"{instance.name} ({basis}), but the log names no hosts (`# Rank ... on HOST` "
                                    "lines) and NCCL printed no node count: give --nodes")
        nodes, basis = seen, f"{basis}; {seen} node(s) from the log"
    try:
        exp = expectation_for(instance, nodes, override_gbps, ranks_per_node, collective=collective,
                              require_data_check=require_data_check, basis=basis)
    except NotJudgeable as err:
        return Resolution(None, str(err))
    return Resolution(exp, basis)
