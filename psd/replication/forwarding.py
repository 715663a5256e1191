"""Forwarding and acknowledgement: updates applied here as a shard's primary, queued for
its backups in the order they were applied, sent in that order, and waited for.

The interface the daemon uses: ``forward`` (queue what was just applied),
``wait`` (until the backups that are up have it; refuses to acknowledge an
update this daemon may no longer be in charge of), ``confirm`` (a retried
update's shard sent whole first), ``send_whole`` (shards a peer asked for),
``drain`` (what was queued for one peer). ``run`` is the one task per peer
that sends its queue in order over its link, many forwards in flight and
those waiting written together (``pipeline``): backups apply the same updates
in the same order, so copies stay byte-identical. The queues of a shard's
backups are sent at once, each by its own task, so an update waits for the
slowest backup, not for their sum. A backup that missed updates answers
BEHIND and gets the whole shard instead (``delivery``).

A backup declared down gets nothing more: what was queued for it is dropped and
later updates are acknowledged without it. This daemon then owes it a resync
(``debts``), which its heartbeats to it say, so a backup that never noticed
(it kept hearing a majority) catches up rather than stay ready and stale.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import trio

from irdma.protocol import Status

from ..errors import Refusal
from ..membership import Membership, MembershipListener
from ..store import Commit
from .debts import Debts
from .delivery import Delivery
from .links import Refused
from .peers import Peer, Peers
from .pipeline import Pipeline
from .queues import Item

log = logging.getLogger("psd")


class Forwarding(MembershipListener):
    """The forward queues of one daemon and what acknowledging an update waits for."""

    def __init__(
        self,
        me: str,
        membership: Membership,
        peers: Peers,
        delivery: Delivery,
        retry_pause: float,
    ) -> None:
        self.me = me
        self.membership = membership
        self.peers = peers
        self.delivery = delivery
        self.retry_pause = retry_pause  # between tries to reach a peer that is up
        # Times this daemon gave up being ready: an update queued before one of them
        # is not acknowledged even if it is ready again by the time it is answered.
        self.losses = 0
        # The backups declared down while this daemon acknowledged updates without them.
        self.debts = Debts(me)

    # -- queueing ---------------------------------------------------------------

    def forward(self, commits: list[Commit]) -> list[Item]:
        """Queue updates just applied here for the shards' backups; call with no await since.
        A copy that is down misses them: it is owed a resync."""
        items = []
        for c in commits:
            backups = self.membership.backups(c.key, c.shard)
            for name in self.membership.down_copies(c.key, c.shard):
                self._owe(name, "updates are acknowledged without it while it is down")
            c.hold(len(backups))  # its payload is kept until each backup's forward is over
            items += [self._queue(name, c.key, c.shard, c) for name in backups]
        return items

    def send_whole(self, peer_name: str, shards: Iterable[tuple[int, int]]) -> list[Item]:
        """Queue whole shards for a peer (after anything queued for it before)."""
        return [self._queue(peer_name, key, index, None) for key, index in shards]

    def _queue(self, peer_name: str, key: int, index: int, commit: Commit | None) -> Item:
        """Queue an update (None: the whole shard) for a peer, marked with how many
        times this daemon had given up being ready (``wait`` compares)."""
        return self.peers[peer_name].queue.put(Item(key, index, commit, losses=self.losses))

    # -- waiting ------------------------------------------------------------------

    async def wait(self, items: list[Item]) -> None:
        """Wait until the backups have these updates, or were declared down.

        Raises Refusal (NO_QUORUM) when one was not delivered and was refused,
        or this daemon gave up being ready (lost its majority or lease, or was
        refused) since it was queued, or is not ready now: it is applied here
        only, another replica may be primary by now and this copy will be
        replaced, so it must not be acknowledged; the client retries it
        elsewhere with the same txn.
        """
        for item in items:
            await item.done.wait()
        m = self.membership
        # A refusal, or a loss of readiness since the items were queued, means another
        # replica may be in charge: not acknowledged, even if this daemon is ready
        # again by now (caught up meanwhile, with its copy replaced).
        stale = any(i.refused or i.losses != self.losses for i in items)
        if any(not i.delivered for i in items) and (stale or not (m.ready and m.has_quorum())):
            why = "its lease or a backup's acceptance" if m.leased else "contact with a majority"
            raise Refusal(
                Status.NO_QUORUM,
                f"{self.me} lost {why} before its backups had the "
                "update; it is not acknowledged: retry it on another replica",
            )

    async def confirm(self, shards: list[tuple[int, int]]) -> None:
        """Before a retried update is answered (it was applied here before, as primary
        or as a backup): every other copy that is up gets these shards whole from
        here. The original may never have reached one of them (refused by a daemon
        that saw another primary, a move's gaining daemon among them), and that copy
        must not outlive this one without it. Refusal (RECOVERING) if a copy
        that is still up did not take it: the client asks again.
        """
        if not self.membership.replicated:
            return
        log.info(
            "%s: a retried update was applied here before (%s); every copy gets it whole first",
            self.me,
            ", ".join(f"shard {index} of tensor {key:#x}" for key, index in shards),
        )
        sent = [
            (name, self._queue(name, key, index, None))
            for key, index in shards
            for name in self.membership.backups(key, index)
        ]
        await self.wait([item for _, item in sent])
        missing = sorted({n for n, i in sent if not i.delivered and self.membership.up(n)})
        if missing:
            raise Refusal(
                Status.RECOVERING,
                f"{self.me} could not give {', '.join(missing)} its copy of a retried "
                "update; ask again",
            )

    async def drain(self, peer_name: str) -> None:
        """Wait until everything queued for a peer so far was delivered (or it went down)."""
        peer = self.peers.get(peer_name)
        if peer is not None:
            await peer.queue.drain()

    async def flush(self) -> None:
        """Wait until everything queued so far was delivered (or its peer went down)."""
        for name in list(self.peers):
            await self.drain(name)

    # -- what changes it -------------------------------------------------------------

    def peers_changed(self) -> None:
        """A peer came up or went down (``MembershipListener``)."""
        self.let_go_of_down_peers()

    def let_go_of_down_peers(self) -> None:
        """A peer that went down no longer holds up acknowledgements (and is owed a
        resync if something queued for it is dropped)."""
        for name, peer in self.peers.items():
            if not self.membership.up(name):
                if peer.queue:
                    self._owe(name, f"{len(peer.queue)} item(s) queued for it dropped (it is down)")
                peer.queue.skip_all()

    def _owe(self, peer: str, why: str) -> None:
        """``peer`` misses updates this daemon may acknowledge: it is owed a resync.
        Not while this daemon is not ready or has no majority (``has_quorum`` checks
        first, so one resumed after a pause gives up being ready here): then what it
        dropped is not acknowledged, and the peer may be the one serving now."""
        if self.membership.ready and self.membership.has_quorum():
            self.debts.incur(peer, why)

    def lost(self) -> None:
        """This daemon gave up being ready: count it."""
        self.losses += 1

    # -- sending --------------------------------------------------------------------

    async def run(self, peer: Peer) -> None:
        """Send ``peer``'s queue in order, many items in flight (``pipeline``), until
        cancelled; when the link fails, what is not done goes again."""
        while True:
            await peer.queue.wait_unsent()
            failure = await Pipeline(
                self.me, peer, self.delivery, self.membership, self._refused
            ).run()
            if failure is None:
                continue
            peer.queue.resend()
            # Keep trying while the peer is up; once it is down the queue is
            # dropped and it is owed a resync (``let_go_of_down_peers``).
            if self.membership.up(peer.name):
                log.info("%s: forwarding to %s failed (%s); retrying", self.me, peer.name, failure)
                await trio.sleep(self.retry_pause)
                continue
            self._owe(peer.name, f"forwarding to it failed once it was down ({failure})")
            if peer.queue:
                peer.queue.done(peer.queue[0])

    def _refused(self, peer: Peer, item: Item, exc: Refused) -> None:
        """``peer`` would not take ``item`` from this daemon: it is dropped."""
        log.warning("%s: %s; dropped", self.me, exc)
        item.refused = True
        if self.membership.leased and item.commit is not None:
            # Applied here as primary, refused by a copy that sees another
            # primary (an epoch switch): this copy may hold an update no
            # other has. Not acknowledged; caught up from the primary.
            self.membership.lose(f"{peer.name} refused an update it forwarded")
