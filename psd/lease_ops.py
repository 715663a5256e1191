"""Readers' leases on whole-tensor writes (LEASE): granting, renewing, releasing,
and ending those that run out (``psd/store/leases.py`` has the rules).

A lease that runs out is ended by ``LeaseOps.run`` when it does, not at the
next write, so a reader that died holds its copies no longer than its lease.
"""

from __future__ import annotations

import math

import trio

from irdma.protocol import Header
from irdma.protocol.messages import Lease

from .conn import Conn, Replies, no_payload
from .store import Store


class LeaseOps:
    """The LEASE handler, and the task ending leases that ran out."""

    def __init__(self, store: Store, replies: Replies) -> None:
        self.store = store
        self.replies = replies
        self._granted = trio.Event()  # a lease was granted: the next end may be sooner

    async def lease(self, conn: Conn, header: Header, msg: Lease) -> None:
        no_payload(conn, msg)
        if msg.ms == 0:
            self.store.release_lease(msg.lease_id)
            await self.replies.reply(conn, header, [], version=0)
            return
        granted = self.store.lease(msg.lease_id, msg.key, msg.stamp, msg.ms / 1000)
        self.granted()
        await self.replies.reply(conn, header, [], version=math.floor(granted * 1000))

    def granted(self) -> None:
        """A lease was granted or renewed: ``run`` looks at when the next one ends."""
        self._granted.set()

    async def run(self) -> None:
        """End each lease when it runs out (on the store's clock), for as long as
        the daemon serves."""
        leases = self.store.blocks.leases
        while True:
            self._granted = trio.Event()
            end = leases.next_end()
            if end is None:
                await self._granted.wait()
                continue
            with trio.move_on_after(max(0.0, end - self.store.clock())):
                await self._granted.wait()
            self.store.expire_leases()
