"""The two shells the client's core runs in: under trio, or in the calling thread.

The core (``irdma.client.AsyncClient``: routing, failover, read-your-writes,
the metadata cache, batching) is written once, as ``async`` code that does
all its waiting, timing and concurrency through its shell:

- ``TrioShell`` (``AsyncClient``): connections with a reader task each in
  the client's nursery, many requests in flight on each.
- ``BlockingShell`` (``Client``): each thread has its own connections and
  runs its requests itself; every wait is a blocking call bounded by the
  client's timeout. Calls that fan out (the shards of a large tensor, one
  frame per daemon) take turns on the thread's connections: a request
  yields once its frame is sent (``transport.blocking.Sent``), so the other
  daemons get theirs before its answer is read, with one request in flight
  per connection (``Busy``). ``drive`` runs a core coroutine to its end.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

from .cluster import Node
from .errors import ClientClosed
from .transport.base import Connection
from .transport.blocking import BlockingConnection, BlockingWaits, Busy, Sent, _yield
from .transport.select import open_blocking_connection, open_connection

if TYPE_CHECKING:
    from .client import AsyncClient

T = TypeVar("T")
Call = Callable[[], Awaitable[Any]]


class Shell(Protocol):
    """What the client's core asks of the shell it runs in (its clock is ``client._now``)."""

    async def sleep(self, seconds: float) -> None: ...

    async def gather(self, calls: list[Call]) -> list[Any]: ...

    def shielded(self) -> contextlib.AbstractContextManager[Any]: ...

    async def connection(self, node: Node) -> Any: ...

    @property
    def conns(self) -> dict[str, Any]: ...


async def gather_under_trio(calls: list[Call]) -> list[Any]:
    """Run calls concurrently; return results in order, or raise the first error
    (the others are cancelled)."""
    results: list[Any] = [None] * len(calls)
    if len(calls) == 1:
        results[0] = await calls[0]()
        return results
    errors: list[BaseException] = []

    async def run(i: int, call: Call) -> None:
        try:
            results[i] = await call()
        except Exception as exc:
            errors.append(exc)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for i, call in enumerate(calls):
            nursery.start_soon(run, i, call)
    if errors:
        raise errors[0]
    return results


class TrioShell:
    """``AsyncClient``'s shell: trio's clock, sleeps, nurseries and connections."""

    def __init__(self, client: AsyncClient, nursery: trio.Nursery) -> None:
        self.client = client
        self.nursery = nursery
        self.conns: dict[str, Connection] = {}
        self._connecting: dict[str, trio.Lock] = defaultdict(trio.Lock)

    sleep = staticmethod(trio.sleep)
    gather = staticmethod(gather_under_trio)

    @staticmethod
    def shielded() -> trio.CancelScope:
        return trio.CancelScope(shield=True)

    async def connection(self, node: Node) -> Connection:
        conn = self.conns.get(node.name)
        if conn is not None and not conn.broken:
            return conn
        async with self._connecting[node.name]:
            conn = self.conns.get(node.name)
            if conn is None or conn.broken:
                c = self.client
                conn = await open_connection(
                    node,
                    self.nursery,
                    forced=c.transport,
                    timeout=c.timeout,
                    shard_size=c.config.shard_size,
                    secret=c._secret,
                    rdma_gid_index=c.config.rdma_gid_index,
                    rdma_mtu=c.config.rdma_mtu,
                    shared=c.shared,
                )
                self.conns[node.name] = conn
            return conn

    async def aclose(self) -> None:
        for conn in self.conns.values():
            await conn.aclose()
        self.conns.clear()


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.conns: dict[str, BlockingConnection] = {}
        self.waits: BlockingWaits | None = None


