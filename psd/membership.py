"""Which daemons this one believes are up and ready, from heartbeats (no I/O here).

The rules that keep replicas from diverging, all local to one daemon:

- A peer is *up* while it was heard from (a heartbeat, its answer, or any
  replication message) within ``failure_timeout``.
- This daemon has *quorum* while it heard from a majority of the cluster
  (itself included) within half of ``failure_timeout``. Peers declare it down
  only after the full ``failure_timeout``, so a daemon cut off from the
  majority stops accepting updates before another replica takes its shards
  over.
- A daemon that went longer than ``failure_timeout - heartbeat`` without
  hearing a majority (cut off by a partition, stopped with SIGSTOP, or just started) may
  have been declared down, and others may have applied updates it missed. It
  is *not ready* until it has caught up from its replicas; until then it
  serves no client reads or updates.
- The *acting primary* of a shard is the first of its replicas (in placement
  order) that is up and ready.

With one copy per shard (``replicas = 1``) none of this applies: the daemon
is always ready and the only holder of its shards.

**With etcd** (``[etcd]`` in the config) liveness comes from leases instead
of heartbeats: a peer is up while its registration (under its lease) is in
etcd, and this daemon may accept updates while it holds its own lease,
counted locally to a deadline that falls before etcd can expire it
(``irdma.cluster.registry``). No majority of daemons is needed: etcd's is. Pings
still carry whether a peer is ready (caught up). A daemon that loses its
lease is not ready until it has registered again and caught up.

**Epochs** (with etcd): the member list changes (``irdma.cluster.epochs``). A daemon
that adopts a new epoch is *settled* once every registered peer of it
reported that epoch or a later one: until then it serves no client
requests, so no daemon acts under one epoch while another still acts under
the one before (an old primary would accept updates beside the new one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from irdma.cluster import ConfigInForce, Node

log = logging.getLogger("psd")


@dataclass(slots=True)
class PeerState:
    last_heard: float | None = None
    ready: bool = False
    # (boot, seq) of the newest state the peer reported: a heartbeat built
    # before a newer one but delivered after it must not undo it.
    stamp: tuple[int, int] | None = None
    epoch: int = 0  # the newest epoch number it reported (with etcd)


class MembershipListener:
    """A part of the daemon told of membership changes (``Membership.listen``); each
    method does nothing unless overridden, and is called with no await since the
    change."""

    def membership_lost(self) -> None:
        """This daemon gave up being ready (``Membership.why_lost`` may say why)."""

    def peers_changed(self) -> None:
        """A peer came up or went down, changed readiness, or the registered set changed."""

    def became_ready(self) -> None:
        """This daemon caught up and serves."""


class Membership:
    """This daemon's view of the cluster."""

    def __init__(
        self, in_force: ConfigInForce, me: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.in_force = in_force
        config = in_force.config
        self.me = me
        self.clock = clock
        self.replicated = config.replicated
        self.peers = {n.name: PeerState() for n in config.nodes if n.name != me}
        self.ready = not self.replicated
        self.lease = config.failure_timeout / 2
        # Longest time without quorum before this daemon assumes it was
        # declared down (it last spoke to peers up to a heartbeat earlier).
        self.grace = config.failure_timeout - config.heartbeat
        self._last_quorum = clock()
        # Why, when ``lose`` was the cause (read by listeners told ``lost``; "" otherwise).
        self.why_lost = ""
        # The parts told of changes (``listen``).
        self._listeners: list[MembershipListener] = []
        # With etcd: the names registered there now, and whether this daemon holds
        # its own lease (``psd.presence`` keeps both); None: heartbeats decide.
        self.leased = config.etcd is not None
        self.registered: frozenset[str] = frozenset()
        # Until when (this object's clock) this daemon surely holds its lease; checked
        # against the clock at every decision, so a daemon resumed after a pause
        # longer than its lease refuses before any task has noticed.
        self.lease_until = float("-inf")

    def listen(self, listener: MembershipListener) -> None:
        """Tell ``listener`` of every change from now on (synchronously, no await since)."""
        self._listeners.append(listener)

    def _lost(self) -> None:
        for listener in self._listeners:
            listener.membership_lost()

    def _changed(self) -> None:
        for listener in self._listeners:
            listener.peers_changed()

    def _ready(self) -> None:
        for listener in self._listeners:
            listener.became_ready()

    # -- observations -------------------------------------------------------

    def observe(self, now: float | None = None) -> None:
        """Check for lost quorum; called on every heartbeat tick and before every decision.

        Called before any new heartbeat is recorded, so a daemon resumed after
        SIGSTOP notices the gap before the first message after it counts.
        """
        if not self.replicated:
            return
        if self.leased:
            now = self.clock() if now is None else now
            if now >= self.lease_until and self.ready:
                self.ready = False
                self.why_lost = ""
                self._lost()
            return
        now = self.clock() if now is None else now
        # Counted from when a majority was last *heard*, not from when the lease last
        # held (up to ``lease`` later): peers declare this daemon down
        # ``failure_timeout`` after they last heard it, so it must give up being ready
        # within ``grace`` of its own last contact, or a daemon healed in between comes
        # back as a ready primary beside the replica that took its shards over.
        heard = self._majority_heard(now)
        if heard is not None and heard > self._last_quorum:
            self._last_quorum = heard
        if now - self._last_quorum > self.grace and self.ready:
            self.ready = False
            self.why_lost = ""
            self._lost()

    def heard(
        self,
        peer: str,
        ready: bool | None = None,
        now: float | None = None,
        stamp: tuple[int, int] | None = None,
        epoch: int | None = None,
    ) -> bool:
        """A message from ``peer`` arrived (``ready``: the state it reported, if any).

        ``stamp`` is (boot, seq) of that report: within one run of the peer
        (same boot) a report older than one already seen is not believed.
        Whether the report is believed (False: stale, or not from a peer).
        """
        state = self.peers.get(peer)
        if state is None:
            return False
        now = self.clock() if now is None else now
        self.observe(now)
        was_up = self.up(peer, now)
        was_ready = state.ready
        state.last_heard = now
        stale = (
            stamp is not None
            and state.stamp is not None
            and stamp[0] == state.stamp[0]
            and stamp[1] < state.stamp[1]
        )
        if stale:
            ready = None  # built before a report already seen
        elif epoch is not None:
            state.epoch = max(state.epoch, epoch)
        if ready is not None:
            state.ready = ready
            if stamp is not None:
                state.stamp = stamp
        elif not was_up:
            state.ready = False  # back from down: not serving until it says so
        if was_ready != state.ready:
            log.info("%s: sees %s %s", self.me, peer, "ready" if state.ready else "not ready")
        if not was_up or was_ready != state.ready:
            self._changed()
        self.observe(now)
        return not stale

    # -- etcd (``psd.presence``) ------------------------------------------------

    def saw_registered(self, names: frozenset[str]) -> None:
        """The member names registered in etcd now (their leases alive)."""
        if names != self.registered:
            self.registered = names
            self._changed()

    def follow_nodes(self) -> None:
        """The config's nodes changed (a new epoch): its new daemons become peers. Those
        it left out stay peers until this daemon settled on it (``forget_leavers``): they
        too must have adopted it, or they could still serve under the one before."""
        for n in self.in_force.config.nodes:
            if n.name != self.me and n.name not in self.peers:
                self.peers[n.name] = PeerState()
        self._changed()

    def forget_leavers(self) -> list[str]:
        """Stop counting the peers the epoch in force left out; return their names."""
        names = {n.name for n in self.in_force.config.nodes}
        gone = [p for p in self.peers if p not in names]
        for name in gone:
            del self.peers[name]
        if gone:
            self._changed()
        return gone

    def settled(self) -> bool:
        """Whether every registered peer reported this daemon's epoch or a later one
        (always, without etcd); see the module's notes on epochs."""
        if not self.leased:
            return True
        epoch = self.in_force.config.epoch
        if epoch is None:
            return False
        return all(
            state.epoch >= epoch.number
            for name, state in self.peers.items()
            if name in self.registered
        )

    def lose(self, why: str = "") -> None:
        """This daemon's copies may be stale (a peer refused what it forwarded as
        primary, or its primary went on without it): not ready until it has caught
        up again."""
        if self.ready:
            self.ready = False
            self.why_lost = why
            self._lost()

    def holds_lease_until(self, until: float) -> None:
        """This daemon holds its lease until ``until`` (this object's clock, i.e.
        ``time.monotonic``); a time already past means it lost it (no longer ready)."""
        self.lease_until = until
        self.observe()

    def became_ready(self) -> None:
        self.ready = True
        self._last_quorum = self.clock()
        self._ready()

    # -- questions ------------------------------------------------------------

    def up(self, name: str, now: float | None = None) -> bool:
        if name == self.me:
            return True
        if self.leased:
            return name in self.registered and name in self.peers
        state = self.peers.get(name)
        if state is None or state.last_heard is None:
            return False
        now = self.clock() if now is None else now
        return now - state.last_heard < self.in_force.config.failure_timeout

    def peer_ready(self, name: str, now: float | None = None) -> bool:
        if name == self.me:
            return self.ready
        return self.up(name, now) and self.peers[name].ready

    def _majority_heard(self, now: float) -> float | None:
        """When this daemon last heard from a majority of the cluster (itself included):
        the time of its ``quorum - 1``-th most recent peer contact; None if never."""
        need = self.in_force.config.quorum - 1
        times = sorted((s.last_heard for s in self.peers.values() if s.last_heard is not None),
                       reverse=True)  # fmt: skip
        if need <= 0:
            return now
        return times[need - 1] if len(times) >= need else None

    def _has_quorum(self, now: float) -> bool:
        heard = 1 + sum(
            1
            for s in self.peers.values()
            if s.last_heard is not None and now - s.last_heard < self.lease
        )
        return heard >= self.in_force.config.quorum

    def has_quorum(self, now: float | None = None) -> bool:
        """Whether this daemon may accept updates (always, with one copy per shard)."""
        if not self.replicated:
            return True
        now = self.clock() if now is None else now
        self.observe(now)
        if self.leased:
            return now < self.lease_until
        return self._has_quorum(now)

    def acting_primary(self, key: int, shard: int, now: float | None = None) -> Node | None:
        """The replica that applies updates to the shard now, as this daemon sees it."""
        now = self.clock() if now is None else now
        for node in self.in_force.config.replicas_for(key, shard):
            if self.peer_ready(node.name, now):
                return node
        return None

    def backups(self, key: int, shard: int, now: float | None = None) -> list[str]:
        """The shard's other copies that are up (ready or catching up, and those that
        gain it in a move under way): updates go to them."""
        now = self.clock() if now is None else now
        return [
            n.name
            for n in self.in_force.config.copies_for(key, shard)
            if n.name != self.me and self.up(n.name, now)
        ]

    def down_copies(self, key: int, shard: int, now: float | None = None) -> list[str]:
        """The shard's other copies that are down (they miss its updates)."""
        now = self.clock() if now is None else now
        return [
            n.name
            for n in self.in_force.config.copies_for(key, shard)
            if n.name != self.me and not self.up(n.name, now)
        ]

    def up_peers(self, now: float | None = None) -> list[str]:
        now = self.clock() if now is None else now
        return [p for p in self.peers if self.up(p, now)]

    def describe(self, now: float | None = None) -> dict[str, str]:
        """Each node's state as seen from here: ready, catching-up or down."""
        now = self.clock() if now is None else now
        out = {self.me: "ready" if self.ready else "catching-up"}
        for p in self.peers:
            if not self.up(p, now):
                out[p] = "down"
            else:
                out[p] = "ready" if self.peers[p].ready else "catching-up"
        return out
