"""Shard placement: which daemons hold a shard (pure; no I/O, no config file).

Placement is rendezvous (highest random weight) hashing of (tensor key,
shard index) over the node names, so every client and daemon computes the
same replica list without a lookup service (the versions of a model's tensor
share their placement), and a change of members moves
only the shards whose replica list it changes. The static config places
over its ``[[nodes]]``; an epoch (``irdma.cluster.epochs``) over its members.
"""

from __future__ import annotations

import hashlib
from typing import Generic, Protocol, TypeVar

from ..protocol.frame import placement_key


class Named(Protocol):
    """What placement needs of a node: its name (the config's ``Node``)."""

    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)

# Placement is pure but costs a hash per node; this many recent answers are kept.
PLACEMENT_CACHE = 1 << 16


def rendezvous_weight(node_name: str, key: int, shard: int) -> int:
    """A node's weight for (key, shard): the highest weights hold the shard (a model
    version's tensor weighs by its group's key: ``protocol.frame.placement_key``)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(node_name.encode())
    h.update(placement_key(key).to_bytes(8, "little"))
    h.update(shard.to_bytes(8, "little"))
    return int.from_bytes(h.digest(), "little")


def rendezvous_rank(name: str, key: int, shard: int) -> tuple[int, str]:
    """What orders a node for (key, shard), highest first: its weight, then its name."""
    return rendezvous_weight(name, key, shard), name


def rendezvous_order(nodes: tuple[N, ...], key: int, shard: int) -> list[N]:
    """All nodes ordered by rendezvous weight for (key, shard), highest first."""
    return sorted(nodes, key=lambda n: rendezvous_rank(n.name, key, shard), reverse=True)


class Placement(Generic[N]):
    """Where each shard's copies live among ``members`` (and, while a move is
    under way, among ``target``), ``replicas`` copies each. Its answers never
    change; a new member list is a new ``Placement``."""

    def __init__(self, members: tuple[N, ...], replicas: int, target: tuple[N, ...] = ()) -> None:
        self.members = members
        self.target = target
        self.replicas = replicas
        self._now: dict[tuple[int, int], tuple[N, ...]] = {}
        self._moving: dict[tuple[int, int], tuple[N, ...]] = {}

    def replicas_for(self, key: int, shard: int) -> tuple[N, ...]:
        """The shard's replicas in preference order (first is the primary)."""
        return self._placed(self._now, self.members, key, shard)

    def target_replicas_for(self, key: int, shard: int) -> tuple[N, ...]:
        """The shard's replicas in the target of a move under way (none without one)."""
        if not self.target:
            return ()
        return self._placed(self._moving, self.target, key, shard)

    def copies_for(self, key: int, shard: int) -> tuple[N, ...]:
        """Every daemon that keeps a copy of the shard: its replicas, then those that
        gain it in a move under way (updates are forwarded to all of them)."""
        now = self.replicas_for(key, shard)
        if not self.target:
            return now  # no move under way (every forward asks: kept cheap)
        return now + tuple(n for n in self.target_replicas_for(key, shard) if n not in now)

    def _placed(
        self,
        cache: dict[tuple[int, int], tuple[N, ...]],
        nodes: tuple[N, ...],
        key: int,
        shard: int,
    ) -> tuple[N, ...]:
        found = cache.get((key, shard))
        if found is None:
            if len(cache) >= PLACEMENT_CACHE:
                cache.clear()
            found = tuple(rendezvous_order(nodes, key, shard)[: self.replicas])
            cache[(key, shard)] = found
        return found
