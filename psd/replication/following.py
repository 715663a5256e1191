"""Following epochs (with etcd, ``irdma.cluster.epochs``) once one is adopted: settle on it, let
go of the peers and the copies it left out, and copy what this daemon gains in its
target.

While an epoch names a target member list, updates are also forwarded to the
daemons that gain a shard in it (``Membership.backups``), and each of them
copies what it gains from the shard's acting primary (``gain``), then says so
in etcd (``on_gained``); once all have, the steward switches the epoch. After
a switch, once settled, a daemon drops the copies it no longer keeps.
"""

from __future__ import annotations

import logging

import trio

from irdma.cluster import ConfigInForce
from irdma.cluster.epochs import Epoch

from ..membership import Membership
from ..store import Store
from .catchup import RETRY_PAUSE, CatchUp, drop_unkept
from .heartbeats import Heartbeats
from .peers import Peers

log = logging.getLogger("psd")


class EpochListener:
    """A part of the daemon told of epochs (``EpochFollower.listen``); each method does
    nothing unless overridden."""

    def epoch_adopted(self) -> None:
        """A newer epoch is in force here."""

    async def epoch_gained(self, number: int) -> None:
        """This daemon has its copies of epoch ``number``'s target."""


class EpochFollower:
    """The work that follows adopting an epoch, one epoch at a time."""

    def __init__(
        self,
        in_force: ConfigInForce,
        me: str,
        store: Store,
        membership: Membership,
        peers: Peers,
        heartbeats: Heartbeats,
        catchup: CatchUp,
    ) -> None:
        self.in_force = in_force
        self.me = me
        self.store = store
        self.membership = membership
        self.peers = peers
        self.heartbeats = heartbeats
        self.catchup = catchup
        # Told of each epoch adopted (the server: its directory says at once what it
        # serves) and gained (presence: etcd hears this daemon has its copies).
        self._listeners: list[EpochListener] = []
        self._work = trio.CancelScope()

    def listen(self, listener: EpochListener) -> None:
        """Tell ``listener`` of every epoch adopted and gained from now on."""
        self._listeners.append(listener)

    def adopted(self) -> None:
        """A newer epoch is in force here (its copies may not be dropped yet)."""
        for listener in self._listeners:
            listener.epoch_adopted()

    def follow(self, epoch: Epoch, nursery: trio.Nursery) -> None:
        """Start following ``epoch`` (just adopted), ending the work for the one before."""
        self._work.cancel()
        self._work = trio.CancelScope()
        nursery.start_soon(self._follow, epoch, self._work)

    async def _follow(self, epoch: Epoch, scope: trio.CancelScope) -> None:
        with scope:
            await self._settle(epoch)
            for name in self.membership.forget_leavers():
                self.peers.part(name)
            drop_unkept(self.in_force.config, self.store, self.me)
            self.adopted()  # serving again (one-sided readers too), without those copies
            if epoch.target is not None and self.me in epoch.target:
                await self._gain(epoch)
                for listener in self._listeners:
                    await listener.epoch_gained(epoch.number)

    async def _settle(self, epoch: Epoch) -> None:
        """Tell every peer of the new epoch now, and wait until all registered ones
        report it (``Membership.settled``)."""
        async with trio.open_nursery() as nursery:
            for peer in list(self.peers.values()):
                nursery.start_soon(self.heartbeats.ping, peer)
        while not self.membership.settled():
            await trio.sleep(self.in_force.config.heartbeat / 4)
        log.info("%s: settled on epoch %d", self.me, epoch.number)

    async def _gain(self, epoch: Epoch) -> None:
        """Copy every shard this daemon gains in ``epoch``'s target from its acting
        primary (which forwards every update to it from now on)."""
        me = self.me

        def gains(key: int, index: int) -> bool:
            return not any(n.name == me for n in self.in_force.config.replicas_for(key, index))

        while True:
            if self.membership.ready and self.membership.settled():
                done = await self.catchup.copy_planned(gains, f"copying for epoch {epoch.number}")
                if done is not None:
                    break
            await trio.sleep(RETRY_PAUSE)
        log.info("%s: has its copies for epoch %d (%d copied)", me, epoch.number, done.copies)
