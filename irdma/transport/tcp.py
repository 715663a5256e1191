"""TCP transport on trio sockets.

Payloads are received with ``recv_into`` straight into their destination and
sent with ``sendmsg`` from the caller's buffers (no joined ``bytes``); the
daemon sends large read payloads with ``sendfile`` from its memfd arena, so
the only copy on a pull is the kernel's into the client's array.
"""

from __future__ import annotations

import errno
import os
import socket as stdsocket
from collections.abc import Sequence
from dataclasses import replace

import trio

from ..protocol import HEADER_SIZE, Flag, Header, Op, ProtocolError, Status, unpack_header
from .base import (
    Buffer,
    Connection,
    Reply,
    Sink,
    StreamBroken,
    StreamClosed,
    translate_socket_errors,
)

# Error messages from a daemon are bounded; anything longer is a broken peer.
MAX_REPLY_DATA = 16 << 20
RECV_CHUNK = 4 << 20
DRAIN_CHUNK = 1 << 20


def tune_socket(sock: trio.socket.SocketType) -> None:
    sock.setsockopt(stdsocket.IPPROTO_TCP, stdsocket.TCP_NODELAY, 1)


class FramedSocket:
    """A trio socket with the exact-size reads and scatter writes the protocol needs."""

    def __init__(self, sock: trio.socket.SocketType, peer: str = "") -> None:
        self.sock = sock
        self.peer = peer
        self._header_buf = bytearray(HEADER_SIZE)

    async def recv_exactly_into(self, view: memoryview | bytearray) -> None:
        """Fill ``view`` completely; raises StreamBroken on EOF or error."""
        mv = memoryview(view).cast("B")
        got, n = 0, len(mv)
        with translate_socket_errors(f"receiving from {self.peer}"):
            while got < n:
                k = await self.sock.recv_into(mv[got:], min(n - got, RECV_CHUNK))
                if k == 0:
                    raise StreamBroken(
                        f"{self.peer} closed the connection after {got} of {n} bytes"
                    )
                got += k

    async def recv_header(self) -> Header | None:
        """The next frame header, or None at a clean end of stream.

        Raises ProtocolError for garbage (bad magic) and StreamBroken for a
        connection that ends inside a header.
        """
        mv = memoryview(self._header_buf)
        with translate_socket_errors(f"receiving from {self.peer}"):
            k = await self.sock.recv_into(mv, HEADER_SIZE)
        if k == 0:
            return None
        if k < HEADER_SIZE:
            await self.recv_exactly_into(mv[k:])
        return unpack_header(self._header_buf)

    async def recv_bytes(self, nbytes: int) -> bytearray:
        buf = bytearray(nbytes)
        await self.recv_exactly_into(buf)
        return buf

    async def drain(self, nbytes: int) -> None:
        """Read and discard ``nbytes`` (the payload of a refused request)."""
        scratch = bytearray(min(nbytes, DRAIN_CHUNK))
        while nbytes:
            n = min(nbytes, len(scratch))
            await self.recv_exactly_into(memoryview(scratch)[:n])
            nbytes -= n

    async def send_all(self, buffers: Sequence[Buffer]) -> None:
        """Send every buffer in order (scatter/gather, no joining)."""
        views = [memoryview(b).cast("B") for b in buffers]
        views = [v for v in views if len(v)]
        with translate_socket_errors(f"sending to {self.peer}"):
            while views:
                sent = await self.sock.sendmsg(views[:64])
                while sent:
                    if sent >= len(views[0]):
                        sent -= len(views[0])
                        views.pop(0)
                    else:
                        views[0] = views[0][sent:]
                        sent = 0

    async def sendfile(self, fd: int, offset: int, count: int) -> None:
        """Send ``count`` bytes of file ``fd`` from ``offset`` without copying to user space."""
        end = offset + count
        fileno = self.sock.fileno()
        with translate_socket_errors(f"sending to {self.peer}"):
            while offset < end:
                await trio.lowlevel.wait_writable(self.sock)
                try:
                    offset += os.sendfile(fileno, fd, offset, end - offset)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    if exc.errno == errno.EAGAIN:
                        continue
                    raise

    def close(self) -> None:
        self.sock.close()


async def open_tcp_socket(host: str, port: int) -> trio.socket.SocketType:
    """Connect to host:port; raises OSError like the stdlib."""
    infos = await trio.socket.getaddrinfo(host, port, type=stdsocket.SOCK_STREAM)
    last: OSError | None = None
    for family, type_, proto, _, addr in infos:
        sock = trio.socket.socket(family, type_, proto)
        try:
            await sock.connect(addr)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        tune_socket(sock)
        return sock
    raise last or OSError(errno.EHOSTUNREACH, f"no address for {host}")


