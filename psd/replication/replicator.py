"""The replicator: keeps a daemon's shards identical on their replicas, composed of the
package's roles (see ``psd/replication/__init__.py`` for which module holds which).

It builds the parts, runs their tasks (one heartbeat and one forwarding task
per peer, the membership tick, catching up whenever this daemon is not ready),
follows new epochs, and reacts when this daemon gives up being ready.
"""

from __future__ import annotations

import logging

import trio

from irdma.auth import cluster_secret
from irdma.cluster import ConfigInForce, Node
from irdma.cluster.epochs import Epoch

from ..membership import Membership, MembershipListener
from ..store import Store
from .catchup import CatchUp
from .catchup_service import CatchUpService
from .delivery import CopyCounts, Delivery
from .following import EpochFollower
from .forwarding import Forwarding
from .heartbeats import Heartbeats
from .lending import Borrower
from .links import Dialer
from .peers import Peer, Peers
from .vetting import Vetting, sender_id

log = logging.getLogger("psd")


class Replicator(MembershipListener):
    """Runs the heartbeats, the forward queues and the catch-up of one daemon.

    Its parts are public, for the request handlers that use them:
    ``forwarding`` (forward, wait, confirm), ``heartbeats`` (PING),
    ``service`` (CATCHUP, SYNC_REQUEST), ``vetting`` (REPLICA_UPDATE, SYNC),
    ``epochs`` (its hooks), ``catchup``.
    """

    def __init__(self, in_force: ConfigInForce, node: Node, store: Store) -> None:
        me = node.name
        self.in_force = in_force
        config = in_force.config
        self.node = node
        self.store = store
        self.membership = Membership(in_force, me)
        # Links to peers authenticate like clients do (``irdma.auth``).
        dialer = Dialer(me, cluster_secret(config), config.failure_timeout)
        self.peers = Peers(config.nodes, me, dialer)
        self.copies = CopyCounts()
        # Reads the bytes same-host primaries lend this daemon (``lending``).
        self.borrower = Borrower()
        delivery = Delivery(
            store,
            sender_id(config, me),
            config.failure_timeout,
            self.copies,
            lend=config.lend_forwards,
        )
        self.forwarding = Forwarding(
            me, self.membership, self.peers, delivery, retry_pause=config.heartbeat / 2
        )
        self.heartbeats = Heartbeats(in_force, me, self.membership, self.peers, self.forwarding)
        self.catchup = CatchUp(
            in_force, me, store, self.membership, self.peers, self.heartbeats, self.forwarding
        )
        self.vetting = Vetting(
            in_force, me, store, self.membership, self.peers, self.catchup.asked, self.copies
        )
        self.service = CatchUpService(
            in_force, me, store, self.membership, self.peers, self.forwarding
        )
        self.epochs = EpochFollower(
            in_force, me, store, self.membership, self.peers, self.heartbeats, self.catchup
        )
        self.membership.listen(self)
        self.membership.listen(self.forwarding)
        self.recovered = trio.Event()  # set the first time this daemon is ready
        # With etcd: set once the first epoch is adopted (catching up waits for it).
        self.adopted = trio.Event()
        self._lost = trio.Event()
        self._nursery: trio.Nursery | None = None

    @property
    def enabled(self) -> bool:
        return self.in_force.config.replicated

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeats, forward queues and catch-up, until cancelled."""
        if not self.enabled:
            self.recovered.set()
            task_status.started()
            await trio.sleep_forever()
        if self.in_force.config.etcd is None:
            self.adopted.set()
        async with trio.open_nursery() as nursery:
            self.serve_in(nursery)
            for peer in self.peers.values():
                nursery.start_soon(self._peer_tasks, peer)
            nursery.start_soon(self._tick)
            nursery.start_soon(self._recovery_loop)
            task_status.started()

    def serve_in(self, nursery: trio.Nursery | None) -> None:
        """Where the peers' connections and the epochs' work run (None: nowhere now)."""
        self._nursery = nursery
        self.peers.dialer.serve_in(nursery)

    async def _peer_tasks(self, peer: Peer) -> None:
        """Heartbeats and the forward queue of one peer, until it leaves the cluster."""
        with peer.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.heartbeats.run, peer)
                nursery.start_soon(self.forwarding.run, peer)

    async def _tick(self) -> None:
        while True:
            self.membership.observe()
            self.forwarding.let_go_of_down_peers()
            self.borrower.prune()  # a primary that exited: its arena's memory goes
            await trio.sleep(self.in_force.config.heartbeat / 2)

    async def _recovery_loop(self) -> None:
        await self.adopted.wait()  # with etcd: catching up needs the epoch's placement
        while True:
            await self.catchup.run()
            self.recovered.set()
            await self._lost.wait()
            self._lost = trio.Event()

    def membership_lost(self) -> None:
        """This daemon gave up being ready (``MembershipListener``)."""
        m = self.membership
        self.forwarding.lost()
        why = m.why_lost or (
            f"no contact with a majority for {m.grace:.1f} s"
            if not m.leased
            else "its etcd lease is not held"
        )
        log.warning("%s: %s; catching up before serving again", self.node.name, why)
        # Whatever was queued while primary is stale now: others may have
        # taken over. This daemon catches up instead. Forwards already written
        # to a peer's socket are dropped too (a reset, not a close): sent when
        # the path comes back, a backup could apply an update that was never
        # acknowledged and that this daemon's catch-up is about to undo.
        self.peers.cut_off(f"{self.node.name} gave up being ready: {why}")
        self._lost.set()

    def adopt(self, epoch: Epoch) -> None:
        """Follow a newer epoch: its daemons become the peers, its members place the
        shards; then (in the background) settle on it, drop copies no longer kept,
        and copy what this daemon gains in its target."""
        assert self._nursery is not None
        if not self.in_force.adopt(epoch):
            return
        for peer in self.peers.follow(self.in_force.config.nodes):
            self._nursery.start_soon(self._peer_tasks, peer)
        self.membership.follow_nodes()
        self.epochs.adopted()
        log.info(
            "%s: epoch %d: members %s%s",
            self.node.name,
            epoch.number,
            ", ".join(epoch.members),
            f"; moving to {', '.join(epoch.target)}" if epoch.target else "",
        )
        self.epochs.follow(epoch, self._nursery)
        self.adopted.set()
