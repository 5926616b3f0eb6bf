"""The CPU bench's arithmetic and ring algorithms, in one process: uint32 lanes summed as big integers, and
all_reduce, all_gather, reduce_scatter and alltoall over socketpairs between threads (no Slurm, no ports)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fmcluster.acceptance.bench import (C_ADD, LANE_BYTES, MAX_RANKS, VALUE_BITS, Collectives, add_lanes,
                                        bounds, lane_mask, lanes, recv_exactly, wrong_lanes)

ADDERS = [pytest.param(False, id="python-integers"),
          pytest.param(True, id="audioop", marks=pytest.mark.skipif(C_ADD is None, reason="no audioop here"))]


def as_ints(data: bytes | bytearray | memoryview) -> list[int]:
    raw = bytes(data)
    return [int.from_bytes(raw[i:i + LANE_BYTES], "little") for i in range(0, len(raw), LANE_BYTES)]


def pack(values: list[int]) -> bytes:
    return b"".join(v.to_bytes(LANE_BYTES, "little") for v in values)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, (1 << VALUE_BITS) - 1), min_size=7, max_size=7), min_size=1, max_size=8))
def test_adding_whole_buffers_is_a_lane_wise_sum_on_both_paths(rows: list[list[int]]) -> None:
    for add in [add_lanes] + ([C_ADD] if C_ADD else []):
        total = pack(rows[0])
        for row in rows[1:]:
            total = add(total, pack(row))
        assert as_ints(total) == [sum(col) for col in zip(*rows)]


def test_the_headroom_holds_for_the_most_ranks_allowed() -> None:
    """MAX_RANKS values at the top of their range still sum inside a lane: no carry into the next lane."""
    top = pack([(1 << VALUE_BITS) - 1, 0, (1 << VALUE_BITS) - 1])
    for add in [add_lanes] + ([C_ADD] if C_ADD else []):
        total = top
        for _ in range(MAX_RANKS - 1):
            total = add(total, top)
        assert as_ints(total) == [MAX_RANKS * ((1 << VALUE_BITS) - 1), 0, MAX_RANKS * ((1 << VALUE_BITS) - 1)]
    assert MAX_RANKS == 256 and MAX_RANKS * ((1 << VALUE_BITS) - 1) < 1 << (8 * LANE_BYTES - 1)


def test_the_mask_keeps_each_lane_below_the_value_bound() -> None:
    big = pack([(1 << 32) - 1, 1 << VALUE_BITS, 5])
    kept = (int.from_bytes(big, "little") & lane_mask(len(big))).to_bytes(len(big), "little")
    assert as_ints(kept) == [(1 << VALUE_BITS) - 1, 0, 5]


def test_wrong_lanes_counts_lanes_not_bytes() -> None:
    assert wrong_lanes(lanes(6, 5), lanes(6, 5)) == 0
    assert wrong_lanes(pack([6, 6, 0x0606, 7]), lanes(6, 4)) == 2


def test_bounds_cover_the_buffer_in_whole_lanes() -> None:
    assert bounds(40, 3) == [(0, 12), (12, 24), (24, 40)]
    assert bounds(8, 3) == [(0, 0), (0, 4), (4, 8)]  # fewer lanes than ranks: some chunks are empty


class PairLink:
    """A ring link over socketpairs: sends on `nxt`, receives on `prev`, a thread for the send."""

    def __init__(self, nxt: socket.socket, prev: socket.socket) -> None:
        self.nxt, self.prev = nxt, prev

    def exchange(self, send: bytes | bytearray | memoryview, recv: memoryview) -> None:
        sender = threading.Thread(target=self.nxt.sendall, args=(send,))
        sender.start()
        recv_exactly(self.prev, recv)
        sender.join()


def on_ring(n: int, body: Callable[[Collectives, int], object], use_c: bool = False) -> list[object]:
    pairs = [socket.socketpair() for _ in range(n)]  # pairs[r]: r -> r+1
    results: list[object] = [None] * n
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            link = PairLink(pairs[r][0], pairs[(r - 1) % n][1]) if n > 1 else None
            results[r] = body(Collectives(link, r, n, use_c=use_c), r)
        except BaseException as err:  # noqa: BLE001 - reraised below, in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for a, b in pairs:
        a.close()
        b.close()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("use_c", ADDERS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("count", [1, 7, 300])
def test_the_ring_collectives_give_the_exact_results(n: int, count: int, use_c: bool) -> None:
    def all_reduce(c: Collectives, r: int) -> list[int]:
        buf = bytearray(pack([r * 1000 + i for i in range(count)]))
        c.all_reduce(buf)
        return as_ints(buf)

    assert on_ring(n, all_reduce, use_c) == [[sum(r * 1000 + i for r in range(n)) for i in range(count)]] * n

    def all_gather(c: Collectives, r: int) -> list[int]:
        buf = bytearray(count * LANE_BYTES * n)
        buf[r * count * LANE_BYTES:(r + 1) * count * LANE_BYTES] = pack([r * 10 + i for i in range(count)])
        c.all_gather(buf, bounds(len(buf), n))
        return as_ints(buf)

    assert on_ring(n, all_gather) == [[j * 10 + i for j in range(n) for i in range(count)]] * n

    def reduce_scatter(c: Collectives, r: int) -> list[int]:
        src = bytearray(pack([r + 3 * i for i in range(count * n)]))
        out = bytearray(count * LANE_BYTES)
        c.reduce_scatter(src, bounds(len(src), n), memoryview(out))
        return as_ints(out)

    assert on_ring(n, reduce_scatter, use_c) == [[sum(q + 3 * (r * count + i) for q in range(n)) for i in range(count)]
                                          for r in range(n)]

    def alltoall(c: Collectives, r: int) -> list[int]:
        src = bytearray(pack([100 * r + j for j in range(n) for _ in range(count)]))
        out = bytearray(len(src))
        c.alltoall(src, out)
        return as_ints(out)

    assert on_ring(n, alltoall) == [[100 * j + r for j in range(n) for _ in range(count)] for r in range(n)]


@pytest.mark.parametrize("use_c", ADDERS)
def test_repeated_in_place_all_reduce_stays_within_the_lanes(use_c: bool) -> None:
    """Timed runs reduce the same buffer again and again: kept modulo 2**23 or saturated, never overflowing."""
    def many(c: Collectives, r: int) -> list[int]:
        buf = bytearray(lanes((1 << VALUE_BITS) - 1 - r, 12))
        for _ in range(20):
            c.all_reduce(buf)
        return as_ints(buf)

    results = on_ring(4, many, use_c)
    first = results[0]
    assert isinstance(first, list) and results == [first] * 4
    assert all(v < (1 << 31 if use_c else 1 << VALUE_BITS) for v in first)
