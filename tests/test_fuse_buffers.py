"""The mount's pool of large buffers: reused only once nothing refers to them."""

from __future__ import annotations

import numpy as np
from irdma_fuse.buffers import BufferPool
from irdma_fuse.files import FileBuffer

from irdma import SharedRegion

MIB = 1 << 20


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_small_buffers_are_not_kept() -> None:
    pool = BufferPool(min_size=4 * MIB)
    a = pool.take(MIB)
    assert len(a) == MIB and a.dtype == np.uint8
    assert pool.held == 0


def test_a_buffer_comes_back_once_nothing_refers_to_it() -> None:
    pool = BufferPool(min_size=MIB)
    a = pool.take(8 * MIB)
    first = address(a)
    b = pool.take(8 * MIB)  # a is in use: another array
    assert address(b) != first and pool.held == 16 * MIB
    del b
    view = memoryview(a[MIB:])  # anything derived from it keeps it in use
    del a
    c = pool.take(8 * MIB)
    assert address(c) != first
    del view
    d = pool.take(6 * MIB)  # free again: the same memory, for a request of up to its size
    assert address(d) == first and len(d) == 6 * MIB
    assert pool.held == 16 * MIB


def test_a_buffer_more_than_twice_the_size_asked_is_not_used() -> None:
    pool = BufferPool(min_size=MIB)
    big = pool.take(32 * MIB)
    big_at = address(big)
    del big
    small = pool.take(8 * MIB)
    assert address(small) != big_at
    assert pool.held == 40 * MIB


def test_trim_lets_go_of_idle_buffers_and_keeps_to_the_budget() -> None:
    pool = BufferPool(min_size=MIB, budget=12 * MIB, idle=30.0)
    kept = [pool.take(8 * MIB) for _ in range(3)]
    pool.trim()
    assert pool.held == 24 * MIB  # all in use: none let go
    del kept[0]
    pool.trim()
    assert pool.held == 24 * MIB  # one free: within the budget and not idle
    del kept[0]
    pool.trim()
    assert pool.held == 16 * MIB  # 16 MiB free, over the budget: the oldest free one goes
    pool.trim(now=10**9)  # long after: the free one is idle
    assert pool.held == 8 * MIB
    assert len(kept) == 1  # the one in use stays


def test_with_a_shared_region_writers_buffers_come_from_it() -> None:
    region = SharedRegion(32 * MIB)
    pool = BufferPool(min_size=MIB, shared=region)
    a = pool.take(8 * MIB, shared=True)
    assert pool.holds_shared(a) and region.offset_of(a) is not None
    assert not pool.holds_shared(pool.take(8 * MIB))  # a reader's: ordinary memory
    assert not pool.holds_shared(pool.take(MIB // 2, shared=True))  # small: ordinary memory
    b = pool.take(30 * MIB, shared=True)  # no room left in the region: ordinary memory
    assert not pool.holds_shared(b) and len(b) == 30 * MIB
    assert FileBuffer(capacity=8 * MIB, pool=pool).shared
    del a
    c = pool.take(8 * MIB)  # the free shared one is kept for writers
    assert not pool.holds_shared(c)


def test_a_shared_buffer_a_failed_push_may_read_is_not_reused() -> None:
    region = SharedRegion(32 * MIB)
    pool = BufferPool(min_size=MIB, shared=region)
    a = pool.take(8 * MIB, shared=True)
    first = address(a)
    region.doubt(region.offset_of(a) + 5)
    del a
    b = pool.take(8 * MIB, shared=True)
    assert address(b) != first and pool.holds_shared(b)
    assert pool.held == 8 * MIB  # the one in doubt is let go, its room kept back
