"""The daemon's side of the shard directory: it publishes where each shard's bytes are.

The slot format, the seqlock and the memory-ordering argument are in
``irdma/protocol/directory.py``. Here the store's changes become slot
writes: ``place`` when a shard is created or installed (odd until its first
``publish``), ``begin`` before an update applied in place (the seq is odd
while the bytes change), ``publish`` after a shard's block, version or
stamp changed, and ``set_prev`` when a kept previous copy is freed. A block
replaced by copy-on-write is freed only after the slot names the new one,
so a reader that copied from the old block sees the seq move and retries.
"""

from __future__ import annotations

import numpy as np

from irdma.protocol.directory import (
    DIRECTORY_MAGIC,
    EMPTY,
    FREED,
    KEY,
    LAYOUT,
    LIVE,
    MAGIC_WORD,
    OFFSET,
    PREV,
    SEQ,
    SERVING_WORD,
    STATE,
    header_of,
    probe,
    table_of,
)


class Directory:
    """The slot table at ``offset`` of the arena mapping ``buf`` (``slots`` slots)."""

    def __init__(self, buf: np.ndarray, offset: int, slots: int) -> None:
        self.offset = offset
        self.slots = slots
        self.table = table_of(buf, offset, slots)
        self.table[:] = 0
        self.header = header_of(buf, offset, slots)
        self.header[:] = 0
        self.header[MAGIC_WORD] = DIRECTORY_MAGIC
        self.used = 0

    def set_serving(self, serving: bool) -> None:
        """Say whether this daemon would serve reads of its shards itself now."""
        self.header[SERVING_WORD] = int(serving)

    def place(self, key: int, layout: int, index: int) -> int:
        """A slot for a new shard (-1 when its probe range is full: served through the daemon).

        The slot stays odd (changing) until ``publish`` says where the shard's
        bytes are: a reader that finds it before then retries or asks the
        daemon, rather than take offset 0 and version 0 for the shard.
        """
        for slot in probe(key, index, self.slots):
            row = self.table[slot]
            if row[STATE] in (EMPTY, FREED):
                row[SEQ] += 1
                row[KEY] = key
                row[LAYOUT] = layout
                row[STATE] = index + LIVE
                row[OFFSET:] = 0  # offset, prev, version, stamp: set by publish
                self.used += 1
                return slot
        return -1

    def begin(self, slot: int) -> None:
        """Bytes of the slot's shard are about to change in place: readers retry until
        ``publish`` (or ``settle``, if the change failed) makes the seq even again."""
        if slot >= 0:
            self.table[slot, SEQ] += 1

    def relabel(self, slot: int, layout: int) -> None:
        """The slot's shard has another layout fingerprint now (its tensor was
        renamed); call between ``begin`` and ``publish``."""
        if slot >= 0:
            assert self.table[slot, SEQ] & 1, "relabel outside begin/publish"
            self.table[slot, LAYOUT] = layout

    def settle(self, slot: int) -> None:
        """End a change begun with ``begin`` that did not happen (seq even again)."""
        if slot >= 0 and self.table[slot, SEQ] & 1:
            self.table[slot, SEQ] += 1

    def publish(self, slot: int, offset: int, prev: int, version: int, stamp: int) -> None:
        """Say where the shard's bytes are now, their version and stamp, and the stamp
        of the previous copy kept (as reads carry stamps; ends a ``begin``)."""
        if slot < 0:
            return
        row = self.table[slot]
        if not row[SEQ] & 1:
            row[SEQ] += 1
        row[OFFSET:] = (offset, prev, version, stamp)
        row[SEQ] += 1

    def set_prev(self, slot: int, prev: int) -> None:
        """The stamp of the previous copy kept changed alone (the copy was freed).

        Inside a change (seq odd) the word is written as it is, and the change's
        ``publish`` writes every word again; otherwise the write is bracketed."""
        if slot < 0:
            return
        row = self.table[slot]
        if row[SEQ] & 1:
            row[PREV] = prev
            return
        row[SEQ] += 1
        row[PREV] = prev
        row[SEQ] += 1

    def free(self, slot: int) -> None:
        """The shard is gone from here: its slot names nothing now."""
        if slot < 0:
            return
        row = self.table[slot]
        row[SEQ] += 1
        row[KEY] = 0
        row[LAYOUT] = 0
        row[STATE] = FREED
        row[OFFSET:] = 0
        row[SEQ] += 1
        self.used -= 1
