"""The payload of the request a daemon is handling: read by the handler, the rest skipped.

Every request frame carries ``header.length`` payload bytes. A handler reads
what it needs through ``RequestPayload``; whatever it leaves (because it
refused the request, or the op ignores a payload) is skipped by the
dispatcher once the handler is done, so the next frame starts where it
should. No handler skips bytes by hand.
"""

from __future__ import annotations

from irdma.protocol import ProtocolError
from irdma.transport.tcp import FramedSocket


class RequestPayload:
    """The unread part of one request's payload on ``stream``."""

    __slots__ = ("left", "stream")

    def __init__(self, stream: FramedSocket, length: int) -> None:
        self.stream = stream
        self.left = length

    def _take(self, n: int) -> None:
        if n > self.left:
            # A handler bug, not the peer's: it asked for more than the frame has.
            raise ProtocolError(f"reading {n} bytes of a payload with {self.left} left")
        self.left -= n

    async def read_into(self, view: memoryview | bytearray | object) -> None:
        """Fill ``view`` (a buffer) with the next bytes of the payload."""
        n = memoryview(view).nbytes  # type: ignore[arg-type]
        self._take(n)
        await self.stream.recv_exactly_into(view)  # type: ignore[arg-type]

    async def read_bytes(self, n: int) -> bytearray:
        """The next ``n`` bytes of the payload."""
        self._take(n)
        return await self.stream.recv_bytes(n)

    async def skip(self, n: int) -> None:
        """Pass over the next ``n`` bytes (a refused entry of a batch)."""
        self._take(n)
        await self.stream.skip(n)

    async def skip_rest(self) -> None:
        """Pass over what the handler did not read."""
        if self.left:
            n, self.left = self.left, 0
            await self.stream.skip(n)
