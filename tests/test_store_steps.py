"""Tests for irdma_psd.store.steps: training pushes held or applied, and whether
waiting readers may go. An arena, no daemon (tests/test_store_modes.py has the
sums; these the parts' answers)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from irdma_psd.store import Store

from irdma.protocol import NO_WORKER, Op, TensorMeta
from irdma.training.modes import Mode

from .helpers.stores import open_store

SHARD = 4096


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store(16 * SHARD, clock=lambda: 100.0) as s:
        yield s


def pushed(store: Store, meta: TensorMeta, worker: int, step: int) -> tuple[int, bool]:
    u = store.begin_update(Op.ACCUMULATE, meta.key, 0, 0, SHARD)
    u.buffer.view(np.float32)[:] = worker + 1
    return store.steps.push(u, worker, step)


def test_a_step_wakes_readers_only_when_it_is_applied(store: Store) -> None:
    meta = TensorMeta("s/t", "float32", (1024,), SHARD, Mode.sync(2).to_options())
    store.create(meta)
    assert pushed(store, meta, 0, 0) == (0, False)  # held for worker 1
    assert store.steps.waits_for(meta.key, 0, 0, 1) == [1]
    assert pushed(store, meta, 1, 0) == (1, True)  # the step's sum: one version
    assert store.steps.waits_for(meta.key, 0, 0, 1) == []
    shard = store.tensors[meta.key].shards[0]
    assert (store.arena.view(shard.block, 0, SHARD).view(np.float32) == 3.0).all()


def test_async_and_anonymous_pushes_apply_without_waking_anyone(store: Store) -> None:
    plain = TensorMeta("s/a", "float32", (1024,), SHARD)
    store.create(plain)
    assert pushed(store, plain, 0, 0) == (1, False)
    ssp = TensorMeta("s/p", "float32", (1024,), SHARD, Mode.ssp(2, 1).to_options())
    store.create(ssp)
    u = store.begin_update(Op.ACCUMULATE, ssp.key, 0, 0, SHARD)
    assert store.steps.push(u, NO_WORKER, 0) == (1, False)
    assert pushed(store, ssp, 0, 0) == (2, True)  # its clock moved: readers re-check


def test_a_copy_follows_its_primarys_steps_and_lets_go_of_what_it_held(store: Store) -> None:
    meta = TensorMeta("s/f", "float32", (1024,), SHARD, Mode.sync(2).to_options())
    tensor, _ = store.create(meta)
    held = store.begin_update(Op.ACCUMULATE, meta.key, 0, 0, SHARD)
    held.txn = 41
    store.steps.hold(held, 0, 0)
    used = store.arena.used
    store.steps.follow(tensor, 0, {0: 1})  # the primary applied step 0 with it
    assert store.applied_steps(tensor, 0) == [1]
    assert tensor.shards[0].recent == {41: 0} and store.arena.used == used - SHARD
    again = store.begin_update(Op.ACCUMULATE, meta.key, 0, 0, SHARD)
    store.steps.hold(again, 1, 1)
    assert store.held_on(tensor, 0) == [(1, 1, again)]
    store.steps.let_go(tensor, 0)
    assert store.held_on(tensor, 0) == [] and again.staging is None
