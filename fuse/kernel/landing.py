"""Reading a WRITE's data straight into the file it is for.

The kernel copies a write's bytes once, from the writer into the memory the
session reads /dev/fuse into; taking them from there into the writer's file
would be a second copy of every byte. A sequential writer's next WRITE starts
where its last one ended, so the session reads each request in three parts
(one readv): the ``WRITE_HEADERS`` bytes a WRITE's data follows, the writer's
file memory from where its next write is expected (``FileBuffer.landing``:
room past the file's end, never bytes of the file), and a spare tail. When
the request is that write, its data already lies where it belongs and
placing it copies nothing (``placed``). Any other request is joined into one
buffer and decoded as usual (``message``): what it left in the room past the
file's end is not part of the file, whose length says where its bytes end.
"""

from __future__ import annotations

from . import requests as rq


class Landing:
    """The parts each request is read into, and the write expected next."""

    def __init__(self, size: int) -> None:
        """``size``: the bytes one read must be able to take (the largest WRITE and
        its headers)."""
        self.head = bytearray(rq.WRITE_HEADERS)
        self.spare = bytearray(size - rq.WRITE_HEADERS)
        self.expected: tuple[int, int] | None = None  # (fh, offset) of the next WRITE
        self.room: memoryview | None = None  # where the last read put a WRITE's data

    def wrote(self, req: rq.Write) -> None:
        """``req`` arrived: the next write through its handle likely follows it."""
        self.expected = (req.fh, req.offset + len(req.data))

    def parts(self, room: memoryview | None, whole: bytearray) -> list[bytearray | memoryview]:
        """What to read the next request into: ``whole`` (``size`` bytes) where there
        is no ``room`` for the expected write's data, else the headers, ``room``
        and the spare tail, as many bytes in all."""
        self.room = None if room is None else room[: len(self.spare)]
        if self.room is None:
            return [whole]
        return [self.head, self.room, memoryview(self.spare)[: len(self.spare) - len(self.room)]]

    def placed(self, n: int) -> rq.Write | None:
        """The request of ``n`` bytes just read into ``parts`` if it is the write
        expected with all its data in the room; None for any other request."""
        room = self.room
        got = rq.write_of(self.head) if room is not None and n >= rq.WRITE_HEADERS else None
        if room is None or got is None:
            return None
        fh, offset, size = got
        if (fh, offset) != self.expected or size > len(room):
            return None
        return rq.decode_write(self.head, room[:size])

    def message(self, n: int, whole: bytearray) -> memoryview:
        """The request of ``n`` bytes just read into ``parts``, whole in ``whole`` (for
        ``decode``): copied there from the parts it was read into, if any."""
        if self.room is not None:
            head = min(n, len(self.head))
            whole[:head] = self.head[:head]
            done = head
            for part in (self.room, self.spare):
                take = min(n - done, len(part))
                whole[done : done + take] = part[:take]
                done += take
        return memoryview(whole)[:n]
