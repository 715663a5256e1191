"""Readers' leases on whole-tensor writes in one daemon's store (psd/store/leases.py,
copies.py, blocks.py, and psd/lease_ops.py ending them): a held copy outlives any
number of rewrites, goes at release and when the lease runs out, and never costs
a write its room. An arena and the daemon's lease task on trio's MockClock, no
sockets."""

from __future__ import annotations

import numpy as np
import pytest
import trio
import trio.testing
from irdma_psd.conn import Replies
from irdma_psd.lease_ops import LeaseOps
from irdma_psd.metrics import RequestMetrics
from irdma_psd.store import Store, StoreError, copies
from irdma_psd.store.leases import LEASE_MAX, LEASES_MAX, Leases

from irdma.protocol import Op, Status, TensorMeta
from irdma.protocol.messages import UNSTAMPED

from .helpers.clock import Clock
from .helpers.stores import open_store

SHARD = 4096
META = TensorMeta("l/t", "uint8", (SHARD,), SHARD)


def rewrite(store: Store, stamp: int) -> None:
    """A whole-tensor write ``stamp`` of the one-shard tensor, every byte its low byte."""
    u = store.begin_update(Op.WRITE, META.key, 0, 0, SHARD)
    u.buffer[:] = stamp & 0xFF
    u.stamp = u.txn = stamp
    store.push(u)


def read_at(store: Store, stamp: int) -> np.ndarray:
    """The shard's copy of write ``stamp`` as a read at that stamp gets it."""
    block, _ = copies.copy_for(store.tensors[META.key].shards[0], stamp)
    return store.arena.view(block, 0, SHARD)


def gone(store: Store, stamp: int) -> bool:
    try:
        read_at(store, stamp)
    except StoreError as exc:
        assert exc.status == Status.STAMP_GONE
        return True
    return False


def test_a_held_write_outlives_rewrites_and_goes_at_release() -> None:
    clock = Clock()
    with open_store(64 * SHARD, clock=clock) as store:
        store.create(META)
        rewrite(store, 0xA1)
        store.lease(7, META.key, 0xA1, LEASE_MAX)
        for stamp in range(0xB1, 0xB6):  # five more: past the previous copy and one older
            rewrite(store, stamp)
            clock.now += copies.OLDER_COPIES_KEPT + 1  # and past the time older ones are kept
        assert not gone(store, 0xA1) and (read_at(store, 0xA1) == 0xA1).all()
        # Those no lease holds went as ever: the previous copy and one older are kept.
        assert [gone(store, s) for s in range(0xB1, 0xB6)] == [True] * 2 + [False] * 3
        used = store.arena.used
        store.release_lease(7)
        # With it went 0xB3, an older copy kept past its time only while a write came.
        assert gone(store, 0xA1) and gone(store, 0xB3) and not gone(store, 0xB4)
        assert store.arena.used == used - 2 * SHARD
        store.release_lease(7)  # released twice: nothing more to let go


def test_a_lease_on_every_copy_narrowed_to_one_lets_the_others_go() -> None:
    """A reader holds every copy before its first read, then the write that read came
    from: the copies between are freed at the narrowing."""
    clock = Clock()
    with open_store(64 * SHARD, clock=clock) as store:
        store.create(META)
        store.lease(8, META.key, 0, 10.0)  # every copy, the unstamped one too
        for stamp in (0xA1, 0xA2, 0xA3, 0xA4):
            rewrite(store, stamp)
        assert not any(gone(store, s) for s in (UNSTAMPED, 0xA1, 0xA2, 0xA3))
        used = store.arena.used
        store.lease(8, META.key, 0xA1, 10.0)
        # Kept: 0xA1 (held), 0xA2 (the one older copy kept anyway), 0xA3 (the
        # previous copy), 0xA4 (current); the unstamped copy was only held.
        assert [gone(store, s) for s in (UNSTAMPED, 0xA1, 0xA2)] == [True, False, False]
        assert store.arena.used == used - SHARD


def test_a_lease_never_costs_a_write_its_room() -> None:
    """With the arena full of what a lease holds, a write takes the room and the
    reader of the held write is told it is gone (STAMP_GONE), never a mix."""
    with open_store(2 * SHARD) as store:  # room for the shard and one more copy
        store.create(META)
        rewrite(store, 0xA1)
        store.lease(9, META.key, 0xA1, 10.0)
        rewrite(store, 0xB1)  # takes the unheld previous copy's room
        assert not gone(store, 0xA1)
        rewrite(store, 0xB2)  # no room but the held copy's: the write takes it
        assert (read_at(store, 0xB2) == 0xB2).all() and store.tensors[META.key].shards[
            0
        ].version == 3
        assert gone(store, 0xA1)


def test_the_lease_table_is_bounded_and_a_lease_of_no_tensor_refused() -> None:
    clock = Clock()
    leases = Leases(clock)
    for i in range(1, LEASES_MAX + 1):
        leases.grant(i, 5, 0xA1, 1.0)
    with pytest.raises(StoreError, match="leases") as ei:
        leases.grant(LEASES_MAX + 1, 5, 0xA1, 1.0)
    assert ei.value.status == Status.NO_SPACE
    assert leases.grant(1, 5, 0xA1, 10 * LEASE_MAX)[0] == LEASE_MAX  # renewed, capped
    clock.now += 2.0  # all but that one ran out: room again
    assert leases.grant(LEASES_MAX + 1, 5, 0xA1, 1.0)[0] == 1.0 and len(leases) == 2
    with open_store(4 * SHARD) as store, pytest.raises(StoreError) as ei:
        store.lease(1, META.key, 0xA1, 1.0)
    assert ei.value.status == Status.NOT_FOUND


async def test_a_lease_that_runs_out_frees_its_copy_without_another_write(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A reader that dies stops renewing: the daemon's lease task ends the lease when
    it runs out and frees the copy only it held (no write needed)."""
    with open_store(64 * SHARD, clock=trio.current_time) as store:
        ops = LeaseOps(store, Replies(RequestMetrics()))
        store.create(META)
        rewrite(store, 0xA1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ops.run)
            store.lease(3, META.key, 0xA1, 2.0)
            ops.granted()
            for stamp in (0xB1, 0xB2, 0xB3):
                rewrite(store, stamp)
            await trio.sleep(1.5)
            store.lease(3, META.key, 0xA1, 2.0)  # renewed: runs out 2 s from now
            ops.granted()
            await trio.sleep(1.5)
            assert not gone(store, 0xA1)  # 3 s after it was taken: renewed, still held
            used = store.arena.used
            await trio.sleep(1.0)
            assert gone(store, 0xA1) and store.arena.used == used - SHARD
            assert len(store.blocks.leases) == 0
            nursery.cancel_scope.cancel()
