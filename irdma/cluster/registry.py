"""The cluster's members and epochs as kept in etcd: the keys, the records, the calls.

Under one key prefix (``/irdma/<cluster>``):

- ``members/<name>``: a daemon's record (its address, metrics address and arena
  size), written with the daemon's lease. The daemon renews the lease while it
  runs; if it stops renewing (killed, hung, cut off from etcd) the key goes
  away when the lease expires, and everyone watching sees it leave.
- ``epoch``: the current epoch (``irdma.cluster.epochs.Epoch``): its number, the
  member list placement uses, and during a move the target list. It changes
  only by compare-and-swap on its revision, so of two daemons proposing the
  next epoch from the same one, exactly one wins.
- ``gained/<name>``: the number of the last epoch whose target copies the
  daemon has (a move switches once every target daemon has them).
- ``drain/<name>``: an operator asked for the daemon to be moved off
  (``irdma drain``); it stays out of the member list while the key exists.

A daemon keeps its own lease's deadline: it counts from when it *sent* the
last renewal etcd granted, so it always runs out no later than etcd's own
expiry of the lease, and a daemon that has lost its lease knows it before
anyone can have acted on the expiry.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

import trio

from .config import EtcdSettings
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


@dataclass
class ClusterState:
    """What etcd holds for one cluster, kept current from a watch (``apply``)."""

    revision: int = 0
    members: dict[str, MemberRecord] = field(default_factory=dict)  # registered now
    epoch: Epoch | None = None
    epoch_revision: int = 0  # the epoch record's mod revision (0: none)
    gained: dict[str, int] = field(default_factory=dict)
    drained: set[str] = field(default_factory=set)

    def apply(self, registry: Registry, kv: KeyValue, deleted: bool) -> None:
        """One key written (or deleted) at ``kv.mod_revision``."""
        key = kv.key
        self.revision = max(self.revision, kv.mod_revision)
        if key == registry.epoch_key:
            if deleted:
                self.epoch, self.epoch_revision = None, 0
            else:
                try:
                    self.epoch = Epoch.from_json(kv.value)
                except ValueError:
                    return  # not ours: ``irdma status`` names it
                self.epoch_revision = kv.mod_revision
            return
        for prefix, table in (
            (registry.members_prefix, self.members),
            (registry.gained_prefix, self.gained),
        ):
            if key.startswith(prefix):
                name = key[len(prefix) :].decode(errors="replace")
                if deleted:
                    table.pop(name, None)
                elif table is self.members:
                    record = registry._member(kv)
                    if record is not None:
                        self.members[name] = record
                else:
                    with contextlib.suppress(ValueError):  # not ours: ignored
                        self.gained[name] = int(kv.value)
                return
        if key.startswith(registry.drain_prefix):
            name = key[len(registry.drain_prefix) :].decode(errors="replace")
            (self.drained.discard if deleted else self.drained.add)(name)


class Registry:
    """Members and epochs of the cluster under ``prefix`` in ``etcd``."""

    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self.etcd = etcd
        self.prefix = prefix.rstrip("/").encode()
        self.members_prefix = self.prefix + b"/members/"
        self.epoch_key = self.prefix + b"/epoch"
        self.gained_prefix = self.prefix + b"/gained/"
        self.drain_prefix = self.prefix + b"/drain/"

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

    # -- the whole cluster at once ---------------------------------------------------

    async def state(self) -> ClusterState:
        """Everything under the prefix, read at one revision."""
        kvs, revision = await self.etcd.get_prefix(self.prefix + b"/")
        state = ClusterState(revision=revision)
        for kv in kvs:
            state.apply(self, kv, deleted=False)
        return state

    async def say_gained(self, name: str, number: int) -> None:
        """``name`` has every copy it gains in epoch ``number``'s target."""
        await self.etcd.put(self.gained_prefix + name.encode(), str(number).encode())

    async def drain(self, name: str) -> None:
        """Ask for ``name`` to be moved off and left out of the member list."""
        await self.etcd.put(self.drain_prefix + name.encode(), b"1")

    async def undrain(self, name: str) -> bool:
        """Let a drained daemon back in; False if it was not being drained."""
        return await self.etcd.delete(self.drain_prefix + name.encode()) > 0

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
        target: Literal["CREATE", "MOD"] = "CREATE" if after == 0 else "MOD"
        same = [Compare(self.epoch_key, target, "EQUAL", after)]
        ok, _ = await self.etcd.txn(same, [Put(self.epoch_key, epoch.to_json())])
        return ok


def lease_ttl(seconds: float) -> int:
    """A lease TTL in whole seconds (etcd's unit), at least 1."""
    return max(1, math.ceil(seconds))


async def current_epoch(settings: EtcdSettings, timeout: float) -> Epoch:
    """The epoch in force in the cluster ``settings`` name (a client with no
    ``[[nodes]]`` starts from it); EtcdError when there is none or etcd is not there."""
    epoch, _ = await Registry.of(settings, timeout).epoch()
    if epoch is None:
        raise EtcdError(
            f"no epoch under {settings.prefix} in etcd ({', '.join(settings.endpoints)}): "
            "has a daemon of this cluster started?"
        )
    return epoch
