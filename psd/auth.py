"""The daemon's side of authentication: the gate every connection passes first.

With a secret, a connection (TCP, or the shm unix socket before ATTACH)
must complete the AUTH handshake (``irdma.auth``) within the time limit
before anything else is read. Any other frame is answered AUTH_FAILED with
the reason, and nothing else; the refusal is logged with the peer's address
and the connection closed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Protocol

import trio

from irdma.auth import AuthRefused, DaemonHandshake
from irdma.protocol import MAX_ERROR_MESSAGE, Header, ProtocolError, Status
from irdma.transport.auth import FrameStream
from irdma.transport.base import StreamBroken, StreamClosed

log = logging.getLogger("psd")

# After a refusal, the peer's frames already on their way are read and
# dropped until it closes, for at most this long: closing with unread bytes
# resets the connection, and the peer could lose the answer that says why.
LINGER = 1.0


class GateStream(FrameStream, Protocol):
    """A connection as the gate reads it (``FramedSocket`` is one)."""

    sock: socket.socket

    async def skip(self, nbytes: int) -> None: ...


async def admit(stream: GateStream, secret: bytes, node: str, timeout: float) -> bool:
    """Run the handshake; True once the peer proved it knows ``secret``.

    False when the peer was refused (answered, logged), went away, or did not
    finish within ``timeout`` seconds; the caller closes the connection.
    Raises StreamBroken or StreamClosed when the connection fails.
    """
    handshake = DaemonHandshake(secret)
    refused: tuple[Header, AuthRefused, int] | None = None
    with trio.move_on_after(timeout) as scope:
        while not handshake.done:
            try:
                header = await stream.recv_header()
            except ProtocolError as exc:
                log.warning(
                    "%s: refused %s: garbage before authenticating: %s", node, stream.peer, exc
                )
                return False
            if header is None:
                # Having seen our proof, a peer with another secret gives up here.
                started = handshake.client_nonce is not None
                log.log(
                    logging.WARNING if started else logging.INFO,
                    "%s: %s closed the connection before authenticating%s",
                    node,
                    stream.peer,
                    " (it may have another secret)" if started else "",
                )
                return False
            try:
                handshake.check(header)  # before taking in a payload
            except AuthRefused as exc:
                refused = (header, exc, header.length)
                break
            payload = bytes(await stream.recv_bytes(header.length))
            try:
                answer = handshake.receive(header, payload)
            except AuthRefused as exc:
                refused = (header, exc, 0)
                break
            await stream.send_all([header.response(Status.OK, length=len(answer)).pack(), answer])
    if refused is not None:
        await _refuse(stream, *refused, node)
        return False
    if scope.cancelled_caught:
        log.warning("%s: refused %s: did not authenticate within %g s", node, stream.peer, timeout)
        return False
    return True


async def _refuse(
    stream: GateStream, header: Header, refusal: AuthRefused, unread: int, node: str
) -> None:
    """Answer the refusal (its reason, nothing else), then give the peer time to read it.

    ``unread`` is how much of the refused frame's payload is still in the stream.
    """
    log.warning("%s: refused %s: %s", node, stream.peer, refusal)
    reason = str(refusal).encode()[:MAX_ERROR_MESSAGE]
    with trio.move_on_after(LINGER), contextlib.suppress(StreamBroken, StreamClosed, ProtocolError):
        await stream.send_all([header.response(refusal.status, length=len(reason)).pack(), reason])
        with contextlib.suppress(OSError):
            stream.sock.shutdown(socket.SHUT_WR)  # the peer sees the end at once
        await stream.skip(unread)
        while (following := await stream.recv_header()) is not None:
            await stream.skip(following.length)
