"""The two shells the client's core runs in: under trio, or in the calling thread.

The core (``irdma.client``: routing, failover, read-your-writes, the metadata
cache, batching) is written once, as ``async`` code that does all its
waiting, timing and concurrency through its shell:

- ``TrioShell`` (``AsyncClient``): connections with a reader task each in
  the client's nursery, many requests in flight on each.
- ``BlockingShell`` (``Client``): each thread has its own connections and
  runs its requests itself; every wait is a blocking call bounded by the
  client's timeout. Calls that fan out (the shards of a large tensor, one
  frame per daemon) take turns on the thread's connections
  (``take_turns``): a request yields once its frame is sent
  (``transport.blocking.Sent``), so the other daemons get theirs before its
  answer is read; one request is in flight per connection (``Busy``); and a
  request whose socket would block yields a ``Wait``, so one ``poll`` over
  every waiting socket resumes whichever answer is arriving. ``drive`` runs
  a core coroutine to its end.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import trio

from ..cluster import ClusterConfig, Node
from ..cluster.etcd import Post, blocking_post, trio_post
from ..errors import ClientClosed
from ..transport.base import Connection, StreamBroken, StreamTimeout
from ..transport.blocking import (
    BlockingConnection,
    BlockingWaits,
    Busy,
    Nap,
    Sent,
    Wait,
    _yield,
    fanning,
    in_fan_out,
    timed_out,
)
from ..transport.select import open_blocking_connection, open_connection
from ..transport.shared import SharedRegion

T = TypeVar("T")
Call = Callable[[], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Dialing:
    """How a shell opens a connection to a daemon: one client's settings."""

    config: ClusterConfig
    forced: str  # the transport asked for ("auto": chosen per daemon)
    timeout: float
    secret: bytes | None
    shared: SharedRegion | None


class Shell(Protocol):
    """What the client's core asks of the shell it runs in."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    async def gather(self, calls: list[Call]) -> list[Any]: ...

    def shielded(self) -> contextlib.AbstractContextManager[Any]: ...

    async def connection(self, node: Node) -> Any: ...

    @property
    def conns(self) -> dict[str, Any]: ...

    @property
    def http_post(self) -> Post:
        """How the shell's calls reach etcd (model version numbers)."""


async def gather_under_trio(calls: list[Call]) -> list[Any]:
    """Run calls concurrently; return results in order, or raise the first error
    (the others are cancelled).

    Every call either gives its result or raises: one that did neither (a
    ``Cancelled`` of another task's scope raised in it, which this nursery takes
    for its own and swallows) is a bug, raised here rather than returned as a
    missing result.
    """
    if len(calls) == 1:
        return [await calls[0]()]
    results: list[Any] = [_UNSET] * len(calls)
    errors: list[Exception] = []

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
    missing = [i for i, r in enumerate(results) if r is _UNSET]
    if missing:
        raise RuntimeError(
            f"irdma: calls {missing} of a gather ended with neither a result nor an error "
            "(a cancellation from another task); please report this as a bug"
        )
    return results


_UNSET = object()  # a gather's result not given yet


class TrioShell:
    """``AsyncClient``'s shell: trio's clock, sleeps, nurseries and connections."""

    def __init__(self, dialing: Dialing, nursery: trio.Nursery) -> None:
        self.dialing = dialing
        self.nursery = nursery
        self.conns: dict[str, Connection] = {}
        self._connecting: dict[str, trio.Lock] = defaultdict(trio.Lock)

    now = staticmethod(trio.current_time)
    sleep = staticmethod(trio.sleep)
    gather = staticmethod(gather_under_trio)
    http_post = staticmethod(trio_post)

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
                d = self.dialing
                conn = await open_connection(
                    node,
                    self.nursery,
                    forced=d.forced,
                    timeout=d.timeout,
                    shard_size=d.config.shard_size,
                    secret=d.secret,
                    rdma_gid_index=d.config.rdma_gid_index,
                    rdma_mtu=d.config.rdma_mtu,
                    shared=d.shared,
                )
                self.conns[node.name] = conn
            return conn

    async def aclose(self) -> None:
        for conn in self.conns.values():
            await conn.aclose()
        self.conns.clear()


