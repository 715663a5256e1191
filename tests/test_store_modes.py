"""psd.store with training modes: held steps, exact sums, eviction, cleanup."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from irdma_psd.arena import PAGE, Arena
from irdma_psd.store import Store, StoreError

from irdma.protocol import NO_WORKER, Op, Status, TensorMeta
from irdma.training.modes import Mode

from .helpers.clock import Clock
from .helpers.stores import open_store


@pytest.fixture
def clock() -> Clock:
    return Clock(1000.0)


@pytest.fixture
def store(clock: Clock) -> Iterator[Store]:
    with open_store(4 << 20, clock=clock) as s:
        yield s


def make(store: Store, mode: Mode, n: int = 1000, dtype: str = "float32") -> TensorMeta:
    meta = TensorMeta("m/w", dtype, (n,), 1024, mode.to_options())
    store.create(meta)
    return meta


def push(store: Store, meta: TensorMeta, shard: int, delta: np.ndarray, **kw) -> int:
    start, length = meta.shard_span(shard)
    raw = np.ascontiguousarray(delta).view(np.uint8)[start : start + length]
    u = store.begin_update(Op.ACCUMULATE, meta.key, shard, 0, length, alpha=kw.pop("alpha", 1.0))
    u.buffer[:] = raw
    return store.push(u, **kw)


def push_all(store: Store, meta: TensorMeta, delta: np.ndarray, **kw) -> None:
    for s in range(meta.num_shards):
        push(store, meta, s, delta, **dict(kw))


def values(store: Store, meta: TensorMeta) -> np.ndarray:
    parts = []
    for s in range(meta.num_shards):
        _, length = meta.shard_span(s)
        parts.append(bytes(store.read_view(meta.key, s, 0, length)[1]))
    return np.frombuffer(b"".join(parts), dtype=meta.dtype)


def grads(workers: int, n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(workers)]


def test_sync_step_is_the_worker_ordered_sum_applied_once(store: Store) -> None:
    meta = make(store, Mode.sync(3))
    gs = grads(3, 1000)
    alpha = -0.1
    # Pushed out of order; summed in worker order all the same.
    for w in (2, 0):
        push_all(store, meta, gs[w], worker=w, step=0, alpha=alpha)
    assert not values(store, meta).any(), "nothing applies before every worker pushed"
    assert store.waits_for(meta.key, 0, 0, 1) == [1]
    push_all(store, meta, gs[1], worker=1, step=0, alpha=alpha)
    total = gs[0] * np.float32(alpha)
    for g in gs[1:]:
        total += g * np.float32(alpha)
    expected = np.zeros(1000, np.float32) + total
    assert np.array_equal(values(store, meta), expected)
    assert store.waits_for(meta.key, 0, 0, 1) == []
    assert store.catalogue.get(meta.key).shards[0].version == 1  # one update per step


def test_apply_set_replaces_with_the_steps_sum(store: Store) -> None:
    meta = make(store, Mode.sync(2, apply="set"), n=8, dtype="int64")
    for step in range(3):
        for w in range(2):
            push_all(store, meta, np.full(8, 10 * step + w, np.int64), worker=w, step=step)
        assert (values(store, meta) == 20 * step + 1).all()


def test_lockstep_pushes_must_name_a_worker_and_cover_whole_shards(store: Store) -> None:
    meta = make(store, Mode.sync(2))
    used = store.arena.used
    with pytest.raises(StoreError, match="must name its worker") as info:
        push(store, meta, 0, np.ones(1000, np.float32), worker=NO_WORKER)
    assert info.value.status == Status.BAD_ARGUMENT
    u = store.begin_update(Op.ACCUMULATE, meta.key, 0, 0, 512)
    with pytest.raises(StoreError, match="whole shards"):
        store.push(u, 0, 0)
    assert store.arena.used == used, "refused pushes leave no staging behind"


def test_writes_apply_at_once_in_any_mode(store: Store) -> None:
    meta = make(store, Mode.sync(2), n=256)
    u = store.begin_update(Op.WRITE, meta.key, 0, 0, 1024)
    u.buffer[:] = np.arange(256, dtype=np.float32).view(np.uint8)
    store.push(u, NO_WORKER, 0)
    assert np.array_equal(values(store, meta), np.arange(256, dtype=np.float32))


def test_ssp_applies_at_once(store: Store) -> None:
    meta = make(store, Mode.ssp(2, 0), n=4)
    push_all(store, meta, np.ones(4, np.float32), worker=0, step=0)
    assert (values(store, meta) == 1).all()
    assert store.waits_for(meta.key, 0, 0, 1) == [1]


def test_error_mode_reports_silent_workers(store: Store, clock: Clock) -> None:
    meta = make(store, Mode.sync(2, worker_timeout=5))
    push_all(store, meta, np.ones(1000, np.float32), worker=0, step=0)
    assert store.expire(meta.key, 0, 0, 1) == []  # worker 1's grace starts
    clock.now += 5
    with pytest.raises(StoreError, match=r"worker\(s\) 1 sent nothing for 5 s") as info:
        store.expire(meta.key, 0, 0, 1)
    assert info.value.status == Status.WORKER_LOST
    assert not values(store, meta).any()


def test_evict_mode_applies_the_step_without_the_silent_worker(store: Store, clock: Clock) -> None:
    meta = make(store, Mode.sync(3, worker_timeout=5, on_timeout="evict"), n=256)
    woken: list[int] = []

    class Woken:
        def wake(self) -> None:
            woken.append(1)

    store.add_waiters(Woken())
    for w in (0, 1):
        push_all(store, meta, np.full(256, w + 1, np.float32), worker=w, step=0)
    store.expire(meta.key, 0, 0, 1)
    clock.now += 6
    assert store.expire(meta.key, 0, 0, 1) == [2]
    assert woken
    assert (values(store, meta) == 3).all()
    assert store.catalogue.info(store.catalogue.get(meta.key)).evicted == (2,)
    with pytest.raises(StoreError, match="evicted") as info:
        push(store, meta, 0, np.ones(256, np.float32), worker=2, step=0)
    assert info.value.status == Status.EVICTED


def test_deleting_or_replacing_frees_held_deltas(store: Store) -> None:
    base = store.arena.used
    meta = make(store, Mode.sync(2))
    push_all(store, meta, np.ones(1000, np.float32), worker=0, step=0)
    assert store.arena.used > base + meta.nbytes  # the held delta is in the arena
    store.delete(meta.key)
    assert store.arena.used == base
    meta = make(store, Mode.sync(2))
    push_all(store, meta, np.ones(1000, np.float32), worker=0, step=0)
    store.create(TensorMeta("m/w", "float32", (10,), 1024, Mode.sync(2).to_options()), replace=True)
    assert store.arena.used == base + PAGE  # only the new one-page shard


def test_a_different_mode_is_refused_unless_replaced(store: Store) -> None:
    meta = make(store, Mode.sync(2))
    again = TensorMeta("m/w", "float32", (1000,), 1024, Mode.sync(3).to_options())
    with pytest.raises(StoreError, match="exists in mode sync workers=2") as info:
        store.create(again)
    assert info.value.status == Status.EXISTS
    # The same mode, or none stated, is the same tensor.
    assert store.create(meta)[1] is False
    assert store.create(TensorMeta("m/w", "float32", (1000,), 1024))[1] is False
    bad = TensorMeta("m/x", "float32", (4,), 1024, {"mode": "sync", "workers": 0})
    with pytest.raises(StoreError, match="workers must be between"):
        store.create(bad)


def test_a_shard_copy_carries_the_steps_its_primary_applied(clock: Clock) -> None:
    """What a primary's store says it applied (applied_steps) is what a backup's store
    installing the whole-shard copy follows: the next step's pushes are taken, the
    held contributions of applied steps are released."""
    arenas = [Arena(4 << 20), Arena(4 << 20)]
    try:
        primary, backup = (Store(a, lambda key, shard: True, clock) for a in arenas)
        meta = make(primary, Mode.sync(2))
        make(backup, Mode.sync(2))
        for step in range(3):
            push(primary, meta, 0, np.ones(1000, np.float32), worker=0, step=step)
            push(primary, meta, 0, np.ones(1000, np.float32), worker=1, step=step)
        push(backup, meta, 0, np.ones(1000, np.float32), worker=0, step=0)  # held, stale
        tensor = primary.tensors[meta.key]
        steps = primary.applied_steps(tensor, 0)
        assert steps == [3]
        data = primary.arena.view(tensor.shards[0].block, 0, 1024)
        backup.install_shard(meta, 0, tensor.shards[0].version, data, {}, steps)
        assert backup.applied_steps(backup.tensors[meta.key], 0) == [3]
        assert backup.tensors[meta.key].coord.held() == []  # the stale hold was released
        assert push(backup, meta, 0, np.ones(1000, np.float32), worker=0, step=3) == 3
    finally:
        for a in arenas:
            a.close()


# -- a backup following its primary's training state ----------------------------------


@pytest.fixture
def pair(clock: Clock) -> Iterator[tuple[Store, Store]]:
    """A replicated primary's store and its backup's, each with its own arena."""
    arenas = [Arena(4 << 20), Arena(4 << 20)]
    try:
        yield tuple(Store(a, lambda key, shard: True, clock, replicated=True) for a in arenas)
    finally:
        for a in arenas:
            a.close()


def deliver(backup: Store, primary: Store) -> list[int]:
    """Apply what the primary forwarded, in order, as the backup's peer handler does."""
    versions = []
    for c in primary.take_commits():
        u = backup.begin_update(c.op, c.key, c.shard, c.offset, c.payload.nbytes, alpha=c.alpha)
        u.buffer[:] = c.payload
        u.txn = c.txn
        if c.held:
            versions.append(backup.hold_replica(u, c.version, c.pushed_by, c.pushed_step))
        else:
            step = (c.group, c.steps_applied) if c.steps_applied else None
            pushed = (c.pushed_by, c.pushed_step) if c.pushed_by != NO_WORKER else None
            versions.append(backup.commit_replica(u, c.version, step, pushed))
    return versions


