"""The shard directory (irdma.protocol.directory, psd/directory.py) and the store's use of
it: slots found by probing, the seqlock, copy-on-write publishing, whole-tensor stamps
and previous copies. Plain numpy, no daemon."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from irdma_psd.arena import ArenaFullError
from irdma_psd.directory import Directory
from irdma_psd.store import Store, StoreError, copies

from irdma.protocol import Op, Status, TensorMeta
from irdma.protocol.directory import (
    MAX_PROBE,
    MAX_SLOTS,
    MIN_SLOTS,
    SEQ,
    directory_bytes,
    find_slot,
    home_slot,
    probe,
    read_slot,
    slots_for,
)
from irdma.protocol.messages import UNSTAMPED
from irdma.transport.direct import TRIES, DirectReader

from .helpers.stores import open_store

SHARD = 8192


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store() as store:
        store.directory.set_serving(True)  # what a serving daemon says (psd/server.py)
        yield store


def meta(name: str = "d/x", n: int = 3 * SHARD // 4, dtype: str = "float32") -> TensorMeta:
    return TensorMeta(name, dtype, (n,), SHARD)


def reader(store: Store) -> DirectReader:
    d = store.directory
    return DirectReader(store.arena.buf, d.offset, d.slots)


def apply(store: Store, m: TensorMeta, index: int, data: np.ndarray, *, stamp: int = 0,
          op: Op = Op.WRITE, offset: int = 0) -> int:  # fmt: skip
    raw = np.ascontiguousarray(data).view(np.uint8)
    u = store.begin_update(op, m.key, index, offset, raw.nbytes)
    u.buffer[:] = raw
    u.stamp = stamp
    return store.commit(u)


def direct_read(store: Store, m: TensorMeta, index: int) -> tuple[np.ndarray, tuple]:
    out = np.empty(m.shard_span(index)[1], np.uint8)
    got = reader(store).read(m.key, m.layout, index, 0, out)
    assert got is not None
    return out.view(m.np_dtype), got


# -- the table ------------------------------------------------------------------------


def test_slot_counts_are_powers_of_two_within_bounds() -> None:
    assert slots_for(1 << 20) == MIN_SLOTS
    assert slots_for(1 << 40) == MAX_SLOTS
    n = slots_for(1 << 30)
    assert n & (n - 1) == 0 and MIN_SLOTS <= n <= MAX_SLOTS


def test_probing_starts_at_a_stable_home_and_wraps() -> None:
    assert home_slot(123, 4, 1024) == home_slot(123, 4, 1024)
    slots = probe(2**64 - 1, 7, 1024)
    assert len(slots) == MAX_PROBE == len(set(slots))
    assert all(0 <= s < 1024 for s in slots)


def test_a_placed_shard_is_found_and_a_freed_one_is_not() -> None:
    buf = np.zeros(directory_bytes(1024), np.uint8)
    d = Directory(buf, 0, 1024)
    slot = d.place(99, 5, 3)
    d.publish(slot, 4096, 0, 7, UNSTAMPED)
    assert find_slot(d.table, 99, 3, 5) == slot
    assert find_slot(d.table, 99, 3, 6) == -1  # another layout: a recreated tensor
    rec = read_slot(d.table, slot)
    assert rec is not None and (rec.offset, rec.version, rec.stamp) == (4096, 7, UNSTAMPED)
    d.free(slot)
    assert find_slot(d.table, 99, 3, 5) == -1
    # A freed slot on the probe path is skipped, not taken for the end of it.
    a = d.place(1, 1, 0)
    b = d.place(1, 1, 0)  # same home: the next slot
    for placed in (a, b):
        d.publish(placed, 0, 0, 1, UNSTAMPED)  # a placed slot is read once published
    d.free(a)
    assert find_slot(d.table, 1, 0, 1) == b


def test_a_slot_being_changed_reads_as_none_until_published() -> None:
    buf = np.zeros(directory_bytes(1024), np.uint8)
    d = Directory(buf, 0, 1024)
    slot = d.place(5, 1, 0)
    d.publish(slot, 0, 0, 1, UNSTAMPED)
    d.begin(slot)
    assert d.table[slot, SEQ] % 2 == 1 and read_slot(d.table, slot) is None
    d.publish(slot, 8192, 0, 2, UNSTAMPED)
    rec = read_slot(d.table, slot)
    assert rec is not None and rec.version == 2 and rec.seq % 2 == 0
    d.begin(slot)
    d.settle(slot)  # a change that did not happen
    assert read_slot(d.table, slot) is not None


def test_a_placed_slot_is_not_read_until_its_first_publish() -> None:
    """Between ``place`` and ``publish`` the slot names the shard but not its bytes
    (offset 0, version 0): a one-sided reader must not take that for the shard."""
    buf = np.zeros(directory_bytes(1024), np.uint8)
    d = Directory(buf, 0, 1024)
    slot = d.place(42, 3, 0)
    assert read_slot(d.table, slot) is None
    assert find_slot(d.table, 42, 0, 3) == -1
    d.publish(slot, 8192, 0, 1, UNSTAMPED)
    rec = read_slot(d.table, slot)
    assert rec is not None and (rec.offset, rec.version) == (8192, 1)
    assert find_slot(d.table, 42, 0, 3) == slot


def test_a_full_probe_range_leaves_the_shard_without_a_slot() -> None:
    buf = np.zeros(directory_bytes(MIN_SLOTS), np.uint8)
    d = Directory(buf, 0, MIN_SLOTS)
    for _ in range(MAX_PROBE):
        assert d.place(7, 1, 0) >= 0
    assert d.place(7, 1, 0) == -1


# -- the store publishes every change ------------------------------------------------


def test_reads_follow_in_place_updates_and_copy_on_write(store: Store) -> None:
    m = meta()
    store.create(m)
    x = np.arange(SHARD // 4, dtype=np.float32)
    apply(store, m, 0, x)
    got, (version, stamp, prev) = direct_read(store, m, 0)
    assert np.array_equal(got, x) and version == 1 and stamp == UNSTAMPED and prev == 0
    shard = store.tensors[m.key].shards[0]
    before = shard.block.offset
    store.pin(shard.block)  # a reader holds it: the next update writes a new block
    apply(store, m, 0, np.ones(SHARD // 4, np.float32), op=Op.ACCUMULATE)
    assert shard.block.offset != before
    got, (version, *_) = direct_read(store, m, 0)
    assert np.array_equal(got, x + 1) and version == 2


def test_a_freed_or_recreated_tensor_is_never_read_from_its_old_slot(store: Store) -> None:
    m = meta()
    store.create(m)
    r = reader(store)
    out = np.empty(SHARD, np.uint8)
    assert r.read(m.key, m.layout, 0, 0, out) is not None
    store.delete(m.key)
    assert r.read(m.key, m.layout, 0, 0, out) is None
    other = meta(dtype="int32")  # same name and key, another layout
    store.create(other)
    apply(store, other, 0, np.full(SHARD // 4, 3, np.int32))
    assert r.read(m.key, m.layout, 0, 0, out) is None
    assert r.read(other.key, other.layout, 0, 0, out) is not None
    assert np.array_equal(out.view(np.int32), np.full(SHARD // 4, 3, np.int32))


def test_a_daemon_that_would_refuse_reads_is_asked(store: Store) -> None:
    """Catching up or cut off from the majority, a daemon says so in its directory:
    readers ask it (and hear why) instead of reading its memory."""
    m = meta()
    store.create(m)
    r = reader(store)
    out = np.empty(SHARD, np.uint8)
    assert r.read(m.key, m.layout, 0, 0, out) is not None
    store.directory.set_serving(False)
    assert r.read(m.key, m.layout, 0, 0, out) is None
    store.directory.set_serving(True)
    assert r.read(m.key, m.layout, 0, 0, out) is not None


def test_a_shard_that_keeps_changing_is_handed_to_the_daemon(store: Store) -> None:
    m = meta()
    store.create(m)
    slot = store.tensors[m.key].shards[0].slot
    r = reader(store)
    out = np.empty(SHARD, np.uint8)
    assert r.read(m.key, m.layout, 0, 0, out) is not None  # its slot is known now
    store.directory.begin(slot)  # the daemon is in the middle of an update
    assert r.read(m.key, m.layout, 0, 0, out) is None
    assert r.contended == 1 and r.retries == TRIES
    store.directory.settle(slot)
    assert r.read(m.key, m.layout, 0, 0, out) is not None


def test_a_copy_changed_during_the_read_is_read_again(store: Store) -> None:
    """The seq moves between the first look and the copy's end: the bytes are not kept."""
    m = meta()
    store.create(m)
    apply(store, m, 0, np.full(SHARD // 4, 1, np.float32))
    r = reader(store)
    original = np.copyto
    changes = []

    def copy_then_update(dst, src, **kw):  # the daemon updates the shard mid-copy
        original(dst, src, **kw)
        if not changes:
            changes.append(1)
            apply(store, m, 0, np.full(SHARD // 4, 2, np.float32))

    out = np.empty(SHARD, np.uint8)
    np.copyto = copy_then_update
    try:
        got = r.read(m.key, m.layout, 0, 0, out)
    finally:
        np.copyto = original
    assert got is not None and got[0] == 2 and r.retries == 1
    assert np.array_equal(out.view(np.float32), np.full(SHARD // 4, 2, np.float32))


def test_slots_are_counted_in_and_out(store: Store) -> None:
    m = meta()
    store.create(m)
    assert store.directory.used == m.num_shards
    store.delete(m.key)
    assert store.directory.used == 0


# -- whole-tensor writes: stamps and previous copies ----------------------------------


def test_a_stamped_write_keeps_the_previous_copy_for_its_readers(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = meta()
    store.create(m)
    old = np.full(SHARD // 4, 1, np.float32)
    apply(store, m, 0, old)
    apply(store, m, 0, np.full(SHARD // 4, 2, np.float32), stamp=0xA0)
    shard = store.tensors[m.key].shards[0]
    assert shard.stamp == 0xA0 and shard.prev is not None
    # The copy from before any stamped write is asked for as UNSTAMPED.
    block, version = copies.copy_for(shard, UNSTAMPED)
    assert version == 1
    assert np.array_equal(store.arena.view(block, 0, SHARD).view(np.float32), old)
    _, (version, stamp, prev) = direct_read(store, m, 0)
    assert (version, stamp, prev) == (2, 0xA0, UNSTAMPED)
    # An accumulate changes the current copy only; the previous stays.
    apply(store, m, 0, np.ones(SHARD // 4, np.float32), op=Op.ACCUMULATE)
    assert copies.copy_for(shard, 0xA0)[1] == 3
    apply(store, m, 0, np.full(SHARD // 4, 5, np.float32), stamp=0xB0)
    assert copies.copy_for(shard, 0xA0)[1] == 3
    assert copies.copy_for(shard, UNSTAMPED)[1] == 1  # two writes ago: kept a while
    monkeypatch.setattr(copies, "OLDER_COPIES_KEPT", 0.0)
    apply(store, m, 0, np.full(SHARD // 4, 6, np.float32), stamp=0xC0)
    assert copies.copy_for(shard, 0xB0)[1] == 4
    assert copies.copy_for(shard, 0xA0)[1] == 3  # replaced just now: kept
    with pytest.raises(StoreError) as info:
        copies.copy_for(shard, UNSTAMPED)  # replaced before, past the time kept
    assert info.value.status == Status.STAMP_GONE
    with pytest.raises(StoreError) as info:
        copies.copy_for(shard, 0xD0)  # a write that has not come here yet
    assert info.value.status == Status.STAMP_PENDING


def test_a_shard_rewritten_back_to_back_keeps_a_bounded_number_of_copies(
    store: Store,
) -> None:
    """Within OLDER_COPIES_KEPT, only OLDER_COPIES_MAX older copies stay: the shard
    cycles through a few blocks instead of taking fresh arena room each write."""
    m = meta()
    store.create(m)
    for i in range(10):
        apply(store, m, 0, np.full(SHARD // 4, i, np.float32), stamp=0xA0 + i)
    shard = store.tensors[m.key].shards[0]
    assert len(shard.older) == copies.OLDER_COPIES_MAX
    kept = 2 + copies.OLDER_COPIES_MAX  # the current copy, prev, the older ones
    assert store.arena.used == (kept + m.num_shards - 1) * SHARD  # the others: one each
    assert copies.copy_for(shard, 0xA0 + 8)[1] == 9  # prev
    assert copies.copy_for(shard, 0xA0 + 8 - copies.OLDER_COPIES_MAX)[1]
    with pytest.raises(StoreError) as info:
        copies.copy_for(shard, 0xA0 + 7 - copies.OLDER_COPIES_MAX)
    assert info.value.status == Status.STAMP_GONE


def test_a_stamp_needs_a_write_of_the_whole_shard(store: Store) -> None:
    m = meta()
    store.create(m)
    with pytest.raises(StoreError) as info:
        apply(store, m, 0, np.ones(4, np.float32), stamp=0xA0)
    assert info.value.status == Status.BAD_ARGUMENT
    with pytest.raises(StoreError):
        apply(store, m, 0, np.ones(SHARD // 4, np.float32), stamp=0xA0, op=Op.ACCUMULATE)
    assert store.tensors[m.key].shards[0].version == 0


def test_previous_copies_give_their_room_back_when_the_arena_needs_it(store: Store) -> None:
    m = meta(n=3 * SHARD // 4)
    store.create(m)
    for i in range(m.num_shards):
        apply(store, m, i, np.full(SHARD // 4, 1, np.float32), stamp=0xA0)
    assert len(store.blocks.prevs) == m.num_shards
    held = store.arena.used
    # Fill what is left; the next allocation takes the previous copies back.
    blocks = []
    with pytest.raises(ArenaFullError):
        while True:
            blocks.append(store.arena.alloc(SHARD))
    big = meta("d/big", n=SHARD // 4)
    store.create(big)
    assert store.blocks.prevs == {} and store.arena.used < held + len(blocks) * SHARD + SHARD
    shard = store.tensors[m.key].shards[0]
    with pytest.raises(StoreError):
        copies.copy_for(shard, UNSTAMPED)
    assert copies.copy_for(shard, 0xA0)[0] is shard.block


def test_a_previous_copy_given_back_is_no_longer_named_by_the_slot(store: Store) -> None:
    """Readers learn the previous copy's stamp from the slot; once the copy is freed
    (the arena needed the room) the slot says there is none, so no reader asks for it."""
    m = meta()
    store.create(m)
    apply(store, m, 0, np.full(SHARD // 4, 1, np.float32), stamp=0xA0)
    apply(store, m, 0, np.full(SHARD // 4, 2, np.float32), stamp=0xB0)
    _, (_, stamp, prev) = direct_read(store, m, 0)
    assert (stamp, prev) == (0xB0, 0xA0)
    seq = store.directory.table[store.tensors[m.key].shards[0].slot, SEQ]
    store.blocks.drop_prevs()
    got, (version, stamp, prev) = direct_read(store, m, 0)
    assert (version, stamp, prev) == (2, 0xB0, 0) and (got == 2).all()
    assert store.directory.table[store.tensors[m.key].shards[0].slot, SEQ] == seq + 2


# -- rename ------------------------------------------------------------------


def test_a_rename_relabels_the_slots_so_a_reader_of_the_old_name_is_refused(
    store: Store,
) -> None:
    old = meta("d/a", 2 * SHARD // 4)
    store.create(old)
    data = np.arange(SHARD // 4, dtype=np.float32)
    version = apply(store, old, 0, data)
    out = np.empty(SHARD, dtype=np.uint8)
    assert reader(store).read(old.key, old.layout, 0, 0, out) is not None
    renamed = store.rename(old.key, "d/a", "d/b").meta
    assert renamed.key == old.key and renamed.layout != old.layout
    # The old name's layout finds nothing; the new one finds the same bytes, one
    # version on (a replica that missed the rename is behind).
    assert reader(store).read(old.key, old.layout, 0, 0, out) is None
    got = reader(store).read(renamed.key, renamed.layout, 0, 0, out)
    assert got is not None and got[0] == version + 1
    assert np.array_equal(out.view(np.float32), data)
    assert store.directory.table[store.tensors[old.key].shards[0].slot, SEQ] % 2 == 0
