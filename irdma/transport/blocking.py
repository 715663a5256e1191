"""Connections of the blocking ``Client``: each request runs in the calling thread.

A request sends its frame and reads its own answer on the same socket: no
event loop, no reader task, no hand-off between threads. The framing, the
answer rules (``next_answer``, PINNED then RELEASE) and the shm bulk path
(``SharedMemory``: MAPPED answers copied out of the daemon's arena, large
writes STAGED) are the ones the trio connections use; only the waiting
differs (``BlockingWaits``).

Waits happen in the calling thread (``poll`` with the client's timeout).

Within one call that fans out (the shards of a large tensor), the shell
(``irdma.client.shells.take_turns``) runs the requests to different daemons
together in this thread. A request yields ``Sent`` once its frame is out
(so the other daemons get theirs before any answer is read), ``Busy``
while another request of the same call has this connection (one request
in flight per connection), and, where its socket would block, ``Wait``
instead of polling it alone: the shell polls every waiting socket at once
and resumes whichever is ready, so each daemon's answer streams into its
destination while the others' do, and a large write's payloads go out to
every daemon together. Every ``Wait`` carries its deadline (the client's
timeout from when it began); past it the request gets ``StreamTimeout``,
as a poll of its own would have raised. Outside a fan-out (``fanning``)
nothing is held, waits poll the one socket, and ``drive`` resumes a
``Sent`` at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket as stdsocket
import threading
import time
import types
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..errors import AuthFailed
from ..protocol import (
    Flag,
    Header,
    Status,
)
from ..protocol.conversation import check_answer, owes_release, release_frame
from .auth import prove_secret
from .base import Buffer, Reply, Sink, StreamBroken, StreamClosed, StreamTimeout
from .shared import SharedRegion
from .shm import exchange_attach
from .tcp import (
    SOCKET,
    BulkPath,
    FramedSocket,
    ensure_usable,
    next_answer,
    receive_unsunk,
    request_frame,
    tune_socket,
)

PINNED = int(Flag.PINNED)
OK = int(Status.OK)


class Holdable(Protocol):
    """Something one request of a fan-out holds at a time (a connection, a connect)."""

    @property
    def busy(self) -> bool: ...


@dataclass(frozen=True)
class Sent:
    """Yielded by a request whose frame is out: its answer is read when it is resumed."""

    conn: BlockingConnection


@dataclass(frozen=True)
class Busy:
    """Yielded by a request that needs what another request of its fan-out holds
    (a connection with an answer pending, a connection being made)."""

    conn: Holdable


@dataclass(frozen=True)
class Wait:
    """Yielded inside a fan-out instead of a poll of one socket: resume when ``fd`` is
    ready for ``events``, or throw ``StreamTimeout`` in once ``deadline`` (monotonic
    clock) passes first."""

    fd: int
    events: int
    deadline: float
    timeout: float


@dataclass(frozen=True)
class Nap:
    """Yielded inside a fan-out instead of ``time.sleep``: resume at ``until``."""

    until: float


Token = Sent | Busy | Wait | Nap


@types.coroutine
def _yield(token: Token) -> Generator[Token, None, None]:
    yield token


class _FanOut(threading.local):
    depth = 0  # fan-outs (``irdma.client.shells.take_turns``) running in this thread


_FAN_OUT = _FanOut()


@contextlib.contextmanager
def fanning() -> Iterator[None]:
    """While a fan-out runs in this thread its requests' waits yield ``Wait``."""
    _FAN_OUT.depth += 1
    try:
        yield
    finally:
        _FAN_OUT.depth -= 1


def in_fan_out() -> bool:
    return _FAN_OUT.depth > 0


def timed_out(timeout: float) -> StreamTimeout:
    return StreamTimeout(f"no answer within {timeout:g} s")


