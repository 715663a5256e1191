"""Tests for irdma_psd.store.copies: which copies a shard keeps for readers of
older whole-tensor writes, and which one a read gets. Plain records, no arena."""

from __future__ import annotations

import pytest
from irdma_psd.arena import Block
from irdma_psd.store import Shard, StoreError, copies

from irdma.protocol import Status
from irdma.protocol.messages import UNSTAMPED


def shard() -> Shard:
    return Shard(0, 4096, Block(0, 4096), version=1)


def test_a_stamped_write_keeps_the_copy_it_replaces_as_prev() -> None:
    s = shard()
    first = s.block
    gone = copies.keep_previous(s, Block(4096, 4096), 0xA0, now=10.0)
    assert gone == []
    assert (s.prev, s.prev_stamp, s.prev_version, s.stamp) == (first, 0, 1, 0xA0)
    assert copies.copy_for(s, UNSTAMPED) == (first, 1)  # the copy before any stamped write
    assert copies.copy_for(s, 0xA0) == (s.block, 1) and copies.copy_for(s, 0)[0] is s.block


def test_older_copies_go_past_the_most_kept_and_past_their_time() -> None:
    s = shard()
    blocks = [Block(4096 * i, 4096) for i in range(1, 5)]
    copies.keep_previous(s, blocks[0], 0xA0, now=0.0)
    s.version = 2
    assert copies.keep_previous(s, blocks[1], 0xB0, now=1.0) == []  # older: the first copy
    s.version = 3
    first = s.older[0][1]
    # One older copy at most: the oldest goes.
    assert copies.keep_previous(s, blocks[2], 0xC0, now=2.0) == [first]
    assert [stamp for stamp, *_ in s.older] == [0xA0]
    # And none past the time kept, even under the most.
    later = 2.0 + copies.OLDER_COPIES_KEPT + 1
    gone = copies.keep_previous(s, blocks[3], 0xD0, now=later)
    assert gone == [blocks[0]] and [stamp for stamp, *_ in s.older] == [0xB0]


def test_a_read_of_a_copy_not_yet_come_is_pending_and_of_one_gone_is_gone() -> None:
    s = shard()
    copies.keep_previous(s, Block(4096, 4096), 0xA0, now=0.0)
    copies.keep_previous(s, Block(8192, 4096), 0xB0, now=0.0)
    copies.keep_previous(s, Block(12288, 4096), 0xC0, now=0.0)
    with pytest.raises(StoreError) as ei:
        copies.copy_for(s, 0xE0)
    assert ei.value.status == Status.STAMP_PENDING
    with pytest.raises(StoreError) as ei:
        copies.copy_for(s, UNSTAMPED)  # the unstamped copy was let go
    assert ei.value.status == Status.STAMP_GONE


def test_letting_go_returns_every_kept_block_once() -> None:
    s = shard()
    first = s.block
    copies.keep_previous(s, Block(4096, 4096), 0xA0, now=0.0)
    second = s.block
    copies.keep_previous(s, Block(8192, 4096), 0xB0, now=0.0)
    assert copies.let_go_all(s) == [second, first]
    assert s.prev is None and s.older == [] and copies.let_go_all(s) == []
    copies.stamped_in_place(s, 0xC0)  # no room for two: the only copy is the write's
    assert s.stamp == 0xC0 and copies.copy_for(s, 0xC0)[0] is s.block
