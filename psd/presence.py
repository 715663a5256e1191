"""A daemon's registration in etcd, and who else is registered (``[etcd]`` configs).

The daemon registers its member record under a lease and renews it
(``irdma.registry``); a watch of the members' prefix tells ``Membership`` who
is up. If the lease is lost (etcd said so, or no renewal came back before
the local deadline), the daemon stops accepting updates at once, registers
again under a new lease and catches up like a restarted daemon. A name still
held by an earlier lease (this daemon killed and restarted within the TTL)
is waited for: that lease expires by itself.
"""

from __future__ import annotations

import logging
import time

import trio

from irdma.cluster import ClusterConfig, Node
from irdma.etcd import EtcdError, Lease
from irdma.registry import MemberRecord, Registry

from .membership import Membership

log = logging.getLogger("psd")

# Pause between attempts to reach etcd or to take a name still held.
RETRY = 0.25


class Presence:
    """Keeps ``node`` registered in etcd and ``membership`` told who is."""

    def __init__(self, config: ClusterConfig, node: Node, membership: Membership) -> None:
        assert config.etcd is not None
        self.config = config
        self.settings = config.etcd
        self.node = node
        self.membership = membership
        self.registry = Registry.of(config.etcd, config.timeout)
        self.names = {n.name for n in config.nodes}

    def record(self) -> MemberRecord:
        n = self.node
        metrics = str(n.metrics_address) if n.metrics_address is not None else None
        return MemberRecord(n.name, str(n.address), n.arena_size, metrics)

    async def run(self) -> None:
        """Register, renew and watch until cancelled; register again after a loss."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch)
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
        """Keep ``membership.registered`` equal to the members in etcd (of this config)."""
        while True:
            try:
                members, revision = await self.registry.members()
                present = set(members) & self.names
                self.membership.saw_registered(frozenset(present))
                async with self.registry.etcd.watch(
                    self.registry.members_prefix, revision + 1
                ) as changes:
                    async for events in changes:
                        for e in events:
                            name = e.kv.key[len(self.registry.members_prefix) :].decode()
                            if name not in self.names:
                                continue
                            if e.kind == "put":
                                present.add(name)
                            else:
                                present.discard(name)
                        self.membership.saw_registered(frozenset(present))
            except EtcdError as exc:
                log.info("%s: watching etcd's members: %s; again", self.node.name, exc)
                await trio.sleep(RETRY)