class _Connecting:
    """One request of this thread making the connection to a node; the others of
    its fan-out that need that node wait for it (``Busy``) and then look again."""

    def __init__(self) -> None:
        self.busy = True
        # Why it failed, for the waiters to raise without trying again (an
        # Exception: a BaseException is never handed to another request).
        self.failure: Exception | None = None


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.conns: dict[str, BlockingConnection] = {}
        self.waits: BlockingWaits | None = None
        self.connecting: dict[str, _Connecting] = {}


class BlockingShell:
    """``Client``'s shell: the calling thread's clock, sleeps and connections."""

    def __init__(self, dialing: Dialing) -> None:
        self.dialing = dialing
        self._thread = _ThreadState()
        self._all: list[BlockingConnection] = []  # every thread's, for close()
        self._lock = threading.Lock()
        self.closed = False

    @property
    def waits(self) -> BlockingWaits:
        waits = self._thread.waits
        if waits is None:
            waits = self._thread.waits = BlockingWaits(self.dialing.timeout)
        return waits

    @property
    def conns(self) -> dict[str, BlockingConnection]:
        """This thread's connections, by daemon name."""
        return self._thread.conns

    now = staticmethod(time.monotonic)
    http_post = staticmethod(blocking_post)

    async def sleep(self, seconds: float) -> None:
        if in_fan_out():  # the call's other requests go on meanwhile
            await _yield(Nap(time.monotonic() + seconds))
        else:
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
        """This thread's connection to ``node``, made if it has none that works.

        One request at a time makes it (``_Connecting``, the node's lock): the
        others of the fan-out that need it wait, then use the one it made, or
        raise what made it fail; a working connection is never replaced."""
        if self.closed:
            raise ClientClosed("client is closed")
        state = self._thread
        conn = state.conns.get(node.name)
        if conn is not None and not conn.broken:
            return conn
        connecting = state.connecting.get(node.name)
        if connecting is not None:
            while connecting.busy:
                await _yield(Busy(connecting))
            conn = state.conns.get(node.name)
            if conn is not None and not conn.broken:
                return conn
            again = _again(connecting.failure)
            if again is not None:
                raise again
            # It was made and broke since, or failed in a way to see for oneself.
            return await self.connection(node)
        connecting = state.connecting[node.name] = _Connecting()
        try:
            conn = await self._open(node)
            state.conns[node.name] = conn
            return conn
        except Exception as exc:
            connecting.failure = exc
            raise
        finally:
            connecting.busy = False
            del state.connecting[node.name]

    async def _open(self, node: Node) -> BlockingConnection:
        d = self.dialing
        conn = await open_blocking_connection(
            node,
            forced=d.forced,
            waits=self.waits,
            shard_size=d.config.shard_size,
            secret=d.secret,
            shared=d.shared,
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


def _again(failure: Exception | None) -> Exception | None:
    """What a request waiting for another's connect raises when the daemon could not
    be reached: the same kind of error, new (each request raises its own). None
    for anything else (a refused secret, say): the waiter connects itself."""
    if isinstance(failure, StreamTimeout):
        return StreamTimeout(str(failure))
    if isinstance(failure, StreamBroken):
        return StreamBroken(str(failure))
    return None


class _Turns:
    """The requests of one fan-out and what each waits for (see ``take_turns``)."""

    def __init__(self) -> None:
        # Each entry: (index, coroutine, an exception to throw in or None).
        self.ready: deque[tuple[int, Any, Exception | None]] = deque()
        self.held: dict[Any, deque[tuple[int, Any]]] = {}  # Busy, by what is held
        self.sockets: dict[int, list[tuple[int, Any, Wait]]] = {}  # Wait, by fd
        self.naps: list[tuple[float, int, Any]] = []

    def __bool__(self) -> bool:
        return bool(self.ready or self.held or self.sockets or self.naps)

    def park(self, i: int, coro: Any, token: object) -> None:
        if isinstance(token, Sent):
            self.ready.append((i, coro, None))  # the others send before its answer is read
        elif isinstance(token, Busy):
            self.held.setdefault(token.conn, deque()).append((i, coro))
        elif isinstance(token, Wait):
            if token.fd < 0:  # closed under it: its next system call says so
                self.ready.append((i, coro, None))
            else:
                self.sockets.setdefault(token.fd, []).append((i, coro, token))
        elif isinstance(token, Nap):
            self.naps.append((token.until, i, coro))
        else:
            coro.close()
            raise RuntimeError(f"a blocking irdma call yielded {token!r}; please report this")

    def let_go(self) -> None:
        """Whoever waits for something no longer held goes next, before the rest."""
        for what in [w for w in self.held if not w.busy]:
            queue = self.held[what]
            self.ready.appendleft((*queue.popleft(), None))
            if not queue:
                del self.held[what]

    def poll(self) -> None:
        """Wait for any socket a request waits on, or the first deadline or nap's end;
        make ready whoever may go on (past its deadline: with ``StreamTimeout``)."""
        ends = [w.deadline for waits in self.sockets.values() for _, _, w in waits]
        ends += [until for until, _, _ in self.naps]
        wait_s = max(0.0, min(ends) - time.monotonic())
        poller = select.poll()
        for fd, waits in self.sockets.items():
            events = 0
            for _, _, w in waits:
                events |= w.events
            poller.register(fd, events)
        for fd, _ in poller.poll(wait_s * 1000):
            for i, coro, _ in self.sockets.pop(fd):
                self.ready.append((i, coro, None))
        now = time.monotonic()
        for fd in [fd for fd, waits in self.sockets.items() if waits[0][2].deadline <= now]:
            for i, coro, w in self.sockets.pop(fd):
                self.ready.append((i, coro, timed_out(w.timeout)))
        naps = []
        for until, i, coro in self.naps:
            if until <= now:
                self.ready.append((i, coro, None))
            else:
                naps.append((until, i, coro))
        self.naps = naps

    def coroutines(self) -> list[Any]:
        return [
            *(coro for _, coro, _ in self.ready),
            *(coro for q in self.held.values() for _, coro in q),
            *(coro for waits in self.sockets.values() for _, coro, _ in waits),
            *(coro for _, _, coro in self.naps),
        ]


async def take_turns(calls: list[Call]) -> list[Any]:
    """Run coroutines together in this thread. Each runs until it has sent a request
    (``Sent``: the others go first, so every daemon has its frame before any
    answer is read), needs a connection another holds (``Busy``), would block
    on its socket (``Wait``) or sleeps (``Nap``). When none can go on, one
    ``poll`` over every waiting socket resumes those ready, so the answers of
    all the daemons stream in together, each straight into its destination.

    Every wait ends by its deadline (the client's timeout, thrown in as
    ``StreamTimeout``), so a daemon killed or paused mid-call is an error
    within the timeout, never a wait for ever. The first error is raised and
    the unfinished requests are closed (a connection with an answer pending
    then fails: its answer was never read). A fan-out inside a call of
    another runs its own turns and passes a wait for a connection held
    outside it to the enclosing one.
    """
    results: list[Any] = [None] * len(calls)
    turns = _Turns()
    with fanning():
        try:
            turns.ready.extend((i, call(), None) for i, call in enumerate(calls))
            while turns:
                if turns.ready:
                    i, coro, exc = turns.ready.popleft()
                    try:
                        token = coro.send(None) if exc is None else coro.throw(exc)
                    except StopIteration as done:
                        results[i] = done.value
                    else:
                        turns.park(i, coro, token)
                    turns.let_go()
                elif turns.sockets or turns.naps:
                    turns.poll()
                else:
                    # Only waits for what a call outside this fan-out holds (let it
                    # go on first), or for what was let go inside a nested one.
                    if all(what.busy for what in turns.held):
                        await _yield(Busy(next(iter(turns.held))))
                    for queue in turns.held.values():
                        turns.ready.extend((i, coro, None) for i, coro in queue)
                    turns.held.clear()
        except BaseException:
            for coro in turns.coroutines():
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
