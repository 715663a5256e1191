"""Tests for irdma_psd.store.blocks: pins, copies kept for readers given back when
room runs out, and a shard's bytes replaced under a reader. An arena, no daemon."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from irdma_psd.arena import Arena
from irdma_psd.store import Store, StoreError
from irdma_psd.store.blocks import Blocks

from irdma.protocol import Op, Status, TensorMeta

from .helpers.stores import open_arena

SHARD = 4096


@pytest.fixture
def arena() -> Iterator[Arena]:
    with open_arena(16 * SHARD) as a:
        yield a


def test_a_retired_block_is_freed_when_its_last_pin_goes(arena: Arena) -> None:
    blocks = Blocks(arena)
    block = blocks.pin(blocks.pin(arena.alloc(SHARD)))
    blocks.retire(block)
    blocks.unpin(block)
    assert arena.used == SHARD
    blocks.unpin(block)
    assert arena.used == 0


def test_room_is_taken_from_older_copies_then_previous_ones(arena: Arena) -> None:
    store = Store(arena, lambda key, shard: True)
    meta = TensorMeta("b/t", "uint8", (SHARD,), SHARD)
    tensor, _ = store.create(meta)
    shard = tensor.shards[0]
    for stamp in (0xA0, 0xB0):
        u = store.begin_update(Op.WRITE, meta.key, 0, 0, SHARD)
        u.stamp = stamp
        store.commit(u)
    assert shard.prev is not None and len(shard.older) == 1
    rest = arena.alloc(arena.allocator.free_bytes)
    one = store.blocks.alloc(SHARD, "a test")  # the older copy's room
    assert shard.older == [] and shard.prev is not None
    two = store.blocks.alloc(SHARD, "a test")  # then the previous copy's
    assert shard.prev is None and store.blocks.prevs == {}
    with pytest.raises(StoreError, match="arena full: a test") as ei:
        store.blocks.alloc(SHARD, "a test")
    assert ei.value.status == Status.NO_SPACE
    assert store.blocks.reserve(SHARD) is None
    for block in (rest, one, two):
        arena.free(block)


def test_overwrite_leaves_a_pinned_block_as_its_reader_saw_it(arena: Arena) -> None:
    store = Store(arena, lambda key, shard: True)
    meta = TensorMeta("b/o", "uint8", (SHARD,), SHARD)
    tensor, _ = store.create(meta)
    shard = tensor.shards[0]
    read = store.blocks.pin(shard.block)
    data = np.full(SHARD, 7, dtype=np.uint8)
    store.blocks.overwrite(shard, data, "a copy")
    store.blocks.publish(shard)
    assert shard.block is not read and not arena.view(read).any()
    assert (arena.view(shard.block, 0, SHARD) == 7).all()
    used = arena.used
    store.blocks.unpin(read)  # replaced, so freed with its last pin
    assert arena.used == used - SHARD
    assert store.blocks.checksum(shard) != 0
