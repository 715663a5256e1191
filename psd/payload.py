"""The payload of the request a daemon is handling: read by the handler, the rest skipped.

Every request frame carries ``header.length`` payload bytes. A handler reads
what it needs through ``RequestPayload``; whatever it leaves (because it
refused the request, or the op ignores a payload) is skipped by the
dispatcher once the handler is done, so the next frame starts where it
should. No handler skips bytes by hand.
"""

from __future__ import annotations

import numpy as np

from irdma.protocol.conversation import PayloadLeft
from irdma.transport.tcp import FramedSocket


class RequestPayload(PayloadLeft):
    """The unread part of one request's payload on ``stream`` (the accounting is the
    protocol's ``PayloadLeft``; this adds the reading)."""

    __slots__ = ("stream",)

    def __init__(self, stream: FramedSocket, length: int) -> None:
        super().__init__(length)
        self.stream = stream

    async def read_into(self, view: np.ndarray) -> None:
        """Fill ``view`` (an update's landing buffer, a shard copy) with the next bytes
        of the payload."""
        self.take(view.nbytes)
        await self.stream.recv_exactly_into(view.data)

    async def read_bytes(self, n: int) -> bytearray:
        """The next ``n`` bytes of the payload."""
        self.take(n)
        return await self.stream.recv_bytes(n)

    async def skip(self, n: int) -> None:
        """Pass over the next ``n`` bytes (a refused entry of a batch)."""
        self.take(n)
        await self.stream.skip(n)

    async def skip_rest(self) -> None:
        """Pass over what the handler did not read."""
        n = self.rest()
        if n:
            await self.stream.skip(n)