def push_txn(store: Store, meta: TensorMeta, delta: np.ndarray, txn: int, **kw) -> int:
    u = store.begin_update(Op.ACCUMULATE, meta.key, 0, 0, meta.nbytes)
    u.buffer[:] = delta.view(np.uint8)
    u.txn = txn
    done = store.applied(u, kw["worker"])
    if done is not None:
        store.abort(u)
        return done
    return store.push(u, **kw)


@pytest.mark.parametrize("mode", [Mode.sync(4), Mode.hybrid(4, 2)], ids=["sync", "hybrid"])
def test_a_backup_holds_the_pushes_its_primary_holds_and_completes_the_step(
    pair: tuple[Store, Store], clock: Clock, mode: Mode
) -> None:
    """The primary dies mid-step: the backup has every push the primary acknowledged
    and, given the rest, applies the step the fault-free run applies, bit for bit."""
    primary, backup = pair
    meta = make(primary, mode, n=256)
    make(backup, mode, n=256)
    gs = grads(4, 256)
    fault_free = Store(Arena(4 << 20), lambda key, shard: True, clock)
    try:
        make(fault_free, mode, n=256)
        for w in range(4):
            push_all(fault_free, meta, gs[w], worker=w, step=0, alpha=-0.5)
        for w in (0, 2):  # held by the primary: acknowledged once the backup has them
            push_all(primary, meta, gs[w], worker=w, step=0, alpha=-0.5)
        assert deliver(backup, primary) == [0, 0]
        assert not values(backup, meta).any(), "held, not applied"
        for w in (1, 3):  # the primary is gone: the rest go to the backup
            push_all(backup, meta, gs[w], worker=w, step=0, alpha=-0.5)
        assert np.array_equal(values(backup, meta), values(fault_free, meta))
        assert values(backup, meta).any()
        assert backup.applied_steps(backup.tensors[meta.key], 0) == [1] * mode.groups
    finally:
        fault_free.arena.close()


