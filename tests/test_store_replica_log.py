"""Tests for irdma_psd.store.replica_log: the txns a shard remembers (a retry is
applied once) and whether a forwarded update sits on this copy. No daemon."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from irdma_psd.arena import Block
from irdma_psd.store import Shard, Store, StoreError
from irdma_psd.store.replica_log import RECENT_TXNS, applied, check_on_top, remember

from irdma.protocol import NO_WORKER, Op, Status, TensorMeta
from irdma.training.modes import Mode

from .helpers.stores import open_store


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store() as s:
        yield s


def test_the_log_keeps_the_last_txns_only() -> None:
    shard = Shard(0, 4096, Block(0, 4096))
    remember(shard, 0, 1)  # an update without an id leaves nothing to answer a retry with
    assert shard.recent == {}
    for txn in range(1, RECENT_TXNS + 2):
        remember(shard, txn, txn)
    assert len(shard.recent) == RECENT_TXNS and 1 not in shard.recent
    assert shard.recent[RECENT_TXNS + 1] == RECENT_TXNS + 1


def test_a_retry_finds_the_version_its_first_try_produced(store: Store) -> None:
    meta = TensorMeta("l/t", "float32", (1024,), 4096)
    store.create(meta)
    first = store.begin_update(Op.WRITE, meta.key, 0, 0, 16)
    first.txn = 77
    assert applied(first) is None
    version = store.commit(first)
    retry = store.begin_update(Op.WRITE, meta.key, 0, 0, 16)
    retry.txn = 77
    assert applied(retry) == version
    retry.txn = 0  # no id: never taken for a retry
    assert applied(retry) is None
    store.abort(retry)


def test_a_push_held_for_its_step_counts_as_applied(store: Store) -> None:
    meta = TensorMeta("l/s", "float32", (1024,), 4096, Mode.sync(2).to_options())
    store.create(meta)
    push = store.begin_update(Op.ACCUMULATE, meta.key, 0, 0, 4096)
    push.txn = 5
    store.push(push, worker=0, step=0)  # held: worker 1 has not pushed
    retry = store.begin_update(Op.ACCUMULATE, meta.key, 0, 0, 4096)
    retry.txn = 5
    assert applied(retry, worker=0) == push.shard.version == 0
    assert applied(retry, worker=NO_WORKER) is None  # only the worker's own push
    store.abort(retry)


def test_a_forwarded_update_must_sit_on_this_copys_version(store: Store) -> None:
    meta = TensorMeta("l/b", "float32", (1024,), 4096)
    store.create(meta)
    update = store.begin_update(Op.WRITE, meta.key, 0, 0, 16)
    check_on_top(update, 0)
    with pytest.raises(StoreError, match="at version 0, the update is for 3") as ei:
        check_on_top(update, 3)
    assert ei.value.status == Status.BEHIND
    store.abort(update)
