"""Sending one peer's forward queue with many items in flight, answers taken in order.

One sender and one completer per link, for as long as the link works:

- the sender takes the items not sent yet (every one waiting, up to the
  window) and writes their frames together in one send, without waiting for
  the answers to those before (the peer serves one connection's requests in
  the order they came, so it applies them in the order they were queued);
- the completer takes the answers in the same order, marks each item
  delivered (or refused) and wakes whoever waits for it. An update the peer
  could not apply (BEHIND: it missed one) is followed by its shard whole,
  sent by the completer itself, one at a time: a copy sent later is never
  older than one sent before. Later answers BEHIND for the same shard that
  a copy sent since already covers need no copy of their own.

A whole shard queued (catch-up, a retried update's confirmation) is sent once
everything before it is answered, alone. The first failure of the link ends
the run (``run`` returns it); ``Forwarding.run`` sends again what is not done.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from irdma.protocol import Status

from ..membership import Membership
from .delivery import Delivery
from .links import PeerError, Refused, Sent
from .peers import Peer
from .queues import Item

log = logging.getLogger("psd")

# How many forwards may be in flight to one peer, and how many bytes of them: enough
# for a write's shards to stream while earlier ones are applied, bounded so that a
# slow peer's answers are due within their budget.
WINDOW_ITEMS = 128
WINDOW_BYTES = 64 << 20


@dataclass(eq=False, slots=True)
class Flight:
    """An item sent and not answered yet (``sent`` None: given up without sending)."""

    item: Item
    sent: Sent | None
    deadline: float = 0.0
    allowed: float = 0.0
    nbytes: int = 0


class Pipeline:
    """One run of a peer's forward queue over its link (until the link fails)."""

    def __init__(
        self,
        me: str,
        peer: Peer,
        delivery: Delivery,
        membership: Membership,
        refused: Callable[[Peer, Item, Refused], None],
    ) -> None:
        self.me = me
        self.peer = peer
        self.delivery = delivery
        self.membership = membership
        self.refused = refused  # what a refusal means is ``Forwarding``'s
        self.flights: deque[Flight] = deque()
        self.in_flight_bytes = 0
        self.failure: PeerError | None = None
        # The version of each shard last sent whole in this run: an update that
        # produced no later version is in that copy.
        self.synced: dict[tuple[int, int], int] = {}
        self._moved = trio.Event()  # a flight was added or answered
        self._scope: trio.CancelScope | None = None

    async def run(self) -> PeerError | None:
        """Send and complete until the link fails: the failure (queue untouched since)."""
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                nursery.start_soon(self._guard, self._send_loop)
                nursery.start_soon(self._guard, self._complete_loop)
        finally:
            self.peer.in_flight -= sum(f.sent is not None for f in self.flights)
        return self.failure

    async def _guard(self, loop: Callable[[], Awaitable[None]]) -> None:
        try:
            await loop()
        except PeerError as exc:
            if self.failure is None:
                self.failure = exc
            assert self._scope is not None
            self._scope.cancel()

    def _moved_now(self) -> None:
        self._moved.set()
        self._moved = trio.Event()

    # -- sending ------------------------------------------------------------------

    async def _send_loop(self) -> None:
        queue = self.peer.queue
        while True:
            await queue.wait_unsent()
            while len(self.flights) >= WINDOW_ITEMS or self.in_flight_bytes >= WINDOW_BYTES:
                await self._moved.wait()
            items = queue.take_unsent(
                WINDOW_ITEMS - len(self.flights), WINDOW_BYTES - self.in_flight_bytes
            )
            batch: list[Item] = []
            for item in items:
                if item.commit is None:
                    await self._post(batch)
                    batch = []
                    await self._whole_in_turn(item)
                else:
                    batch.append(item)
            await self._post(batch)

    async def _post(self, items: list[Item]) -> None:
        """Send these updates together, in order (one not to be sent is given up)."""
        requests = []
        to_send = []
        for item in items:
            assert item.commit is not None
            if not self.membership.ready:
                # Applied as primary before this daemon lost its majority: another
                # replica may have taken over since. Not sent.
                self._add(Flight(item, None))
                continue
            lender = self.delivery.lender
            if item.lent is None and self.peer.borrows and self.peer.kernel == lender.kernel:
                item.lent = lender.lend(item.commit.payload)
                if item.lent is not None:
                    self.delivery.copies.lent += 1
                    self.delivery.copies.lent_bytes += item.commit.payload.nbytes
            lent = item.lent[1] if item.lent is not None else None
            requests.append(self.delivery.update_request(item.commit, lent))
            to_send.append(item)
        if not requests:
            return
        nbytes = sum(i.commit.payload.nbytes for i in to_send if i.commit is not None)
        # Answered after everything already in flight: its budget counts those bytes too.
        allowed = self.delivery.budget(self.in_flight_bytes + nbytes)
        deadline = trio.current_time() + allowed
        for item in to_send:
            item.sending = True
        try:
            sents = await self.peer.link.post(requests, deadline=deadline, allowed=allowed)
        finally:
            # Written (or given up): the payloads of items done meanwhile can go.
            for item in to_send:
                item.sending = False
                item.finish()
        for item, sent in zip(to_send, sents, strict=True):
            assert item.commit is not None
            self._add(Flight(item, sent, deadline, allowed, item.commit.payload.nbytes))

    def _add(self, flight: Flight) -> None:
        self.flights.append(flight)
        self.in_flight_bytes += flight.nbytes
        self.peer.in_flight += flight.sent is not None
        self._moved_now()

    async def _whole_in_turn(self, item: Item) -> None:
        """A shard queued whole: sent once everything before it is answered, alone."""
        while self.flights:
            await self._moved.wait()
        try:
            version = await self.delivery.shard(self.peer.link, item.key, item.shard)
            if version is not None:
                self.synced[(item.key, item.shard)] = version
            item.delivered = True
        except Refused as exc:
            self.refused(self.peer, item, exc)
        self.peer.queue.done(item)

    # -- completing -----------------------------------------------------------------

    async def _complete_loop(self) -> None:
        while True:
            while not self.flights:
                await self._moved.wait()
            flight = self.flights[0]
            item = flight.item
            if flight.sent is not None:
                try:
                    await self._complete(flight)
                    item.delivered = True
                except Refused as exc:
                    self.refused(self.peer, item, exc)
            self.flights.popleft()
            self.in_flight_bytes -= flight.nbytes
            self.peer.in_flight -= flight.sent is not None
            self.peer.queue.done(item)
            self._moved_now()

    async def _complete(self, flight: Flight) -> None:
        """Wait for an update's answer; send its shard whole if the peer could not apply it."""
        assert flight.sent is not None and flight.item.commit is not None
        item, commit = flight.item, flight.item.commit
        reply, why = await self.peer.link.outcome(
            flight.sent, deadline=flight.deadline, allowed=flight.allowed
        )
        if reply.status == Status.OK:
            return
        if reply.status == Status.NOT_OWNER:
            raise Refused(
                f"{self.peer.name} refused an update to shard {item.shard} of tensor "
                f"{item.key:#x}: {why.decode(errors='replace')}"
            )
        if item.lent is not None and reply.status == Status.BAD_ARGUMENT:
            # It cannot read this daemon's arena (another pid namespace, no access):
            # later forwards carry their bytes.
            self.peer.borrows = False
            log.warning(
                "%s: %s cannot read lent bytes (%s); forwarding bytes to it from now on",
                self.me,
                self.peer.name,
                why.decode(errors="replace"),
            )
        synced = self.synced.get((item.key, item.shard))
        if synced is not None and commit.version <= synced:
            return  # the copy sent since holds it
        # The backup missed updates, or lacks the tensor: send the shard.
        log.info(
            "%s: %s answered %s to an update of shard %d of tensor %#x (%s); sending "
            "the shard whole",
            self.me,
            self.peer.name,
            Status(reply.status).name,
            item.shard,
            item.key,
            why.decode(errors="replace"),
        )
        version = await self.delivery.shard(self.peer.link, item.key, item.shard)
        if version is not None:
            self.synced[(item.key, item.shard)] = version
