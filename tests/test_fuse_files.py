"""A writer's buffer (fuse/files.py FileBuffer): the file as it will be pushed."""

from __future__ import annotations

import numpy as np
from irdma_fuse.files import FileBuffer


def test_a_loaded_file_becomes_the_buffer_without_a_copy() -> None:
    loaded = np.arange(100, dtype=np.uint8)
    buf = FileBuffer.holding(loaded)
    assert np.shares_memory(buf.array, loaded) and len(buf) == 100
    buf.write(10, b"\xff\xff")  # in place, within the file
    assert loaded[10] == 255 and bytes(buf.view()) == loaded.tobytes()
    buf.write(120, b"\x07")  # past the end: grows, the hole reads as zeros
    assert len(buf) == 121 and bytes(buf.read(100, 21)) == bytes(20) + b"\x07"
    assert bytes(buf.read(0, 12))[10:] == b"\xff\xff"
    buf.resize(5)
    assert bytes(buf.view()) == bytes(range(5))


def test_a_new_buffer_copies_what_it_starts_from() -> None:
    start = bytearray(b"abc")
    buf = FileBuffer(start, capacity=1 << 20)
    start[0] = ord("z")
    assert bytes(buf.view()) == b"abc" and len(buf.array) >= 1 << 20


def test_landing_is_room_past_the_end_and_a_write_there_is_not_copied() -> None:
    buf = FileBuffer(b"abcd")
    end = len(buf.array)
    assert buf.landing(2, 8) is None  # bytes of the file lie there
    assert buf.landing(end, 8) is None  # past the memory
    assert buf.landing(end - 60, 100) is not None and len(buf.landing(end - 60, 100)) == 60
    room = buf.landing(4, 100)
    assert room is not None and len(room) == 100
    room[:3] = b"xyz"  # what the kernel's read puts there
    before = buf.array.copy()
    buf.write(4, room[:3])
    assert bytes(buf.view()) == b"abcdxyz" and np.array_equal(buf.array, before)
    # A write read elsewhere is copied in as before.
    buf.write(7, b"!")
    assert bytes(buf.view()) == b"abcdxyz!"


def test_a_write_landed_in_memory_the_buffer_has_since_outgrown_is_copied() -> None:
    buf = FileBuffer(b"ab")
    room = buf.landing(2, 2)
    assert room is not None
    room[:2] = b"cd"
    old = buf.array
    buf.resize(len(old) + 1)  # grows: new memory, with the file's bytes only
    assert not np.shares_memory(buf.array, old)
    buf.write(2, room[:2])  # the landed bytes lie in the old memory: copied over
    assert bytes(buf.view()[:4]) == b"abcd"
