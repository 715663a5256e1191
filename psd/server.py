"""The daemon's request loop: frames in, decoded to messages, dispatched, frames out.

The handlers live by role: ``meta_ops`` (tensors' metadata, set-up),
``data_ops`` (reads, writes, accumulates), ``peer_ops`` (replication), with
the gates a data request passes in ``admission``; this module listens,
authenticates, decodes and dispatches.

Each connection is served by one task that reads a request, handles it and
answers, in order; only a read that must wait for a training step (see
``irdma.training.modes``) is answered later, from its own task, so the connection
goes on meanwhile. A request the daemon refuses gets an error status and the
connection goes on; a frame that cannot be trusted (bad magic, another
protocol version, an oversized payload) gets an answer where one can be
sent and the connection is closed. Nothing a peer sends can crash the daemon
or change a tensor unless the request is valid.
"""

from __future__ import annotations

import logging
import socket as stdsocket
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any

import trio

from irdma.auth import cluster_secret
from irdma.cluster import ClusterConfig, ConfigInForce, Node
from irdma.cluster.epochs import epoch_tag
from irdma.protocol import (
    PROTOCOL_VERSION,
    Flag,
    Header,
    Op,
    ProtocolError,
    Status,
)
from irdma.protocol.directory import SERVING_REFRESH
from irdma.protocol.messages import (
    Auth,
    BadRequest,
    Catchup,
    Create,
    Delete,
    Diff,
    Hello,
    Lease,
    ListTensors,
    Ping,
    RdmaConnect,
    Read,
    ReadBatch,
    Release,
    Rename,
    ReplicaUpdate,
    ShardCopy,
    Stat,
    SyncRequest,
    Update,
    UpdateBatch,
    decode_request,
)
from irdma.transport.base import StreamBroken, StreamClosed
from irdma.transport.tcp import FramedSocket, to_stdlib

from .admission import Admission
from .auth import admit
from .conn import Conn, Replies
from .data_ops import DataOps
from .diff_ops import DiffOps
from .errors import Refusal
from .lease_ops import LeaseOps
from .membership import MembershipListener
from .meta_ops import MetaOps
from .metrics import RequestMetrics
from .payload import RequestPayload
from .peer_ops import PeerOps
from .rdma import RdmaService, RdmaSession
from .replication import Replicator
from .replication.following import EpochListener
from .staged import StagedMemory
from .state import StateReader
from .store import Store

log = logging.getLogger("psd")

_STAGED = int(Flag.STAGED)  # int math: enum ops are slow


def max_payload_for(config: ClusterConfig) -> int:
    """Largest request or reply payload a daemon accepts: a shard or a batch."""
    return max(config.shard_size, 64 << 20) + (1 << 20)


# Longest a read waits for a training step before it is answered NOT_READY
# (the client asks again): a waiting client still hears from its daemon well
# within its own timeout, and silent workers are checked for this often.
MAX_POLL = 1.0