class BytesSink(Sink):
    """Collects a small payload (metadata, error text) into ``data``."""

    def __init__(self, limit: int = MAX_REPLY_DATA) -> None:
        self.limit = limit
        self.data = b""

    async def receive(self, stream, header: Header) -> None:  # type: ignore[no-untyped-def]
        if header.length > self.limit:
            raise ProtocolError(f"reply of {header.length} bytes is over the {self.limit} limit")
        buf = bytearray(header.length)
        await stream.recv_exactly_into(buf)
        self.data = bytes(buf)


class _Pending:
    __slots__ = ("error", "event", "reply", "sink")

    def __init__(self, sink: Sink | None) -> None:
        self.sink = sink
        self.event = trio.Event()
        self.reply: Reply | None = None
        self.error: BaseException | None = None


class TcpConnection(Connection):
    """One client connection to a daemon, carrying many requests at once.

    A reader task routes each response to its request by id; sends are
    serialised by a lock so frames never interleave. RELEASE notices for
    zero-copy replies go out from their own task so the reader never waits
    behind a large send (which could deadlock against a daemon that is
    itself blocked sending to us).
    """

    def __init__(self, stream: FramedSocket) -> None:
        self.stream = stream
        self._send_lock = trio.Lock()
        self._pending: dict[int, _Pending] = {}
        self._next_id = 1
        self._releases: list[int] = []
        self._release_wakeup = trio.Event()
        self._cancel = trio.CancelScope()
        self._failure: BaseException | None = None
        self._closed = False

    @classmethod
    async def open(
        cls, host: str, port: int, nursery: trio.Nursery, peer: str = ""
    ) -> TcpConnection:
        """Connect and start the connection's background tasks in ``nursery``."""
        with translate_socket_errors(f"connecting to {peer or f'{host}:{port}'}"):
            sock = await open_tcp_socket(host, port)
        conn = cls(FramedSocket(sock, peer or f"{host}:{port}"))
        nursery.start_soon(conn._run)
        return conn

    @property
    def broken(self) -> bool:
        return self._failure is not None or self._closed

    async def _run(self) -> None:
        with self._cancel:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._release_loop)
                    await self._read_loop()
                    nursery.cancel_scope.cancel()
            except (StreamBroken, StreamClosed, ProtocolError) as exc:
                self._fail(exc)
        self._fail(StreamClosed(f"connection to {self.stream.peer} closed"))

    async def _read_loop(self) -> None:
        while True:
            header = await self.stream.recv_header()
            if header is None:
                raise StreamBroken(f"{self.stream.peer} closed the connection")
            if not header.is_response:
                raise ProtocolError(f"{self.stream.peer} sent a request, not a response")
            pending = self._pending.pop(header.request_id, None)
            if pending is None:
                raise ProtocolError(
                    f"{self.stream.peer} answered unknown request {header.request_id}"
                )
            if header.status == Status.OK and pending.sink is not None:
                await pending.sink.receive(self.stream, header)
                pending.reply = Reply(header)
            else:
                sink = BytesSink()
                await sink.receive(self.stream, header)
                pending.reply = Reply(header, sink.data)
            if header.flags & Flag.PINNED:
                self._releases.append(header.request_id)
                self._release_wakeup.set()
            pending.event.set()

    async def _release_loop(self) -> None:
        while True:
            await self._release_wakeup.wait()
            self._release_wakeup = trio.Event()
            ids, self._releases = self._releases, []
            frames = [Header(op=Op.RELEASE, request_id=i).pack() for i in ids]
            async with self._send_lock:
                await self.stream.send_all(frames)

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        for pending in self._pending.values():
            pending.error = self._failure
            pending.event.set()
        self._pending.clear()
        self._cancel.cancel()
        self.stream.close()

    async def request(
        self, header: Header, payload: Sequence[Buffer] = (), sink: Sink | None = None
    ) -> Reply:
        if self._failure is not None:
            raise StreamBroken(str(self._failure)) from self._failure
        if self._closed:
            raise StreamClosed(f"connection to {self.stream.peer} is closed")
        rid = self._next_id
        self._next_id += 1
        header = replace(header, request_id=rid)
        pending = _Pending(sink)
        self._pending[rid] = pending
        try:
            async with self._send_lock:
                await self.stream.send_all([header.pack(), *payload])
            await pending.event.wait()
        except BaseException as exc:
            # Cancelled or failed part-way: the stream may hold half a frame,
            # or a reply may be arriving into the caller's buffer. Drop the
            # connection rather than let it touch memory the caller took back.
            self._fail(
                exc
                if isinstance(exc, StreamBroken | StreamClosed)
                else StreamClosed(f"request to {self.stream.peer} abandoned")
            )
            raise
        if pending.error is not None:
            err = pending.error
            if isinstance(err, StreamBroken | StreamClosed):
                raise type(err)(str(err)) from err
            raise StreamBroken(str(err)) from err
        assert pending.reply is not None
        return pending.reply

    async def aclose(self) -> None:
        self._closed = True
        self._fail(StreamClosed(f"connection to {self.stream.peer} closed"))
        await trio.lowlevel.checkpoint()
