"""One-sided reads from a same-host daemon's arena: a version check and a copy.

A client attached over shared memory maps the daemon's whole arena
read-only, shard directory included (``irdma/protocol/directory.py``). A
read of a shard finds the shard's slot once (probing from its home slot)
and keeps it; then each read is: the slot's seq (even), its words, the copy
out of the arena, the seq again. Equal means the copied bytes are one
version of the shard, whole; anything else (the daemon changing the shard,
the slot freed or reused, a shard that moved) makes it look again, and
after ``TRIES`` attempts the read goes to the daemon, which pins a stable
copy: a shard being updated continuously never starves its readers.
"""

from __future__ import annotations

import numpy as np

from ..protocol.directory import SERVING_WORD, find_slot, header_of, read_slot, table_of

# Version checks a read makes before it asks the daemon instead.
TRIES = 8


class DirectReader:
    """One-sided reads from ``arena`` (the read-only mapping of a daemon's memfd)."""

    def __init__(self, arena: np.ndarray, offset: int, slots: int) -> None:
        self.arena = arena
        self.blocks_end = offset  # shard bytes lie below the directory
        self.table = table_of(arena, offset, slots)
        self.header = header_of(arena, offset, slots)
        self._slots: dict[tuple[int, int], int] = {}
        # How reads went: served here (and their bytes), version checks that
        # failed (the daemon changed the shard meanwhile), reads handed to the
        # daemon after TRIES such failures.
        self.reads = 0
        self.bytes = 0
        self.retries = 0
        self.contended = 0

    def read(
        self, key: int, layout: int, index: int, offset: int, out: np.ndarray, min_version: int = 0
    ) -> tuple[int, int, int] | None:
        """Copy bytes ``[offset, offset + len(out))`` of shard ``index`` of ``key`` into
        ``out`` (uint8); return (version, stamp, previous copy's stamp), or None when
        the daemon must answer: it is not serving reads itself now (catching up,
        cut off from the majority),
        the shard is not in the directory, is older than ``min_version``, or kept
        changing during ``TRIES`` attempts (``out`` then holds nothing useful)."""
        if self.header[SERVING_WORD] != 1:
            return None  # the daemon would refuse the read now: let it say why
        table = self.table
        where = (key, index)
        slot = self._slots.get(where)
        if slot is None:
            slot = find_slot(table, key, index, layout)
            if slot < 0:
                return None
            self._slots[where] = slot
        n = len(out)
        for _ in range(TRIES):
            rec = read_slot(table, slot)
            if rec is None:
                self.retries += 1
                continue
            if not rec.names(key, index, layout):
                # Freed, reused or the tensor recreated: look for it afresh.
                del self._slots[where]
                slot = find_slot(table, key, index, layout)
                if slot < 0:
                    return None
                self._slots[where] = slot
                continue
            start = rec.offset + offset
            if start + n > self.blocks_end or rec.version < min_version:
                return None
            np.copyto(out, self.arena[start : start + n])
            if int(table[slot, 0]) == rec.seq:
                self.reads += 1
                self.bytes += n
                return rec.version, rec.stamp, rec.prev
            self.retries += 1
        self.contended += 1
        return None

    def forget(self, key: int) -> None:
        """Drop the slots kept for a tensor (deleted or recreated by this client)."""
        self._slots = {w: s for w, s in self._slots.items() if w[0] != key}
