"""Memory (and time) of `fmcluster.acceptance.parser.parse_file` on the logs that used to blow it up.

    .venv/bin/python benchmarks/acceptance_parse_memory.py [--size-mb 200] [--line-mb 20] [--rev 4aaf608]

Writes three logs to a temporary directory: a healthy 2-node p5 nccl-tests run buried in SIZE_MB of NCCL
INFO lines (what NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=ALL produces on a big job), and the same run with
one LINE_MB line in it, either a progress bar redrawn with carriage returns or size rows run together
without newlines (the worst case for a parser that splits a line into tokens). Each is parsed in a
fresh process, twice: once for peak RSS (ru_maxrss, the whole interpreter included, and its growth over
the RSS after imports) and wall time, once under tracemalloc for the peak of Python allocations. `--rev`
also measures the parser of an older commit (extracted with `git archive`) for comparison.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "tests" / "fixtures" / "nccl" / "p5_2node_all_reduce_ok.log"
INFO = [
    "p5-st-p5-{h}:{pid}:{tid} [{d}] NCCL INFO Channel {c:02d}/0 : {r}[{d}] -> {n}[{d}] via P2P/CUMEM/read",
    "p5-st-p5-{h}:{pid}:{tid} [{d}] NCCL INFO NET/OFI Registering memory with MR cache (size {s}, ptr 0x7f{pid}00)",
    "p5-st-p5-{h}:{pid}:{tid} [{d}] NCCL INFO AllReduce: opCount {c:x} sendbuff 0x7f3a{s:x} recvbuff 0x7f3b{s:x} "
    "count {s} datatype 7 op 0 root 0 comm 0x55d0c8a1e2b0 [nranks=16] stream 0x55d0c9",
    "p5-st-p5-{h}:{pid}:{tid} [{d}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
]


def write_info_log(path: Path, size_mb: int) -> None:
    """The healthy run's header and INFO lines, then size_mb of INFO lines, then its table and footer."""
    lines = HEALTHY.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if line.startswith("#       size"))
    target = size_mb << 20
    with path.open("w") as f:
        f.writelines(lines[:cut - 2])
        written, i = 0, 0
        block: list[str] = []
        while written < target:
            h, d = 1 + i % 2, i % 8
            line = INFO[i % len(INFO)].format(h=h, d=d, pid=41230 + d, tid=41241 + d, c=i % 32, r=i % 16,
                                             n=(i + 1) % 16, s=4096 * (1 + i % 4096)) + "\n"
            block.append(line)
            written += len(line)
            i += 1
            if len(block) == 10_000:
                f.writelines(block)
                block.clear()
        f.writelines(block)
        f.writelines(lines[cut - 2:])


def write_long_line_log(path: Path, line_mb: int, tokens: bool) -> None:
    """The healthy run with one line_mb line in it: a progress bar redrawn with carriage returns, or (tokens)
    size rows run together without newlines, the worst case for a parser that splits lines into tokens."""
    lines = HEALTHY.read_text().splitlines(keepends=True)
    rows = [line.rstrip("\n") for line in lines if line.strip()[:1].isdigit()]
    with path.open("w") as f:
        f.writelines(lines[:40])
        written, i = 0, 0
        while written < line_mb << 20:
            piece = f"{rows[i % len(rows)]} " if tokens else "\r[" + "#" * 62 + "]"
            f.write(piece)
            written += len(piece)
            i += 1
        f.write("\n")
        f.writelines(lines[40:])


def worker(log: Path, trace: bool) -> None:
    """Runs in its own process: parse `log` and print figures as one JSON line."""
    import tracemalloc

    from fmcluster.acceptance.parser import parse_file

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    parsed = parse_file(log)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if trace else None
    print(json.dumps({
        "rss_before_kib": rss_before, "rss_peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "seconds": seconds, "tracemalloc_peak": peak, "rows": len(parsed.rows),
        "long_lines": getattr(parsed, "long_lines", None), "completed": parsed.completed,
    }))


def measure(src: Path, log: Path, trace: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    argv = [sys.executable, __file__, "--worker", str(log)] + (["--trace"] if trace else [])
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def source_at(rev: str, into: Path) -> Path:
    archive = into / "src.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / rev, filter="data")
    return into / rev / "src"


def report(label: str, src: Path, logs: list[tuple[str, Path]]) -> None:
    print(f"\nparser: {label}")
    print(f"  {'log':<40} {'file MiB':>9} {'RSS after import':>17} {'peak RSS':>9} {'growth':>8} "
          f"{'tracemalloc peak':>17} {'seconds':>8}  rows")
    for name, log in logs:
        plain = measure(src, log, trace=False)
        traced = measure(src, log, trace=True)
        mib = 1 / 1024
        print(f"  {name:<40} {log.stat().st_size / (1 << 20):9.1f} {plain['rss_before_kib'] * mib:14.1f} MiB "
              f"{plain['rss_peak_kib'] * mib:6.1f} MiB {(plain['rss_peak_kib'] - plain['rss_before_kib']) * mib:5.1f} MiB "
              f"{traced['tracemalloc_peak'] / (1 << 20):14.2f} MiB {plain['seconds']:8.1f}  {plain['rows']}"
              f"{'' if plain['completed'] else ' (incomplete)'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=200)
    p.add_argument("--line-mb", type=int, default=20)
    p.add_argument("--rev", help="also measure the parser at this git revision (e.g. the one before issue 15)")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.trace)
        return 0
    with tempfile.TemporaryDirectory(prefix="fmc-parse-bench-") as tmp:
        base = Path(tmp)
        info_log, bar_log, row_log = base / "info.log", base / "long-bar.log", base / "long-rows.log"
        started = time.monotonic()
        write_info_log(info_log, args.size_mb)
        write_long_line_log(bar_log, args.line_mb, tokens=False)
        write_long_line_log(row_log, args.line_mb, tokens=True)
        print(f"wrote {info_log.stat().st_size / (1 << 20):.0f} MiB of INFO lines around a healthy 2-node p5 run, and "
              f"the run with one {args.line_mb} MiB line (twice) in {time.monotonic() - started:.0f} s")
        logs = [(f"{args.size_mb} MB of NCCL INFO lines", info_log),
                (f"one {args.line_mb} MB line: progress bar", bar_log),
                (f"one {args.line_mb} MB line: rows, no newlines", row_log)]
        report("this checkout", ROOT / "src", logs)
        if args.rev:
            report(f"git {args.rev}", source_at(args.rev, base), logs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