class BlockingWaits:
    """How one thread's blocking connections wait: ``poll`` bounded by ``timeout``,
    or, inside a fan-out, a ``Wait`` for the fan-out to poll with the others."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    async def _wait(self, sock: stdsocket.socket, events: int) -> None:
        if _FAN_OUT.depth:
            deadline = time.monotonic() + self.timeout
            await _yield(Wait(sock.fileno(), events, deadline, self.timeout))
            return
        poller = select.poll()
        poller.register(sock, events)
        if not poller.poll(self.timeout * 1000):
            raise timed_out(self.timeout)

    async def readable(self, sock: stdsocket.socket) -> None:
        await self._wait(sock, select.POLLIN)

    async def writable(self, sock: stdsocket.socket) -> None:
        await self._wait(sock, select.POLLOUT)

    async def checkpoint(self) -> None:
        pass

    def closing(self, sock: stdsocket.socket) -> None:
        pass


class WaitingSocket:
    """A non-blocking stdlib socket with the awaitable calls of a trio socket that the
    shm ATTACH exchange uses, waiting through ``waits``."""

    def __init__(self, sock: stdsocket.socket, waits: BlockingWaits) -> None:
        self.sock = sock
        self.waits = waits

    def fileno(self) -> int:
        return self.sock.fileno()

    async def connect(self, address: Any) -> None:
        try:
            self.sock.connect(address)
        except BlockingIOError:
            await self.waits.writable(self.sock)
            err = self.sock.getsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_ERROR)
            if err:
                raise OSError(err, os.strerror(err)) from None

    async def sendmsg(self, buffers: list[bytes], ancdata: list) -> int:
        while True:
            try:
                return self.sock.sendmsg(buffers, ancdata)
            except BlockingIOError:
                await self.waits.writable(self.sock)

    async def send(self, data: bytes) -> int:
        while True:
            try:
                return self.sock.send(data)
            except BlockingIOError:
                await self.waits.writable(self.sock)

    async def recvmsg(self, bufsize: int, ancbufsize: int) -> tuple:
        while True:
            try:
                return self.sock.recvmsg(bufsize, ancbufsize)
            except BlockingIOError:
                await self.waits.readable(self.sock)


# How often, at most, a one-sided read checks its daemon's socket (seconds).
ALIVE_CHECK = 1e-3


class BlockingConnection:
    """A client's connection to one daemon, one request at a time, run by the caller.

    Bulk data takes ``bulk`` (``SOCKET`` over TCP, a ``SharedMemory`` for a
    same-host daemon), the same objects the trio connections compose. A
    request that fails part-way (timeout, broken socket, cancellation,
    Ctrl-C) fails the connection: its socket may hold half a frame.
    """

    def __init__(
        self,
        stream: FramedSocket,
        waits: BlockingWaits,
        bulk: BulkPath[BlockingConnection] = SOCKET,
    ) -> None:
        self.stream = stream
        self.waits = waits
        self.bulk = bulk
        self._next_id = 1
        self._failure: Exception | None = None
        self._closed = False
        self._poll: select.poll | None = None
        self._alive_at = -1.0  # when daemon_alive last found the socket quiet
        self._in_flight = False  # a request of this thread's fan-out holds the socket

    @property
    def transport(self) -> str:
        return self.bulk.transport

    @property
    def broken(self) -> bool:
        return self._failure is not None or self._closed

    @property
    def busy(self) -> bool:
        """A request of this thread's fan-out is waiting for its answer on it."""
        return self._in_flight

    def daemon_alive(self) -> bool:
        """No request is in flight between calls, so anything to read (an end of
        stream, an error) means the daemon went away: ask it, and find out how.

        Looked at once per ``ALIVE_CHECK`` at most: a daemon that died stops
        changing its memory, so reads in that moment get its last state, and
        one restarted takes far longer than that to serve from a new arena."""
        if self.broken or self._in_flight:
            return False  # an answer on its way is readable too: ask, not guess
        now = time.monotonic()
        if now - self._alive_at < ALIVE_CHECK:
            return True
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.stream.sock.fileno(), select.POLLIN)
        if self._poll.poll(0):
            return False
        self._alive_at = now
        return True

    def _fail(self, exc: Exception) -> None:
        if self._failure is None:
            self._failure = exc
        self.stream.close()
        self.bulk.close()

    async def request(
        self, header: Header, payload: Sequence[Buffer] = (), sink: Sink | None = None
    ) -> Reply:
        """Send one request and read its answer (see ``Connection.request``)."""
        # Before the bulk path takes staging room: one request's at a time.
        while self._in_flight:
            await _yield(Busy(self))
        self._in_flight = True
        try:
            return await self.bulk.request(self, header, payload, sink)
        finally:
            self._in_flight = False

    async def exchange(
        self, header: Header, payload: Sequence[Buffer] = (), sink: Sink | None = None
    ) -> Reply:
        """Send one frame and read its answer on this socket."""
        ensure_usable(self._failure, self._closed, self.stream.peer)
        rid = self._next_id
        self._next_id += 1
        frame = request_frame(header, rid)
        stream = self.stream
        try:
            await stream.send_all([frame, *payload])
            await _yield(Sent(self))  # the shell may send to other daemons first
            answer = await next_answer(stream)
            if answer.request_id != rid:
                raise StreamBroken(
                    f"{stream.peer} answered request {answer.request_id}, expected {rid}"
                )
            check_answer(header.op, answer, memory=self.bulk is not SOCKET)
            if answer.status == OK and sink is not None:
                await self.bulk.receive(self, answer, sink)
                reply = Reply(answer)
            else:
                reply = await receive_unsunk(stream, answer)
            if owes_release(answer):
                # The daemon holds the answer's memory until told it was taken.
                await stream.send_all([release_frame(rid)])
            return reply
        except (StreamBroken, StreamClosed, AuthFailed) as exc:
            self._fail(exc)
            raise
        except Exception as exc:  # a malformed answer (ProtocolError) and the like
            self._fail(exc)
            raise StreamBroken(f"{stream.peer}: {exc}") from exc
        except BaseException as exc:  # closed by its fan-out, Ctrl-C: half a frame may be in flight
            # Kept for later requests as an Exception: a BaseException is never handed on.
            self._fail(StreamBroken(f"{stream.peer}: a request was abandoned part-way ({exc!r})"))
            raise

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self.stream.close()


