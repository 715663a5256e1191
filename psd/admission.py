"""The gates a client's data request passes on a replicated daemon: current and in the
majority; the shard's acting primary for updates; not behind what the client saw."""

from __future__ import annotations

from irdma.cluster import ConfigInForce, Node
from irdma.protocol import Status

from .errors import Refusal
from .membership import Membership


class Admission:
    """Refuses (Refusal with a failover status) what this daemon must not serve now."""

    def __init__(self, in_force: ConfigInForce, node: Node, membership: Membership) -> None:
        self.in_force = in_force
        self.node = node
        self.membership = membership

    def check_ready(self) -> None:
        """Client data requests need a daemon that is current and in the majority."""
        m = self.membership
        if not m.replicated:
            return
        if not m.ready:
            raise Refusal(
                Status.RECOVERING,
                f"{self.node.name} is catching up from its replicas; ask another replica",
            )
        if not m.settled():
            raise Refusal(
                Status.RECOVERING,
                f"{self.node.name} is settling on a new cluster epoch; ask again shortly",
            )
        if not m.has_quorum():
            raise Refusal(
                Status.NO_QUORUM,
                f"{self.node.name} cannot reach a majority of the cluster "
                f"({self.in_force.config.quorum} of {len(self.in_force.config.nodes)} daemons)",
            )

    def check_primary(self, key: int, shard: int) -> None:
        """Updates are applied by the shard's acting primary only."""
        self.check_ready()
        if not self.membership.replicated:
            return
        primary = self.membership.acting_primary(key, shard)
        if primary is None or primary.name != self.node.name:
            where = primary.name if primary is not None else "none ready"
            raise Refusal(
                Status.NOT_OWNER,
                f"{self.node.name} is not the primary of shard {shard} (primary: {where})",
            )

    def behind(self, key: int, index: int, seen: int, have: int) -> bool:
        """True when this copy lacks an update the client saw acknowledged.

        The shard's acting primary is never behind: it applied every
        acknowledged update, so a client that saw more saw an older tensor
        of the same name (recreated since), and follows this one.
        """
        if seen <= have:
            return False
        primary = self.membership.acting_primary(key, index)
        return primary is None or primary.name != self.node.name

    def check_fresh(self, key: int, version: int, have: int, index: int) -> None:
        if self.behind(key, index, version, have):
            raise Refusal(
                Status.BEHIND,
                f"{self.node.name} has shard {index} at version {have}, the client saw "
                f"{version} acknowledged",
            )
