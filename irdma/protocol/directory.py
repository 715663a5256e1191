"""The shard directory: where a daemon keeps each shard's bytes, readable without asking it.

A daemon's arena memfd ends with a table of 64-byte slots, one per shard it
holds (past the blocks its allocator hands out). Same-host clients map it
read-only with the arena; over RDMA it is inside the registered memory. A
client finds a shard's slot by probing from ``home_slot`` (linear probing,
at most ``MAX_PROBE`` slots) and keeps the index; every read checks that the
slot still names that shard, so a slot reused for another shard, or a shard
that moved, is noticed and never read as if it were the one asked for.

Each slot is a seqlock: eight little-endian u64 words

    0 seq      odd while the daemon changes the slot or the shard's bytes in place
    1 key      the tensor's key (0 in an empty or freed slot)
    2 layout   the tensor's layout fingerprint (a recreated tensor has another)
    3 state    EMPTY (0), FREED (1), or shard index + LIVE (2)
    4 offset   where the shard's current bytes start in the arena
    5 prev     the stamp of the previous copy the daemon keeps (0: none)
    6 version  the shard's version (grows with every update applied)
    7 stamp    the whole-tensor write its bytes come from

Stamps are as reads carry them (``messages.wire_stamp``: UNSTAMPED for a
shard no stamped write has replaced). The shard's length is not in the slot:
the reader knows it from the tensor's layout, which the slot must match.

After the slots comes one more, the directory's header: word 0 is
``DIRECTORY_MAGIC``, word 1 ``SERVING``: 1 while the daemon would serve a
read of its shards itself (with replicas: caught up and in the majority;
it rewrites the word every ``SERVING_REFRESH`` seconds), 0 otherwise. A
reader checks it before each read and asks the daemon while it is 0.

The daemon (``psd/directory.py``) makes ``seq`` odd, changes the slot and
(for an update in place) the shard's bytes, then makes ``seq`` even again.
A reader reads ``seq``, the slot and the bytes, then ``seq`` again: equal
and even means the bytes are one version, whole. Why that order holds:
on x86-64 (TSO) a CPU's stores become visible to other CPUs in program
order and loads are not reordered with older loads, so the reader's first
``seq`` load comes before its data loads, and the second after them. Large
copies may use non-temporal stores, which glibc fences (``sfence``) before
``memcpy`` returns, before the daemon's closing ``seq`` store. Other
architectures need explicit barriers that Python cannot issue, so one-sided
reads are used on x86-64 only (``ONE_SIDED_ARCH``). Over RDMA the three
reads are separate RDMA READs, the later ones posted with the fence flag so
each starts after the one before has completed.

No I/O here: the daemon writes slots, clients and tests read them.
"""

from __future__ import annotations

import platform
import struct
from dataclasses import dataclass

import numpy as np

SLOT_BYTES = 64
SLOT_WORDS = SLOT_BYTES // 8
SEQ, KEY, LAYOUT, STATE, OFFSET, PREV, VERSION, STAMP = range(SLOT_WORDS)
EMPTY = 0
FREED = 1
LIVE = 2  # state = shard index + LIVE
# A shard is looked for in at most this many slots from its home slot.
MAX_PROBE = 32
# Slots a daemon's table has: one per four pages of arena, a power of two in
# these bounds (a shard that finds no slot is still served, through the daemon).
MIN_SLOTS = 1 << 10
MAX_SLOTS = 1 << 18
SLOT = struct.Struct("<8Q")
# The header slot after the table.
DIRECTORY_MAGIC = int.from_bytes(b"IRDMDIR1", "little")
MAGIC_WORD, SERVING_WORD = 0, 1
# How often a replicated daemon rewrites its serving word (seconds): well
# under the failure timeout by which its peers decide it is gone.
SERVING_REFRESH = 0.05

ONE_SIDED_ARCH = platform.machine() in ("x86_64", "AMD64")

_MIX = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def slots_for(capacity: int, page: int = 4096) -> int:
    """The slot count of a daemon whose arena holds ``capacity`` bytes of blocks."""
    want = max(1, capacity // (4 * page))
    n = 1 << (want - 1).bit_length()
    return min(MAX_SLOTS, max(MIN_SLOTS, n))


def directory_bytes(slots: int) -> int:
    """Bytes of a directory of ``slots`` slots: the slots, then the header slot."""
    return (slots + 1) * SLOT_BYTES


def header_of(mapping: np.ndarray, offset: int, slots: int) -> np.ndarray:
    """The directory's header slot inside a mapped arena, as 8 u64 words."""
    at = offset + slots * SLOT_BYTES
    return mapping[at : at + SLOT_BYTES].view("<u8")


def home_slot(key: int, index: int, slots: int) -> int:
    """Where probing for shard ``index`` of tensor ``key`` starts (``slots``: a power of two)."""
    h = (key ^ ((index + 1) * _MIX)) & _MASK64
    h ^= h >> 29
    return h & (slots - 1)


def probe(key: int, index: int, slots: int) -> list[int]:
    """The slots shard ``index`` of ``key`` may occupy, in probing order."""
    home = home_slot(key, index, slots)
    return [(home + i) & (slots - 1) for i in range(min(MAX_PROBE, slots))]


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """A consistent reading of one slot (its seq was even and unchanged around it)."""

    seq: int
    key: int
    layout: int
    state: int
    offset: int
    prev: int
    version: int
    stamp: int

    def names(self, key: int, index: int, layout: int) -> bool:
        """Whether this slot holds shard ``index`` of the tensor ``key`` of ``layout``."""
        return (
            self.key == key and self.state == index + LIVE and (not layout or self.layout == layout)
        )


def table_of(mapping: np.ndarray, offset: int, slots: int) -> np.ndarray:
    """The directory inside a mapped arena (uint8 ``mapping``), as a ``slots`` x 8 u64 view."""
    return mapping[offset : offset + slots * SLOT_BYTES].view("<u8").reshape(slots, SLOT_WORDS)


def read_slot(table: np.ndarray, slot: int) -> SlotRecord | None:
    """The slot's words, or None while the daemon is changing it (seq odd or moved)."""
    row = table[slot]
    seq = int(row[SEQ])
    if seq & 1:
        return None
    words = row.tolist()
    if int(row[SEQ]) != seq:
        return None
    return SlotRecord(seq, *words[1:])


def slot_record(raw: np.ndarray) -> SlotRecord | None:
    """A slot read as 64 bytes in one go (an RDMA READ), or None if its seq was odd.

    One read is not atomic against the daemon's writes: the reader checks the
    seq again in a later read before it trusts what this says."""
    words = SLOT.unpack_from(raw.data)
    if words[SEQ] & 1:
        return None
    return SlotRecord(*words)


def find_slot(table: np.ndarray, key: int, index: int, layout: int) -> int:
    """The slot holding shard ``index`` of ``key`` (with ``layout``), or -1."""
    slots = len(table)
    for slot in probe(key, index, slots):
        rec = read_slot(table, slot)
        if rec is None:
            continue  # changing: it may be this one; probing on costs little
        if rec.names(key, index, layout):
            return slot
        if rec.state == EMPTY:
            return -1
    return -1
