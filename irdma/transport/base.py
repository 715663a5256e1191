"""The interface every transport implements (ps-lite's ``Van``).

A transport opens ``Connection``s to daemons. A connection carries many
requests at once, matched to responses by request id; each response payload
goes to the request's ``Sink``, which receives it straight into its
destination (a caller's numpy array, say), so no transport builds
per-request ``bytes`` on the data path.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import trio

from ..protocol import Header, ProtocolError

Buffer = Any  # an object supporting the buffer protocol (bytes, memoryview, ndarray)


class StreamBroken(Exception):
    """The peer went away or the connection failed (not closed by us)."""


class StreamTimeout(StreamBroken):
    """The peer stopped answering: a request waited longer than the timeout."""


class StreamClosed(Exception):
    """We closed the connection ourselves."""


SOCKET_ERRORS = (OSError, trio.ClosedResourceError, trio.BrokenResourceError)


def for_this_task(err: Exception) -> Exception:
    """A failure another task recorded, as an exception of the task that raises it now.

    Each task raises an object of its own (one object raised in several tasks
    shares, and keeps growing, one traceback); it keeps the stream error's kind
    (anything else becomes StreamBroken), and the recorded one is its cause.
    Only Exceptions are ever recorded for other tasks: a task's ``Cancelled``
    belongs to its own cancel scopes.
    """
    kind = type(err) if isinstance(err, StreamBroken | StreamClosed) else StreamBroken
    fresh = kind(str(err))
    fresh.__cause__ = err
    return fresh


def translate_socket_error(exc: BaseException, what: str) -> StreamBroken | StreamClosed:
    """The stream error for an OS or trio socket error (raise it ``from exc``).

    Hot paths catch ``SOCKET_ERRORS`` and call this, instead of a context
    manager, because a generator-based one costs microseconds per call.
    """
    if isinstance(exc, trio.ClosedResourceError):
        return StreamClosed(f"{what}: connection closed")
    if isinstance(exc, OSError):
        if exc.errno == errno.EBADF:  # closed by another of our tasks
            return StreamClosed(f"{what}: connection closed")
        return StreamBroken(f"{what}: {exc.strerror or exc}")
    return StreamBroken(f"{what}: {exc}")


async def acquire_soon(lock: trio.Lock) -> None:
    """Take ``lock`` without a trip through the scheduler when it is free
    (trio.Lock.acquire always yields); wait for it only under contention."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()


@contextlib.contextmanager
def translate_socket_errors(what: str) -> Iterator[None]:
    """Turn OS-level socket errors into StreamBroken or StreamClosed, keeping the cause."""
    try:
        yield
    except SOCKET_ERRORS as exc:
        raise translate_socket_error(exc, what) from exc


class Waits(Protocol):
    """How a FramedSocket waits when a system call would block."""

    async def readable(self, sock: socket.socket) -> None: ...

    async def writable(self, sock: socket.socket) -> None: ...

    async def checkpoint(self) -> None: ...

    def closing(self, sock: socket.socket) -> None: ...


class TrioWaits:
    """Waits under trio: the socket is registered with trio's epoll while waiting."""

    readable = staticmethod(trio.lowlevel.wait_readable)
    writable = staticmethod(trio.lowlevel.wait_writable)
    checkpoint = staticmethod(trio.lowlevel.checkpoint)

    @staticmethod
    def closing(sock: socket.socket) -> None:
        # Wakes tasks waiting on it (they get ClosedResourceError).
        trio.lowlevel.notify_closing(sock)


TRIO_WAITS = TrioWaits()


class ByteStream(Protocol):
    """What a sink needs from a connection to receive a payload."""

    async def recv_exactly_into(self, view: memoryview | bytearray) -> None: ...

    async def skip(self, nbytes: int) -> None: ...


class MemoryStream:
    """A ByteStream over bytes already in memory (a mapped arena, a buffer RDMA filled).

    One-sided transports hand a sink this instead of the socket: the sink
    copies straight from where the bytes are.
    """

    __slots__ = ("memory", "offset")

    def __init__(self, memory: np.ndarray, offset: int) -> None:
        self.memory = memory
        self.offset = offset

    async def recv_exactly_into(self, view: memoryview | bytearray) -> None:
        dest = np.frombuffer(view, dtype=np.uint8)
        end = self.offset + len(dest)
        if end > len(self.memory):
            raise ProtocolError("a one-sided answer points past the end of its memory")
        np.copyto(dest, self.memory[self.offset : end])
        self.offset = end

    async def skip(self, nbytes: int) -> None:
        self.offset += nbytes


class Sink(abc.ABC):
    """Where a response payload goes. ``receive`` consumes exactly ``header.length`` bytes."""

    @abc.abstractmethod
    async def receive(self, stream: ByteStream, header: Header) -> None: ...


@dataclass(slots=True)
class Reply:
    header: Header
    data: bytes = b""


class Connection(abc.ABC):
    """A client's connection to one daemon."""

    @abc.abstractmethod
    async def request(
        self, header: Header, payload: Sequence[Buffer] = (), sink: Sink | None = None
    ) -> Reply:
        """Send one request and wait for its response.

        The response payload goes to ``sink`` when it succeeds; otherwise (or
        with no sink) it is returned in ``Reply.data``. Raises StreamBroken or
        StreamClosed when the connection fails; the caller decides what that
        means (retry elsewhere, or an error naming the daemon).
        """

    @property
    def transport(self) -> str:
        """The transport bulk data takes on this connection: "tcp", "shm" or "rdma"."""
        return "tcp"

    @property
    @abc.abstractmethod
    def broken(self) -> bool: ...

    def daemon_alive(self) -> bool:
        """Whether the daemon's end of the connection is, as far as can be told without
        waiting, still open (a one-sided read must not trust memory of a daemon
        that died)."""
        return not self.broken

    @abc.abstractmethod
    async def aclose(self) -> None: ...
