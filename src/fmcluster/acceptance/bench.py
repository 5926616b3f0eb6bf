"""CPU collective-bandwidth benchmark with nccl-tests' output format: the local stand-in for nccl-tests.

Standard library only (the nodes boot a pristine Debian with python3 and no torch or numpy). One rank per
Slurm task; the ranks meet at MASTER_ADDR:MASTER_PORT (rank 0 listens there and hands every rank the
listening address of every other), then form a TCP ring, each rank connected to its successor, and run
all_reduce, all_gather, reduce_scatter or alltoall over it with real data of the stated sizes. Every result
is checked, and the output is nccl-tests' header, size table (size, count, type, redop, root, time, algbw,
busbw, #wrong, out-of-place and in-place) and footer (`# Out of bounds values`, `# Avg bus bandwidth`), plus
INFO lines in NCCL's shape for the network it used, tagged `FMCTCP` (never `NCCL`: nothing here pretends to
be NCCL). The same parser and verdict then judge it. busbw uses nccl-tests' factors (all_reduce 2(n-1)/n,
the others (n-1)/n), so figures compare across node counts the same way.

Data are `uint32` lanes holding values below 2**23, so a sum over up to MAX_RANKS (256) ranks stays below
2**31. A reduction adds whole chunks at once: with audioop.add (C, 32-bit lanes, standard library up to Python
3.12) where the interpreter has it, else as Python integers (int.from_bytes, one addition, to_bytes), which is
a lane-wise sum because no carry crosses a lane within that headroom. Repeated in-place runs would outgrow it:
the integer path keeps results modulo 2**23 (one mask over the rank's own chunk), audioop saturates. The
checks start from fresh values, so both paths give exact sums there. The algorithms are the ring ones:
reduce_scatter then all_gather for all_reduce (each link carries 2(n-1)/n of the buffer, as busbw assumes);
alltoall forwards along the ring, so each link carries n(n-1)/2 chunks where a mesh carries n-1, and its busbw
reads lower than a mesh's above 2 ranks.

Out-of-place means the collective writes a separate output buffer (for all_reduce: input copied to the
output, then reduced there); in-place reuses the input buffer.

Run under Slurm (`srun python -m fmcluster.acceptance.bench -b 1M -e 16M`): rank and size come from
SLURM_PROCID/SLURM_NTASKS, the rendezvous from MASTER_ADDR/MASTER_PORT. The ring binds and connects through
the address of the interface that routes to MASTER_ADDR unless FMC_BENCH_SOCKET_IFNAME names one (the knob
the broken-fabric test turns): a wrong interface makes the run fail or crawl, as a wrong NCCL_SOCKET_IFNAME does.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import socket
import struct
import sys
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from fmcluster.exits import ExitCode

VERSION = "0.2.0"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
LANE_BYTES = 4
LANE_TYPE = "uint32"
VALUE_BITS = 23
# 256 values below 2**23 sum below 2**31: exact also in audioop's lanes, which are signed
MAX_RANKS = 1 << (8 * LANE_BYTES - 1 - VALUE_BITS)
TRANSPORT = f"fmcluster TCP ring (Python {sys.version.split()[0]})"
_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def parse_size(text: str) -> int:
    """`8`, `64K`, `1M`, `2G` (powers of 1024, as nccl-tests reads -b/-e)."""
    m = re.fullmatch(r"(\d+)([KMG]?)B?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 8, 64K, 1M, 1G)")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def bus_factor(op: str, nranks: int) -> float:
    if nranks <= 1:
        return 0.0
    return 2 * (nranks - 1) / nranks if op == "all_reduce" else (nranks - 1) / nranks


# -- lanes: uint32 values summed a whole chunk at a time ---------------------------------------------------
def lanes(value: int, count: int) -> bytes:
    """`count` uint32 lanes, each holding `value` (little-endian, as the reduction reads them)."""
    return value.to_bytes(LANE_BYTES, "little") * count


def _c_adder() -> Callable[[bytes | bytearray | memoryview, bytes | bytearray | memoryview], bytes] | None:
    """audioop.add on 4-byte lanes: a C loop, 20-50 times the integer path's speed; gone in Python 3.13."""
    if sys.byteorder != "little":  # audioop reads native order, the integer path little-endian
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import audioop
        except ImportError:
            return None
    return lambda a, b: audioop.add(a, b, LANE_BYTES)


