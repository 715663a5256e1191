"""Which replica a shard's request goes to, and failing over to the others.

The client's routing role (ps-lite's Postoffice and Customer for one
worker): updates start at the replica that last took updates for a replica
set; reads spread over the replicas by load and skip those that failed
recently; a request that meets a dead daemon or a failover status is tried
on the next replica; and the highest version this client saw of each shard
rides on its reads (read-your-writes: a backup behind it answers BEHIND).
One implementation for both shells: time and sleeps come from the client's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Protocol

from ..cluster import ClusterConfig, ConfigInForce, Node
from ..errors import FAILOVER_STATUSES, DaemonError, DaemonUnavailable
from ..protocol import NO_WORKER, Header
from ..protocol.messages import Read, Stat, Update
from ..transport.base import Buffer, Reply, Sink
from .retry import failover_pause, patience


class Requests(Protocol):
    """What the router asks of the client's session (``session.Session``)."""

    async def request(
        self, node: Node, header: Header, payload: Sequence[Buffer] = (), sink: Sink | None = None
    ) -> Reply:
        """One request to one daemon: raises DaemonUnavailable, DaemonTimeout or a
        DaemonError."""

    def now(self) -> float:
        """The shell's clock."""

    async def sleep(self, seconds: float) -> None: ...


def several_copies(config: ClusterConfig) -> bool:
    """Whether each shard is kept on more than one daemon (a read may go to any of
    them; losing one daemon loses no shard)."""
    return config.replicas > 1


def fails_over(config: ClusterConfig) -> bool:
    """Whether requests fail over and updates carry txns: the daemons replicate
    (several copies, or members that can change under an etcd epoch)."""
    return config.replicated


def asks_primary(update: bool, worker_field: int) -> bool:
    """Whether a request starts at the shard's primary rather than any replica.

    Updates do, and so do reads for a training step: only the primary keeps
    the step's state (who pushed, held deltas); a backup would refuse them.
    """
    return update or worker_field != NO_WORKER


def worker_field(worker: int | None, step: int) -> int:
    """The header's worker field; checks the values a header can carry."""
    if worker is None:
        return NO_WORKER
    if not isinstance(worker, int) or not 0 <= worker < NO_WORKER:
        raise ValueError(f"worker must be a rank between 0 and {NO_WORKER - 1}, not {worker!r}")
    if not isinstance(step, int) or not 0 <= step < 1 << 63:
        raise ValueError(f"step must be a non-negative integer, not {step!r}")
    return worker


