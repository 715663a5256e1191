"""The steward: the one daemon that proposes the cluster's next epoch (with etcd).

Any daemon could compute the next epoch (``irdma.cluster.epochs.next_epoch`` is a
pure rule over what etcd holds); one proposes it, so moves do not start and
stop as views differ by a few milliseconds: the registered member with the
lowest name that is ready and settled on the epoch in force. Two daemons
that both believe they are it (their watches differ for a moment) cannot
both change the epoch: a proposal is a compare-and-swap on the epoch
record's revision.

Before the first epoch exists any daemon may propose it: the ``[[nodes]]``
of its config, as they are written there.
"""

from __future__ import annotations

import logging
import time

from irdma.cluster import ConfigInForce, Node
from irdma.cluster.epochs import ClusterView, Epoch, next_epoch
from irdma.cluster.registry import ClusterState, Registry

from .membership import Membership

log = logging.getLogger("psd")


class Steward:
    """Decides and proposes epochs for one daemon, when it is the steward."""

    def __init__(
        self,
        in_force: ConfigInForce,
        node: Node,
        registry: Registry,
        membership: Membership,
        clock=time.monotonic,
    ) -> None:
        self.in_force = in_force
        config = in_force.config
        assert config.etcd is not None
        self.node = node
        self.registry = registry
        self.membership = membership
        self.clock = clock
        self.replace_after = config.etcd.replace_after
        # Since when (this daemon's clock) each member of the epoch is unregistered.
        self.absent_since: dict[str, float] = {}

    def observe(self, state: ClusterState) -> None:
        """Note which members are unregistered now (called on every change seen)."""
        now = self.clock()
        members = set(state.epoch.names) if state.epoch is not None else set()
        for name in members - set(state.members):
            self.absent_since.setdefault(name, now)
        for name in list(self.absent_since):
            if name in state.members or name not in members:
                del self.absent_since[name]

    def is_steward(self, state: ClusterState) -> bool:
        epoch = state.epoch
        if (
            epoch is None
            or self.in_force.config.epoch is None
            or self.in_force.config.epoch.number != epoch.number
        ):
            return False
        present = [n for n in epoch.members if n in state.members]
        return (
            bool(present)
            and min(present) == self.node.name
            and self.membership.ready
            and self.membership.settled()
        )

    def proposal(self, state: ClusterState) -> Epoch | None:
        """The epoch this daemon would propose now, if any."""
        if state.epoch is None:
            return self.first_epoch()
        if not self.is_steward(state):
            return None
        now = self.clock()
        view = ClusterView(
            registered={name: r.address for name, r in state.members.items()},
            drained=frozenset(state.drained),
            absent={name: now - since for name, since in self.absent_since.items()},
            gained=dict(state.gained),
        )
        return next_epoch(state.epoch, view, self.replace_after)

    def first_epoch(self) -> Epoch:
        nodes = sorted(self.in_force.config.nodes, key=lambda n: n.name)
        return Epoch(
            1,
            tuple(n.name for n in nodes),
            self.in_force.config.replicas,
            None,
            tuple((n.name, str(n.address)) for n in nodes),
        )

    async def step(self, state: ClusterState) -> None:
        """Propose the next epoch if there should be one (EtcdError if etcd fails)."""
        epoch = self.proposal(state)
        if epoch is None:
            return
        if await self.registry.propose(epoch, state.epoch_revision):
            what = (
                f"moving to {', '.join(epoch.target)}"
                if epoch.target
                else f"members {', '.join(epoch.members)}"
            )
            log.info("%s: proposed epoch %d: %s", self.node.name, epoch.number, what)
