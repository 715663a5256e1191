"""Tests for irdma_psd.store.apply: a received update applied in place, or to a
copy where a reader pins the shard, and refused whole when it cannot apply. An
arena, no daemon."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from irdma_psd.arena import Arena
from irdma_psd.store import PendingUpdate, Store, StoreError

from irdma.protocol import Op, Status, TensorMeta

SHARD = 4096


@pytest.fixture
def store() -> Iterator[Store]:
    arena = Arena(16 * SHARD)
    try:
        yield Store(arena, lambda key, shard: True)
    finally:
        arena.close()


def staged(store: Store, meta: TensorMeta, op: Op, values: list[float], **kw) -> PendingUpdate:
    u = store.begin_update(op, meta.key, 0, 0, 4 * len(values), **kw)
    u.buffer.view(np.float32)[:] = values
    return u


def test_an_accumulate_under_a_reader_goes_to_a_copy(store: Store) -> None:
    meta = TensorMeta("a/t", "float32", (1024,), SHARD)
    tensor, _ = store.create(meta)
    shard = tensor.shards[0]
    read = store.pin(shard.block)
    assert store.applier.commit(staged(store, meta, Op.ACCUMULATE, [1, 2], alpha=3.0)) == 1
    assert shard.block is not read and not store.arena.view(read).any()
    assert store.arena.view(shard.block, 0, 8).view(np.float32).tolist() == [3.0, 6.0]
    store.unpin(read)
    # Nothing pins it now: the next one applies in place.
    block = shard.block
    store.applier.commit(staged(store, meta, Op.ACCUMULATE, [1, 1]))
    assert shard.block is block
    assert store.arena.view(block, 0, 8).view(np.float32).tolist() == [4.0, 7.0]


def test_an_update_of_a_tensor_replaced_meanwhile_is_refused(store: Store) -> None:
    meta = TensorMeta("a/r", "float32", (1024,), SHARD)
    store.create(meta)
    u = staged(store, meta, Op.WRITE, [5])
    store.create(TensorMeta("a/r", "float32", (2048,), SHARD), replace=True)
    with pytest.raises(StoreError, match="deleted or replaced during the update") as ei:
        store.applier.commit(u)
    assert ei.value.status == Status.NOT_FOUND
    assert store.arena.used == 2 * SHARD  # the new tensor's shards; the staging given back


def test_a_stamp_needs_a_write_of_the_whole_shard(store: Store) -> None:
    meta = TensorMeta("a/s", "float32", (1024,), SHARD)
    tensor, _ = store.create(meta)
    u = staged(store, meta, Op.WRITE, [1, 2])
    u.stamp = 0xA0
    with pytest.raises(StoreError, match="whole-tensor write's stamp") as ei:
        store.applier.commit(u)
    assert ei.value.status == Status.BAD_ARGUMENT and tensor.shards[0].version == 0
