"""Reading a WRITE's data where it belongs (fuse/kernel/landing.py), without a mount.

A read of /dev/fuse fills the parts it is given front to back, as readv does;
``fill`` does the same with a message built here.
"""

from __future__ import annotations

import struct

from irdma_fuse.kernel import requests as rq
from irdma_fuse.kernel.landing import Landing

SIZE = 4096 + rq.WRITE_HEADERS


def write_message(fh: int, offset: int, data: bytes, unique: int = 9) -> bytes:
    head = struct.pack("<IIQQIIIHH", rq.WRITE_HEADERS + len(data), 16, unique, 5, 0, 0, 0, 0, 0)
    return head + struct.pack("<QQIIQII", fh, offset, len(data), 0, 0, 0, 0) + data


def fill(parts: list, message: bytes) -> int:
    """What readv does with ``message``: each part filled in turn."""
    assert sum(len(p) for p in parts) == SIZE  # as much as the kernel requires
    done = 0
    for part in parts:
        take = min(len(part), len(message) - done)
        part[:take] = message[done : done + take]
        done += take
    return done


def test_the_expected_write_lands_in_its_room() -> None:
    landing = Landing(SIZE)
    landing.wrote(rq.Write(1, 5, 0, 0, 0, fh=3, offset=0, data=b"x" * 100))
    assert landing.expected == (3, 100)
    file = bytearray(1000)
    room = memoryview(file)[100:]
    n = fill(landing.parts(room, bytearray(SIZE)), write_message(3, 100, b"abc"))
    w = landing.placed(n)
    assert w is not None and (w.fh, w.offset, bytes(w.data)) == (3, 100, b"abc")
    assert file[100:103] == b"abc"  # read where it belongs: nothing to copy


def test_any_other_request_is_joined_whole() -> None:
    landing = Landing(SIZE)
    landing.expected = (3, 100)
    room = memoryview(bytearray(300))
    into = bytearray(SIZE)
    for message in (
        write_message(3, 0, b"q" * 500),  # another offset, and longer than the room
        write_message(4, 100, b"r" * 50),  # another file
        struct.pack("<IIQQIIIHH", 40 + 6, 1, 11, 1, 0, 0, 0, 0, 0) + b"w.npy\0",  # LOOKUP
    ):
        n = fill(landing.parts(room, into), message)
        assert landing.placed(n) is None
        joined = landing.message(n, into)
        assert bytes(joined) == message
        assert rq.decode(joined) == rq.decode(message)


def test_a_write_longer_than_its_room_is_joined() -> None:
    landing = Landing(SIZE)
    landing.expected = (3, 100)
    room = memoryview(bytearray(10))
    message = write_message(3, 100, bytes(range(40)))
    whole = bytearray(SIZE)
    n = fill(landing.parts(room, whole), message)
    assert landing.placed(n) is None
    assert bytes(landing.message(n, whole)) == message


def test_without_room_a_request_is_read_whole() -> None:
    landing = Landing(SIZE)
    whole = bytearray(SIZE)
    message = write_message(3, 0, b"abc")
    n = fill(landing.parts(None, whole), message)
    assert landing.placed(n) is None  # no write was expected
    assert bytes(landing.message(n, whole)) == message