def test_retried_pushes_are_answered_once_held_or_applied_on_either_copy(
    pair: tuple[Store, Store],
) -> None:
    """A retry (same txn) of a held push is not held twice, on the primary or on the
    backup it was forwarded to; once the step is applied, a retry of any of its pushes
    is answered with the step's version there too (the sum travels under the txn of
    the push that completed it, the others were held on the backup)."""
    primary, backup = pair
    mode = Mode.sync(3)
    meta = make(primary, mode, n=256)
    make(backup, mode, n=256)
    ones = np.ones(256, np.float32)
    assert push_txn(primary, meta, ones, 11, worker=0, step=0) == 0
    assert push_txn(primary, meta, ones, 11, worker=0, step=0) == 0  # a retry
    assert push_txn(primary, meta, ones, 12, worker=1, step=0) == 0
    deliver(backup, primary)
    assert push_txn(backup, meta, ones, 12, worker=1, step=0) == 0  # retried on the backup
    assert push_txn(primary, meta, ones, 13, worker=2, step=0) == 1
    assert deliver(backup, primary) == [1]
    for store in (primary, backup):
        for w, txn in enumerate((11, 12, 13)):
            assert push_txn(store, meta, ones, txn, worker=w, step=0) == 1
        assert (values(store, meta) == 3).all(), "applied once"
    with pytest.raises(StoreError, match="already applied"):  # not a retry: refused
        push_txn(backup, meta, ones, 99, worker=0, step=0)


