"""The link to one other daemon: one authenticated connection, requests bounded by a
timeout, and every way one can fail turned into ``PeerError`` here.

Links to peers authenticate like clients do (``irdma.auth``). A request that
times out closes the connection (a late answer must not be taken for the
next request's); the next request connects again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from irdma.cluster import Node
from irdma.errors import AuthFailed
from irdma.protocol import Header
from irdma.transport.base import StreamBroken, StreamClosed
from irdma.transport.tcp import Answer, FramedConnection

log = logging.getLogger("psd")


class PeerError(Exception):
    """A peer could not be reached or refused a replication message."""


class Refused(PeerError):
    """The peer does not take copies from this daemon (it sees another primary)."""


@dataclass(slots=True)
class Dialer:
    """How this daemon connects to its peers, and the nursery their connections'
    reader tasks run in (``serve_in``, once the replicator runs)."""

    me: str
    secret: bytes | None
    timeout: float  # to connect and authenticate: the failure timeout
    nursery: trio.Nursery | None = None

    def serve_in(self, nursery: trio.Nursery | None) -> None:
        self.nursery = nursery

    async def open(self, node: Node) -> FramedConnection:
        assert self.nursery is not None, "links connect once the replicator runs"
        addr = node.address
        return await FramedConnection.open(
            addr.host,
            addr.port,
            self.nursery,
            peer=f"{node.name} ({addr})",
            timeout=self.timeout,
            secret=self.secret,
        )


@dataclass(frozen=True, slots=True)
class Sent:
    """A request sent on a link's connection, its answer still to come."""

    conn: FramedConnection
    answer: Answer


class Link:
    """The connection to one peer, opened on first use and again after a failure."""

    def __init__(self, node: Node, dialer: Dialer) -> None:
        self.node = node
        self._dialer = dialer
        self._conn: FramedConnection | None = None
        self._lock = trio.Lock()  # one connect at a time
        self._auth_error: str | None = None  # why the last link failed to authenticate

    async def _connection(self) -> FramedConnection:
        if self._conn is not None and not self._conn.broken:
            return self._conn
        async with self._lock:
            if self._conn is None or self._conn.broken:
                self._conn = await self._dialer.open(self.node)
                self._auth_error = None
            return self._conn

    async def request(
        self, header: Header, payload: Iterable[Any] = (), *, timeout: float
    ) -> tuple[Header, bytes]:
        """One request to the peer: its answer's header and payload.

        Raises PeerError when it cannot be sent, the peer does not authenticate
        us, or no answer comes within ``timeout``.
        """
        deadline = trio.current_time() + timeout
        (sent,) = await self.post([(header, list(payload))], deadline=deadline, allowed=timeout)
        return await self.outcome(sent, deadline=deadline, allowed=timeout)

    async def post(
        self,
        requests: Sequence[tuple[Header, Sequence[Any]]],
        *,
        deadline: float,
        allowed: float,
    ) -> list[Sent]:
        """Send requests in this order, written together, without waiting for their
        answers (``outcome`` waits): the peer serves one connection's requests in
        the order they came, so it applies them in this order.

        Raises PeerError when they cannot be sent by ``deadline`` (``allowed``
        seconds after they were due, for the message).
        """
        with trio.move_on_at(deadline) as scope:
            with self._failing():
                conn = await self._connection()
                answers = await conn.post([(h, p, None) for h, p in requests])
        if scope.cancelled_caught:
            await self.aclose()  # half a frame may be out: the connection is done for
            raise PeerError(f"{self.node.name}: could not send within {allowed:g} s")
        return [Sent(conn, a) for a in answers]

    async def outcome(self, sent: Sent, *, deadline: float, allowed: float) -> tuple[Header, bytes]:
        """The answer to a request ``post`` sent: its header and payload.

        Raises PeerError when the connection failed or no answer came by ``deadline``.
        """
        with trio.move_on_at(deadline) as scope:
            with self._failing():
                reply = await sent.conn.outcome(sent.answer)
        if scope.cancelled_caught:
            if self._conn is sent.conn:
                await self.aclose()  # a late answer must not be taken for the next one
            raise PeerError(f"{self.node.name}: no answer within {allowed:g} s")
        return reply.header, reply.data

    @contextlib.contextmanager
    def _failing(self) -> Iterator[None]:
        """Every way a request fails, as PeerError."""
        name = self.node.name
        try:
            yield
        except (StreamBroken, StreamClosed, OSError) as exc:
            raise PeerError(f"{name}: {exc}") from None
        except AuthFailed as exc:
            # Another secret on the peer: said once, not at every heartbeat.
            if self._auth_error != str(exc):
                log.error("%s: cannot link to %s: %s", self._dialer.me, name, exc)
            self._auth_error = str(exc)
            raise PeerError(f"{name}: {exc}") from None

    def abandon(self, why: str, *, reset: bool = False) -> None:
        """Let go of the connection at once (``why`` for whoever waits on it).

        ``reset``: what was written to its socket and not yet read by the peer is
        thrown away (a reset, not a close), so it is never delivered later.
        """
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if reset:
            conn.stream.reset()
        conn.abandon(StreamClosed(why))

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()