class BlockingShell:
    """``Client``'s shell: the calling thread's clock, sleeps and connections."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        client._now = time.monotonic
        self._thread = _ThreadState()
        self._all: list[BlockingConnection] = []  # every thread's, for close()
        self._lock = threading.Lock()
        self.closed = False

    @property
    def waits(self) -> BlockingWaits:
        waits = self._thread.waits
        if waits is None:
            waits = self._thread.waits = BlockingWaits(self.client.timeout)
        return waits

    @property
    def conns(self) -> dict[str, BlockingConnection]:
        """This thread's connections, by daemon name."""
        return self._thread.conns

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def shielded(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # nothing cancels a blocking call from outside

    async def gather(self, calls: list[Call]) -> list[Any]:
        """Run ``calls`` taking turns in this thread; results in order, or the first
        error (the calls not finished are closed, failing a connection whose
        answer is pending, as a cancelled request under trio does)."""
        if len(calls) == 1:
            return [await calls[0]()]
        return await take_turns(calls)

    async def connection(self, node: Node) -> BlockingConnection:
        if self.closed:
            raise ClientClosed("client is closed")
        state = self._thread
        conn = state.conns.get(node.name)
        if conn is None or conn.broken:
            conn = state.conns[node.name] = await self._open(node)
        return conn

    async def _open(self, node: Node) -> BlockingConnection:
        c = self.client
        conn = await open_blocking_connection(
            node,
            forced=c.transport,
            waits=self.waits,
            shard_size=c.config.shard_size,
            secret=c._secret,
            shared=c.shared,
        )
        with self._lock:
            self._all = [k for k in self._all if not k.broken]
            self._all.append(conn)
        return conn

    def close(self) -> None:
        self.closed = True
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()


async def take_turns(calls: list[Call]) -> list[Any]:
    """Run coroutines in this thread: each runs until it has sent a request
    (``Sent``) or finds its connection held by another (``Busy``). When none
    can go on, the oldest pending answer is read (blocking, bounded by the
    client's timeout) and one waiter for that connection goes next.

    So this never waits for ever, as an earlier fan-out under ``trio.run``
    with lent sockets could when a daemon was killed mid-call. A fan-out
    inside a call of another passes a wait for a connection held outside it
    to the enclosing one.
    """
    results: list[Any] = [None] * len(calls)
    ready: deque[tuple[int, Any]] = deque((i, call()) for i, call in enumerate(calls))
    holders: dict[BlockingConnection, tuple[int, Any]] = {}  # oldest sent first
    waiting: dict[BlockingConnection, deque[tuple[int, Any]]] = {}
    try:
        while ready or holders or waiting:
            if ready:
                i, coro = ready.popleft()
                try:
                    token = coro.send(None)
                except StopIteration as done:
                    results[i] = done.value
                    continue
                if isinstance(token, Sent) and token.conn not in holders:
                    holders[token.conn] = (i, coro)
                elif isinstance(token, Busy):
                    waiting.setdefault(token.conn, deque()).append((i, coro))
                else:
                    raise RuntimeError(
                        f"a blocking irdma call yielded {token!r}; please report this"
                    )
            elif holders:
                conn = next(iter(holders))
                ready.append(holders.pop(conn))  # reads its answer when resumed
                queue = waiting.get(conn)
                if queue:
                    ready.append(queue.popleft())
                    if not queue:
                        del waiting[conn]
            else:
                # Only waits: for connections whose holder went on meanwhile, or
                # that a call outside this fan-out holds (let it go on first).
                if all(conn.busy for conn in waiting):
                    await _yield(Busy(next(iter(waiting))))
                for queue in waiting.values():
                    ready.extend(queue)
                waiting.clear()
    except BaseException:
        for _, coro in [*ready, *holders.values(), *(w for q in waiting.values() for w in q)]:
            coro.close()
        raise
    return results


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a core coroutine of the blocking shell to its end, in this thread.

    Every wait is a blocking call; a request that sent its frame outside a
    fan-out is resumed at once to read its answer. Anything else it yields
    is a bug, reported as such.
    """
    while True:
        try:
            token = coro.send(None)
        except StopIteration as done:
            return done.value
        if not isinstance(token, Sent):
            coro.close()
            raise RuntimeError(
                f"a blocking irdma call tried to suspend ({token!r}); please report this as a bug"
            )
