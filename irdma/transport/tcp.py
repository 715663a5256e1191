"""TCP transport on trio sockets.

Payloads are received with ``recv_into`` straight into their destination and
sent with ``sendmsg`` from the caller's buffers (no joined ``bytes``); the
daemon sends large read payloads with ``sendfile`` from its memfd arena, so
the only copy on a pull is the kernel's into the client's array.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket as stdsocket
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import trio

from ..errors import AuthFailed
from ..protocol import (
    HEADER_SIZE,
    MAX_ERROR_MESSAGE,
    REQUEST_ID,
    REQUEST_ID_OFFSET,
    Header,
    ProtocolError,
    Status,
    unpack_header,
)
from ..protocol.conversation import check_answer, owes_release, release_frame
from .auth import prove_secret
from .base import (
    SOCKET_ERRORS,
    TRIO_WAITS,
    Buffer,
    ByteStream,
    Connection,
    Reply,
    Sink,
    StreamBroken,
    StreamClosed,
    StreamTimeout,
    Waits,
    acquire_soon,
    for_this_task,
    translate_socket_error,
    translate_socket_errors,
)

if TYPE_CHECKING:
    import numpy as np

    from .direct import DirectReader

# Error messages from a daemon are bounded; anything longer is a broken peer.
MAX_REPLY_DATA = 16 << 20
RECV_CHUNK = 4 << 20
# SO_RCVLOWAT bounds while waiting for the rest of a large payload.
LOWAT_MIN = int(os.environ.get("IRDMA_LOWAT_MIN", 64 << 10))
LOWAT_MAX = 1 << 20
DRAIN_CHUNK = 1 << 20


# A connection that always has data ready yields to other tasks after this
# many operations, so one busy peer cannot starve the rest.
YIELD_EVERY = 32
AUTH_FAILED = int(Status.AUTH_FAILED)
# SO_LINGER on, 0 s: close() resets the connection and drops unsent data.
_LINGER_RESET = struct.pack("ii", 1, 0)


def tune_socket(sock: stdsocket.socket | trio.socket.SocketType) -> None:
    if sock.family in (stdsocket.AF_INET, stdsocket.AF_INET6):
        sock.setsockopt(stdsocket.IPPROTO_TCP, stdsocket.TCP_NODELAY, 1)


def to_stdlib(sock: trio.socket.SocketType) -> stdsocket.socket:
    """Take the OS socket out of a trio socket, non-blocking, for FramedSocket."""
    raw = stdsocket.socket(fileno=sock.detach())
    raw.setblocking(False)
    tune_socket(raw)
    return raw


class FramedSocket:
    """A non-blocking socket with the exact-size reads and scatter writes the protocol needs.

    Each call first tries the system call and waits for readiness only when
    it would block, so a request whose bytes are already there costs no trip
    through the scheduler (trio's socket wrappers add two per call);
    ``YIELD_EVERY`` keeps that fair. How it waits is ``waits``: under trio
    (the default, for the daemon and ``AsyncClient``) or in the calling
    thread (``irdma.client.shells.BlockingWaits``, for the blocking ``Client``).
    """

    def __init__(self, sock: stdsocket.socket, peer: str = "", waits: Waits | None = None) -> None:
        self.sock = sock
        self.peer = peer
        self.waits = waits or TRIO_WAITS
        self._header_buf = bytearray(HEADER_SIZE)
        self._header_view = memoryview(self._header_buf)
        self._ops = 0

    async def _recv_into(self, view: memoryview) -> int:
        while True:
            try:
                return self.sock.recv_into(view, min(len(view), RECV_CHUNK))
            except BlockingIOError:
                self._ops = 0
                await self.waits.readable(self.sock)

    async def recv_exactly_into(self, view: memoryview | bytearray) -> None:
        """Fill ``view`` completely; raises StreamBroken on EOF or error."""
        mv = memoryview(view).cast("B")
        got, n = 0, len(mv)
        lowat = 1
        try:
            while got < n:
                try:
                    k = self.sock.recv_into(mv[got:] if got else mv, min(n - got, RECV_CHUNK))
                except BlockingIOError:
                    # For a large payload, be woken only once a good part of
                    # it has arrived: fewer wakeups, larger copies.
                    want = min(n - got, LOWAT_MAX)
                    if want < LOWAT_MIN:
                        # Never wait for more than is still to come: a low
                        # mark left from earlier in the payload deadlocks.
                        want = 1
                    if want != lowat:
                        self.sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVLOWAT, want)
                        lowat = want
                    self._ops = 0
                    await self.waits.readable(self.sock)
                    continue
                if k == 0:
                    raise StreamBroken(
                        f"{self.peer} closed the connection after {got} of {n} bytes"
                    )
                got += k
            if lowat != 1:
                self.sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVLOWAT, 1)
        except SOCKET_ERRORS as exc:
            raise translate_socket_error(exc, f"receiving from {self.peer}") from exc

    async def recv_header(self) -> Header | None:
        """The next frame header, or None at a clean end of stream.

        Raises ProtocolError for garbage (bad magic) and StreamBroken for a
        connection that ends inside a header.
        """
        self._ops += 1
        if self._ops >= YIELD_EVERY:  # inline: one coroutine less per frame
            self._ops = 0
            await self.waits.checkpoint()
        mv = self._header_view
        try:
            k = await self._recv_into(mv)
        except SOCKET_ERRORS as exc:
            raise translate_socket_error(exc, f"receiving from {self.peer}") from exc
        if k == 0:
            return None
        if k < HEADER_SIZE:
            await self.recv_exactly_into(mv[k:])
        return unpack_header(self._header_buf)

    async def recv_bytes(self, nbytes: int) -> bytearray:
        buf = bytearray(nbytes)
        await self.recv_exactly_into(buf)
        return buf

    async def skip(self, nbytes: int) -> None:
        """Read and discard ``nbytes`` (the payload of a refused request)."""
        scratch = bytearray(min(nbytes, DRAIN_CHUNK))
        while nbytes:
            n = min(nbytes, len(scratch))
            await self.recv_exactly_into(memoryview(scratch)[:n])
            nbytes -= n

    async def send_all(self, buffers: Sequence[Buffer]) -> None:
        """Send every buffer in order (scatter/gather, no joining)."""
        try:
            views = [m for m in (memoryview(b) for b in buffers) if m.nbytes]
            while views:
                try:
                    sent = self.sock.sendmsg(views[:64])
                except BlockingIOError:
                    await self.waits.writable(self.sock)
                    continue
                while sent:
                    if sent >= views[0].nbytes:
                        sent -= views[0].nbytes
                        views.pop(0)
                    else:
                        views[0] = views[0].cast("B")[sent:]
                        sent = 0
        except SOCKET_ERRORS as exc:
            raise translate_socket_error(exc, f"sending to {self.peer}") from exc

    async def sendfile(self, fd: int, offset: int, count: int) -> None:
        """Send ``count`` bytes of file ``fd`` from ``offset`` without copying to user space."""
        end = offset + count
        fileno = self.sock.fileno()
        with translate_socket_errors(f"sending to {self.peer}"):
            while offset < end:
                try:
                    offset += os.sendfile(fileno, fd, offset, end - offset)
                except BlockingIOError:
                    await self.waits.writable(self.sock)

    def close(self) -> None:
        """Close the socket; tasks waiting on it get StreamClosed."""
        if self.sock.fileno() != -1:
            self.waits.closing(self.sock)
            self.sock.close()

    def reset(self) -> None:
        """Close with a reset: bytes still in the send buffer are dropped, not delivered
        (a plain close would have the kernel send them whenever the path comes back)."""
        if self.sock.fileno() != -1:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_LINGER, _LINGER_RESET)
        self.close()


async def open_tcp_socket(host: str, port: int) -> stdsocket.socket:
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
        return to_stdlib(sock)
    raise last or OSError(errno.EHOSTUNREACH, f"no address for {host}")


class BytesSink(Sink):
    """Collects a small payload (metadata, error text) into ``data``."""

    def __init__(self, limit: int = MAX_REPLY_DATA) -> None:
        self.limit = limit
        self.data = b""

    async def receive(self, stream: ByteStream, header: Header) -> None:
        if header.length > self.limit:
            raise ProtocolError(f"reply of {header.length} bytes is over the {self.limit} limit")
        buf = bytearray(header.length)
        await stream.recv_exactly_into(buf)
        self.data = bytes(buf)


def ensure_usable(failure: Exception | None, closed: bool, peer: str) -> None:
    """Raise StreamBroken (with its cause) or StreamClosed for a connection that
    failed or that we closed."""
    if failure is not None:
        raise StreamBroken(str(failure)) from failure
    if closed:
        raise StreamClosed(f"connection to {peer} is closed")


def request_frame(header: Header, request_id: int) -> bytearray:
    """The packed header of a request, stamped with the connection's request id."""
    frame = bytearray(header.pack())
    REQUEST_ID.pack_into(frame, REQUEST_ID_OFFSET, request_id)
    return frame


async def next_answer(stream: FramedSocket) -> Header:
    """The header of the next answer on a client's connection.

    Raises StreamBroken when the daemon hung up, ProtocolError when it sent
    a request, and AuthFailed when it refused the connection for want of
    the secret (it closes it then, so every request on it fails alike).
    """
    header = await stream.recv_header()
    if header is None:
        raise StreamBroken(f"{stream.peer} closed the connection")
    if not header.is_response:
        raise ProtocolError(f"{stream.peer} sent a request, not a response")
    if header.status == AUTH_FAILED:
        sink = BytesSink(MAX_ERROR_MESSAGE)
        await sink.receive(stream, header)
        reason = sink.data.decode("utf-8", "replace")
        raise AuthFailed(f"daemon {stream.peer} refused the connection: {reason}")
    return header


async def receive_unsunk(stream: FramedSocket, header: Header) -> Reply:
    """An answer with no sink to take it (an error, or a request without one): its bytes."""
    sink = BytesSink()
    await sink.receive(stream, header)
    return Reply(header, sink.data)


class Answer:
    """The answer a request sent on a FramedConnection waits for (``post``, ``outcome``)."""

    __slots__ = ("error", "event", "op", "reply", "sink")

    def __init__(self, op: int, sink: Sink | None) -> None:
        self.op = op
        self.sink = sink
        self.event = trio.Event()
        self.reply: Reply | None = None
        self.error: Exception | None = None


class Exchanger(Protocol):
    """What a bulk path needs of a connection (a trio FramedConnection or a
    blocking one): its stream, whether it broke, and one framed exchange."""

    stream: FramedSocket

    @property
    def broken(self) -> bool: ...

    async def exchange(
        self, header: Header, payload: Sequence[Buffer] = (), sink: Sink | None = None
    ) -> Reply: ...


# The connection a bulk path works for: SOCKET and SharedMemory take any
# Exchanger, RdmaPath needs a trio FramedConnection (it releases and abandons).
_Conn = TypeVar("_Conn", contravariant=True)


class BulkPath(Protocol[_Conn]):
    """How a connection moves bulk data beside its frames: over the socket itself
    (``SOCKET``), through shared memory (``shm.SharedMemory``) or RDMA verbs
    (``rdma.RdmaPath``). A FramedConnection has one and may switch it."""

    transport: str
    # The daemon's arena mapped in this process (shm): one-sided reads that copy
    # on any thread; None where the path has none.
    directory: DirectReader | None

    async def request(
        self, conn: _Conn, header: Header, payload: Sequence[Buffer], sink: Sink | None
    ) -> Reply:
        """Send one request (placing its payload where this path puts it) via
        ``conn.exchange`` and return the answer."""

    async def read_direct(
        self,
        conn: _Conn,
        key: int,
        layout: int,
        index: int,
        offset: int,
        out: np.ndarray,
        min_version: int = 0,
    ) -> tuple[int, int, int] | None:
        """One-sided: the shard's bytes into ``out`` without a message to the daemon,
        and (version, stamp, previous copy's stamp); None when the daemon must
        answer (or this path cannot read one-sided)."""

    async def receive(self, conn: _Conn, header: Header, sink: Sink) -> bool:
        """Hand a successful answer's payload to ``sink``. True: the bytes are not
        taken yet, and the path sends RELEASE for a pinned answer itself."""

    def background(self) -> list[Callable[[], Awaitable[None]]]:
        """Loops the path needs while the connection lives (run like its reader)."""

    def close(self) -> None:
        """The connection failed or closed: release what the path holds."""


class SocketPath:
    """Bulk data travels with its frames on the socket (TCP)."""

    transport = "tcp"
    directory: DirectReader | None = None  # no daemon memory reachable from here

    async def request(
        self, conn: Exchanger, header: Header, payload: Sequence[Buffer], sink: Sink | None
    ) -> Reply:
        return await conn.exchange(header, payload, sink)

    async def read_direct(
        self,
        conn: Exchanger,
        key: int,
        layout: int,
        index: int,
        offset: int,
        out: np.ndarray,
        min_version: int = 0,
    ) -> None:
        return None  # every read asks the daemon

    async def receive(self, conn: Exchanger, header: Header, sink: Sink) -> bool:
        await sink.receive(conn.stream, header)
        return False

    def background(self) -> list[Callable[[], Awaitable[None]]]:
        return []

    def close(self) -> None:
        pass


SOCKET = SocketPath()


class FramedConnection(Connection):
    """One client connection to a daemon, carrying many requests at once.

    A reader task routes each response to its request by id; sends are
    serialised by a lock so frames never interleave. RELEASE notices for
    zero-copy replies go out from their own task so the reader never waits
    behind a large send (which could deadlock against a daemon that is
    itself blocked sending to us). Bulk data takes the connection's
    ``bulk`` path; every medium shares this framing.
    """

    def __init__(
        self,
        stream: FramedSocket,
        timeout: float = 10.0,
        bulk: BulkPath[FramedConnection] = SOCKET,
    ) -> None:
        self.stream = stream
        self.timeout = timeout
        self.bulk = bulk
        self._nursery: trio.Nursery | None = None
        # When the oldest outstanding request last saw the daemon answer
        # (or was sent, if nothing was outstanding before it).
        self._last_progress = 0.0
        self._send_lock = trio.Lock()
        self._pending: dict[int, Answer] = {}
        self._next_id = 1
        self._releases: list[int] = []
        self._release_wakeup = trio.Event()
        self._cancel = trio.CancelScope()
        # Callers' sends in progress: cancelled when the connection fails, so a
        # send waiting on a full socket (a daemon that stopped reading) ends with
        # the watchdog's timeout instead of waiting for ever.
        self._sending: set[trio.CancelScope] = set()
        self._failure: Exception | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        nursery: trio.Nursery,
        peer: str = "",
        timeout: float = 10.0,
        secret: bytes | None = None,
    ) -> FramedConnection:
        """Connect over TCP and start the connection's background tasks in ``nursery``.

        A request that gets no answer for ``timeout`` seconds (while the
        daemon answers nothing else either) fails the connection with
        StreamTimeout; so does a connect that takes longer. With ``secret``,
        the connection authenticates first (``irdma.auth``); AuthFailed when
        that fails.
        """
        peer = peer or f"{host}:{port}"
        with trio.move_on_after(timeout) as scope:
            with translate_socket_errors(f"connecting to {peer}"):
                sock = await open_tcp_socket(host, port)
        if scope.cancelled_caught:
            raise StreamTimeout(f"connecting to {peer}: no answer within {timeout:g} s")
        stream = FramedSocket(sock, peer)
        if secret is not None:
            await prove_secret(stream, secret, timeout)
        conn = cls(stream, timeout)
        nursery.start_soon(conn._run)
        return conn

    @property
    def transport(self) -> str:
        return self.bulk.transport

    def use(self, bulk: BulkPath[FramedConnection]) -> None:
        """Move bulk data over ``bulk`` from now on, its background loops started."""
        self.bulk = bulk
        if self._nursery is not None:
            for loop in bulk.background():
                self._nursery.start_soon(self._guard, loop)

    @property
    def broken(self) -> bool:
        return self._failure is not None or self._closed

    async def _run(self) -> None:
        with self._cancel:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._guard, self._release_loop)
                nursery.start_soon(self._guard, self._read_loop)
                nursery.start_soon(self._guard, self._watchdog)
                for loop in self.bulk.background():
                    nursery.start_soon(self._guard, loop)
        self._fail(StreamClosed(f"connection to {self.stream.peer} closed"))

    async def _guard(self, loop: Callable[[], Awaitable[None]]) -> None:
        """Run a background loop; any failure fails the connection, never the nursery."""
        try:
            await loop()
        except Exception as exc:
            self._fail(exc)

    async def _read_loop(self) -> None:
        while True:
            header = await next_answer(self.stream)
            self._last_progress = trio.current_time()
            pending = self._pending.pop(header.request_id, None)
            if pending is None:
                raise ProtocolError(
                    f"{self.stream.peer} answered unknown request {header.request_id}"
                )
            check_answer(pending.op, header, memory=self.bulk is not SOCKET)
            release_later = False
            if header.status == Status.OK and pending.sink is not None:
                release_later = await self.bulk.receive(self, header, pending.sink)
                pending.reply = Reply(header)
            else:
                pending.reply = await receive_unsunk(self.stream, header)
            if owes_release(header) and not release_later:
                self.release(header.request_id)
            pending.event.set()

    def release(self, request_id: int) -> None:
        """Tell the daemon (soon, from the release task) it may reuse a pinned answer's memory."""
        self._releases.append(request_id)
        self._release_wakeup.set()

    async def _watchdog(self) -> None:
        """Fail the connection when outstanding requests see no answer for ``timeout``.

        One timer per connection instead of a cancel scope per request (which
        was a sixth of a small request's cost); a timeout is noticed within
        ``timeout`` plus one tick.
        """
        tick = max(0.005, min(self.timeout / 8, 0.5))
        while True:
            await trio.sleep(tick)
            if self._pending and trio.current_time() - self._last_progress > self.timeout:
                raise StreamTimeout(f"{self.stream.peer} did not answer within {self.timeout:g} s")

    async def _release_loop(self) -> None:
        while True:
            await self._release_wakeup.wait()
            self._release_wakeup = trio.Event()
            ids, self._releases = self._releases, []
            frames = [release_frame(i) for i in ids]
            await self._send(frames)

    async def _send(self, buffers: list[Buffer]) -> None:
        """Send one or more whole frames; frames from concurrent tasks never interleave."""
        await acquire_soon(self._send_lock)
        try:
            await self.stream.send_all(buffers)
        finally:
            self._send_lock.release()

    def _fail(self, exc: Exception) -> None:
        if self._failure is None:
            self._failure = exc
        for pending in self._pending.values():
            pending.error = self._failure
            pending.event.set()
        self._pending.clear()
        for sending in self._sending:
            sending.cancel()
        self._cancel.cancel()
        self.stream.close()
        # Verbs resources are destroyed now, not whenever the garbage collector
        # gets to them (pyverbs objects freed in the wrong order crash).
        self.bulk.close()

    def abandon(self, exc: BaseException) -> None:
        """A request failed or was cancelled mid-way: the connection cannot be trusted."""
        self._fail(
            exc
            if isinstance(exc, StreamBroken | StreamClosed)
            else StreamClosed(f"request to {self.stream.peer} abandoned")
        )

    async def request(
        self, header: Header, payload: Sequence[Buffer] = (), sink: Sink | None = None
    ) -> Reply:
        return await self.bulk.request(self, header, payload, sink)

    async def exchange(
        self, header: Header, payload: Sequence[Buffer] = (), sink: Sink | None = None
    ) -> Reply:
        """Send one frame and wait for its answer (the framing every bulk path uses)."""
        (pending,) = await self.post([(header, payload, sink)])
        return await self.outcome(pending)

    async def post(
        self, requests: Sequence[tuple[Header, Sequence[Buffer], Sink | None]]
    ) -> list[Answer]:
        """Send requests (frame and payload each, written together, in this order) without
        waiting for their answers: what ``outcome`` then waits for, in any order.

        Cancelled or failed part-way, the connection is abandoned: the stream
        may hold half a frame.
        """
        ensure_usable(self._failure, self._closed, self.stream.peer)
        buffers: list[Buffer] = []
        answers = []
        if not self._pending:
            self._last_progress = trio.current_time()
        for header, payload, sink in requests:
            rid = self._next_id
            self._next_id += 1
            buffers += [request_frame(header, rid), *payload]
            answer = Answer(header.op, sink)
            self._pending[rid] = answer
            answers.append(answer)
        try:
            with trio.CancelScope() as sending:
                self._sending.add(sending)
                try:
                    await self._send(buffers)
                finally:
                    self._sending.discard(sending)
            if sending.cancelled_caught:
                if self._failure is not None:
                    raise for_this_task(self._failure)
                raise StreamClosed(f"connection to {self.stream.peer} failed")
        except BaseException as exc:
            self.abandon(exc)
            raise
        return answers

    async def outcome(self, answer: Answer) -> Reply:
        """The answer to a request ``post`` sent, once it came (or the connection failed)."""
        try:
            await answer.event.wait()
        except BaseException as exc:
            # Cancelled while a reply may be arriving into the caller's buffer:
            # drop the connection rather than let it touch memory the caller took back.
            self.abandon(exc)
            raise
        if answer.error is not None:
            err = answer.error
            if isinstance(err, AuthFailed):
                raise AuthFailed(str(err)) from err
            raise for_this_task(err)
        assert answer.reply is not None
        return answer.reply

    async def aclose(self) -> None:
        self._closed = True
        self._fail(StreamClosed(f"connection to {self.stream.peer} closed"))
        await trio.lowlevel.checkpoint()
