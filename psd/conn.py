"""A connection as the daemon serves it, and how every handler answers on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from irdma.protocol import (
    MAX_ERROR_MESSAGE,
    MAX_META_PAYLOAD,
    Header,
    ProtocolError,
    Status,
    decode_json,
    pack_response,
)
from irdma.protocol.messages import Request
from irdma.sizes import SMALL_REPLY
from irdma.transport.base import acquire_soon
from irdma.transport.tcp import FramedSocket

from .arena import Block
from .errors import Refusal
from .metrics import RequestMetrics
from .payload import RequestPayload
from .staged import StagedMemory


@dataclass
class Conn:
    """One client or peer connection as the daemon serves it."""

    stream: FramedSocket
    nursery: trio.Nursery
    pins: dict[int, Block] = field(default_factory=dict)
    send_lock: trio.Lock = field(default_factory=trio.Lock)
    # One-sided memory for bulk data: a same-host client attached over the
    # unix socket (shm), or an RDMA queue pair set up over this connection.
    memory: StagedMemory | None = None
    authenticated: bool = False  # the peer proved the cluster's secret (or none is set)
    # The payload of the request being dispatched (its handler reads it).
    payload: RequestPayload = field(init=False)
    deferred: bool = False  # the request in dispatch is answered later, by its own task

    @property
    def transport(self) -> str:
        return self.memory.transport if self.memory is not None else "tcp"

    async def send(self, buffers: list) -> None:
        """Send whole frames; replies from waiting reads never interleave with others."""
        await acquire_soon(self.send_lock)
        try:
            await self.stream.send_all(buffers)
        finally:
            self.send_lock.release()


class Replies:
    """Answers on a connection, counted in the daemon's metrics."""

    def __init__(self, metrics: RequestMetrics) -> None:
        self.metrics = metrics

    async def reply(
        self,
        conn: Conn,
        header: Header,
        data: list,
        *,
        flags: int = 0,
        version: int | None = None,
        stamps: tuple[int, int] | None = None,
    ) -> None:
        """Answer ``header`` OK with ``data`` (buffers) as the payload.

        ``stamps``: a READ's answer, (served copy's stamp, previous copy's
        stamp) as ``messages.read_answer`` carries them."""
        stamp, prev = stamps if stamps is not None else (None, None)
        if len(data) == 1:
            # One payload (a shard's bytes, a JSON answer): one buffer to send.
            view = memoryview(data[0])
            length = view.nbytes
            frame = pack_response(header, 0, length, flags, version, stamp, prev)
            buffers = [frame + view] if length <= SMALL_REPLY else [frame, view]
        else:
            length = sum(memoryview(d).nbytes for d in data)
            buffers = [pack_response(header, 0, length, flags, version, stamp, prev), *data]
        self.metrics.series(header.op, conn.transport).sent += length
        await conn.send(buffers)

    async def error(
        self, conn: Conn, header: Header, status: Status, message: str, stamp: int | None = None
    ) -> None:
        """Refuse ``header`` with ``status``; the message is the payload. ``stamp``:
        the answer's stamp field (None: the request's)."""
        # Messages quote what the peer sent, which may hold a lone surrogate
        # (JSON "\ud800"): plain encode() raised UnicodeEncodeError here.
        data = message.encode(errors="backslashreplace")[:MAX_ERROR_MESSAGE]
        frame = pack_response(header, int(status), len(data), stamp=stamp)
        self.metrics.series(header.op, conn.transport).sent += len(data)
        self.metrics.error(header.op, status)
        await conn.send([frame + data])


async def payload_json(conn: Conn, limit: int = MAX_META_PAYLOAD) -> Any:
    """The request's payload, decoded as JSON (BAD_ARGUMENT if it is not)."""
    length = conn.payload.left
    if length > limit:
        raise Refusal(Status.TOO_LARGE, f"metadata of {length} bytes over {limit}")
    data = await conn.payload.read_bytes(length)
    try:
        return decode_json(data)
    except ProtocolError as exc:
        raise Refusal(Status.BAD_ARGUMENT, str(exc)) from None


def no_payload(conn: Conn, msg: Request) -> None:
    """Refuse a request of an op that takes no payload but came with one."""
    if conn.payload.left:
        raise Refusal(Status.BAD_FRAME, f"op {msg.op.name} takes no payload")
