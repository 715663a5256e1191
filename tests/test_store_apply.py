"""Tests for irdma_psd.store.apply: a received update applied in place, or to a
copy where a reader pins the shard, and refused whole when it cannot apply. An
arena, no daemon."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from irdma_psd.store import PendingUpdate, Store, StoreError

from irdma.protocol import Op, Status, TensorMeta

from .helpers.stores import open_store

SHARD = 4096


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store(16 * SHARD) as s:
        yield s


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


def whole(store: Store, meta: TensorMeta, value: float, stamp: int, txn: int) -> PendingUpdate:
    """Shard 0 of a whole-tensor write ``stamp``, every element ``value``."""
    u = staged(store, meta, Op.WRITE, [value] * (SHARD // 4))
    u.stamp, u.txn = stamp, txn
    return u


def test_a_client_s_whole_write_older_than_the_shard_s_is_refused(store: Store) -> None:
    """The shard keeps the later whole write whatever order they come in; the refusal
    names it (the writer stamps its write after it)."""
    meta = TensorMeta("a/o", "float32", (1024,), SHARD)
    tensor, _ = store.create(meta)
    shard = tensor.shards[0]
    assert store.push(whole(store, meta, 2.0, 0xB0, txn=2)) == 1
    used = store.arena.used
    for stamp in (0xA0, 0xB0):  # older, and another write that drew the same stamp
        with pytest.raises(StoreError, match="not older than this one") as ei:
            store.push(whole(store, meta, 1.0, stamp, txn=stamp))
        assert ei.value.status == Status.STALE_STAMP and ei.value.stamp == 0xB0
    assert (shard.version, shard.stamp) == (1, 0xB0) and store.arena.used == used
    assert store.arena.view(shard.block, 0, 4).view(np.float32)[0] == 2.0
    # Stamped again after it, the write applies.
    assert store.push(whole(store, meta, 1.0, 0xC0, txn=3)) == 2 and shard.stamp == 0xC0
    # Accumulates and partial writes carry no stamp: they apply between whole writes.
    assert store.push(staged(store, meta, Op.ACCUMULATE, [1.0])) == 3
    assert store.push(staged(store, meta, Op.WRITE, [7.0])) == 4
    with pytest.raises(StoreError) as ei:
        store.push(whole(store, meta, 1.0, 0xB8, txn=4))
    assert ei.value.stamp == 0xC0


def test_a_retry_of_a_whole_write_overtaken_since_is_answered_applied(store: Store) -> None:
    """A retry (same txn) of a write a later one replaced is answered with the version
    it made, not refused: it was applied, in its turn."""
    meta = TensorMeta("a/y", "float32", (1024,), SHARD)
    store.create(meta)
    assert store.push(whole(store, meta, 1.0, 0xA0, txn=7)) == 1
    assert store.push(whole(store, meta, 2.0, 0xB0, txn=8)) == 2
    retry = whole(store, meta, 1.0, 0xA0, txn=7)
    assert store.applied(retry) == 1
    store.abort(retry)


def test_a_backup_applies_its_primary_s_whole_writes_in_the_primary_s_order(
    store: Store,
) -> None:
    """A backup applies what its primary forwards in the order it comes, stamps or
    not: the primary decided which write is later (``Store.push``), and a backup
    that refused one would no longer hold the primary's copy."""
    meta = TensorMeta("a/b", "float32", (1024,), SHARD)
    tensor, _ = store.create(meta)
    store.commit_replica(whole(store, meta, 2.0, 0xB0, txn=1), 1)
    assert store.commit_replica(whole(store, meta, 1.0, 0xA0, txn=2), 2) == 2
    assert tensor.shards[0].stamp == 0xA0
