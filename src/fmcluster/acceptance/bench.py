"""CPU collective-bandwidth benchmark with nccl-tests' output format: the local stand-in for nccl-tests.

Runs one rank per Slurm task with torch.distributed's gloo backend over TCP, measures all_reduce,
all_gather, reduce_scatter or alltoall over a range of sizes, checks every result, and prints the same
header, size table (size, count, type, redop, root, time, algbw, busbw, #wrong, out-of-place and
in-place) and footer (`# Out of bounds values`, `# Avg bus bandwidth`) as nccl-tests, plus INFO lines in
NCCL's shape for the network it used (tagged `GLOO`, never `NCCL`: nothing here pretends to be NCCL).
The same parser and verdict then judge it. busbw uses nccl-tests' factors (all_reduce 2(n-1)/n, the
others (n-1)/n), so figures compare across node counts the same way.

Out-of-place means the collective writes a separate output buffer (for all_reduce: input copied to the
output, then reduced there); in-place reuses the input buffer.

Run under Slurm (`srun python -m fmcluster.acceptance.bench -b 1M -e 16M`): rank and size come from
SLURM_PROCID/SLURM_NTASKS, the rendezvous from MASTER_ADDR/MASTER_PORT. The interface is the one that
routes to MASTER_ADDR unless FMC_BENCH_SOCKET_IFNAME names one (the knob the broken-fabric test turns).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from datetime import timedelta

VERSION = "0.1.0"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
FLOAT_BYTES = 4


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


def local_route(master: str) -> tuple[str, str]:
    """(interface, address) this node uses to reach `master`, from the kernel's routing table."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((master, 9))
        address = probe.getsockname()[0]
    finally:
        probe.close()
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == address:
            return fields[1], address
    return "?", address


