"""Readers' leases on whole-tensor writes: which copies of a tensor's shards are
held for a reader past the rules for older copies (``copies``). Pure: the
store asks which writes of a tensor are held now, and ``blocks.Blocks`` lets
go of what no lease holds any more.

A reader streaming a tensor in ranges (the mount) takes a lease on the
tensor at every daemon holding a copy of it before its first range, holding
*every* copy (those held now and those replaced while the lease lasts), then
narrows it to the write that range came from and renews it while it reads.
A lease ends when released or when it runs out (a reader that died leaks
nothing). Held copies use arena room like any kept copy: when a write needs
the room, they are let go (the lease loses, never the write; the reader's
read of that write then fails with STAMP_GONE, as without a lease).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from irdma.protocol import Status
from irdma.protocol.messages import UNSTAMPED

from ..errors import StoreError

# The longest a daemon grants a lease at once, whatever a reader asks: a
# reader that died holds its copies no longer than this.
LEASE_MAX = 60.0
# Leases one daemon holds at once (each is a few dozen bytes and a check per
# kept copy); a reader asking for more is refused (NO_SPACE) and reads as
# without one.
LEASES_MAX = 4096


@dataclass(frozen=True, slots=True)
class Held:
    """The writes of one tensor that leases hold now (stamps as shards keep them:
    0 for the copy from before any whole-tensor write)."""

    every: bool = False  # every copy: a reader has not chosen its write yet
    stamps: frozenset[int] = frozenset()

    def __contains__(self, stamp: object) -> bool:
        return self.every or stamp in self.stamps


NOTHING_HELD = Held()


@dataclass(slots=True)
class Lease:
    key: int
    every: bool
    stamp: int  # as shards keep it (see ``Held``); meaningless when ``every``
    until: float  # on the leases' clock


def shard_stamp(wire: int) -> int:
    """A write's stamp as a lease names it on the wire, as shards keep it."""
    return 0 if wire == UNSTAMPED else wire


class Leases:
    """The leases one daemon holds, by lease id, on the injected ``clock``."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._by_id: dict[int, Lease] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def grant(
        self, lease_id: int, key: int, stamp: int, seconds: float
    ) -> tuple[float, int | None]:
        """Hold tensor ``key``'s copies of write ``stamp`` (the wire's: 0 every
        copy, ``UNSTAMPED`` the one from before any) for ``seconds`` (at most
        LEASE_MAX); the same ``lease_id`` again renews or changes it. Returns
        the seconds granted, and the key a changed lease held before (its
        copies may be let go now), if another or narrowed."""
        old = self._by_id.get(lease_id)
        if old is None and len(self._by_id) >= LEASES_MAX:
            self.expire()
            if len(self._by_id) >= LEASES_MAX:
                raise StoreError(
                    Status.NO_SPACE,
                    f"this daemon holds {LEASES_MAX} readers' leases already; read without one",
                )
        granted = min(max(0.0, seconds), LEASE_MAX)
        lease = Lease(key, stamp == 0, shard_stamp(stamp), self._clock() + granted)
        self._by_id[lease_id] = lease
        narrowed = old is not None and (
            old.key != key or (old.every and not lease.every) or old.stamp != lease.stamp
        )
        return granted, old.key if old is not None and narrowed else None

    def release(self, lease_id: int) -> int | None:
        """End lease ``lease_id``; the key it held (None: no such lease)."""
        lease = self._by_id.pop(lease_id, None)
        return lease.key if lease is not None else None

    def expire(self) -> set[int]:
        """End the leases that ran out; the keys they held."""
        now = self._clock()
        ended = [i for i, lease in self._by_id.items() if lease.until <= now]
        return {self._by_id.pop(i).key for i in ended}

    def next_end(self) -> float | None:
        """When the first lease runs out (the clock's time), None with none held."""
        return min((lease.until for lease in self._by_id.values()), default=None)

    def held(self, key: int) -> Held:
        """What the leases on tensor ``key`` hold now (one that ran out holds nothing)."""
        now = self._clock()
        mine = [lease for lease in self._by_id.values() if lease.key == key and lease.until > now]
        if not mine:
            return NOTHING_HELD
        every = any(lease.every for lease in mine)
        return Held(every, frozenset(lease.stamp for lease in mine if not lease.every))
