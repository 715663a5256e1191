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
