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

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from ..protocol.directory import LIVE, SERVING_WORD, find_slot, header_of, table_of

# Version checks a read makes before it asks the daemon instead.
TRIES = 8

T = TypeVar("T")


class DirectReader:
    """One-sided reads from ``arena`` (the read-only mapping of a daemon's memfd).

    Safe to call from two threads at once (``Copier``): its counters are
    updated under a lock, its slot cache with single dict operations.
    """

    def __init__(self, arena: np.ndarray, offset: int, slots: int) -> None:
        self.arena = arena
        self.blocks_end = offset  # shard bytes lie below the directory
        self.table = table_of(arena, offset, slots)
        self.header = header_of(arena, offset, slots)
        self._slots: dict[tuple[int, int], int] = {}
        self._counting = threading.Lock()
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
        cut off from the majority), the shard is not in the directory, is older
        than ``min_version``, or kept changing during ``TRIES`` attempts (``out``
        then holds nothing useful)."""
        got, retries, gave_up = self._read(key, layout, index, offset, out, min_version)
        with self._counting:
            self.retries += retries
            self.contended += gave_up
            if got is not None:
                self.reads += 1
                self.bytes += len(out)
        return got

    def _read(
        self, key: int, layout: int, index: int, offset: int, out: np.ndarray, min_version: int
    ) -> tuple[tuple[int, int, int] | None, int, bool]:
        """``read``'s work: (its answer, the version checks that failed, whether it
        gave up after TRIES)."""
        if self.header[SERVING_WORD] != 1:
            return None, 0, False  # the daemon would refuse the read now: let it say why
        table = self.table
        where = (key, index)
        slot = self._slots.get(where)
        if slot is None:
            slot = find_slot(table, key, index, layout)
            if slot < 0:
                return None, 0, False
            self._slots[where] = slot
        n = len(out)
        retries = 0
        live = index + LIVE
        for _ in range(TRIES):
            # The words in one go, seq first; the seq read after the copy covers
            # them as well as the bytes (protocol/directory.py).
            seq, w_key, w_layout, state, block, prev, version, stamp = table[slot].tolist()
            if seq & 1:
                retries += 1
                continue
            if w_key != key or state != live or (layout and w_layout != layout):
                # Freed, reused or the tensor recreated: look for it afresh.
                self._slots.pop(where, None)
                slot = find_slot(table, key, index, layout)
                if slot < 0:
                    return None, retries, False
                self._slots[where] = slot
                continue
            start = block + offset
            if start + n > self.blocks_end or version < min_version:
                return None, retries, False
            np.copyto(out, self.arena[start : start + n])
            if int(table[slot, 0]) == seq:
                return (version, stamp, prev), retries, False
            retries += 1
        return None, retries, True


class Copier:
    """Runs the copies of one large one-sided read on two threads: the caller's and
    one of its own (numpy releases the GIL while it copies).

    Shard by shard, one thread copies at about a third of the speed of one
    large copy on these machines (glibc uses non-temporal stores only for
    copies above its threshold, far above a shard); two threads reach about
    the speed of one large copy (``bench/copies.py``).
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def run(self, calls: list[Callable[[], T]]) -> list[T]:
        """Call each of ``calls``, half of them in the other thread; results in order."""
        if len(calls) < 2:
            return [call() for call in calls]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="irdma-copy")
        half = len(calls) // 2
        theirs = self._pool.submit(lambda: [call() for call in calls[half:]])
        try:
            mine = [call() for call in calls[:half]]
        finally:
            rest = theirs.result()  # never leave the other thread writing into the caller's array
        return mine + rest

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