async def open_tcp(
    host: str, port: int, peer: str, waits: BlockingWaits, secret: bytes | None
) -> BlockingConnection:
    """Connect to a daemon over TCP (and authenticate with ``secret``)."""
    last: OSError | None = None
    try:
        infos = stdsocket.getaddrinfo(host, port, type=stdsocket.SOCK_STREAM)
    except OSError as exc:
        raise StreamBroken(f"connecting to {peer}: {exc.strerror or exc}") from exc
    for family, type_, proto, _, addr in infos:
        sock = stdsocket.socket(family, type_, proto)
        sock.setblocking(False)
        try:
            await WaitingSocket(sock, waits).connect(addr)
        except StreamTimeout:
            sock.close()
            raise StreamTimeout(
                f"connecting to {peer}: no answer within {waits.timeout:g} s"
            ) from None
        except OSError as exc:
            sock.close()
            last = exc
            continue
        except BaseException:  # cancelled (a sibling shard failed), Ctrl-C
            sock.close()
            raise
        tune_socket(sock)
        stream = FramedSocket(sock, peer, waits)
        if secret is not None:
            await prove_secret(stream, secret, waits.timeout)  # closes the stream if it fails
        return BlockingConnection(stream, waits)
    reason = (last.strerror or str(last)) if last is not None else "no address"
    raise StreamBroken(f"connecting to {peer}: {reason}")


async def attach_shm(
    path: Path,
    peer: str,
    node: str | None,
    waits: BlockingWaits,
    secret: bytes | None,
    staging_size: int,
    shared: SharedRegion | None = None,
) -> BlockingConnection:
    """Attach to a same-host daemon's shared memory (raises like ``shm.attach_connection``)."""
    sock = stdsocket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        memory = await exchange_attach(
            WaitingSocket(sock, waits),
            path,
            peer,
            node,
            secret,
            waits.timeout,
            staging_size,
            waits,
            shared,
        )
    except BaseException:
        sock.close()
        raise
    return BlockingConnection(FramedSocket(sock, peer, waits), waits, memory)
