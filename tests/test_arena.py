"""Tests for irdma_psd.arena: the page-aligned allocator and the memfd arena."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from irdma_psd.arena import PAGE, Allocator, Arena, ArenaFullError, Block, round_up
from irdma_psd.loans import LOAN_BYTES

from irdma.protocol.directory import directory_bytes, slots_for

from .helpers.stores import open_arena

# -- round_up ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "to", "expected"),
    [(0, PAGE, 0), (1, PAGE, PAGE), (PAGE, PAGE, PAGE), (PAGE + 1, PAGE, 2 * PAGE), (5, 4, 8)],
)
def test_round_up(n: int, to: int, expected: int) -> None:
    assert round_up(n, to) == expected


# -- Allocator ---------------------------------------------------------------


@pytest.mark.parametrize("capacity", [0, -PAGE, 100, PAGE + 1])
def test_allocator_bad_capacity(capacity: int) -> None:
    with pytest.raises(ValueError, match="capacity"):
        Allocator(capacity)


def test_allocator_alignment_and_accounting() -> None:
    a = Allocator(64 * PAGE)
    expected_used = 0
    offsets = []
    for n in [1, PAGE, PAGE + 1, 0, 3 * PAGE - 7, 12345]:
        off = a.alloc(n)
        assert off % PAGE == 0
        offsets.append(off)
        expected_used += round_up(max(n, 1))
        assert a.used == expected_used
        assert a.free_bytes == a.capacity - expected_used
    # First fit on a fresh allocator hands out extents back to back.
    sizes = [round_up(max(n, 1)) for n in [1, PAGE, PAGE + 1, 0, 3 * PAGE - 7, 12345]]
    assert offsets == [sum(sizes[:i]) for i in range(len(sizes))]


def test_allocator_custom_alignment() -> None:
    a = Allocator(1024, align=64)
    assert a.alloc(1) == 0
    assert a.alloc(65) == 64
    assert a.alloc(64) == 192
    assert a.used == 256


def test_allocator_reuses_freed_space() -> None:
    a = Allocator(16 * PAGE)
    x = a.alloc(2 * PAGE)
    y = a.alloc(PAGE)
    a.alloc(PAGE)
    a.free(x, 2 * PAGE)
    assert a.alloc(2 * PAGE) == x
    a.free(y, PAGE)
    assert a.alloc(PAGE) == y
    assert a.used == 4 * PAGE


def test_allocator_first_fit_picks_lowest_hole() -> None:
    a = Allocator(16 * PAGE)
    offs = [a.alloc(PAGE) for _ in range(6)]
    a.free(offs[1], PAGE)
    a.free(offs[4], PAGE)
    assert a.alloc(PAGE) == offs[1]
    assert a.alloc(PAGE) == offs[4]


def test_allocator_coalesces_neighbours() -> None:
    a = Allocator(4 * PAGE)
    offs = [a.alloc(PAGE) for _ in range(4)]
    assert a.free_bytes == 0
    # Free two neighbours: a two-page request then fits exactly there.
    a.free(offs[1], PAGE)
    a.free(offs[2], PAGE)
    assert a.largest_free == 2 * PAGE
    assert a.alloc(2 * PAGE) == offs[1]
    # Free in the order middle-last so both sides merge.
    a.free(offs[0], PAGE)
    a.free(offs[3], PAGE)
    a.free(offs[1], 2 * PAGE)
    assert a.used == 0
    assert a.largest_free == 4 * PAGE
    assert a.alloc(4 * PAGE) == 0


def test_allocator_merge_with_following_extent_only() -> None:
    a = Allocator(3 * PAGE)
    x = a.alloc(PAGE)
    y = a.alloc(PAGE)
    a.alloc(PAGE)
    a.free(y, PAGE)
    a.free(x, PAGE)  # merges with y's extent that follows it
    assert a.largest_free == 2 * PAGE
    assert a.alloc(2 * PAGE) == 0


def test_allocator_exhaustion_leaves_used_unchanged() -> None:
    a = Allocator(8 * PAGE)
    offs = [a.alloc(PAGE) for _ in range(8)]
    with pytest.raises(ArenaFullError, match="no free extent"):
        a.alloc(1)
    assert a.used == 8 * PAGE
    # Fragmented: three pages free in total but no two contiguous.
    for off in offs[0:6:2]:
        a.free(off, PAGE)
    assert a.free_bytes == 3 * PAGE
    with pytest.raises(ArenaFullError):
        a.alloc(2 * PAGE)
    assert a.used == 5 * PAGE
    assert a.alloc(PAGE) == offs[0]


def test_allocator_too_large() -> None:
    a = Allocator(4 * PAGE)
    with pytest.raises(ArenaFullError):
        a.alloc(4 * PAGE + 1)
    assert a.used == 0
    assert a.alloc(4 * PAGE) == 0


def test_allocator_double_free() -> None:
    a = Allocator(8 * PAGE)
    x = a.alloc(PAGE)
    y = a.alloc(2 * PAGE)
    a.alloc(PAGE)
    a.free(x, PAGE)
    with pytest.raises(ValueError, match="double"):
        a.free(x, PAGE)
    assert a.used == 3 * PAGE
    a.free(y, 2 * PAGE)
    with pytest.raises(ValueError, match="double"):
        a.free(y + PAGE, PAGE)  # inside a free extent
    with pytest.raises(ValueError, match="double"):
        a.free(y, 2 * PAGE)
    # Overlapping the free extent at the end of the arena.
    with pytest.raises(ValueError, match="overlapping"):
        a.free(3 * PAGE, 2 * PAGE)
    assert a.used == PAGE


# A simple model: live extents as {offset: size}; free space is the gaps.


def gaps(live: dict[int, int], capacity: int) -> list[tuple[int, int]]:
    out = []
    pos = 0
    for off in sorted(live):
        if off > pos:
            out.append((pos, off - pos))
        pos = off + live[off]
    if pos < capacity:
        out.append((pos, capacity - pos))
    return out


ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 6 * PAGE)),
        st.tuples(st.just("free"), st.integers(0, 1000)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_allocator_against_model(seq: list[tuple[str, int]]) -> None:
    capacity = 32 * PAGE
    a = Allocator(capacity)
    live: dict[int, int] = {}
    for op, n in seq:
        if op == "alloc":
            need = round_up(max(n, 1))
            holes = [g for g in gaps(live, capacity) if g[1] >= need]
            if holes:
                off = a.alloc(n)
                assert off == holes[0][0]  # first fit
                live[off] = need
            else:
                used = a.used
                with pytest.raises(ArenaFullError):
                    a.alloc(n)
                assert a.used == used
        elif live:
            off = sorted(live)[n % len(live)]
            a.free(off, live.pop(off))
        # Invariants.
        spans = sorted(live.items())
        for (o1, s1), (o2, _) in itertools.pairwise(spans):
            assert o1 + s1 <= o2
        assert all(o % PAGE == 0 and o + s <= capacity for o, s in spans)
        assert a.used == sum(live.values())
        assert a.largest_free == max((g[1] for g in gaps(live, capacity)), default=0)
    for off, size in list(live.items()):
        a.free(off, size)
    assert a.used == 0
    assert a.largest_free == capacity


# -- Arena -------------------------------------------------------------------


@pytest.fixture
def arena() -> Iterator[Arena]:
    with open_arena() as a:
        yield a


def test_arena_capacity_rounding() -> None:
    for asked, got in [
        (1, PAGE),
        (5000, 2 * PAGE),
        (1 << 20, 1 << 20),
        ((1 << 20) + 1, (1 << 20) + PAGE),
    ]:
        a = Arena(asked)
        try:
            assert a.capacity == got
            assert a.allocator.capacity == got
            # The shard directory follows the blocks in the same memfd, then the
            # loans of bytes lent to same-host backups.
            table = round_up(directory_bytes(slots_for(got)))
            assert a.size == got + table + round_up(LOAN_BYTES)
            assert a.loans.offset == got + table
            assert len(a.buf) == a.size
            assert a.buf.dtype == np.uint8
            assert os.fstat(a.fd).st_size == a.size
            assert a.directory.offset == got
            assert a.used == 0
        finally:
            a.close()


def test_arena_alloc_rounds_to_pages(arena: Arena) -> None:
    b = arena.alloc(100)
    assert isinstance(b, Block)
    assert b.size == PAGE
    assert b.offset % PAGE == 0
    c = arena.alloc(PAGE + 1)
    assert c.size == 2 * PAGE
    assert c.offset == b.offset + PAGE
    assert arena.used == 3 * PAGE
    arena.free(b)
    arena.free(c)
    assert arena.used == 0


def test_arena_views_write_and_read_through(arena: Arena) -> None:
    arena.alloc(PAGE)  # so the block under test is not at offset 0
    b = arena.alloc(3 * PAGE)
    v = arena.view(b)
    assert len(v) == 3 * PAGE
    v[:] = np.arange(len(v), dtype=np.uint64).astype(np.uint8)
    w = arena.view(b, 10, 5)
    assert w.tolist() == [10, 11, 12, 13, 14]
    w[:] = 200
    assert v[10:15].tolist() == [200] * 5
    # The views are the arena's memory itself, shared through the memfd.
    assert arena.buf[b.offset + 12] == 200
    assert os.pread(arena.fd, 5, b.offset + 10) == bytes([200] * 5)
    os.pwrite(arena.fd, b"\x07\x08", b.offset)
    assert v[:2].tolist() == [7, 8]
    assert len(arena.view(b, 3 * PAGE)) == 0


@pytest.mark.parametrize(
    ("start", "length"), [(-1, 2), (0, 3 * PAGE + 1), (PAGE, -1), (3 * PAGE + 1, 0)]
)
def test_arena_view_out_of_range(arena: Arena, start: int, length: int) -> None:
    b = arena.alloc(3 * PAGE)
    with pytest.raises(ValueError, match="outside block"):
        arena.view(b, start, length)


def test_arena_zero_size_block(arena: Arena) -> None:
    before = arena.allocator.largest_free
    b = arena.alloc(0)
    assert b.size == 0
    assert arena.used == 0
    assert arena.allocator.largest_free == before
    assert len(arena.view(b)) == 0
    arena.free(b)
    arena.free(b)  # freeing nothing twice is harmless
    assert arena.used == 0


def test_arena_full(arena: Arena) -> None:
    blocks = [arena.alloc(PAGE) for _ in range(arena.capacity // PAGE)]
    assert arena.used == arena.capacity
    with pytest.raises(ArenaFullError):
        arena.alloc(1)
    assert arena.used == arena.capacity
    assert arena.alloc(0).size == 0  # still fine: takes nothing
    arena.free(blocks[5])
    assert arena.alloc(PAGE).offset == blocks[5].offset


def test_arena_double_free(arena: Arena) -> None:
    b = arena.alloc(PAGE)
    arena.alloc(PAGE)
    arena.free(b)
    with pytest.raises(ValueError):
        arena.free(b)
    assert arena.used == PAGE


def test_arena_close_releases_fd() -> None:
    a = Arena(PAGE)
    fd = a.fd
    a.close()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_arena_close_with_live_view() -> None:
    a = Arena(2 * PAGE)
    fd = a.fd
    v = a.view(a.alloc(PAGE))
    a.close()  # must not raise although a view still exports the mapping
    with pytest.raises(OSError):
        os.fstat(fd)
    del v