def test_a_held_push_on_a_copy_at_another_step_is_behind(pair: tuple[Store, Store]) -> None:
    primary, backup = pair
    mode = Mode.sync(2)
    meta = make(primary, mode, n=256)
    make(backup, mode, n=256)
    for w in range(2):
        push_all(primary, meta, np.ones(256, np.float32), worker=w, step=0)
    primary.take_commits()  # lost: the backup never saw step 0
    push_all(primary, meta, np.ones(256, np.float32), worker=0, step=1)
    used = backup.arena.used
    with pytest.raises(StoreError, match="at version 0") as info:
        deliver(backup, primary)
    assert info.value.status == Status.BEHIND
    assert backup.arena.used == used and backup.tensors[meta.key].coord.held() == []


def test_a_shard_copy_brings_ssp_clocks_and_lets_go_of_held_pushes(
    pair: tuple[Store, Store],
) -> None:
    primary, backup = pair
    ssp = make(primary, Mode.ssp(2, 0), n=4)
    make(backup, Mode.ssp(2, 0), n=4)
    push_all(primary, ssp, np.ones(4, np.float32), worker=0, step=0)
    push_all(primary, ssp, np.ones(4, np.float32), worker=0, step=1)
    deliver(backup, primary)
    # Worker 0's clock came with its pushes: its read of step 2 waits for worker 1 only.
    assert backup.waits_for(ssp.key, 0, 0, 2) == [1]
    push_all(primary, ssp, np.ones(4, np.float32), worker=1, step=0)
    tensor = primary.tensors[ssp.key]
    data = primary.arena.view(tensor.shards[0].block, 0, 16)
    clocks = primary.clocks(tensor, 0)
    assert clocks == [2, 1]
    backup.install_shard(ssp, 0, tensor.shards[0].version, data, {}, None, 0, clocks)
    assert backup.waits_for(ssp.key, 0, 1, 1) == []


def test_a_shard_copy_lets_go_of_the_backups_held_pushes(pair: tuple[Store, Store]) -> None:
    primary, backup = pair
    meta = make(primary, Mode.sync(2), n=256)
    make(backup, Mode.sync(2), n=256)
    push_all(primary, meta, np.ones(256, np.float32), worker=0, step=0)
    deliver(backup, primary)
    used = backup.arena.used
    tensor = primary.tensors[meta.key]
    data = primary.arena.view(tensor.shards[0].block, 0, 1024)
    backup.install_shard(meta, 0, 0, data, {}, [0])
    assert backup.tensors[meta.key].coord.held() == [] and backup.arena.used < used
    assert [w for w, _, _ in primary.held_on(tensor, 0)] == [0]  # sent after the copy


def test_waiters_are_woken_by_a_step_applied_and_a_training_tensor_gone(store: Store) -> None:
    class Woken:
        count = 0

        def wake(self) -> None:
            self.count += 1

    woken = Woken()
    store.add_waiters(woken)
    meta = make(store, Mode.sync(2))
    push_all(store, meta, np.ones(1000, np.float32), worker=0, step=0)
    assert woken.count == 0, "a held push changes nothing a read waits for"
    push(store, meta, 0, np.ones(1000, np.float32), worker=1, step=0)
    assert woken.count == 1  # shard 0's step applied
    store.delete(meta.key)
    assert woken.count == 2  # reads waiting on it now fail
    plain = TensorMeta("m/plain", "float32", (16,), 1024)
    store.create(plain)
    store.delete(plain.key)
    assert woken.count == 2, "no read waits on an async tensor"
