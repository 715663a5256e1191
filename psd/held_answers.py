"""Answering an update once every copy that is up holds it.

A primary applies an update, queues it for the backups and answers only when
``Forwarding.wait`` says they hold it (and, for a retry, ``confirm``). While
they take it, the connection may serve the client's next request: receiving
the next shard of a large write then overlaps forwarding this one, and the
updates that arrive together reach the backups in one send.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from time import perf_counter

from irdma.protocol import Header
from irdma.transport.base import StreamBroken, StreamClosed

from .conn import Conn, Replies
from .errors import Refusal
from .metrics import RequestMetrics
from .replication import Forwarding, Item

# An update at least this large is answered by a task of its own once its backups
# hold it, so the connection takes in the next one meanwhile (smaller ones do this
# only when the next request is already waiting).
DEFER_MIN = 256 << 10


def more_waiting(conn: Conn) -> bool:
    """Whether the client sent more on this connection already (a peek, no wait)."""
    try:
        return bool(conn.stream.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:
        return False  # nothing yet (or a failure its reader finds)


class HeldAnswers:
    """Sends an update's answer once its copies hold it, in place or from a task."""

    def __init__(self, forwarding: Forwarding, replies: Replies, metrics: RequestMetrics) -> None:
        self.forwarding = forwarding
        self.replies = replies
        self.metrics = metrics

    async def answer(
        self,
        conn: Conn,
        header: Header,
        items: list[Item],
        retried: list[tuple[int, int]],
        answer: Callable[[], Awaitable[None]],
        nbytes: int,
    ) -> None:
        """Answer once every copy that is up holds ``items`` (and confirms ``retried``).

        A large update (``DEFER_MIN``), or one with the client's next request
        already on the socket, is answered by a task of its own so the
        connection reads on; a lone small update waits in place (a task of
        its own costs a small update's latency).
        """
        if not items and not retried:
            await answer()
        elif nbytes >= DEFER_MIN or more_waiting(conn):
            conn.deferred = True
            conn.nursery.start_soon(self._answer_later, conn, header, items, retried, answer)
        else:
            await self._held(items, retried)
            await answer()

    async def _held(self, items: list[Item], retried: list[tuple[int, int]]) -> None:
        await self.forwarding.wait(items)
        if retried:
            await self.forwarding.confirm(retried)

    async def _answer_later(
        self,
        conn: Conn,
        header: Header,
        items: list[Item],
        retried: list[tuple[int, int]],
        answer: Callable[[], Awaitable[None]],
    ) -> None:
        started = perf_counter()
        try:
            try:
                await self._held(items, retried)
            except Refusal as exc:
                await self.replies.error(conn, header, exc.status, exc.message)
            else:
                await answer()
        except (StreamBroken, StreamClosed):
            pass  # the connection task notices and cleans up
        finally:
            self.metrics.series(header.op, conn.transport).observe(perf_counter() - started)