C_ADD = _c_adder()


def lane_mask(nbytes: int) -> int:
    """The integer that keeps the low VALUE_BITS of every lane of an `nbytes` chunk."""
    return int.from_bytes(lanes((1 << VALUE_BITS) - 1, nbytes // LANE_BYTES), "little")


def add_lanes(a: bytes | bytearray | memoryview, b: bytes | bytearray | memoryview) -> bytes:
    """Lane-wise sum of two chunks of equal length: one big-integer addition, exact while no lane reaches 2**32
    (the last lane's carry would not fit: OverflowError)."""
    return (int.from_bytes(a, "little") + int.from_bytes(b, "little")).to_bytes(len(a), "little")


def wrong_lanes(got: bytes | bytearray | memoryview, expected: bytes) -> int:
    if got == expected:
        return 0
    g, e = memoryview(got).cast("B"), memoryview(expected)
    return sum(g[i:i + LANE_BYTES] != e[i:i + LANE_BYTES] for i in range(0, len(e), LANE_BYTES))


# -- addresses -----------------------------------------------------------------------------------------------
def interface_address(iface: str) -> str | None:
    """The IPv4 address of `iface`, or None when the node has no such interface or it has no address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", iface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def local_route(master: str) -> tuple[str, str]:
    """(interface, address) this node uses to reach `master`, from the kernel's routing table."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master, 9))  # UDP: no packet leaves, the kernel only picks the route
        address = str(probe.getsockname()[0])
    for _, name in socket.if_nameindex():
        if interface_address(name) == address:
            return name, address
    return "?", address


# -- the wire --------------------------------------------------------------------------------------------------
def recv_exactly(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        got = sock.recv_into(view)
        if got == 0:
            raise ConnectionError("a peer closed its connection mid-collective")
        view = view[got:]


class Control:
    """The rendezvous connections to rank 0, kept for barriers and small gathers (JSON lines)."""

    def __init__(self, rank: int, nranks: int, master: str, port: int, timeout: float) -> None:
        self.rank, self.nranks = rank, nranks
        self.peers: list[Any] = []  # rank 0: a file per rank 1..n-1, in rank order
        self.up: Any = None  # other ranks: the file to rank 0
        deadline = time.monotonic() + timeout
        if rank == 0:
            with socket.create_server(("", port), backlog=max(nranks, 8)) as server:
                server.settimeout(timeout)
                by_rank: dict[int, Any] = {}
                while len(by_rank) < nranks - 1:
                    server.settimeout(max(deadline - time.monotonic(), 0.001))
                    try:
                        conn, _ = server.accept()
                    except TimeoutError:
                        raise TimeoutError(f"rendezvous: {len(by_rank) + 1} of {nranks} ranks arrived within "
                                           f"{timeout:.0f} s at port {port}") from None
                    conn.settimeout(timeout)
                    f = conn.makefile("rwb")
                    peer = int(json.loads(f.readline())["rank"])
                    if not 0 < peer < nranks or peer in by_rank:
                        raise RuntimeError(f"rendezvous: unexpected rank {peer} (SLURM_NTASKS={nranks})")
                    by_rank[peer] = f
                self.peers = [by_rank[r] for r in range(1, nranks)]
        else:
            while True:
                try:
                    conn = socket.create_connection((master, port), timeout=max(deadline - time.monotonic(), 0.001))
                    break
                except OSError as err:  # rank 0 may not be listening yet
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"rendezvous: no rank 0 at {master}:{port} within {timeout:.0f} s "
                                           f"({err})") from None
                    time.sleep(0.1)
            conn.settimeout(timeout)
            self.up = conn.makefile("rwb")
            self._send(self.up, {"rank": rank})

    @staticmethod
    def _send(f: Any, obj: object) -> None:
        f.write(json.dumps(obj).encode() + b"\n")
        f.flush()

    @staticmethod
    def _recv(f: Any) -> Any:
        line = f.readline()
        if not line:
            raise ConnectionError("rendezvous: a rank left")
        return json.loads(line)

    def allgather(self, obj: object) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank (also the barrier)."""
        if self.rank != 0:
            self._send(self.up, obj)
            result: list[Any] = self._recv(self.up)
            return result
        everyone = [obj, *(self._recv(f) for f in self.peers)]
        for f in self.peers:
            self._send(f, everyone)
        return everyone

    def close(self) -> None:
        for f in [*self.peers, self.up]:
            if f is not None:
                f.close()


class Ring:
    """One TCP connection to the successor (sent on) and one from the predecessor (received on)."""

    def __init__(self, rank: int, nranks: int, address: str, listener: socket.socket,
                 peers: list[dict[str, Any]], timeout: float) -> None:
        self.rank, self.nranks = rank, nranks
        succ = peers[(rank + 1) % nranks]
        # Bound to our interface's address: a wrong FMC_BENCH_SOCKET_IFNAME sends the ring the wrong way.
        self.next = socket.create_connection((succ["address"], succ["port"]), timeout=timeout,
                                             source_address=(address, 0))
        self.next.sendall(struct.pack("!I", rank))
        listener.settimeout(timeout)
        self.prev, _ = listener.accept()
        self.prev.settimeout(timeout)
        hello = bytearray(4)
        recv_exactly(self.prev, memoryview(hello))
        pred = (rank - 1) % nranks
        if struct.unpack("!I", hello)[0] != pred:
            raise RuntimeError(f"ring: expected rank {pred} as predecessor, got {struct.unpack('!I', hello)[0]}")
        for s in (self.next, self.prev):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sender = ThreadPoolExecutor(max_workers=1)  # sends overlap receives: both directions stream

    def exchange(self, send: bytes | bytearray | memoryview, recv: memoryview) -> None:
        """Send `send` to the successor while filling `recv` from the predecessor."""
        pending = self.sender.submit(self.next.sendall, send)
        recv_exactly(self.prev, recv)
        pending.result()

    def close(self) -> None:
        self.sender.shutdown()
        self.next.close()
        self.prev.close()


class Link(Protocol):
    def exchange(self, send: bytes | bytearray | memoryview, recv: memoryview) -> None: ...


def bounds(nbytes: int, parts: int) -> list[tuple[int, int]]:
    """`parts` byte ranges of whole lanes covering `nbytes` (the first ones one lane longer when uneven)."""
    total = nbytes // LANE_BYTES
    cuts = [i * total // parts * LANE_BYTES for i in range(parts + 1)]
    return list(zip(cuts, cuts[1:]))


class Collectives:
    """The ring algorithms on bytearrays of uint32 lanes."""

    def __init__(self, ring: Link | None, rank: int, nranks: int, use_c: bool = True) -> None:
        self.ring, self.rank, self.n = ring, rank, nranks
        self.c_add = C_ADD if use_c else None
        self.adder = "audioop.add (C)" if self.c_add else "Python integers"
        self.masks: dict[int, int] = {}
        self.scratch: dict[tuple[str, int], memoryview] = {}  # reused: fresh pages per call cost page faults

    def _scratch(self, name: str, nbytes: int) -> memoryview:
        if (name, nbytes) not in self.scratch:
            self.scratch[(name, nbytes)] = memoryview(bytearray(nbytes))
        return self.scratch[(name, nbytes)]

    def _mask(self, nbytes: int) -> int:
        if nbytes not in self.masks:
            self.masks[nbytes] = lane_mask(nbytes)
        return self.masks[nbytes]

    def reduce_scatter(self, src: bytearray, chunks: list[tuple[int, int]], dest: memoryview) -> None:
        """Sum chunk `rank` of `src` over all ranks into `dest`. Reads src[chunk] before any write to `dest`
        that aliases it (the last step reads the own chunk, then writes it)."""
        n, r, s_view = self.n, self.rank, memoryview(src)
        if n == 1 or self.ring is None:
            dest[:] = s_view[chunks[0][0]:chunks[0][1]]
            return
        longest = max(b - a for a, b in chunks)
        scratch = self._scratch("reduce", longest)
        a, b = chunks[(r - 1) % n]
        outgoing: bytes | memoryview = s_view[a:b]
        for step in range(n - 1):
            a, b = chunks[(r - step - 2) % n]
            incoming = scratch[:b - a]
            self.ring.exchange(outgoing, incoming)
            if self.c_add:
                outgoing = self.c_add(incoming, s_view[a:b])  # saturates: repeated in-place runs stay bounded
                if step == n - 2:
                    dest[:] = outgoing
                continue
            total = int.from_bytes(incoming, "little") + int.from_bytes(s_view[a:b], "little")
            if step == n - 2:
                dest[:] = (total & self._mask(b - a)).to_bytes(b - a, "little")
            else:
                outgoing = total.to_bytes(b - a, "little")

    def all_gather(self, buf: bytearray, chunks: list[tuple[int, int]]) -> None:
        """Chunk `rank` of `buf` is this rank's; afterwards every chunk holds its owner's."""
        if self.ring is None:
            return
        n, r, view = self.n, self.rank, memoryview(buf)
        for step in range(n - 1):
            sa, sb = chunks[(r - step) % n]
            ra, rb = chunks[(r - step - 1) % n]
            self.ring.exchange(view[sa:sb], view[ra:rb])

    def all_reduce(self, buf: bytearray) -> None:
        chunks = bounds(len(buf), self.n)
        a, b = chunks[self.rank]
        self.reduce_scatter(buf, chunks, memoryview(buf)[a:b])
        self.all_gather(buf, chunks)

    def alltoall(self, src: bytearray, out: bytearray) -> None:
        """Chunk j of `src` goes to rank j, landing in chunk `rank` of its `out`. Along the ring: each rank
        passes on what is not for it, so the bundle shrinks by one chunk a hop."""
        n, r, c = self.n, self.rank, len(src) // self.n
        s_view = memoryview(src)
        out[r * c:(r + 1) * c] = s_view[r * c:(r + 1) * c]
        if self.ring is None or n == 1:
            return
        # bundle for ranks r+1, r+2, ..., r+n-1, in that order
        outgoing = self._scratch("alltoall-out", (n - 1) * c)
        outgoing[:(n - 1 - r) * c] = s_view[(r + 1) * c:]
        outgoing[(n - 1 - r) * c:] = s_view[:r * c]
        buffers = [self._scratch("alltoall-0", (n - 1) * c), self._scratch("alltoall-1", (n - 1) * c)]
        for hop in range(1, n):
            incoming = buffers[hop % 2][:(n - hop) * c]  # from rank r-hop: chunks for r, r+1, ..., r+n-1-hop
            self.ring.exchange(outgoing, incoming)
            origin = (r - hop) % n
            out[origin * c:(origin + 1) * c] = incoming[:c]
            outgoing = incoming[c:]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))
        self.nranks = int(os.environ.get("SLURM_NTASKS", os.environ.get("WORLD_SIZE", "1")))
        if not 0 <= self.rank < self.nranks <= MAX_RANKS:
            raise ValueError(f"rank {self.rank} of {self.nranks}: SLURM_PROCID must be below SLURM_NTASKS, and "
                             f"at most {MAX_RANKS} ranks fit the {LANE_TYPE} lanes' headroom")
        self.node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
        self.master = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = int(os.environ.get("MASTER_PORT", "29500"))
        forced = os.environ.get("FMC_BENCH_SOCKET_IFNAME")
        if forced:
            address = interface_address(forced)
            if address is None:
                # the verdict's bad_socket_interface reads this wording (gloo's and NCCL's)
                raise OSError(f"Unable to find address for: {forced} (FMC_BENCH_SOCKET_IFNAME names an interface "
                              "this node lacks or one without an IPv4 address)")
            self.iface, self.address = forced, address
        else:
            self.iface, self.address = local_route(self.master)
        self.info(f"Bootstrap : Using {self.iface}:{self.address}<0>")
        listener = socket.create_server((self.address, 0), backlog=4)
        try:
            self.control = Control(self.rank, self.nranks, self.master, port, args.timeout)
            me = {"rank": self.rank, "pid": os.getpid(), "node": self.node, "iface": self.iface,
                  "address": self.address, "port": listener.getsockname()[1]}
            self.peers: list[dict[str, Any]] = self.control.allgather(me)
            self.ring = Ring(self.rank, self.nranks, self.address, listener, self.peers, args.timeout) \
                if self.nranks > 1 else None
        finally:
            listener.close()
        self.coll = Collectives(self.ring, self.rank, self.nranks)
        self.info(f"NET/Socket : Using [0]{self.iface}:{self.address}<0>")
        self.info("Using network Socket")
        self.info(f"Reduction : uint32 lanes summed with {self.coll.adder}")

    def info(self, msg: str) -> None:
        print(f"{self.node}:{os.getpid()}:{threading.get_native_id()} [0] FMCTCP INFO {msg}", flush=True)

    def say(self, line: str) -> None:
        if self.rank == 0:
            print(line, flush=True)

    # -- the collectives, each returning (run, check) closures over preallocated buffers --------------
    def buffers(self, op: str, count: int) -> tuple[Callable[[bool], None], Callable[[], int]]:
        """`count` lanes per rank (all_reduce: the whole buffer; others: one rank's chunk)."""
        coll, n, r, nbytes = self.coll, self.nranks, self.rank, count * LANE_BYTES
        if op == "all_reduce":
            inp, out = bytearray(lanes(r + 1, count)), bytearray(nbytes)

            def run(in_place: bool) -> None:
                if in_place:
                    coll.all_reduce(inp)
                else:
                    out[:] = inp
                    coll.all_reduce(out)

            def check() -> int:
                inp[:] = lanes(r + 1, count)
                coll.all_reduce(inp)
                return wrong_lanes(inp, lanes(n * (n + 1) // 2, count))
        elif op == "all_gather":
            inp, out = bytearray(lanes(r + 1, count)), bytearray(nbytes * n)
            chunks = bounds(nbytes * n, n)

            def run(in_place: bool) -> None:
                if not in_place:
                    out[r * nbytes:(r + 1) * nbytes] = inp
                coll.all_gather(out, chunks)

            def check() -> int:
                out[:] = bytes(nbytes * n)
                out[r * nbytes:(r + 1) * nbytes] = lanes(r + 1, count)
                coll.all_gather(out, chunks)
                return wrong_lanes(out, b"".join(lanes(j + 1, count) for j in range(n)))
        elif op == "reduce_scatter":
            inp, out = bytearray(lanes(r + 1, count * n)), bytearray(nbytes)
            chunks = bounds(nbytes * n, n)

            def run(in_place: bool) -> None:
                dest = memoryview(inp)[r * nbytes:(r + 1) * nbytes] if in_place else memoryview(out)
                coll.reduce_scatter(inp, chunks, dest)

            def check() -> int:
                inp[:] = lanes(r + 1, count * n)
                coll.reduce_scatter(inp, chunks, memoryview(out))
                return wrong_lanes(out, lanes(n * (n + 1) // 2, count))
        else:  # alltoall: in place too writes a separate buffer, as the gloo bench did
            inp, out = bytearray(nbytes * n), bytearray(nbytes * n)

            def fill() -> None:
                inp[:] = b"".join(lanes(j + 100 * r, count) for j in range(n))

            fill()

            def run(in_place: bool) -> None:
                coll.alltoall(inp, out)

            def check() -> int:
                fill()
                coll.alltoall(inp, out)
                return wrong_lanes(out, b"".join(lanes(100 * j + r, count) for j in range(n)))
        return run, check

    def timed(self, run: Callable[[bool], None], in_place: bool) -> float:
        for _ in range(self.args.warmup_iters):
            run(in_place)
        self.control.allgather(None)  # barrier
        start = time.perf_counter()
        for _ in range(self.args.iters):
            run(in_place)
        elapsed = (time.perf_counter() - start) / self.args.iters
        return max(float(t) for t in self.control.allgather(elapsed)) * 1e6

    def sizes(self) -> list[int]:
        out, size = [], self.args.minbytes
        while size <= self.args.maxbytes:
            out.append(size)
            size *= self.args.stepfactor
        return out

    def header(self) -> None:
        a, op = self.args, self.args.op
        self.say(f"# fmcluster cpu-bench version {VERSION} (nccl-tests output format; TCP ring, no GPU)")
        self.say(f"# Using {TRANSPORT}")
        self.say(f"# Collective test starting: {op}_perf")
        self.say(f"# nThread 1 nGpus 0 minBytes {a.minbytes} maxBytes {a.maxbytes} step: {a.stepfactor}(factor) "
                 f"warmup iters: {a.warmup_iters} iters: {a.iters} agg iters: 1 validation: {a.check} graph: 0")
        self.say("#")
        self.say("# Using devices")
        for p in self.peers:
            self.say(f"#  Rank {p['rank']:2d} Group  0 Pid {p['pid']:6d} on {p['node']:>10} device  0 [cpu] "
                     f"{p['iface']} {p['address']}")
        ring = " ".join(f"{r:3d}" for r in range(self.nranks))
        if self.rank == 0:
            self.info(f"Channel 00/01 : {ring}")
            self.info("1 coll channels, 0 collnet channels, 0 nvls channels, 1 p2p channels, 1 p2p channels per peer")
        nxt = (self.rank + 1) % self.nranks
        self.info(f"Channel 00/0 : {self.rank}[0] -> {nxt}[0] [send] via NET/Socket/0")
        self.info(f"comm 0x0 rank {self.rank} nranks {self.nranks} cudaDev -1 - Init COMPLETE")
        self.control.allgather(None)
        self.say("#")
        self.say("#                                                              out-of-place                       in-place          ")
        self.say("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong")
        self.say("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)       ")

    def run(self) -> int:
        op, n = self.args.op, self.nranks
        self.header()
        factor = bus_factor(op, n)
        busbws: list[float] = []
        wrong_rows = 0
        for size in self.sizes():
            per_rank = size // LANE_BYTES // (1 if op == "all_reduce" else n)
            if per_rank == 0:
                continue
            run, check = self.buffers(op, per_rank)
            cells = []
            for in_place in (False, True):
                t_us = self.timed(run, in_place)
                wrong = sum(int(w) for w in self.control.allgather(check())) if self.args.check else None
                algbw = size / t_us / 1e3
                busbw = algbw * factor
                busbws.append(busbw)
                wrong_rows += 1 if wrong else 0
                time_fmt = f"{t_us:8.2f}" if t_us < 1e5 else f"{t_us:8.0f}"
                cells.append(f"{time_fmt}  {algbw:6.2f}  {busbw:6.2f}  {'N/A' if wrong is None else wrong:>6}")
            count = size // LANE_BYTES if op in ("all_reduce", "alltoall") else per_rank
            redop = "sum" if op in ("all_reduce", "reduce_scatter") else "none"
            self.say(f"{size:12d}  {count:12d}  {LANE_TYPE:>8}  {redop:>6}  {-1:6d}  {cells[0]}  {cells[1]}")
        self.say(f"# Out of bounds values : {wrong_rows} {'OK' if wrong_rows == 0 else 'FAILED'}")
        self.say(f"# Avg bus bandwidth    : {sum(busbws) / max(len(busbws), 1):.4f} ")
        self.say("#")
        self.say(f"# Collective test concluded: {op}_perf")
        self.say("#")
        self.control.allgather(None)  # nobody closes its sockets while a peer still reads
        if self.ring:
            self.ring.close()
        self.control.close()
        return ExitCode.OK if wrong_rows == 0 else ExitCode.FAILED


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fmcluster-cpu-bench", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--op", choices=OPS, default="all_reduce")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("1M"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("16M"))
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=5)
    p.add_argument("-w", "--warmup_iters", type=int, default=2)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("-T", "--timeout", type=int, default=120, help="seconds before a stuck collective fails")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.stepfactor < 2 or args.minbytes > args.maxbytes:
        print("Error: -f must be >= 2 and -b <= -e", file=sys.stderr)
        return ExitCode.INVALID
    try:
        return Bench(args).run()
    except Exception as err:  # a benchmark reports, it does not hide: one line the parser reads
        print(f"{type(err).__name__}: {err}".splitlines()[0], flush=True)
        return ExitCode.FAILED  # the run failed (not "not ready": the one table's meaning, fmcluster.exits)


if __name__ == "__main__":
    raise SystemExit(main())
