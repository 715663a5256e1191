"""Sinks: where response payloads are received, without intermediate bytes."""

from __future__ import annotations

from collections.abc import Callable

from ..protocol import ENTRY_SIZE, BatchEntry, Header, ProtocolError, Status, unpack_entries
from ..protocol.messages import batch_count
from ..transport.base import ByteStream, Sink


class IntoSink(Sink):
    """Receives a payload of exactly ``len(view)`` bytes into ``view``."""

    def __init__(self, view: memoryview, on_done: Callable[[int], None] | None = None) -> None:
        self.view = view
        self.on_done = on_done

    async def receive(self, stream: ByteStream, header: Header) -> None:
        if header.length != len(self.view):
            raise ProtocolError(f"expected {len(self.view)} bytes of data, got {header.length}")
        await stream.recv_exactly_into(self.view)
        if self.on_done is not None:
            self.on_done(len(self.view))


class BatchReadSink(Sink):
    """Receives a READ_BATCH answer: the entries, then each successful entry's data."""

    def __init__(self, views: list[memoryview]) -> None:
        self.views = views
        self.entries: list[BatchEntry] = []

    async def receive(self, stream: ByteStream, header: Header) -> None:
        n = len(self.views)
        count = batch_count(header)
        if count != 0 and count != n:
            raise ProtocolError(f"batch answer has {count} entries, expected {n}")
        head = bytearray(n * ENTRY_SIZE)
        if header.length < len(head):
            raise ProtocolError("batch answer is shorter than its entries")
        await stream.recv_exactly_into(head)
        self.entries = unpack_entries(head, n)
        expected = len(head)
        for entry, view in zip(self.entries, self.views, strict=True):
            if entry.status == Status.OK:
                if entry.length != len(view):
                    raise ProtocolError(
                        f"batch entry has {entry.length} bytes, expected {len(view)}"
                    )
                expected += entry.length
        if expected != header.length:
            raise ProtocolError(f"batch answer is {header.length} bytes, entries say {expected}")
        for entry, view in zip(self.entries, self.views, strict=True):
            if entry.status == Status.OK:
                await stream.recv_exactly_into(view)
