"""What a DIFF answer carries: the elements of a byte range that differ between two
versions of a tensor, and how a reader applies them (no I/O).

A reader holding version a of a range asks the daemon holding both a and b
for b; the answer is the cheapest of three encodings, each after a ``HEAD``:

- ``INDICES``: the changed elements' indices (uint32, from the range's
  start), then their new values;
- ``BITMAP``: one bit per element of the range (set: changed; numpy's
  ``packbits`` order, little), then the new values of those set;
- ``WHOLE``: the range's bytes at b, when neither saves anything.

Elements are compared by their bytes, so a NaN that stays the same NaN is
unchanged and ``-0.0`` replacing ``0.0`` is a change: the reader ends
bit-identical to b.
"""

from __future__ import annotations

import enum
import struct

import numpy as np

from .frame import ProtocolError

# encoding, item size, the number of changed elements (WHOLE: of all).
HEAD = struct.Struct("<BxxxIQ")
# The largest range one DIFF compares (indices are uint32 element numbers).
MAX_DIFF_ELEMENTS = 1 << 32
_UINTS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class Encoding(enum.IntEnum):
    WHOLE = 0
    INDICES = 1
    BITMAP = 2


def _elements(data: memoryview | bytes, itemsize: int) -> np.ndarray:
    """The range as one row per element, compared as unsigned integers."""
    raw = np.frombuffer(data, dtype=np.uint8)
    uint = _UINTS.get(itemsize)
    if uint is not None:
        return raw.view(uint)
    if itemsize % 8 == 0:  # complex128: two words per element
        return raw.view(np.uint64).reshape(-1, itemsize // 8)
    return raw.reshape(-1, itemsize)


def changed_mask(old: memoryview | bytes, new: memoryview | bytes, itemsize: int) -> np.ndarray:
    """One bool per element of two equal-sized ranges: whether its bytes differ."""
    if len(old) != len(new) or len(new) % itemsize:
        raise ValueError(
            f"ranges of {len(old)} and {len(new)} bytes are not the same whole "
            f"number of {itemsize}-byte elements"
        )
    ne = _elements(old, itemsize) != _elements(new, itemsize)
    return ne.any(axis=1) if ne.ndim == 2 else ne


def encode(
    old: memoryview | bytes, new: memoryview | bytes, itemsize: int
) -> list[bytes | memoryview]:
    """The buffers of a DIFF answer turning ``old`` into ``new`` (the cheapest
    encoding; ``WHOLE`` if no other saves a byte)."""
    n = len(new) // itemsize
    if n >= MAX_DIFF_ELEMENTS:
        raise ValueError(f"a DIFF range holds at most {MAX_DIFF_ELEMENTS - 1} elements")
    mask = changed_mask(old, new, itemsize)
    idx = np.flatnonzero(mask)
    count = len(idx)
    by_index = count * 4
    by_bitmap = -(-n // 8)
    if min(by_index, by_bitmap) + count * itemsize >= len(new):
        return [HEAD.pack(Encoding.WHOLE, itemsize, n), new]
    values = _elements(new, itemsize)[idx].tobytes()
    if by_index <= by_bitmap:
        return [HEAD.pack(Encoding.INDICES, itemsize, count), idx.astype("<u4").tobytes(), values]
    bits = np.packbits(mask, bitorder="little").tobytes()
    return [HEAD.pack(Encoding.BITMAP, itemsize, count), bits, values]


def apply(payload: memoryview | bytes, into: memoryview, itemsize: int) -> int:
    """Apply a DIFF answer to ``into`` (the reader's bytes of the range at version a,
    made b's); return the number of elements written. ProtocolError if the
    answer does not fit the range."""
    data = memoryview(payload).cast("B")
    if len(data) < HEAD.size:
        raise ProtocolError(f"a DIFF answer of {len(data)} bytes has no head")
    code, size, count = HEAD.unpack_from(data)
    if size != itemsize:
        raise ProtocolError(f"a DIFF answer of {size}-byte elements for {itemsize}-byte ones")
    n = len(into) // itemsize
    body = data[HEAD.size :]
    target = _elements(into, itemsize)
    if code == Encoding.WHOLE:
        if count != n or len(body) != len(into):
            raise ProtocolError(f"a whole DIFF answer of {len(body)} bytes for {len(into)}")
        into[:] = body
        return n
    if code == Encoding.INDICES:
        need = count * (4 + itemsize)
        if len(body) != need:
            raise ProtocolError(f"a DIFF answer of {count} indices has {len(body)} bytes")
        idx = np.frombuffer(body[: count * 4], dtype="<u4")
    elif code == Encoding.BITMAP:
        nbits = -(-n // 8)
        if len(body) != nbits + count * itemsize:
            raise ProtocolError(f"a DIFF bitmap answer of {count} values has {len(body)} bytes")
        bits = np.unpackbits(np.frombuffer(body[:nbits], np.uint8), count=n, bitorder="little")
        # Indices, then a fancy assignment: twice as fast as assigning by the mask.
        idx = np.flatnonzero(bits)
        if len(idx) != count:
            raise ProtocolError(f"a DIFF bitmap sets {len(idx)} bits for {count} values")
        target[idx] = _elements(body[nbits:], itemsize)
        return count
    else:
        raise ProtocolError(f"unknown DIFF encoding {code}")
    if count and int(idx.max()) >= n:
        raise ProtocolError(f"a DIFF index {int(idx.max())} is past the range's {n} elements")
    target[idx] = _elements(body[count * 4 :], itemsize)
    return count
