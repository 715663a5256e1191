"""Epochs: the cluster's member list at one moment, and where shards live in it (no I/O).

With membership kept in etcd (issue 19's design, docs/architecture.md), every
change of the member list (a daemon joins, is drained, or its lease expires)
is a new epoch with a number one higher. Placement is a pure function of an
epoch: rendezvous (highest random weight) hashing of (tensor key, shard) over
the epoch's member names, the same rule as the static config's
(``irdma.cluster.rendezvous_order``), so a change moves only the shards
whose replica list it changes: adding a fourth daemon to three gives it about
a quarter of the shard copies and moves nothing else.

``plan_moves`` says, for the shards a daemon knows of, which copies an
epoch change creates (copied from a replica that holds the shard in the old
epoch) and which it makes redundant (dropped once the new epoch is in force).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from .cluster import rendezvous_rank


@dataclass(frozen=True, slots=True)
class Epoch:
    """Epoch ``number``: the daemons ``members`` (names), each shard on ``replicas`` of them."""

    number: int
    members: tuple[str, ...]
    replicas: int

    def __post_init__(self) -> None:
        if self.number < 1:
            raise ValueError(f"epoch numbers start at 1, not {self.number}")
        if len(set(self.members)) != len(self.members):
            raise ValueError(f"epoch {self.number}: a member is named twice: {self.members}")
        if not self.members:
            raise ValueError(f"epoch {self.number} has no members")
        if self.replicas < 1:
            raise ValueError(f"epoch {self.number}: replicas must be >= 1, not {self.replicas}")

    def replicas_for(self, key: int, shard: int) -> tuple[str, ...]:
        """The shard's replicas in preference order (the first is its primary), at most
        ``replicas`` of them (fewer while the epoch has fewer members)."""
        ranked = sorted(self.members, key=lambda n: rendezvous_rank(n, key, shard), reverse=True)
        return tuple(ranked[: self.replicas])

    def holds(self, name: str, key: int, shard: int) -> bool:
        return name in self.replicas_for(key, shard)

    def next(self, members: Iterable[str]) -> Epoch:
        """The epoch after this one, with ``members`` (kept in sorted order)."""
        return Epoch(self.number + 1, tuple(sorted(set(members))), self.replicas)

    def to_json(self) -> bytes:
        body = {"epoch": self.number, "members": list(self.members), "replicas": self.replicas}
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Epoch:
        """An epoch as stored; ValueError naming the problem if it is not one."""
        try:
            raw = json.loads(data)
            number, members, replicas = raw["epoch"], raw["members"], raw["replicas"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not an epoch record: {exc}") from None
        if not (
            isinstance(number, int)
            and isinstance(replicas, int)
            and isinstance(members, list)
            and all(isinstance(m, str) and m for m in members)
        ):
            raise ValueError(f"not an epoch record: {raw!r}")
        return cls(number, tuple(members), replicas)


@dataclass(frozen=True, slots=True)
class Move:
    """What an epoch change does to one shard's copies."""

    key: int
    shard: int
    sources: tuple[str, ...]  # its replicas in the old epoch (copies come from these)
    gaining: tuple[str, ...]  # replicas of the new epoch without a copy in the old one
    losing: tuple[str, ...]  # replicas of the old epoch not in the new one


def plan_moves(old: Epoch, new: Epoch, shards: Iterable[tuple[int, int]]) -> list[Move]:
    """The shards (of ``shards``: (key, index) pairs) whose replica set changes from
    ``old`` to ``new``, with the copies to make and to drop; unchanged ones are left out.
    A shard whose old replicas are all gone from ``new`` still names them as sources
    (a drained daemon serves its copies until the switch)."""
    out = []
    for key, shard in shards:
        before, after = old.replicas_for(key, shard), new.replicas_for(key, shard)
        if set(before) == set(after):
            continue
        gaining = tuple(n for n in after if n not in before)
        losing = tuple(n for n in before if n not in after)
        out.append(Move(key, shard, before, gaining, losing))
    return out


def copies_moved(moves: Iterable[Move], shards: int, replicas: int) -> float:
    """The fraction of all shard copies an epoch change creates anew (0..1)."""
    total = shards * replicas
    return sum(len(m.gaining) for m in moves) / total if total else 0.0