def _os_random(bits: int) -> int:
    """``bits`` random bits from the operating system.

    Ids that must differ between processes never come from the process-wide
    ``random``: training scripts seed it alike on every rank (``random.seed(0)``,
    ``seed_everything``), so every rank would draw the same ids, and a replicated
    shard would take one rank's update for a retry of another's (applied once,
    the other silently lost) or a reader accept two writes' shards as one. The
    OS's generator is also fork-safe: a forked worker does not repeat its
    parent's ids. One ``getrandom`` call costs well under a microsecond.
    """
    return int.from_bytes(os.urandom((bits + 7) // 8), "little") >> (-bits % 8)


def new_txn() -> int:
    """A fresh update id: 64 random bits, unique across clients without coordination."""
    return _os_random(64) or 1


def _with_version(msg: Read, version: int) -> Read:
    if msg.min_version == version:
        return msg
    return dataclasses.replace(msg, min_version=version)


class Router:
    """Replica choice and failover for one client.

    Requests go through ``requests`` (the client's session), whose clock and
    sleeps are the shell's.
    """

    def __init__(self, in_force: ConfigInForce, timeout: float, requests: Requests) -> None:
        self.in_force = in_force
        self.timeout = timeout
        self.requests = requests
        # With replicas: the highest version of each (key, shard) this client
        # saw acknowledged or read, so no replica serves it anything older.
        self.seen_versions: dict[tuple[int, int], int] = {}
        # The replica that last accepted updates for a replica set (by the
        # name of its preferred primary), and replicas that failed recently.
        self.primary_hint: dict[str, Node] = {}
        self.failed_at: dict[str, float] = {}
        self._spread = _os_random(16)  # clients seeded alike still spread

    @property
    def patience(self) -> float:
        """Seconds a request may keep failing over (``retry.patience``)."""
        return patience(self.timeout, self.in_force.config.failure_detection)

    @property
    def fails_over(self) -> bool:
        """Whether requests fail over (``fails_over``)."""
        return fails_over(self.in_force.config)

    def seen(self, key: int, shard: int) -> int:
        """The highest version of the shard this client saw (0: none)."""
        return self.seen_versions.get((key, shard), 0)

    def saw(self, key: int, shard: int, version: int, update: bool) -> None:
        if update:
            self.seen_versions[(key, shard)] = max(version, self.seen(key, shard))
        else:
            # A read is answered below what this client saw only by the
            # primary itself (the tensor was recreated): follow it.
            self.seen_versions[(key, shard)] = version

    def forget(self, key: int) -> None:
        """The tensor was recreated or deleted: what was seen of it says nothing now."""
        self.seen_versions = {k: v for k, v in self.seen_versions.items() if k[0] != key}

    def _epoch_number(self) -> int:
        """The epoch this client routes by (0: the config file's members, no epoch)."""
        epoch = self.in_force.config.epoch
        return epoch.number if epoch is not None else 0

    def failed(self, node: Node) -> None:
        """``node`` did not answer: prefer the other replicas for a while."""
        self.failed_at[node.name] = self.requests.now()

    def candidates(
        self, key: int, shard: int, update: bool, load: dict[str, int] | None = None
    ) -> list[Node]:
        """The shard's replicas in the order to try them.

        Updates start at the replica that last took updates for this replica
        set (the primary); reads are spread over the replicas, skipping those
        that failed in the last few seconds. ``load`` (bytes already given to
        each daemon by the same call) makes a read start at the least loaded
        replica, so one tensor's shards are spread evenly over the daemons
        even where placement put more of them on one.
        """
        replicas = list(self.in_force.config.replicas_for(key, shard))
        if update:
            hint = self.primary_hint.get(replicas[0].name)
            start = replicas.index(hint) if hint in replicas else 0
        else:
            self._spread += 1
            start = self._spread % len(replicas)
        order = replicas[start:] + replicas[:start]
        now = self.requests.now()
        recent = self.patience
        healthy = [n for n in order if now - self.failed_at.get(n.name, -1e9) > recent]
        if load is not None:
            healthy.sort(key=lambda n: load.get(n.name, 0))  # stable: ties keep the rotation
        return healthy + [n for n in order if n not in healthy]

    async def on_replicas(
        self,
        key: int,
        shard: int,
        msg: Read | Update | Stat,
        payload: Sequence[Buffer] = (),
        sink: Sink | None = None,
        *,
        length: int = 0,
        update: bool,
        track: bool = True,
        candidates: list[Node] | None = None,
    ) -> Reply:
        """A request for one shard, failing over to its other replicas.

        ``length`` is the payload's size in bytes.

        ``track``: the reply's version is the shard's (not a stat's sum), so
        remember it for read-your-writes.

        Safe to repeat: reads always; updates because they carry a txn the
        daemons remember, so a retried update is applied once. Gives up after
        the client timeout plus two failure timeouts (time for the cluster
        to notice a dead primary) with the last error.
        """
        if not self.fails_over:
            node = self.in_force.config.primary_for(key, shard)
            return await self.requests.request(node, msg.frame(length), payload, sink)
        worker = NO_WORKER if isinstance(msg, Stat) else msg.worker
        update_like = asks_primary(update, worker)
        candidates = candidates or self.candidates(key, shard, update_like)
        placed_in = self._epoch_number()
        deadline = self.requests.now() + self.patience
        attempt = 0
        last: Exception | None = None
        while True:
            if self._epoch_number() != placed_in:
                # The client moved to another epoch meanwhile (this request's refusal,
                # or another call's): its requests now carry that epoch, so the daemons
                # judge them by its placement; they must go where it places the shard.
                candidates = self.candidates(key, shard, update_like)
                placed_in = self._epoch_number()
                attempt = 0
            node = candidates[attempt % len(candidates)]
            if track and isinstance(msg, Read):
                msg = _with_version(msg, self.seen(key, shard))
            try:
                reply = await self.requests.request(node, msg.frame(length), payload, sink)
            except DaemonUnavailable as exc:
                self.failed(node)
                # A daemon's own refusal says more than another's silence.
                last = exc if not isinstance(last, DaemonError) else last
            except DaemonError as exc:
                if exc.status not in FAILOVER_STATUSES:
                    raise
                last = exc
            else:
                if track:
                    self.saw(key, shard, reply.header.version, update)
                if update:
                    self.primary_hint[candidates[0].name] = node
                    self.failed_at.pop(node.name, None)
                return reply
            attempt += 1
            if self.requests.now() >= deadline:
                assert last is not None
                raise last
            if attempt % len(candidates) == 0:
                # A whole round failed: give the cluster time to fail over.
                await self.requests.sleep(failover_pause(attempt // len(candidates)))
