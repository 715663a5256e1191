"""Catching up: a daemon that starts, or that was cut off long enough to have been
declared down, asks its peers which shards they hold (versions and checksums), has
the current copy of each of its shards sent to it, and only then announces itself
ready (the *handoff*); each peer first sends it everything it queued for it, so no
update falls between the copy and the handoff.

Which copies to take is decided by ``catchup_plan.plan`` (pure); this module
asks, copies and hands off. A move's gains (``following``) are copied the
same way (``copy_planned`` with a filter).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from irdma.cluster import DEFAULT_SHARD_SIZE, ClusterConfig, ConfigInForce
from irdma.protocol import Status
from irdma.protocol.messages import Catchup, SyncRequest

from ..membership import Membership
from ..store import Store
from .bodies import BadBody, CatchupAnswer, CatchupQuestion, CopyRequest, ShardId
from .catchup_plan import Plan, Report, Undecided, plan
from .delivery import MODEST_RATE
from .forwarding import Forwarding
from .heartbeats import Heartbeats
from .links import PeerError
from .peers import Peers
from .vetting import epoch_number

log = logging.getLogger("psd")

# How long a catch-up waits between attempts when it cannot decide yet
# (no quorum, or a replica it needs is down).
RETRY_PAUSE = 0.2

# What a peer may take beyond the failure timeout to answer a catch-up question or
# a copy request (it walks its shards, or sends them after its queue).
PEER_WORK = 30.0


def drop_unkept(config: ClusterConfig, store: Store, me: str) -> None:
    """Drop the local copies this daemon keeps in neither the members' placement
    nor the target's (a move switched away from it, or it is no member)."""
    unkept = [
        (key, index)
        for key, tensor in store.tensors.items()
        for index in tensor.shards
        if not config.holds(me, key, index)
    ]
    for key, index in unkept:
        store.drop_shard(key, index)
    if unkept:
        log.info("%s: dropped %d shard copies it no longer keeps", me, len(unkept))


