"""The cluster's members and epochs as kept in etcd: the keys, the records, the calls.

Under one key prefix (``/irdma/<cluster>``):

- ``members/<name>``: a daemon's record (its address, metrics address and arena
  size), written with the daemon's lease. The daemon renews the lease while it
  runs; if it stops renewing (killed, hung, cut off from etcd) the key goes
  away when the lease expires, and everyone watching sees it leave.
- ``epoch``: the current epoch (``irdma.epochs.Epoch``): its number and the
  member list placement uses. It changes only by compare-and-swap on its
  revision, so of two daemons proposing the next epoch from the same one,
  exactly one wins.

A daemon keeps its own lease's deadline: it counts from when it *sent* the
last renewal etcd granted, so it always runs out no later than etcd's own
expiry of the lease, and a daemon that has lost its lease knows it before
anyone can have acted on the expiry.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import trio

from .cluster import EtcdSettings
from .epochs import Epoch
from .etcd import Compare, Etcd, EtcdError, KeyValue, Lease, Put

# Renew a lease this many times per TTL (the first failures leave time to retry).
RENEWALS_PER_TTL = 3


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """What a daemon says about itself when it registers."""

    name: str
    address: str  # tcp://host:port, shm://..., rdma://...
    arena_size: int
    metrics_address: str | None = None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> MemberRecord:
        try:
            raw = json.loads(data)
            record = cls(**raw)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not a member record: {exc}") from None
        if not (isinstance(record.name, str) and isinstance(record.address, str)):
            raise ValueError(f"not a member record: {raw!r}")
        return record


class Registry:
    """Members and epochs of the cluster under ``prefix`` in ``etcd``."""

    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self.etcd = etcd
        self.prefix = prefix.rstrip("/").encode()
        self.members_prefix = self.prefix + b"/members/"
        self.epoch_key = self.prefix + b"/epoch"

    @classmethod
    def of(cls, settings: EtcdSettings, timeout: float) -> Registry:
        """The registry a config's ``[etcd]`` names, each call within ``timeout``."""
        return cls(Etcd(settings.endpoints, timeout=timeout), settings.prefix)

    def member_key(self, name: str) -> bytes:
        return self.members_prefix + name.encode()

    # -- members --------------------------------------------------------------------

    async def register(self, record: MemberRecord, ttl: int) -> Lease:
        """Write ``record`` under a new lease of ``ttl`` seconds; return the lease.

        Refused (EtcdError) while another lease holds the name: a daemon of
        that name is still registered (or its lease has not expired yet).
        """
        lease = await self.etcd.grant(ttl)
        key = self.member_key(record.name)
        free = [Compare(key, "CREATE", "EQUAL", 0)]
        ok, _ = await self.etcd.txn(free, [Put(key, record.to_json(), lease.id)])
        if not ok:
            await self.etcd.revoke(lease.id)
            held = await self.etcd.get(key)
            raise EtcdError(
                f"member {record.name!r} is already registered"
                + (f" (lease {held.lease:x})" if held is not None else "")
                + "; is another daemon of that name running? (a killed one's lease "
                "expires within its TTL)"
            )
        return lease

    async def members(self) -> tuple[dict[str, MemberRecord], int]:
        """Registered members by name, and the revision they were read at."""
        kvs, revision = await self.etcd.get_prefix(self.members_prefix)
        return {r.name: r for r in map(self._member, kvs) if r is not None}, revision

    def _member(self, kv: KeyValue) -> MemberRecord | None:
        try:
            return MemberRecord.from_json(kv.value)
        except ValueError:
            return None  # not ours to judge here: ``irdma status`` names such keys

    async def leave(self, lease: Lease) -> None:
        """Deregister now (the lease's keys go at once, not after its TTL)."""
        await self.etcd.revoke(lease.id)

    async def keep_alive(
        self,
        lease: Lease,
        on_lost: Callable[[str], None],
        on_renewed: Callable[[float], None] = lambda until: None,
    ) -> None:
        """Renew ``lease`` until cancelled; call ``on_lost`` (once, with why) and return
        when it can no longer be trusted to be held: etcd said it expired, or no
        renewal was granted before the local deadline.

        ``on_renewed`` gets each new deadline in ``time.monotonic`` time: the
        send of the renewal plus the TTL granted, never later than etcd's own
        expiry. A process that was stopped past it must check the clock
        against it before acting (this task may run later than its work).
        """
        deadline = time.monotonic() + lease.ttl
        every = lease.ttl / RENEWALS_PER_TTL
        while True:
            await trio.sleep(max(0.0, min(deadline - time.monotonic(), every)))
            if time.monotonic() >= deadline:
                on_lost(f"lease {lease.id:x} not renewed within its {lease.ttl} s")
                return
            sent = time.monotonic()
            try:
                with trio.move_on_after(deadline - sent):
                    ttl = await self.etcd.keep_alive(lease.id)
                    if ttl <= 0:
                        on_lost(f"etcd says lease {lease.id:x} expired")
                        return
                    deadline = sent + ttl
                    on_renewed(deadline)
            except EtcdError:
                continue  # tried again until the deadline

    # -- epochs ---------------------------------------------------------------------

    async def epoch(self) -> tuple[Epoch | None, int]:
        """The current epoch (None before the first) and its record's mod revision."""
        kv = await self.etcd.get(self.epoch_key)
        if kv is None:
            return None, 0
        return Epoch.from_json(kv.value), kv.mod_revision

    async def propose(self, epoch: Epoch, after: int) -> bool:
        """Make ``epoch`` current if the record is still at mod revision ``after``
        (0: there is none yet); False if another change came first."""
        target = "CREATE" if after == 0 else "MOD"
        same = [Compare(self.epoch_key, target, "EQUAL", after)]
        ok, _ = await self.etcd.txn(same, [Put(self.epoch_key, epoch.to_json())])
        return ok


def lease_ttl(seconds: float) -> int:
    """A lease TTL in whole seconds (etcd's unit), at least 1."""
    return max(1, math.ceil(seconds))