def interface_address(iface: str) -> str:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", iface], capture_output=True, text=True,
                         check=False).stdout.split()
    return out[3].split("/")[0] if len(out) > 3 else "?"


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.args = torch, dist, args
        self.rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))
        self.nranks = int(os.environ.get("SLURM_NTASKS", os.environ.get("WORLD_SIZE", "1")))
        self.node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
        self.master = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = int(os.environ.get("MASTER_PORT", "29500"))
        forced = os.environ.get("FMC_BENCH_SOCKET_IFNAME")
        if forced:
            self.iface, self.address = forced, interface_address(forced)
        else:
            self.iface, self.address = local_route(self.master)
        os.environ["GLOO_SOCKET_IFNAME"] = self.iface
        self.info(f"Bootstrap : Using {self.iface}:{self.address}<0>")
        dist.init_process_group("gloo", init_method=f"tcp://{self.master}:{port}", rank=self.rank,
                                world_size=self.nranks, timeout=timedelta(seconds=args.timeout))
        self.info(f"NET/Socket : Using [0]{self.iface}:{self.address}<0>")
        self.info("Using network Socket")

    def info(self, msg: str) -> None:
        print(f"{self.node}:{os.getpid()}:{threading.get_native_id()} [0] GLOO INFO {msg}", flush=True)

    def say(self, line: str) -> None:
        if self.rank == 0:
            print(line, flush=True)

    # -- the collectives, each returning (run, check) closures over preallocated buffers --------------
    def buffers(self, op: str, count: int) -> tuple[Callable[[bool], None], Callable[[], int]]:
        torch, dist, n, r = self.torch, self.dist, self.nranks, self.rank
        if op == "all_reduce":
            inp, out = torch.empty(count), torch.empty(count)

            def run(in_place: bool) -> None:
                if in_place:
                    dist.all_reduce(inp)
                else:
                    out.copy_(inp)
                    dist.all_reduce(out)

            def check() -> int:
                inp.fill_(r + 1)
                dist.all_reduce(inp)
                return int((inp != n * (n + 1) / 2).sum())
        elif op == "all_gather":
            inp, out = torch.empty(count), torch.empty(count * n)

            def run(in_place: bool) -> None:
                src = out[r * count:(r + 1) * count] if in_place else inp
                dist.all_gather_into_tensor(out, src)

            def check() -> int:
                inp.fill_(r + 1)
                dist.all_gather_into_tensor(out, inp)
                expected = torch.arange(1, n + 1, dtype=out.dtype).repeat_interleave(count)
                return int((out != expected).sum())
        elif op == "reduce_scatter":
            inp, out = torch.empty(count * n), torch.empty(count)

            def run(in_place: bool) -> None:
                dist.reduce_scatter_tensor(inp[r * count:(r + 1) * count] if in_place else out, inp)

            def check() -> int:
                inp.fill_(r + 1)
                dist.reduce_scatter_tensor(out, inp)
                return int((out != n * (n + 1) / 2).sum())
        else:  # alltoall
            inp, out = torch.empty(count * n), torch.empty(count * n)

            def run(in_place: bool) -> None:
                dist.all_to_all_single(out, inp)

            def check() -> int:
                inp.copy_(torch.arange(n, dtype=inp.dtype).repeat_interleave(count) + 100 * r)
                dist.all_to_all_single(out, inp)
                expected = torch.arange(n, dtype=out.dtype).repeat_interleave(count) * 100 + r
                return int((out != expected).sum())
        return run, check

    def timed(self, run: Callable[[bool], None], in_place: bool) -> float:
        for _ in range(self.args.warmup_iters):
            run(in_place)
        self.dist.barrier()
        start = time.perf_counter()
        for _ in range(self.args.iters):
            run(in_place)
        elapsed = self.torch.tensor([(time.perf_counter() - start) / self.args.iters])
        self.dist.all_reduce(elapsed, op=self.dist.ReduceOp.MAX)
        return float(elapsed.item()) * 1e6

    def sizes(self) -> list[int]:
        out, size = [], self.args.minbytes
        while size <= self.args.maxbytes:
            out.append(size)
            size *= self.args.stepfactor
        return out

    def gather_identities(self, width: int = 160) -> list[list[str]]:
        """Every rank's (rank, pid, node, interface, address), via a byte tensor (no numpy/pickle needed)."""
        torch = self.torch
        mine = f"{self.rank} {os.getpid()} {self.node} {self.iface} {self.address}".encode()[:width]
        buf = torch.zeros(width, dtype=torch.uint8)
        buf[: len(mine)] = torch.tensor(list(mine), dtype=torch.uint8)
        everyone = torch.zeros(width * self.nranks, dtype=torch.uint8)
        self.dist.all_gather_into_tensor(everyone, buf)
        raw = bytes(everyone.tolist())
        return [raw[i * width:(i + 1) * width].rstrip(b"\0").decode().split() for i in range(self.nranks)]

    def header(self) -> None:
        a, op = self.args, self.args.op
        self.say(f"# fmcluster cpu-bench version {VERSION} (nccl-tests output format; gloo over TCP, no GPU)")
        self.say(f"# Using gloo (torch {self.torch.__version__})")
        self.say(f"# Collective test starting: {op}_perf")
        self.say(f"# nThread 1 nGpus 0 minBytes {a.minbytes} maxBytes {a.maxbytes} step: {a.stepfactor}(factor) "
                 f"warmup iters: {a.warmup_iters} iters: {a.iters} agg iters: 1 validation: {a.check} graph: 0")
        self.say("#")
        self.say("# Using devices")
        for rank, pid, node, iface, address in self.gather_identities():
            self.say(f"#  Rank {int(rank):2d} Group  0 Pid {int(pid):6d} on {node:>10} device  0 [cpu] {iface} {address}")
        ring = " ".join(f"{r:3d}" for r in range(self.nranks))
        if self.rank == 0:
            self.info(f"Channel 00/01 : {ring}")
            self.info("1 coll channels, 0 collnet channels, 0 nvls channels, 1 p2p channels, 1 p2p channels per peer")
        nxt = (self.rank + 1) % self.nranks
        self.info(f"Channel 00/0 : {self.rank}[0] -> {nxt}[0] [send] via NET/Socket/0")
        self.info(f"comm 0x0 rank {self.rank} nranks {self.nranks} cudaDev -1 - Init COMPLETE")
        self.dist.barrier()
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
            per_rank = size // FLOAT_BYTES // (1 if op == "all_reduce" else n)
            if per_rank == 0:
                continue
            run, check = self.buffers(op, per_rank)
            cells = []
            for in_place in (False, True):
                t_us = self.timed(run, in_place)
                wrong = check() if self.args.check else None
                if wrong is not None:
                    total = self.torch.tensor([wrong])
                    self.dist.all_reduce(total)
                    wrong = int(total.item())
                algbw = size / t_us / 1e3
                busbw = algbw * factor
                busbws.append(busbw)
                wrong_rows += 1 if wrong else 0
                time_fmt = f"{t_us:8.2f}" if t_us < 1e5 else f"{t_us:8.0f}"
                cells.append(f"{time_fmt}  {algbw:6.2f}  {busbw:6.2f}  {'N/A' if wrong is None else wrong:>6}")
            count = size // FLOAT_BYTES if op in ("all_reduce", "alltoall") else per_rank
            redop = "sum" if op in ("all_reduce", "reduce_scatter") else "none"
            self.say(f"{size:12d}  {count:12d}  {'float':>8}  {redop:>6}  {-1:6d}  {cells[0]}  {cells[1]}")
        self.say(f"# Out of bounds values : {wrong_rows} {'OK' if wrong_rows == 0 else 'FAILED'}")
        self.say(f"# Avg bus bandwidth    : {sum(busbws) / max(len(busbws), 1):.4f} ")
        self.say("#")
        self.say(f"# Collective test concluded: {op}_perf")
        self.say("#")
        self.dist.destroy_process_group()
        return 0 if wrong_rows == 0 else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fmcluster-cpu-bench", description=__doc__.split("\n\n")[0])
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
    warnings.filterwarnings("ignore")
    args = parser().parse_args(argv)
    if args.stepfactor < 2 or args.minbytes > args.maxbytes:
        print("Error: -f must be >= 2 and -b <= -e", file=sys.stderr)
        return 2
    try:
        return Bench(args).run()
    except Exception as err:  # a benchmark reports, it does not hide: one line the parser reads
        print(f"{type(err).__name__}: {err}".splitlines()[0], flush=True)
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