class CatchUp:
    """Asks the peers, takes the copies a plan names, and hands off."""

    def __init__(
        self,
        in_force: ConfigInForce,
        me: str,
        store: Store,
        membership: Membership,
        peers: Peers,
        heartbeats: Heartbeats,
        forwarding: Forwarding,
    ) -> None:
        self.in_force = in_force
        self.me = me
        self.store = store
        self.membership = membership
        self.peers = peers
        self.heartbeats = heartbeats
        self.forwarding = forwarding
        # The peers this daemon asked for shard copies and waits on (``Vetting``
        # takes their copies before this daemon is ready).
        self.asked: set[str] = set()
        # Daemons the last round's answers said they hear: asked in the next round
        # too (only the last round's: one heard once and gone since is not waited on).
        self.also_ask: set[str] = set()
        # Why the last round could not decide, as logged (a reason is logged once).
        self._why = ""

    async def run(self) -> None:
        """Become current for every local shard, then announce readiness."""
        me = self.me
        epoch = self.in_force.config.epoch
        if epoch is not None and me not in epoch.names:
            # Registered but not in the epoch (new, or drained): it keeps no copies, so
            # it has nothing to catch up on; the steward moves some to it if it joins.
            drop_unkept(self.in_force.config, self.store, me)
            self.membership.became_ready()
            log.info("%s: not a member of epoch %d; ready to join", me, epoch.number)
            return
        announced = False
        while True:
            if not self.membership.has_quorum():
                if not announced:
                    log.info("%s: waiting for a majority of daemons before catching up", me)
                    announced = True
                await trio.sleep(RETRY_PAUSE)
                continue
            done = await self.copy_planned()
            if done is None:
                await trio.sleep(RETRY_PAUSE)
                continue
            for key, index in done.drop:
                self.store.drop_deleted(key, index)
            if await self.handoff():
                break
            await trio.sleep(RETRY_PAUSE)
        given = sum(len(shards) for shards in done.give.values())
        log.info(
            "%s: caught up (%d shard(s) copied from replicas, %d dropped as deleted, "
            "%d given to a primary that had lost them); ready",
            me,
            done.copies,
            len(done.drop),
            given,
        )

    async def copy_planned(
        self, only: Callable[[int, int], bool] | None = None, doing: str = "catching up"
    ) -> Plan | None:
        """Plan which copies to take and take them; the plan, or None (try again after
        a pause) when it could not be decided or a copy failed."""
        decided = await self.plan(only)
        if isinstance(decided, Undecided):
            if decided.why != self._why:
                log.info("%s: %s", self.me, decided.why)
            self._why = decided.why
            return None
        self._why = ""
        try:
            for source, shards in decided.fetch.items():
                await self.fetch(source, shards)
            for primary, shards in decided.give.items():
                await self.give(primary, shards)
        except PeerError as exc:
            log.info("%s: %s from a peer failed (%s); again", self.me, doing, exc)
            return None
        return decided

    async def plan(self, only: Callable[[int, int], bool] | None = None) -> Plan | Undecided:
        """Ask every peer that is up what it holds, and decide (``catchup_plan.plan``).
        ``only``: consider just the shards it accepts (a move's gains)."""
        reports, asked = await self._ask_peers()
        mine = {
            (key, index): (shard.version, self.store.checksum(shard))
            for key, tensor in self.store.tensors.items()
            for index, shard in tensor.shards.items()
        }

        def replicas(key: int, index: int) -> list[str]:
            return [n.name for n in self.in_force.config.replicas_for(key, index)]

        def acting_primary(key: int, index: int) -> str | None:
            node = self.membership.acting_primary(key, index)
            return node.name if node is not None else None

        # Those asked count as heard: one that was up when asked and silent since may
        # hold shards placed here (it was only slow to answer).
        heard = set(self.membership.up_peers()) | asked
        return plan(
            self.me,
            mine,
            reports,
            replicas,
            acting_primary,
            only,
            heard,
            self.in_force.config.quorum,
        )

    async def _ask_peers(self) -> tuple[dict[str, Report], set[str]]:
        """Each peer's answer to the catch-up question, by name (those that gave one),
        and the names of the peers asked."""
        question = CatchupQuestion(self.me, epoch_number(self.in_force.config)).encode()
        reports: dict[str, Report] = {}

        async def ask(name: str) -> None:
            try:
                header, data = await self.peers.named(name).link.request(
                    Catchup().frame(len(question)),
                    [question],
                    timeout=self.in_force.config.failure_timeout + PEER_WORK,
                )
            except PeerError:
                return
            if header.status != Status.OK:
                return
            try:
                answer = CatchupAnswer.decode(data)
            except BadBody as exc:
                log.warning("%s: %s sent %s", self.me, name, exc)
                return
            reports[name] = Report(
                answer.ready, answer.held(), frozenset(answer.up), frozenset(answer.deleted)
            )
            # A daemon it hears and this one does not (yet): asked next round.
            heard_there.update(answer.up)

        names = (set(self.membership.up_peers()) | self.also_ask) & set(self.peers)
        heard_there: set[str] = set()
        async with trio.open_nursery() as nursery:
            for name in sorted(names):
                nursery.start_soon(ask, name)
        self.also_ask = heard_there - {self.me}
        return reports, names

    async def fetch(self, source: str, shards: list[ShardId]) -> None:
        """Have ``source`` send these shards whole (after what it queued for this daemon).
        Raises PeerError when it cannot or does not."""
        body = CopyRequest(self.me, tuple(shards), epoch_number(self.in_force.config)).encode()
        tensors = self.store.tensors
        total = sum(
            tensors[k].shards[s].nbytes
            for k, s in shards
            if k in tensors and s in tensors[k].shards
        )
        # At least the default shard size per shard (one not held here has no size).
        timeout = (
            self.in_force.config.failure_timeout
            + PEER_WORK
            + max(total, len(shards) * DEFAULT_SHARD_SIZE) / MODEST_RATE
        )
        self.asked.add(source)
        try:
            header, data = await self.peers.named(source).link.request(
                SyncRequest().frame(len(body)), [body], timeout=timeout
            )
        finally:
            self.asked.discard(source)
        if header.status != Status.OK:
            raise PeerError(f"{source}: {data.decode(errors='replace')}")

    async def give(self, primary: str, shards: list[ShardId]) -> None:
        """Send ``primary`` these shards whole: it serves them and lost its copies
        (``catchup_plan``). Raises PeerError when it did not take every one."""
        items = self.forwarding.send_whole(primary, shards)
        for item in items:
            await item.done.wait()
        if not all(item.delivered for item in items):
            raise PeerError(f"{primary} did not take the copies of shards it had lost")
        log.info(
            "%s: gave %s %d shard(s) it had lost (restarted without them)",
            self.me,
            primary,
            len(shards),
        )

    async def handoff(self) -> bool:
        """Tell every peer this daemon is ready; each first delivers what it queued for it.

        The pings say "ready", but this daemon acts on it (serves, takes
        primary role) only once every peer answered: until then the peers'
        drained queues still come from the primary they had. Whether every
        peer that is up answered (then this daemon is ready).
        """
        ok = True

        async def tell(name: str) -> None:
            nonlocal ok
            timeout = self.in_force.config.failure_timeout + PEER_WORK
            peer = self.peers.get(name)  # None: it left the cluster since
            if peer is None or not await self.heartbeats.ping(peer, timeout, handoff=True):
                ok = ok and not self.membership.up(name)

        with self.heartbeats.announcing():
            async with trio.open_nursery() as nursery:
                for name in self.membership.up_peers():
                    nursery.start_soon(tell, name)
        if not ok:
            return False
        self.membership.became_ready()
        return True
