"""Keeping a daemon's shards identical on their replicas: heartbeats, forwarding, catch-up.

- **Heartbeats.** Every ``heartbeat`` seconds the daemon pings each peer and
  records who answered (``Membership``).
- **Forwarding.** An update applied here as a shard's primary is queued,
  in the order it was applied, for every backup of the shard that is up; one
  task per peer sends the queue in order over one connection, so backups
  apply the same updates in the same order (byte-identical copies). A backup
  that missed updates answers BEHIND and is sent the whole shard instead.
  The client's update is acknowledged once every backup that is up has it.
- **Catching up.** A daemon that starts, or that was cut off long enough to
  have been declared down, asks its peers which shards they hold (versions
  and checksums), has the current copy of each of its shards pushed to it,
  and only then announces itself ready; each peer first sends it everything
  it queued for it, so no update falls between the copy and the handoff.
- **Whose copies count.** A daemon takes forwarded updates and shard copies
  only from a peer it sees as up and ready (and never for a shard it is the
  acting primary of), or, while catching up, from the peer it asked. A
  primary that was paused or cut off and comes back with stale queued
  updates is refused, drops them, and catches up like any rejoining daemon.
- **Moves** (with etcd, ``irdma.epochs``). While an epoch names a target
  member list, updates are also forwarded to the daemons that gain a shard in
  it, and each of them copies what it gains from the shard's acting primary
  (``gain``), then says so in etcd; once all have, the steward switches the
  epoch. After a switch, once settled, a daemon drops the copies it no
  longer keeps. Copies travel only between daemons of the same epoch.
"""

from __future__ import annotations

import logging
import secrets
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np
import trio

from irdma.auth import cluster_secret
from irdma.cluster import ClusterConfig, Node
from irdma.cluster.epochs import Epoch
from irdma.errors import AuthFailed
from irdma.protocol import (
    Header,
    ProtocolError,
    Status,
    TensorMeta,
    decode_json,
    encode_json,
)
from irdma.protocol.messages import Catchup, Ping, ReplicaUpdate, ShardCopy, SyncRequest
from irdma.transport.base import StreamBroken, StreamClosed
from irdma.transport.tcp import FramedConnection

from .errors import StoreError
from .membership import Membership
from .store import Commit, Store, held_commit

log = logging.getLogger("psd")

# What a catch-up takes: shards to copy, by the peer to copy them from; shards to drop.
Plan = tuple[dict[str, list[tuple[int, int]]], list[tuple[int, int]]]

# How long a catch-up waits between attempts when it cannot decide yet
# (no quorum, or a replica it needs is down).
RETRY_PAUSE = 0.2


@dataclass(slots=True)
class CopyCounts:
    """Whole shards this daemon sent to peers and installed from them, since it started
    (catch-up after a restart, a backup found behind, a move of epochs)."""

    sent: int = 0
    sent_bytes: int = 0
    received: int = 0
    received_bytes: int = 0


@dataclass(eq=False)
class Item:
    """One message queued for a peer: a forwarded update, or a whole shard."""

    key: int
    shard: int
    commit: Commit | None  # None: send the whole shard (SYNC)
    done: trio.Event = field(default_factory=trio.Event)
    delivered: bool = False  # done can also mean skipped (the peer went down)
    refused: bool = False  # the peer would not take it (it sees another primary)
    queued: float = field(default_factory=time.monotonic)  # for the lag metric
    # How many times this daemon had given up being ready when the item was queued.
    losses: int = 0


class PeerError(Exception):
    """A peer could not be reached or refused a replication message."""


class Refused(PeerError):
    """The peer does not take copies from this daemon (it sees another primary)."""