class Server(MembershipListener, EpochListener):
    """Serves one node's store on its configured TCP address."""

    def __init__(
        self,
        in_force: ConfigInForce,
        node: Node,
        store: Store,
        replicator: Replicator | None = None,
        rdma: RdmaService | None = None,
    ) -> None:
        self.in_force = in_force
        config = in_force.config
        self.node = node
        self.store = store
        self.rdma = rdma
        # With a secret, every connection must authenticate first (``.auth``).
        self.secret = cluster_secret(config)
        self.replicator = replicator or Replicator(in_force, node, store)
        self.membership = self.replicator.membership
        self.metrics = RequestMetrics()  # counted in dispatch and where answers are sent
        self.state = StateReader(self.replicator)  # HELLO and the metrics gauges
        self.max_payload = max_payload_for(config)
        self.listen_port = node.address.port
        replies = Replies(self.metrics)
        self.replies = replies
        admission = Admission(in_force, node, self.membership)
        self._admission = admission
        # The directory says at once when this daemon serves, and what.
        self.membership.listen(self)
        self.replicator.epochs.listen(self)
        poll = min(MAX_POLL, config.timeout / 4)
        data = DataOps(
            node,
            store,
            admission,
            self.replicator.forwarding,
            replies,
            self.metrics,
            poll=poll,
            max_payload=self.max_payload,
        )
        meta = MetaOps(
            in_force,
            node,
            store,
            self.state,
            self.membership,
            replies,
            max_payload=self.max_payload,
            rdma=rdma,
            secret=self.secret,
        )
        peers = PeerOps(store, self.replicator, replies, data)
        self.leases = LeaseOps(store, replies)
        diffs = DiffOps(store, replies)
        # One handler per message kind (irdma.protocol.messages); each role in its module.
        self._handlers: dict[type, Callable[[Conn, Header, Any], Awaitable[None]]] = {
            Auth: meta.auth,
            Hello: meta.hello,
            Create: meta.create,
            Delete: meta.delete,
            ListTensors: meta.list,
            Stat: meta.stat,
            Rename: meta.rename,
            RdmaConnect: meta.rdma_connect,
            Read: data.read,
            Update: data.update,
            ReadBatch: data.read_batch,
            UpdateBatch: data.update_batch,
            Release: data.release,
            Lease: self.leases.lease,
            Diff: diffs.diff,
            ReplicaUpdate: peers.replica_update,
            Ping: peers.ping,
            Catchup: peers.catchup,
            SyncRequest: peers.sync_request,
            ShardCopy: peers.sync,
        }

    # -- listening ----------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        addr = self.node.address
        infos = await trio.socket.getaddrinfo(addr.host, addr.port, type=stdsocket.SOCK_STREAM)
        family, type_, proto, _, sockaddr = infos[0]
        listener = trio.socket.socket(family, type_, proto)
        with listener:
            listener.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_REUSEADDR, 1)
            await listener.bind(sockaddr)
            listener.listen(128)
            self.listen_port = listener.getsockname()[1]
            log.info("%s listening on %s", self.node.name, addr)
            task_status.started(self.listen_port)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._publish_serving)
                nursery.start_soon(self.leases.run)
                while True:
                    try:
                        sock, peer = await listener.accept()
                    except OSError as exc:  # EMFILE and friends: back off, keep serving
                        log.warning("accept failed: %s", exc)
                        await trio.sleep(0.1)
                        continue
                    nursery.start_soon(self.handle_connection, to_stdlib(sock), _peer_name(peer))

    async def _publish_serving(self) -> None:
        """Keep the directory's serving word to what this daemon's own gates say,
        so one-sided readers ask it (and are refused) whenever it would refuse.

        Rewritten at once when catch-up ends (a client told "ready" by HELLO
        finds the word set), and every ``SERVING_REFRESH`` for what time
        changes (a majority no longer heard)."""
        while True:
            self._refresh_serving()
            if not self.in_force.config.replicated:
                return  # always ready: nothing changes
            await trio.sleep(SERVING_REFRESH)

    def became_ready(self) -> None:
        """Caught up (``MembershipListener``): serving now."""
        self._refresh_serving()

    def epoch_adopted(self) -> None:
        """A newer epoch is in force (``EpochListener``): what this daemon serves changed."""
        self._refresh_serving()

    def _refresh_serving(self) -> None:
        try:
            self._admission.check_ready()
        except Refusal:
            self.store.directory.set_serving(False)
        else:
            self.store.directory.set_serving(True)

    def _check_epoch(self, header: Header) -> None:
        """A client request routed with another epoch is refused with this daemon's
        (the client takes it and routes again); none yet: not serving."""
        epoch = self.in_force.config.epoch
        if epoch is None:
            raise Refusal(
                Status.RECOVERING, f"{self.node.name} has not read the cluster's epoch yet"
            )
        if header.epoch != epoch_tag(epoch.number):
            raise Refusal(Status.STALE_EPOCH, epoch.to_json().decode())

    async def handle_connection(
        self,
        sock: stdsocket.socket,
        peer: str,
        memory: StagedMemory | None = None,
        *,
        authenticated: bool = False,
    ) -> None:
        """Serve one connection; ``authenticated`` if its peer proved the secret already."""
        stream = FramedSocket(sock, peer)
        try:
            async with trio.open_nursery() as nursery:
                conn = Conn(stream, nursery, memory=memory, authenticated=authenticated)
                try:
                    await self._serve_requests(conn)
                except (StreamBroken, StreamClosed) as exc:
                    # Caught here, before the nursery wraps it in a group: a
                    # peer that hung up is routine, not an internal error.
                    log.info("connection from %s ended: %s", peer, exc)
                finally:
                    nursery.cancel_scope.cancel()  # reads still waiting go with the connection
        except Exception:
            log.exception("closing connection from %s after an internal error", peer)
        finally:
            for block in conn.pins.values():
                self.store.unpin(block)
            conn.pins.clear()
            stream.close()
            if isinstance(conn.memory, RdmaSession):
                conn.memory.close()

    async def _serve_requests(self, conn: Conn) -> None:
        if self.secret is not None and not conn.authenticated:
            # The one gate: nothing is read or answered before the peer proves the secret.
            timeout = self.in_force.config.timeout
            if not await admit(conn.stream, self.secret, self.node.name, timeout):
                return
            conn.authenticated = True
        while True:
            try:
                header = await conn.stream.recv_header()
            except ProtocolError as exc:
                log.warning("closing connection from %s: garbage frame: %s", conn.stream.peer, exc)
                return
            if header is None:
                return
            if not await self.dispatch(conn, header):
                return

    # -- dispatch -----------------------------------------------------------

    async def dispatch(self, conn: Conn, header: Header) -> bool:
        """Handle one request; return False when the connection must close.

        Every request is counted here, by op and transport: the request, the
        payload bytes that came with it, its latency (a read waiting for a
        training step is timed by ``_wait_then``, which answers it). Answers
        count their bytes and error statuses where they are sent.
        """
        series = self.metrics.series(header.op, conn.transport)
        series.requests += 1
        # Larger ones are refused unread; a STAGED write counts its staged bytes (in _update).
        if header.length <= self.max_payload and not header.flags & _STAGED:
            series.received += header.length
        started = perf_counter()
        conn.deferred = False
        try:
            return await self._dispatch(conn, header)
        finally:
            if not conn.deferred:
                series.observe(perf_counter() - started)

    async def _dispatch(self, conn: Conn, header: Header) -> bool:
        if header.proto != PROTOCOL_VERSION:
            await self.replies.error(
                conn,
                header,
                Status.BAD_VERSION,
                f"protocol version {header.proto} not supported (daemon speaks {PROTOCOL_VERSION})",
            )
            return False
        if header.is_response:
            await self.replies.error(
                conn, header, Status.BAD_FRAME, "expected a request, got a response"
            )
            return False
        if header.length > self.max_payload:
            await self.replies.error(
                conn,
                header,
                Status.TOO_LARGE,
                f"payload of {header.length} bytes is over the {self.max_payload} limit",
            )
            return False
        conn.payload = payload = RequestPayload(conn.stream, header.length)
        try:
            try:
                msg = decode_request(header)
                handler = self._handlers[type(msg)]
            except BadRequest as exc:
                raise Refusal(exc.status, exc.message) from None
            except KeyError:
                # ATTACH, say, is the shm handshake's first frame: not a request
                # on a connection already serving them.
                raise Refusal(
                    Status.BAD_OP, f"op {Op(header.op).name} is not served here"
                ) from None
            if self.in_force.config.etcd is not None and type(msg) in _ROUTED:
                self._check_epoch(header)
            await handler(conn, header, msg)
        except Refusal as exc:
            # A refused request's unread payload is skipped before the answer.
            await payload.skip_rest()
            await self.replies.error(conn, header, exc.status, exc.message, exc.stamp)
        else:
            await payload.skip_rest()
        return True


# Client requests routed by placement: with etcd they must carry the daemon's epoch.
_ROUTED = frozenset(
    {Read, Update, ReadBatch, UpdateBatch, Stat, Create, Delete, Rename, ListTensors, Diff}
)


def _peer_name(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
