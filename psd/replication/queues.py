"""What waits to be sent to one peer: forwarded updates and whole shards, in order.

An item stays queued until it is done (delivered or given up); the items not
sent yet are kept apart (``take_unsent``), so many can be in flight at once
(``pipeline``) and, after the link failed, everything not done goes again
(``resend``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import trio

from ..loans import Loan
from ..store import Commit
from .bodies import LentBytes


@dataclass(eq=False)
class Item:
    """One message queued for a peer: a forwarded update, or a whole shard."""

    key: int
    shard: int
    commit: Commit | None  # None: send the whole shard (SYNC)
    done: trio.Event = field(default_factory=trio.Event)
    delivered: bool = False  # done can also mean skipped (the peer went down)
    refused: bool = False  # the peer would not take it (it sees another primary)
    queued: float = field(default_factory=time.monotonic)  # for the lag metric
    # How many times this daemon had given up being ready when the item was queued.
    losses: int = 0
    sending: bool = False  # its bytes are being written to the peer's socket now
    finished: bool = False  # its hold on the commit's payload is let go
    # The commit's bytes lent to a same-host peer (``lending``), the same loan for
    # every send of it; revoked before the hold is let go.
    lent: tuple[Loan, LentBytes] | None = None

    def finish(self) -> None:
        """Let go of the commit's payload once the item is done and no send reads it
        (whoever ends the later of the two calls this)."""
        if self.done.is_set() and not self.sending and not self.finished:
            self.finished = True
            if self.lent is not None:
                self.lent[0].revoke()  # a peer reading late sees it; the bytes may go now
            if self.commit is not None:
                self.commit.let_go()


class ForwardQueue:
    """The items for one peer, sent in order by one task (``Forwarding.run``)."""

    def __init__(self) -> None:
        self._items: deque[Item] = deque()
        self._unsent: deque[Item] = deque()
        self._wake = trio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self._items)

    def __getitem__(self, index: int) -> Item:
        return self._items[index]

    def put(self, item: Item) -> Item:
        self._items.append(item)
        self._unsent.append(item)
        self._changed()
        return item

    def _changed(self) -> None:
        self._wake.set()
        self._wake = trio.Event()

    async def first(self) -> Item:
        """The oldest item, once there is one (it stays queued until ``done``)."""
        while not self._items:
            await self._wake.wait()
        return self._items[0]

    async def wait_unsent(self) -> None:
        """Until an item waits to be sent."""
        while not self._unsent:
            await self._wake.wait()

    def take_unsent(self, most: int, room: int) -> list[Item]:
        """Up to ``most`` of the items not sent yet, oldest first (now counted as sent),
        their updates' bytes within ``room`` (one at least)."""
        out: list[Item] = []
        while self._unsent and len(out) < most:
            commit = self._unsent[0].commit
            nbytes = commit.payload.nbytes if commit is not None else 0
            if out and nbytes > room:
                break
            room -= nbytes
            out.append(self._unsent.popleft())
        return out

    def resend(self) -> None:
        """Whatever is not done goes again, in order (the link failed under it)."""
        self._unsent = deque(self._items)
        if self._unsent:
            self._changed()

    def done(self, item: Item) -> None:
        """``item`` was sent (or given up on): off the queue, and its waiters woken."""
        if self._items and self._items[0] is item:
            self._items.popleft()
        if self._unsent and self._unsent[0] is item:
            self._unsent.popleft()
        item.done.set()
        item.finish()

    def skip_all(self) -> None:
        """The peer is down: what was queued for it is not waited for (it catches up later)."""
        self._unsent.clear()
        while self._items:
            item = self._items.popleft()
            item.done.set()
            item.finish()

    async def drain(self) -> None:
        """Wait until everything queued so far was delivered (or skipped)."""
        if self._items:
            await self._items[-1].done.wait()
