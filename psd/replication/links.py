"""The link to one other daemon: one authenticated connection, requests bounded by a
timeout, and every way one can fail turned into ``PeerError`` here.

Links to peers authenticate like clients do (``irdma.auth``). A request that
times out closes the connection (a late answer must not be taken for the
next request's); the next request connects again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import trio

from irdma.cluster import Node
from irdma.errors import AuthFailed
from irdma.protocol import Header
from irdma.transport.base import StreamBroken, StreamClosed
from irdma.transport.tcp import FramedConnection

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
        name = self.node.name
        with trio.move_on_after(timeout) as scope:
            try:
                conn = await self._connection()
                reply = await conn.request(header, list(payload))
            except (StreamBroken, StreamClosed, OSError) as exc:
                raise PeerError(f"{name}: {exc}") from None
            except AuthFailed as exc:
                # Another secret on the peer: said once, not at every heartbeat.
                if self._auth_error != str(exc):
                    log.error("%s: cannot link to %s: %s", self._dialer.me, name, exc)
                self._auth_error = str(exc)
                raise PeerError(f"{name}: {exc}") from None
        if scope.cancelled_caught:
            await self.aclose()  # a late answer must not be taken for the next one
            raise PeerError(f"{name}: no answer within {timeout:g} s")
        return reply.header, reply.data

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
