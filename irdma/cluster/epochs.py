"""Epochs: the cluster's member list at one moment, and where shards live in it (no I/O).

With membership kept in etcd (issue 19's design, docs/architecture.md), every
change of the member list (a daemon joins, is drained, or its lease expires)
is a new epoch with a number one higher. Placement is a pure function of an
epoch: rendezvous (highest random weight) hashing of (tensor key, shard) over
the epoch's member names, the same rule as the static config's
(``irdma.cluster.placement.rendezvous_order``), so a change moves only the shards
whose replica list it changes: adding a fourth daemon to three gives it about
a quarter of the shard copies and moves nothing else.

A change of members happens in two epochs, copy then switch: the first keeps
the members and names the ``target`` list; the daemons that gain copies in
it copy them from the current replicas (which forward every new update to
them meanwhile), and once every one of them has, the next epoch makes the
target the members. ``next_epoch`` is the one rule that decides which epoch
comes next (the steward daemon proposes it, ``psd.steward``).

``plan_moves`` says, for the shards a daemon knows of, which copies an
epoch change creates (copied from a replica that holds the shard in the old
epoch) and which it makes redundant (dropped once the new epoch is in force).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from .placement import rendezvous_rank

# Requests carry an epoch's number in 16 bits (``epoch_tag``); 0 is "not routed
# by an epoch" (static configs), so tags run 1..65535 and wrap.
EPOCH_TAGS = 0xFFFF


def epoch_tag(number: int) -> int:
    """The 16-bit tag a request routed with epoch ``number`` carries (never 0)."""
    return (number - 1) % EPOCH_TAGS + 1


@dataclass(frozen=True, slots=True)
class Epoch:
    """Epoch ``number``: the daemons ``members`` (names), each shard on ``replicas`` of
    them; while ``target`` is set, the member list being moved to (copies under way).
    ``addresses`` are the (name, address) of every member and target daemon, so a
    client needs nothing but this record to route."""

    number: int
    members: tuple[str, ...]
    replicas: int
    target: tuple[str, ...] | None = None
    addresses: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.number < 1:
            raise ValueError(f"epoch numbers start at 1, not {self.number}")
        for names in (self.members, self.target or ()):
            if len(set(names)) != len(names):
                raise ValueError(f"epoch {self.number}: a member is named twice: {names}")
        if not self.members or self.target == ():
            raise ValueError(f"epoch {self.number} has no members")
        if self.replicas < 1:
            raise ValueError(f"epoch {self.number}: replicas must be >= 1, not {self.replicas}")

    @property
    def names(self) -> tuple[str, ...]:
        """Members, then target daemons that are not members yet."""
        return self.members + tuple(n for n in self.target or () if n not in self.members)

    def address_of(self, name: str) -> str | None:
        return dict(self.addresses).get(name)

    def replicas_for(self, key: int, shard: int) -> tuple[str, ...]:
        """The shard's replicas in preference order (the first is its primary), at most
        ``replicas`` of them (fewer while the epoch has fewer members)."""
        return _ranked(self.members, key, shard)[: self.replicas]

    def target_replicas_for(self, key: int, shard: int) -> tuple[str, ...]:
        """The shard's replicas in the target member list (none without a target)."""
        if self.target is None:
            return ()
        return _ranked(self.target, key, shard)[: self.replicas]

    def holds(self, name: str, key: int, shard: int) -> bool:
        """Whether ``name`` keeps a copy: a replica now, or one in the target."""
        return name in self.replicas_for(key, shard) or name in self.target_replicas_for(key, shard)

    def next(self, members: Iterable[str]) -> Epoch:
        """The epoch after this one, with ``members`` (kept in sorted order)."""
        return Epoch(self.number + 1, tuple(sorted(set(members))), self.replicas)

    def moving_to(self, target: Iterable[str], addresses: Mapping[str, str]) -> Epoch:
        """The next epoch: the same members, copying towards ``target`` (the same
        members again: no move, the target is dropped)."""
        names = tuple(sorted(set(target)))
        known = dict(self.addresses) | dict(addresses)
        moving = None if set(names) == set(self.members) else names
        keep = set(self.members) | set(moving or ())
        return replace(
            self,
            number=self.number + 1,
            target=moving,
            addresses=tuple(sorted((n, a) for n, a in known.items() if n in keep)),
        )

    def switched(self) -> Epoch:
        """The next epoch: the target becomes the members."""
        assert self.target is not None
        keep = set(self.target)
        return Epoch(
            self.number + 1,
            self.target,
            self.replicas,
            None,
            tuple((n, a) for n, a in self.addresses if n in keep),
        )

    def to_json(self) -> bytes:
        body = {
            "epoch": self.number,
            "members": list(self.members),
            "replicas": self.replicas,
            "target": list(self.target) if self.target is not None else None,
            "addresses": dict(self.addresses),
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Epoch:
        """An epoch as stored; ValueError naming the problem if it is not one."""
        try:
            raw = json.loads(data)
            number, members, replicas = raw["epoch"], raw["members"], raw["replicas"]
            target, addresses = raw.get("target"), raw.get("addresses", {})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not an epoch record: {exc}") from None
        if not (
            isinstance(number, int)
            and isinstance(replicas, int)
            and _names(members)
            and (target is None or _names(target))
            and isinstance(addresses, dict)
            and all(isinstance(a, str) for a in addresses.values())
        ):
            raise ValueError(f"not an epoch record: {raw!r}")
        return cls(
            number,
            tuple(members),
            replicas,
            tuple(target) if target is not None else None,
            tuple(sorted(addresses.items())),
        )


def _names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(m, str) and m for m in value)


def _ranked(names: tuple[str, ...], key: int, shard: int) -> tuple[str, ...]:
    return tuple(sorted(names, key=lambda n: rendezvous_rank(n, key, shard), reverse=True))


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the steward knows when it decides the next epoch (``next_epoch``)."""

    registered: Mapping[str, str]  # daemons registered in etcd now: name -> address
    drained: frozenset[str] = frozenset()  # names an operator asked to drain
    absent: Mapping[str, float] = field(default_factory=dict)  # member -> seconds unregistered
    gained: Mapping[str, int] = field(default_factory=dict)  # name -> epoch it copied for


def next_epoch(current: Epoch, view: ClusterView, replace_after: float) -> Epoch | None:
    """The epoch that should follow ``current``, or None while it should stay.

    The wanted member list is the members and every registered daemon, less
    those being drained and members unregistered for ``replace_after`` seconds
    (their leases expired: their copies are made again elsewhere). A change
    of it starts a move (a target); a move whose target every daemon of it
    registered and copied for switches; a move whose wanted list changed
    meanwhile is revised (its copies are made again for the new target,
    mostly already there).
    """
    lost = {n for n, t in view.absent.items() if t >= replace_after}
    wanted = (set(current.members) | set(view.registered)) - view.drained - lost
    if not wanted:
        return None  # never an empty cluster: the last members stay
    if current.target is None:
        if wanted == set(current.members):
            return None
        return current.moving_to(wanted, view.registered)
    if wanted != set(current.target):
        return current.moving_to(wanted, view.registered)
    if all(n in view.registered and view.gained.get(n) == current.number for n in wanted):
        return current.switched()
    return None


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
