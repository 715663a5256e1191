"""The connecting side of the AUTH handshake over a framed stream (``irdma.auth`` decides).

Used by every transport before its first other frame: TCP right after the
connect, shm before ATTACH, and by daemons reaching their peers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import trio

from ..auth import MAX_ANSWER, ClientHandshake
from ..errors import AuthFailed
from ..protocol import Header, ProtocolError
from .base import TRIO_WAITS, Buffer, StreamBroken, StreamTimeout


class FrameStream(Protocol):
    """What the handshake needs of a connection (``FramedSocket`` has it)."""

    peer: str

    async def recv_header(self) -> Header | None: ...

    async def recv_bytes(self, nbytes: int) -> bytearray: ...

    async def send_all(self, buffers: Sequence[Buffer]) -> None: ...

    def close(self) -> None: ...


async def prove_secret(stream: FrameStream, secret: bytes, timeout: float) -> None:
    """Prove to the daemon at the other end that we know ``secret``, and check its proof.

    Raises AuthFailed (refused, or the daemon's proof is wrong), StreamTimeout
    (no answer within ``timeout`` seconds) or StreamBroken (the connection
    failed, or the daemon sent garbage); the stream is closed then.
    """
    try:
        if getattr(stream, "waits", TRIO_WAITS) is not TRIO_WAITS:
            # Waits in the calling thread bound each wait by the timeout themselves.
            await _handshake(stream, secret)
            return
        with trio.move_on_after(timeout) as scope:
            await _handshake(stream, secret)
        if scope.cancelled_caught:
            raise StreamTimeout(f"authenticating to {stream.peer}: no answer within {timeout:g} s")
    except ProtocolError as exc:
        stream.close()
        raise StreamBroken(f"authenticating to {stream.peer}: {exc}") from exc
    except BaseException:
        stream.close()
        raise


async def _handshake(stream: FrameStream, secret: bytes) -> None:
    handshake = ClientHandshake(secret, stream.peer)
    await stream.send_all([handshake.challenge()])
    header, payload = await _answer(stream)
    await stream.send_all([handshake.answer_challenge(header, payload)])
    header, payload = await _answer(stream)
    handshake.finish(header, payload)


async def _answer(stream: FrameStream) -> tuple[Header, bytes]:
    header = await stream.recv_header()
    if header is None:
        raise StreamBroken(f"{stream.peer} closed the connection during authentication")
    if header.length > MAX_ANSWER:
        raise AuthFailed(f"daemon {stream.peer} sent an AUTH answer of {header.length} bytes")
    return header, bytes(await stream.recv_bytes(header.length))
