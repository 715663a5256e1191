"""Tests for irdma_psd.store.outbox: what a primary keeps for its backups. No daemon."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from irdma_psd.arena import Arena
from irdma_psd.store import Store

from irdma.protocol import Op, TensorMeta
from irdma.training.modes import Mode

from .helpers.stores import open_arena


@pytest.fixture
def arena() -> Iterator[Arena]:
    with open_arena() as a:
        yield a


def test_an_update_goes_to_the_backups_as_received(arena: Arena) -> None:
    store = Store(arena, lambda key, shard: True, replicated=True)
    meta = TensorMeta("o/t", "float32", (1024,), 4096)
    store.create(meta)
    u = store.begin_update(Op.ACCUMULATE, meta.key, 0, 0, 8, alpha=2.0)
    u.buffer.view(np.float32)[:] = [1.0, 3.0]
    u.txn = 9
    assert store.outbox.wants(u)
    store.commit(u, pushed=(4, 11))
    [c] = store.take_commits()
    # The delta before it was scaled in place, with the txn and version it made.
    assert c.payload.view(np.float32).tolist() == [1.0, 3.0] and c.alpha == 2.0
    assert (c.key, c.shard, c.op, c.txn, c.version) == (meta.key, 0, Op.ACCUMULATE, 9, 1)
    assert (c.pushed_by, c.pushed_step, c.held) == (4, 11, False)
    assert store.take_commits() == []


def test_a_held_push_goes_to_the_backups_on_the_version_it_sits_on(arena: Arena) -> None:
    store = Store(arena, lambda key, shard: True, replicated=True)
    meta = TensorMeta("o/s", "float32", (1024,), 4096, Mode.sync(2).to_options())
    store.create(meta)
    u = store.begin_update(Op.ACCUMULATE, meta.key, 0, 0, 4096)
    store.push(u, worker=1, step=0)
    [c] = store.take_commits()
    assert c.held and (c.pushed_by, c.pushed_step, c.version) == (1, 0, 0)


def test_nothing_is_kept_without_backups_or_for_a_forwarded_update(arena: Arena) -> None:
    alone = Store(arena, lambda key, shard: True)
    meta = TensorMeta("o/a", "float32", (1024,), 4096)
    alone.create(meta)
    alone.commit(alone.begin_update(Op.WRITE, meta.key, 0, 0, 8))
    assert alone.take_commits() == []
    alone.delete(meta.key)
    backup = Store(arena, lambda key, shard: True, replicated=True)
    backup.create(meta)
    backup.commit_replica(backup.begin_update(Op.WRITE, meta.key, 0, 0, 8), 1)
    assert backup.take_commits() == []


def in_arena(arena: Arena, a: np.ndarray) -> bool:
    """Whether ``a``'s bytes lie in the arena's mapping (not a copy on the heap)."""
    return np.shares_memory(arena.buf, a)


def test_a_staged_accumulate_is_kept_for_the_backups_where_it_was_received(arena: Arena) -> None:
    """No copy: the staged delta is read as the accumulate's source (not scaled in
    place), kept until the forwards are over, then its block goes back to the arena."""
    store = Store(arena, lambda key, shard: True, replicated=True)
    meta = TensorMeta("o/k", "float32", (1024,), 4096)
    store.create(meta)
    used = arena.used
    u = store.begin_update(Op.ACCUMULATE, meta.key, 0, 0, 4096, alpha=0.5)
    u.buffer.view(np.float32)[:] = 2.0
    store.commit(u)
    [c] = store.take_commits()
    assert in_arena(arena, c.payload) and c.release is not None
    assert (c.payload.view(np.float32) == 2.0).all()  # as received, not scaled
    shard = store.tensors[meta.key].shards[0]
    assert (arena.view(shard.block, 0, 4096).view(np.float32) == 1.0).all()
    assert arena.used > used  # the staging block is still held
    c.hold(2)  # two backups
    c.let_go()
    assert arena.used > used
    c.let_go()
    assert arena.used == used


def test_a_whole_shard_write_is_forwarded_from_the_shard_block_it_became(arena: Arena) -> None:
    """The staged bytes became the shard's block: pinned while forwarded, so the next
    write to the shard goes to a new block and the forward's bytes stay as they were."""
    store = Store(arena, lambda key, shard: True, replicated=True)
    meta = TensorMeta("o/w", "float32", (1024,), 4096)
    store.create(meta)
    u = store.begin_update(Op.WRITE, meta.key, 0, 0, 4096)
    u.buffer.view(np.float32)[:] = 7.0
    store.commit(u)
    [c] = store.take_commits()
    shard = store.tensors[meta.key].shards[0]
    assert shard.block.pins == 1 and in_arena(arena, c.payload)
    again = store.begin_update(Op.WRITE, meta.key, 0, 0, 8)  # part of the shard
    again.buffer.view(np.float32)[:] = 9.0
    store.commit(again)
    store.take_commits()
    assert (c.payload.view(np.float32) == 7.0).all()
    c.hold(1)
    c.let_go()
    assert shard.block.pins == 0
