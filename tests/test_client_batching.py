"""Batch frames (irdma/client/batching.py): many tensors' pieces cut into frames of at
most BATCH_ENTRIES entries and BATCH_BYTES of payload. Pure."""

from __future__ import annotations

from irdma.client.batching import BATCH_BYTES, BATCH_ENTRIES, frames_of
from irdma.protocol import ENTRY_SIZE, BatchEntry


def work(count: int, size: int) -> list[tuple[BatchEntry, memoryview]]:
    view = memoryview(bytes(size))
    return [(BatchEntry(i, 0, 0, size), view) for i in range(count)]


def test_frames_hold_at_most_the_entries_a_frame_may_carry() -> None:
    frames = list(frames_of(work(2 * BATCH_ENTRIES + 1, 8)))
    assert [len(f) for f in frames] == [BATCH_ENTRIES, BATCH_ENTRIES, 1]
    # In order, every entry once.
    assert [e.key for f in frames for e, _ in f] == list(range(2 * BATCH_ENTRIES + 1))


def test_frames_hold_at_most_the_payload_a_frame_may_carry() -> None:
    size = BATCH_BYTES // 3
    frames = list(frames_of(work(7, size)))
    assert all(sum(len(v) + ENTRY_SIZE for _, v in f) <= BATCH_BYTES for f in frames)
    assert [len(f) for f in frames] == [2, 2, 2, 1]


def test_a_piece_larger_than_a_frame_goes_alone() -> None:
    frames = list(frames_of(work(2, BATCH_BYTES + 1)))
    assert [len(f) for f in frames] == [1, 1]
    assert list(frames_of([])) == []