class Peer:
    """The link to one other daemon: a connection and the queue of what it must receive."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.queue: deque[Item] = deque()
        self.wake = trio.Event()
        self.conn: FramedConnection | None = None
        self.lock = trio.Lock()  # one connect at a time
        self.auth_error: str | None = None  # why the last link failed to authenticate
        self.scope = trio.CancelScope()  # its heartbeat and sender tasks (ended when it leaves)

    def put(self, item: Item) -> Item:
        self.queue.append(item)
        self.wake.set()
        return item

    def skip_all(self) -> None:
        """The peer is down: what was queued for it is not waited for (it catches up later)."""
        while self.queue:
            self.queue.popleft().done.set()


class Replicator:
    """Runs the heartbeats and the forward queues of one daemon."""

    def __init__(self, config: ClusterConfig, node: Node, store: Store) -> None:
        self.config = config
        self.node = node
        self.store = store
        # Links to peers authenticate like clients do (``irdma.auth``).
        self.secret = cluster_secret(config)
        self.membership = Membership(config, node.name)
        self.peers = {n.name: Peer(n) for n in config.nodes if n.name != node.name}
        self.names = [n.name for n in config.nodes]
        self.index = self.sender_id(node.name)  # how copies name their sender
        # Heartbeats carry (boot, seq) so a late one cannot undo a newer state.
        self._boot = secrets.randbits(63)
        self._seq = 0
        # Set during the handoff: pings report ready before this daemon acts on it.
        self._announcing = False
        # Peers this daemon asked for shard copies while catching up.
        self._asked: set[str] = set()
        self._nursery: trio.Nursery | None = None
        self._lost = trio.Event()
        self.membership.on_lost = self._on_lost
        self.membership.on_change = self._on_change
        self.recovered = trio.Event()  # set the first time this daemon is ready
        # With etcd: set once the first epoch is adopted (catching up waits for it);
        # ``on_gained`` tells etcd this daemon has its copies of a move's target, and
        # ``on_adopted`` is the server's (the directory says at once what it serves).
        self.adopted = trio.Event()
        self.on_gained: Callable[[int], Awaitable[None]] = _gained_nowhere
        self.on_adopted: Callable[[], None] = _nothing
        self._epoch_work = trio.CancelScope()
        # Why this daemon last gave up being ready (said in the log).
        self._lost_why = ""
        self.copies = CopyCounts()
        # Times this daemon gave up being ready: an update queued before one of them
        # is not acknowledged even if it is ready again by the time it is answered.
        self.losses = 0

    @property
    def enabled(self) -> bool:
        return self.config.replicated

    def sender_id(self, name: str) -> int:
        """How replication messages name their sender: its index in the node list, or
        (with etcd, where the list changes) a 31-bit hash of its name."""
        if self.config.etcd is not None:
            return zlib.crc32(name.encode()) & 0x7FFFFFFF
        return self.names.index(name)

    def sender_name(self, sender: int) -> str | None:
        if self.config.etcd is not None:
            return next((p for p in self.peers if self.sender_id(p) == sender), None)
        return self.names[sender] if sender < len(self.names) else None

    def _on_lost(self) -> None:
        why = self._lost_why or (
            f"no contact with a majority for {self.membership.grace:.1f} s"
            if not self.membership.leased
            else "its etcd lease is not held"
        )
        self._lost_why = ""
        self.losses += 1
        log.warning("%s: %s; catching up before serving again", self.node.name, why)
        # Whatever was queued while primary is stale now: others may have
        # taken over. This daemon catches up instead. Forwards already written
        # to a peer's socket are dropped too (a reset, not a close): sent when
        # the path comes back, a backup could apply an update that was never
        # acknowledged and that this daemon's catch-up is about to undo.
        for peer in self.peers.values():
            peer.skip_all()
            if peer.conn is not None:
                peer.conn.stream.reset()
                peer.conn.abandon(StreamClosed(f"{self.node.name} lost its majority"))
                peer.conn = None
        self._lost.set()

    def _on_change(self) -> None:
        # A peer that went down no longer holds up acknowledgements.
        for name, peer in self.peers.items():
            if not self.membership.up(name):
                peer.skip_all()

    # -- running ------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeats, forward queues and catch-up, until cancelled."""
        if not self.enabled:
            self.recovered.set()
            task_status.started()
            await trio.sleep_forever()
        if self.config.etcd is None:
            self.adopted.set()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for peer in self.peers.values():
                nursery.start_soon(self._peer_tasks, peer)
            nursery.start_soon(self._tick)
            nursery.start_soon(self._recovery_loop)
            task_status.started()

    async def _peer_tasks(self, peer: Peer) -> None:
        """Heartbeats and the forward queue of one peer, until it leaves the cluster."""
        with peer.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeats, peer)
                nursery.start_soon(self._sender, peer)

    # -- epochs (etcd) ----------------------------------------------------------------

    def adopt(self, epoch: Epoch) -> None:
        """Follow a newer epoch: its daemons become the peers, its members place the
        shards; then (in the background) settle on it, drop copies no longer kept,
        and copy what this daemon gains in its target."""
        assert self._nursery is not None
        if not self.config.adopt(epoch):
            return
        self.names = [n.name for n in self.config.nodes]
        for n in self.config.nodes:
            peer = self.peers.get(n.name)
            if n.name == self.node.name:
                continue
            if peer is not None and peer.node.address != n.address:
                self._part(peer)
                peer = None
            if peer is None:
                self.peers[n.name] = peer = Peer(n)
                self._nursery.start_soon(self._peer_tasks, peer)
        self.membership.follow_nodes()
        self.on_adopted()
        log.info(
            "%s: epoch %d: members %s%s",
            self.node.name,
            epoch.number,
            ", ".join(epoch.members),
            f"; moving to {', '.join(epoch.target)}" if epoch.target else "",
        )
        self._epoch_work.cancel()
        self._epoch_work = trio.CancelScope()
        self._nursery.start_soon(self._follow_epoch, epoch, self._epoch_work)
        self.adopted.set()

    def _part(self, peer: Peer) -> None:
        """A peer left the cluster (or moved): stop its tasks, let go of its queue."""
        peer.scope.cancel()
        peer.skip_all()
        if peer.conn is not None:
            peer.conn.abandon(StreamClosed(f"{peer.node.name} left the cluster"))
            peer.conn = None

    async def _follow_epoch(self, epoch: Epoch, scope: trio.CancelScope) -> None:
        with scope:
            await self._settle(epoch)
            for name in self.membership.forget_leavers():
                self._part(self.peers.pop(name))
            self._drop_unkept()
            self.on_adopted()  # serving again (one-sided readers too), without those copies
            if epoch.target is not None and self.node.name in epoch.target:
                await self._gain(epoch)
                await self.on_gained(epoch.number)

    async def _settle(self, epoch: Epoch) -> None:
        """Tell every peer of the new epoch now, and wait until all registered ones
        report it (``Membership.settled``)."""
        async with trio.open_nursery() as nursery:
            for peer in list(self.peers.values()):
                nursery.start_soon(self._ping, peer)
        while not self.membership.settled():
            await trio.sleep(self.config.heartbeat / 4)
        log.info("%s: settled on epoch %d", self.node.name, epoch.number)

    def _drop_unkept(self) -> None:
        """Drop the local copies this daemon keeps in neither the members' placement
        nor the target's (a move switched away from it)."""
        me = self.node.name
        unkept = [
            (key, index)
            for key, tensor in self.store.tensors.items()
            for index in tensor.shards
            if not self.config.holds(me, key, index)
        ]
        for key, index in unkept:
            self.store.drop_shard(key, index)
        if unkept:
            log.info("%s: dropped %d shard copies it no longer keeps", me, len(unkept))

    async def _gain(self, epoch: Epoch) -> None:
        """Copy every shard this daemon gains in ``epoch``'s target from its acting
        primary (which forwards every update to it from now on)."""
        me = self.node.name

        def gains(key: int, index: int) -> bool:
            return not any(n.name == me for n in self.config.replicas_for(key, index))

        while True:
            if self.membership.ready and self.membership.settled():
                plan = await self._copy_planned(gains, f"copying for epoch {epoch.number}")
                if plan is not None:
                    break
            await trio.sleep(RETRY_PAUSE)
        copied = sum(len(v) for v in plan[0].values())
        log.info("%s: has its copies for epoch %d (%d copied)", me, epoch.number, copied)

    async def _tick(self) -> None:
        while True:
            self.membership.observe()
            self._on_change()
            await trio.sleep(self.config.heartbeat / 2)

    async def _recovery_loop(self) -> None:
        await self.adopted.wait()  # with etcd: catching up needs the epoch's placement
        while True:
            await self._catch_up()
            self.recovered.set()
            await self._lost.wait()
            self._lost = trio.Event()

    # -- connections -------------------------------------------------------------

    async def _conn(self, peer: Peer) -> FramedConnection:
        assert self._nursery is not None
        if peer.conn is not None and not peer.conn.broken:
            return peer.conn
        async with peer.lock:
            if peer.conn is None or peer.conn.broken:
                addr = peer.node.address
                peer.conn = await FramedConnection.open(
                    addr.host,
                    addr.port,
                    self._nursery,
                    peer=f"{peer.node.name} ({addr})",
                    timeout=self.config.failure_timeout,
                    secret=self.secret,
                )
                peer.auth_error = None
            return peer.conn

    async def request(
        self, peer: Peer, header: Header, payload: Iterable[Any] = (), *, timeout: float
    ) -> tuple[Header, bytes]:
        """One request to a peer; raises PeerError when it fails or times out."""
        with trio.move_on_after(timeout) as scope:
            try:
                conn = await self._conn(peer)
                reply = await conn.request(header, list(payload))
            except (StreamBroken, StreamClosed, OSError) as exc:
                raise PeerError(f"{peer.node.name}: {exc}") from None
            except AuthFailed as exc:
                # Another secret on the peer: said once, not at every heartbeat.
                if peer.auth_error != str(exc):
                    log.error("%s: cannot link to %s: %s", self.node.name, peer.node.name, exc)
                peer.auth_error = str(exc)
                raise PeerError(f"{peer.node.name}: {exc}") from None
        if scope.cancelled_caught:
            if peer.conn is not None:
                await peer.conn.aclose()  # a late answer must not be taken for the next one
                peer.conn = None
            raise PeerError(f"{peer.node.name}: no answer within {timeout:g} s")
        return reply.header, reply.data

    # -- heartbeats -----------------------------------------------------------

    def ping_body(self, handoff: bool = False) -> bytes:
        self.membership.observe()  # a daemon resumed after a pause says so at once
        self._seq += 1
        return encode_json(
            {
                "node": self.node.name,
                "ready": self.membership.ready or self._announcing,
                "handoff": handoff,
                "boot": self._boot,
                "seq": self._seq,
                "epoch": self._epoch_number(),
            }
        )

    def _epoch_number(self) -> int:
        return self.config.epoch.number if self.config.epoch is not None else 0

    @staticmethod
    def _epoch_of(body: dict) -> int | None:
        epoch = body.get("epoch")
        return epoch if isinstance(epoch, int) else None

    @staticmethod
    def _stamp(body: dict) -> tuple[int, int] | None:
        boot, seq = body.get("boot"), body.get("seq")
        if isinstance(boot, int) and isinstance(seq, int):
            return boot, seq
        return None

    async def received_ping(self, body: Any) -> bytes:
        """A peer's heartbeat arrived; return the answer (this daemon's state).

        A handoff (the peer caught up and takes its shards back) is answered
        only after everything queued for the peer was delivered, so the peer
        starts serving with every update this daemon applied for it.
        """
        self._check_enabled("heartbeat")
        if not isinstance(body, dict) or not self._is_peer(body.get("node")):
            raise StoreError(Status.BAD_ARGUMENT, "heartbeat from an unknown node")
        name = body["node"]
        self.membership.heard(
            name, bool(body.get("ready")), stamp=self._stamp(body), epoch=self._epoch_of(body)
        )
        if body.get("handoff"):
            await self.drain(name)
        return self.ping_body()

    async def _heartbeats(self, peer: Peer) -> None:
        interval = self.config.heartbeat
        while True:
            started = trio.current_time()
            await self._ping(peer)
            await trio.sleep_until(started + interval)

    async def _ping(self, peer: Peer, timeout: float | None = None, handoff: bool = False) -> bool:
        body = self.ping_body(handoff)
        try:
            header, data = await self.request(
                peer,
                Ping().frame(len(body)),
                [body],
                timeout=timeout or self.config.failure_timeout,
            )
        except PeerError:
            return False
        if header.status != Status.OK:
            return False
        reply = decode_json(data)
        if isinstance(reply, dict):
            self.membership.heard(
                peer.node.name,
                bool(reply.get("ready")),
                stamp=self._stamp(reply),
                epoch=self._epoch_of(reply),
            )
        return True

    # -- forwarding -------------------------------------------------------------

    def forward(self, commits: list[Commit]) -> list[Item]:
        """Queue updates just applied here for the shards' backups; call with no await since."""
        return [
            self._queue(name, c.key, c.shard, c)
            for c in commits
            for name in self.membership.backups(c.key, c.shard)
        ]

    def sync_to(self, peer_name: str, shards: Iterable[tuple[int, int]]) -> list[Item]:
        """Queue whole shards for a peer (after anything queued for it before)."""
        return [self._queue(peer_name, key, index, None) for key, index in shards]

    def _peer(self, name: str) -> Peer:
        """The peer of that name. Tasks started for the peers up a moment ago find
        one that left the cluster meanwhile (``_follow_epoch``) gone: PeerError."""
        peer = self.peers.get(name)
        if peer is None:
            raise PeerError(f"{name} left the cluster")
        return peer

    def _queue(self, peer_name: str, key: int, index: int, commit: Commit | None) -> Item:
        """Queue an update (None: the whole shard) for a peer, marked with how many
        times this daemon had given up being ready (``wait`` compares)."""
        return self.peers[peer_name].put(Item(key, index, commit, losses=self.losses))

    async def wait(self, items: list[Item]) -> None:
        """Wait until the backups have these updates, or were declared down.

        Raises StoreError (NO_QUORUM) when one was not delivered and was refused,
        or this daemon gave up being ready (lost its majority or lease, or was
        refused) since it was queued, or is not ready now: it is applied here
        only, another replica may be primary by now and this copy will be
        replaced, so it must not be acknowledged; the client retries it
        elsewhere with the same txn.
        """
        for item in items:
            await item.done.wait()
        m = self.membership
        # A refusal, or a loss of readiness since the items were queued, means another
        # replica may be in charge: not acknowledged, even if this daemon is ready
        # again by now (caught up meanwhile, with its copy replaced).
        stale = any(i.refused or i.losses != self.losses for i in items)
        if any(not i.delivered for i in items) and (stale or not (m.ready and m.has_quorum())):
            why = "its lease or a backup's acceptance" if m.leased else "contact with a majority"
            raise StoreError(
                Status.NO_QUORUM,
                f"{self.node.name} lost {why} before its backups had the "
                "update; it is not acknowledged: retry it on another replica",
            )

    async def confirm(self, shards: list[tuple[int, int]]) -> None:
        """Before a retried update is answered (it was applied here before, as primary
        or as a backup): every other copy that is up gets these shards whole from
        here. The original may never have reached one of them (refused by a daemon
        that saw another primary, a move's gaining daemon among them), and that copy
        must not outlive this one without it. StoreError (RECOVERING) if a copy
        that is still up did not take it: the client asks again.
        """
        if not self.enabled:
            return
        log.info(
            "%s: a retried update was applied here before (%s); every copy gets it whole first",
            self.node.name,
            ", ".join(f"shard {index} of tensor {key:#x}" for key, index in shards),
        )
        sent = [
            (name, self._queue(name, key, index, None))
            for key, index in shards
            for name in self.membership.backups(key, index)
        ]
        await self.wait([item for _, item in sent])
        missing = sorted({n for n, i in sent if not i.delivered and self.membership.up(n)})
        if missing:
            raise StoreError(
                Status.RECOVERING,
                f"{self.node.name} could not give {', '.join(missing)} its copy of a retried "
                "update; ask again",
            )

    async def drain(self, peer_name: str) -> None:
        """Wait until everything queued for a peer so far was delivered (or it went down)."""
        peer = self.peers.get(peer_name)
        if peer is not None and peer.queue:
            await peer.queue[-1].done.wait()

    async def flush(self) -> None:
        for name in self.peers:
            await self.drain(name)

    async def _sender(self, peer: Peer) -> None:
        while True:
            while not peer.queue:
                peer.wake = trio.Event()
                await peer.wake.wait()
            item = peer.queue[0]
            try:
                if item.commit is not None and not self.membership.ready:
                    # Applied as primary before this daemon lost its majority:
                    # another replica may have taken over since. Not sent.
                    pass
                else:
                    await self._deliver(peer, item)
                    item.delivered = True
            except Refused as exc:
                log.warning("%s: %s; dropped", self.node.name, exc)
                item.refused = True
                if self.membership.leased and item.commit is not None:
                    # Applied here as primary, refused by a copy that sees another
                    # primary (an epoch switch): this copy may hold an update no
                    # other has. Not acknowledged; caught up from the primary.
                    self._lost_why = f"{peer.node.name} refused an update it forwarded"
                    self.membership.lose()
            except PeerError as exc:
                # Keep trying while the peer is up; once it is down the
                # queue is dropped (it catches up when it returns).
                if self.membership.up(peer.node.name):
                    log.info(
                        "%s: forwarding to %s failed (%s); retrying",
                        self.node.name,
                        peer.node.name,
                        exc,
                    )
                    await trio.sleep(self.config.heartbeat / 2)
                    continue
            if peer.queue and peer.queue[0] is item:
                peer.queue.popleft()
            item.done.set()

    async def _deliver(self, peer: Peer, item: Item) -> None:
        if item.commit is not None:
            status, why = await self._send_update(peer, item.commit)
            if status == Status.OK:
                return
            if status == Status.NOT_OWNER:
                raise Refused(
                    f"{peer.node.name} refused an update to shard {item.shard} of tensor "
                    f"{item.key:#x}: {why.decode(errors='replace')}"
                )
            # The backup missed updates, or lacks the tensor: send the shard.
            log.info(
                "%s: %s answered %s to an update of shard %d of tensor %#x (%s); sending "
                "the shard whole",
                self.node.name,
                peer.node.name,
                Status(status).name,
                item.shard,
                item.key,
                why.decode(errors="replace"),
            )
        await self._send_shard(peer, item.key, item.shard)

    async def _send_update(self, peer: Peer, c: Commit) -> tuple[int, bytes]:
        """Forward one update; the peer's status and, for a refusal, why."""
        header = ReplicaUpdate(
            c.op,
            c.key,
            c.shard,
            c.offset,
            c.payload.nbytes,
            c.alpha,
            c.layout,
            c.dtype,
            produces=c.version,
            sender=self.index,
            txn=c.txn,
            group=c.group,
            steps_applied=c.steps_applied,
            stamp=c.stamp,
            pushed_by=c.pushed_by,
            pushed_step=c.pushed_step,
            held=c.held,
        ).frame(c.payload.nbytes)
        reply, text = await self.request(peer, header, [c.payload], timeout=self._budget(c.payload))
        return reply.status, text

    async def _send_shard(self, peer: Peer, key: int, index: int) -> None:
        tensor = self.store.tensors.get(key)
        shard = tensor.shards.get(index) if tensor is not None else None
        if tensor is None or shard is None:
            return  # deleted here meanwhile: nothing to send
        block = self.store.pin(shard.block)
        copied = shard.version
        try:
            body = encode_json(
                {
                    "meta": tensor.meta.to_dict(),
                    "version": shard.version,
                    "txns": [[t, v] for t, v in shard.recent.items()],
                    "steps": self.store.applied_steps(tensor, index),
                    "clocks": self.store.clocks(tensor, index),
                    "stamp": shard.stamp,
                }
            )
            data = self.store.arena.view(block, 0, shard.nbytes)
            header = ShardCopy(
                key, index, shard.version, len(body), shard.nbytes, sender=self.index
            ).frame(len(body) + shard.nbytes)
            reply, text = await self.request(peer, header, [body, data], timeout=self._budget(data))
        finally:
            self.store.unpin(block)
        if reply.status == Status.OK:
            self.copies.sent += 1
            self.copies.sent_bytes += shard.nbytes
        else:
            error = Refused if reply.status == Status.NOT_OWNER else PeerError
            raise error(
                f"{peer.node.name} refused shard {index} of {tensor.meta.name!r}: "
                f"{Status(reply.status).name}: {text.decode(errors='replace')}"
            )
        # The copy let go of the pushes the peer held for the step: send ours.
        for worker, step, held in self.store.held_on(tensor, index):
            if self.store.tensors.get(key) is not tensor:
                return  # replaced meanwhile: its own copy follows
            # Held since the copy: later ones are queued behind it.
            c = held_commit(held, worker, step, copied)
            status, _ = await self._send_update(peer, c)
            if status not in (Status.OK, Status.BEHIND):
                raise PeerError(
                    f"{peer.node.name} refused a held push of worker {worker} to shard "
                    f"{index} of {tensor.meta.name!r}: {Status(status).name}"
                )

    def _budget(self, data: np.ndarray | memoryview) -> float:
        # A peer that is up answers within the failure timeout, plus the time
        # the bytes take at a modest 100 MB/s.
        return self.config.failure_timeout + data.nbytes / 100e6

    # -- serving peers' catch-up ---------------------------------------------

    def catchup_answer(self, body: Any) -> bytes:
        """What a catching-up peer needs to know: are we ready, and what do we hold for it."""
        self._check_enabled("catch-up")
        asker = body.get("node") if isinstance(body, dict) else None
        if not self._is_peer(asker):
            raise StoreError(Status.BAD_ARGUMENT, f"catch-up from unknown node {asker!r}")
        if self.membership.leased and asker not in self.membership.registered:
            # Updates go only to registered peers: answered before this daemon sees
            # the asker's registration, the asker would miss the ones in between.
            raise StoreError(
                Status.RECOVERING,
                f"{self.node.name} does not see {asker} registered in etcd yet; ask again",
            )
        self._check_same_epoch(body, asker)
        # From now on updates are forwarded to it, so nothing falls between
        # this answer and the copies it asks for.
        self.membership.heard(asker)
        self._on_change()
        return encode_json({"ready": self.membership.ready, "shards": self.holdings_for(asker)})

    def holdings_for(self, asker: str) -> list[list[int]]:
        """[key, shard, version, crc] of every local shard ``asker`` is a replica of."""
        out = []
        for key, tensor in self.store.tensors.items():
            for index, shard in tensor.shards.items():
                if self.config.holds(asker, key, index):
                    out.append([key, index, shard.version, self.store.checksum(shard)])
        return out

    # -- catching up ----------------------------------------------------------------

    async def _catch_up(self) -> None:
        """Become current for every local shard, then announce readiness."""
        me = self.node.name
        epoch = self.config.epoch
        if epoch is not None and me not in epoch.names:
            # Registered but not in the epoch (new, or drained): it keeps no copies, so
            # it has nothing to catch up on; the steward moves some to it if it joins.
            self._drop_unkept()
            self.membership.became_ready()
            log.info("%s: not a member of epoch %d; ready to join", me, epoch.number)
            return
        announced = False
        while True:
            if not self.membership.has_quorum():
                if not announced:
                    log.info("%s: waiting for a majority of daemons before catching up", me)
                    announced = True
                await trio.sleep(RETRY_PAUSE)
                continue
            plan = await self._copy_planned()
            if plan is None:
                await trio.sleep(RETRY_PAUSE)
                continue
            fetch, drop = plan
            for key, index in drop:
                self.store.drop_shard(key, index)
            if await self._handoff():
                break
            await trio.sleep(RETRY_PAUSE)
        copied = sum(len(s) for s in fetch.values())
        log.info(
            "%s: caught up (%d shard(s) copied from replicas, %d dropped); ready",
            me,
            copied,
            len(drop),
        )

    async def _copy_planned(
        self, only: Callable[[int, int], bool] | None = None, doing: str = "catching up"
    ) -> Plan | None:
        """Plan which copies to take (``_plan``) and take them; the plan, or None (try
        again after a pause) when it could not be decided or a copy failed."""
        plan = await self._plan(only)
        if plan is None:
            return None
        try:
            for source, shards in plan[0].items():
                await self._fetch(source, shards)
        except PeerError as exc:
            log.info("%s: %s from a peer failed (%s); again", self.node.name, doing, exc)
            return None
        return plan

    async def _plan(self, only: Callable[[int, int], bool] | None = None) -> Plan | None:
        """Which shards to copy from which peer, and which to drop; None if undecidable now.
        ``only``: consider just the shards it accepts (a move's gains)."""
        me = self.node.name
        reports: dict[str, tuple[bool, dict[tuple[int, int], tuple[int, int]]]] = {}

        async def ask(name: str) -> None:
            body = encode_json({"node": me, "epoch": self._epoch_number()})
            try:
                header, data = await self.request(
                    self._peer(name),
                    Catchup().frame(len(body)),
                    [body],
                    timeout=self.config.failure_timeout + 30.0,
                )
            except PeerError:
                return
            if header.status != Status.OK:
                return
            rec = decode_json(data)
            held = {(k, s): (v, c) for k, s, v, c in rec["shards"]}
            reports[name] = (bool(rec["ready"]), held)

        async with trio.open_nursery() as nursery:
            for name in self.membership.up_peers():
                nursery.start_soon(ask, name)
        mine = {
            (key, index): (shard.version, self.store.checksum(shard))
            for key, tensor in self.store.tensors.items()
            for index, shard in tensor.shards.items()
        }
        wanted = set(mine)
        for _, held in reports.values():
            wanted |= set(held)
        fetch: dict[str, list[tuple[int, int]]] = {}
        drop: list[tuple[int, int]] = []
        for key, index in sorted(wanted):
            if only is not None and not only(key, index):
                continue
            others = [n.name for n in self.config.replicas_for(key, index) if n.name != me]
            ready = [n for n in others if n in reports and reports[n][0]]
            if ready:
                # The acting primary is current by construction (every acknowledged
                # update is on it, and it forwards what follows here): take its copy
                # and no other. A backup's may lag forwards the primary already sent
                # here, and would overwrite them. Views differing for a moment (the
                # primary's report missing, or not ready in it): decide again.
                primary = self.membership.acting_primary(key, index)
                if primary is None or primary.name not in ready:
                    return None
                src = primary.name
                theirs = reports[src][1].get((key, index))
                if theirs is None:
                    if (key, index) in mine:
                        drop.append((key, index))
                    continue
            else:
                # Nobody is serving the shard (the whole cluster is starting):
                # the highest version among all its replicas wins.
                if any(n not in reports for n in others):
                    log.info(
                        "%s: shard %d of tensor %#x waits for replica(s) %s to decide "
                        "which copy is current",
                        me,
                        index,
                        key,
                        ", ".join(n for n in others if n not in reports),
                    )
                    return None
                candidates = [(me, mine.get((key, index)))] + [
                    (n, reports[n][1].get((key, index))) for n in others
                ]
                have = [(n, r) for n, r in candidates if r is not None]
                best = max(have, key=lambda c: c[1][0])
                src, theirs = best
            if src != me and mine.get((key, index)) != theirs:
                fetch.setdefault(src, []).append((key, index))
        return fetch, drop

    async def _fetch(self, source: str, shards: list[tuple[int, int]]) -> None:
        body = encode_json(
            {
                "node": self.node.name,
                "shards": [list(s) for s in shards],
                "epoch": self._epoch_number(),
            }
        )
        total = sum(
            self.store.tensors[k].shards[s].nbytes
            for k, s in shards
            if k in self.store.tensors and s in self.store.tensors[k].shards
        )
        self._asked.add(source)
        try:
            header, data = await self.request(
                self._peer(source),
                SyncRequest().frame(len(body)),
                [body],
                timeout=self.config.failure_timeout + 30.0 + max(total, len(shards) << 22) / 100e6,
            )
        finally:
            self._asked.discard(source)
        if header.status != Status.OK:
            raise PeerError(f"{source}: {data.decode(errors='replace')}")

    async def _handoff(self) -> bool:
        """Tell every peer this daemon is ready; each first delivers what it queued for it.

        The pings say "ready", but this daemon acts on it (serves, takes
        primary role) only once every peer answered: until then the peers'
        drained queues still come from the primary they had.
        """
        self._announcing = True
        ok = True

        async def tell(name: str) -> None:
            nonlocal ok
            timeout = self.config.failure_timeout + 30.0
            peer = self.peers.get(name)  # None: it left the cluster since
            if peer is None or not await self._ping(peer, timeout=timeout, handoff=True):
                ok = ok and not self.membership.up(name)

        try:
            async with trio.open_nursery() as nursery:
                for name in self.membership.up_peers():
                    nursery.start_soon(tell, name)
        finally:
            self._announcing = False
        if not ok:
            return False
        self.membership.became_ready()
        return True

    # -- helpers for the server -----------------------------------------------------

    async def sent(self, items: list[Item]) -> None:
        """Wait until the shards queued for a sync request were delivered."""
        await self.wait(items)
        if not all(item.delivered for item in items):
            raise StoreError(
                Status.RECOVERING,
                f"{self.node.name} could not send every shard asked for; ask again",
            )

    def queue_sync_request(self, body: Any) -> list[Item]:
        """Queue the shards a peer asked for (after what was queued for it before)."""
        self._check_enabled("sync request")
        try:
            asker = body["node"]
            shards = [(int(k), int(s)) for k, s in body["shards"]]
        except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: int(1e400)
            raise StoreError(Status.BAD_ARGUMENT, "bad sync request") from None
        if not self._is_peer(asker):
            raise StoreError(Status.BAD_ARGUMENT, f"unknown node {asker!r}")
        self._check_same_epoch(body, asker)
        self.membership.heard(asker)
        return self.sync_to(asker, shards)

    def _check_same_epoch(self, body: dict, asker: str) -> None:
        """Copies go only between daemons of one epoch: under another, the asker and
        this daemon disagree on who forwards which updates to whom."""
        if self.config.etcd is None:
            return
        theirs, mine = self._epoch_of(body), self._epoch_number()
        if theirs != mine:
            raise StoreError(
                Status.RECOVERING,
                f"{self.node.name} is at epoch {mine}, {asker} at {theirs}; ask again",
            )

    def _is_peer(self, name: object) -> TypeGuard[str]:
        """Whether a name from a message body is another daemon's (a list is no name)."""
        return isinstance(name, str) and name in self.peers

    def _check_enabled(self, what: str) -> None:
        """With one copy per shard no daemon sends replication messages: refuse them.

        (Nothing would deliver the shards a sync request queues, so it would
        wait forever; a heartbeat would make a forged copy look sent by a peer.)
        """
        if not self.enabled:
            raise StoreError(
                Status.BAD_OP,
                f"{what} refused: this cluster keeps one copy of each shard (replicas = 1), "
                "so its daemons exchange no replication messages",
            )

    def check_sender(self, sender_index: int, key: int, shard: int, *, whole: bool = False) -> None:
        """Refuse a forwarded update or shard copy from a daemon that is not in charge of it.

        Taken: from a peer this daemon sees as up and ready, for a shard it
        is not the acting primary of; and while catching up, from the peer it
        asked for copies. Anything else is a stale primary's leftover.
        """
        self._check_enabled("copy")
        m = self.membership
        sender = self.sender_name(sender_index)
        if sender is None and self.config.epoch is not None:
            # A daemon this epoch left out, with updates queued from before: refused, so
            # it drops them rather than retry.
            raise StoreError(
                Status.NOT_OWNER,
                f"copy from daemon #{sender_index}, not one of epoch {self.config.epoch.number}",
            )
        if sender is None or sender == self.node.name:
            raise StoreError(Status.BAD_ARGUMENT, f"copy from unknown daemon #{sender_index}")
        if not self.config.holds(self.node.name, key, shard):
            raise StoreError(
                Status.NOT_OWNER,
                f"{self.node.name} keeps no copy of shard {shard} of tensor {key:#x}",
            )
        if not self.config.holds(sender, key, shard):
            raise StoreError(
                Status.NOT_OWNER,
                f"{sender} is not a replica of shard {shard} of tensor {key:#x}",
            )
        if not m.ready:
            if sender in self._asked or m.peer_ready(sender):
                return
            raise StoreError(
                Status.NOT_OWNER,
                f"{self.node.name} is catching up and takes copies only from ready replicas, "
                f"not {sender}",
            )
        primary = m.acting_primary(key, shard)
        if whole and m.leased and (primary is None or primary.name != sender):
            # A whole shard replaces what is here: only from the primary, whose forwards
            # this copy may already hold (a backup's copy may lag them).
            raise StoreError(
                Status.NOT_OWNER,
                f"{self.node.name} takes whole copies of shard {shard} of tensor {key:#x} "
                f"from {primary.name if primary else 'its primary'}, not {sender}",
            )
        if m.peer_ready(sender) and (primary is None or primary.name != self.node.name):
            return
        raise StoreError(
            Status.NOT_OWNER,
            f"{self.node.name} takes shard {shard} of tensor {key:#x} from "
            f"{primary.name if primary else 'no ready replica'}, not {sender}",
        )

    def install(self, copy: ShardCopy, payload: memoryview) -> None:
        """Apply a shard copy (SYNC): replace the local copy of a shard with the primary's."""
        meta_len = copy.meta_length
        try:
            rec = decode_json(payload[:meta_len])
            meta = TensorMeta.from_dict(rec["meta"])
            txns = {int(t): int(v) for t, v in rec.get("txns", [])}
            steps = [int(n) for n in rec.get("steps", [])]
            clocks = [int(n) for n in rec.get("clocks", [])]
            stamp = int(rec.get("stamp", 0))
            if not 0 <= stamp < 1 << 64:
                raise ValueError(f"stamp {stamp} is not a 64-bit id")
        except (
            ProtocolError,  # not JSON at all
            ValueError,
            KeyError,
            TypeError,
            OverflowError,  # int() of an infinite float (JSON 1e400)
        ) as exc:
            raise StoreError(Status.BAD_ARGUMENT, f"bad shard copy: {exc}") from None
        if meta.key != copy.key:
            # check_sender vetted the sender for copy.key's shard, not this one.
            raise StoreError(
                Status.BAD_ARGUMENT, "shard copy: header key does not match its tensor"
            )
        data = np.frombuffer(payload[meta_len:], dtype=np.uint8)
        self.store.install_shard(meta, copy.shard, copy.version, data, txns, steps, stamp, clocks)
        self.copies.received += 1
        self.copies.received_bytes += data.nbytes


def _nothing() -> None:
    pass


async def _gained_nowhere(number: int) -> None:
    pass
