"""A daemon's registration in etcd, and who else is registered (``[etcd]`` configs).

The daemon registers its member record under a lease and renews it
(``irdma.cluster.registry``); a watch of the cluster's prefix tells ``Membership`` who
is up, hands every new epoch to the ``Replicator`` and wakes the
``Steward``. If the lease is lost (etcd said so, or no renewal came back
before the local deadline), the daemon stops accepting updates at once, registers
again under a new lease and catches up like a restarted daemon. A name still
held by an earlier lease (this daemon killed and restarted within the TTL)
is waited for: that lease expires by itself.
"""

from __future__ import annotations

import logging
import time

import trio

from irdma.cluster import ConfigInForce, Node
from irdma.cluster.etcd import EtcdError, Lease
from irdma.cluster.registry import ClusterState, MemberRecord, Registry

from .replication import Replicator
from .replication.following import EpochListener
from .steward import Steward

log = logging.getLogger("psd")

# Pause between attempts to reach etcd or to take a name still held.
RETRY = 0.25


class Presence(EpochListener):
    """Keeps ``node`` registered in etcd and ``membership`` told who is."""

    def __init__(self, in_force: ConfigInForce, node: Node, replicator: Replicator) -> None:
        self.in_force = in_force
        config = in_force.config
        assert config.etcd is not None
        self.settings = config.etcd
        self.node = node
        self.replicator = replicator
        self.membership = replicator.membership
        self.registry = Registry.of(config.etcd, config.timeout)
        self.steward = Steward(in_force, node, self.registry, self.membership)
        self.state: ClusterState | None = None
        self._wake = trio.Event()
        replicator.epochs.listen(self)

    def record(self) -> MemberRecord:
        n = self.node
        metrics = str(n.metrics_address) if n.metrics_address is not None else None
        return MemberRecord(n.name, str(n.address), n.arena_size, metrics)

    async def run(self) -> None:
        """Register, renew and watch until cancelled; register again after a loss."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch)
            nursery.start_soon(self._stewarding)
            while True:
                lease, asked = await self._register()
                lost = trio.Event()
                why: list[str] = []

                def on_lost(reason: str, why: list[str] = why, lost: trio.Event = lost) -> None:
                    why.append(reason)
                    lost.set()

                self.membership.holds_lease_until(asked + lease.ttl)
                log.info(
                    "%s: registered in etcd (lease %x, %d s)", self.node.name, lease.id, lease.ttl
                )
                try:
                    async with trio.open_nursery() as renewing:
                        renewing.start_soon(
                            self.registry.keep_alive,
                            lease,
                            on_lost,
                            self.membership.holds_lease_until,
                        )
                        await lost.wait()
                        renewing.cancel_scope.cancel()
                finally:
                    self.membership.holds_lease_until(float("-inf"))
                    if not lost.is_set():  # stopping: leave now rather than after the TTL
                        with trio.move_on_after(1.0, shield=True):
                            await self._leave(lease)
                log.warning(
                    "%s: %s; not serving until registered again and caught up",
                    self.node.name,
                    why[0],
                )

    async def _leave(self, lease: Lease) -> None:
        try:
            await self.registry.leave(lease)
        except EtcdError as exc:
            log.info("%s: leaving etcd: %s (the lease expires by itself)", self.node.name, exc)

    async def _register(self) -> tuple[Lease, float]:
        """A lease holding this daemon's registration, and a time (``time.monotonic``)
        no later than etcd granted it: the lease runs from then."""
        announced = False
        while True:
            asked = time.monotonic()
            try:
                return await self.registry.register(self.record(), self.settings.lease_ttl), asked
            except EtcdError as exc:
                if not announced:
                    log.info("%s: not registered in etcd yet: %s", self.node.name, exc)
                    announced = True
            await trio.sleep(RETRY)

    async def _watch(self) -> None:
        """Keep ``state`` equal to what etcd holds for the cluster, and act on it."""
        while True:
            try:
                self.state = await self.registry.state()
                self._changed(self.state)
                async with self.registry.etcd.watch(
                    self.registry.prefix + b"/", self.state.revision + 1
                ) as changes:
                    async for events in changes:
                        for e in events:
                            self.state.apply(self.registry, e.kv, deleted=e.kind == "delete")
                        self._changed(self.state)
            except EtcdError as exc:
                log.info("%s: watching etcd: %s; again", self.node.name, exc)
                await trio.sleep(RETRY)

    def _changed(self, state: ClusterState) -> None:
        self.membership.saw_registered(frozenset(state.members))
        if state.epoch is not None:
            self.replicator.adopt(state.epoch)
        self.steward.observe(state)
        self._wake.set()

    async def _stewarding(self) -> None:
        """Propose the next epoch whenever one is due (``psd.steward``); checked on
        every change seen, and every ``RETRY`` for the time members stay away."""
        while True:
            with trio.move_on_after(RETRY):
                await self._wake.wait()
            self._wake = trio.Event()
            if self.state is None:
                continue
            try:
                await self.steward.step(self.state)
            except EtcdError as exc:
                log.info("%s: proposing an epoch: %s; again", self.node.name, exc)

    async def epoch_gained(self, number: int) -> None:
        """Tell etcd this daemon has its copies for epoch ``number``'s target."""
        while True:
            try:
                await self.registry.say_gained(self.node.name, number)
                return
            except EtcdError as exc:
                log.info("%s: saying it has its copies: %s; again", self.node.name, exc)
                await trio.sleep(RETRY)
