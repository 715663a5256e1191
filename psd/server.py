"""The daemon's request loop: frames in, store calls, frames out.

Each connection is served by one task that reads a request, handles it and
answers, in order; only a read that must wait for a training step (see
``irdma.modes``) is answered later, from its own task, so the connection
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
from dataclasses import dataclass, field
from functools import partial
from time import perf_counter
from typing import ClassVar

import numpy as np
import trio

from irdma.auth import cluster_secret
from irdma.cluster import ClusterConfig, Node
from irdma.protocol import (
    ENTRY_SIZE,
    LOCATION,
    MAX_ERROR_MESSAGE,
    MAX_META_PAYLOAD,
    MAX_NAME_BYTES,
    NO_WORKER,
    PROTOCOL_VERSION,
    BatchEntry,
    Flag,
    Header,
    Op,
    ProtocolError,
    Status,
    TensorMeta,
    decode_json,
    encode_json,
    pack_entries,
    pack_response,
    unpack_entries,
)
from irdma.protocol.messages import (
    Auth,
    BadRequest,
    Catchup,
    Create,
    Delete,
    Hello,
    ListTensors,
    Ping,
    RdmaConnect,
    Read,
    ReadBatch,
    Release,
    ReplicaUpdate,
    Request,
    ShardCopy,
    Stat,
    SyncRequest,
    Update,
    UpdateBatch,
    decode_request,
)
from irdma.sizes import SMALL_REPLY, ZERO_COPY_MIN
from irdma.transport.base import StreamBroken, StreamClosed, acquire_soon
from irdma.transport.tcp import FramedSocket, to_stdlib
from irdma.transport.verbs import VerbsError

from .arena import Block
from .auth import admit
from .metrics import RequestMetrics
from .payload import RequestPayload
from .rdma import ConnectRequest, RdmaService, RdmaSession
from .replication import Replicator
from .staged import StagedMemory
from .state import StateReader
from .store import Store, StoreError
from .store import Update as StoreUpdate

log = logging.getLogger("psd")

_STAGED = int(Flag.STAGED)  # int math: enum ops are slow


def max_payload_for(config: ClusterConfig) -> int:
    """Largest request or reply payload a daemon accepts: a shard or a batch."""
    return max(config.shard_size, 64 << 20) + (1 << 20)


# Longest a read waits for a training step before it is answered NOT_READY
# (the client asks again): a waiting client still hears from its daemon well
# within its own timeout, and silent workers are checked for this often.
MAX_POLL = 1.0


@dataclass
class _Conn:
    stream: FramedSocket
    nursery: trio.Nursery
    pins: dict[int, Block] = field(default_factory=dict)
    send_lock: trio.Lock = field(default_factory=trio.Lock)
    # One-sided memory for bulk data: a same-host client attached over the
    # unix socket (shm), or an RDMA queue pair set up over this connection.
    memory: StagedMemory | None = None
    authenticated: bool = False  # the peer proved the cluster's secret (or none is set)
    # The payload of the request being dispatched (its handler reads it).
    payload: RequestPayload = field(init=False)
    deferred: bool = False  # the request in dispatch is answered later, by its own task

    @property
    def transport(self) -> str:
        return self.memory.transport if self.memory is not None else "tcp"

    async def send(self, buffers: list) -> None:
        """Send whole frames; replies from waiting reads never interleave with others."""
        await acquire_soon(self.send_lock)
        try:
            await self.stream.send_all(buffers)
        finally:
            self.send_lock.release()


class Server:
    """Serves one node's store on its configured TCP address."""

    def __init__(
        self,
        config: ClusterConfig,
        node: Node,
        store: Store,
        replicator: Replicator | None = None,
        rdma: RdmaService | None = None,
    ) -> None:
        self.config = config
        self.node = node
        self.store = store
        self.rdma = rdma
        # With a secret, every connection must authenticate first (``.auth``).
        self.secret = cluster_secret(config)
        self.replicator = replicator or Replicator(config, node, store)
        self.membership = self.replicator.membership
        self.metrics = RequestMetrics()  # counted in dispatch and where answers are sent
        self.state = StateReader(self.replicator)  # HELLO and the metrics gauges
        self.max_payload = max_payload_for(config)
        self.listen_port = node.address.port
        self.poll = min(MAX_POLL, config.timeout / 4)
        self._changed = trio.Event()
        store.on_change = self._wake

    def _wake(self) -> None:
        """Wake every read waiting for a training step; each re-checks its own condition."""
        self._changed.set()
        self._changed = trio.Event()

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
                while True:
                    try:
                        sock, peer = await listener.accept()
                    except OSError as exc:  # EMFILE and friends: back off, keep serving
                        log.warning("accept failed: %s", exc)
                        await trio.sleep(0.1)
                        continue
                    nursery.start_soon(self.handle_connection, to_stdlib(sock), _peer_name(peer))

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
                conn = _Conn(stream, nursery, memory=memory, authenticated=authenticated)
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

    async def _serve_requests(self, conn: _Conn) -> None:
        if self.secret is not None and not conn.authenticated:
            # The one gate: nothing is read or answered before the peer proves the secret.
            timeout = self.config.timeout
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

    # -- replies ------------------------------------------------------------

    async def _reply(
        self, conn: _Conn, header: Header, data: list, *, flags: int = 0, **fields: int
    ) -> None:
        if len(data) == 1:
            # One payload (a shard's bytes, a JSON answer): one buffer to send.
            view = memoryview(data[0])
            length = view.nbytes
            frame = pack_response(header, 0, length, flags, fields.get("version"))
            buffers = [frame + view] if length <= SMALL_REPLY else [frame, view]
        else:
            length = sum(memoryview(d).nbytes for d in data)
            buffers = [pack_response(header, 0, length, flags, fields.get("version")), *data]
        self.metrics.series(header.op, conn.transport).sent += length
        await conn.send(buffers)

    async def _error(self, conn: _Conn, header: Header, status: Status, message: str) -> None:
        # Messages quote what the peer sent, which may hold a lone surrogate
        # (JSON "\ud800"): plain encode() raised UnicodeEncodeError here.
        data = message.encode(errors="backslashreplace")[:MAX_ERROR_MESSAGE]
        frame = pack_response(header, int(status), len(data))
        self.metrics.series(header.op, conn.transport).sent += len(data)
        self.metrics.error(header.op, status)
        await conn.send([frame + data])

    # -- dispatch -----------------------------------------------------------

    async def dispatch(self, conn: _Conn, header: Header) -> bool:
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

    async def _dispatch(self, conn: _Conn, header: Header) -> bool:
        if header.proto != PROTOCOL_VERSION:
            await self._error(
                conn,
                header,
                Status.BAD_VERSION,
                f"protocol version {header.proto} not supported (daemon speaks {PROTOCOL_VERSION})",
            )
            return False
        if header.is_response:
            await self._error(conn, header, Status.BAD_FRAME, "expected a request, got a response")
            return False
        if header.length > self.max_payload:
            await self._error(
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
                raise StoreError(exc.status, exc.message) from None
            except KeyError:
                # ATTACH, say, is the shm handshake's first frame: not a request
                # on a connection already serving them.
                raise StoreError(
                    Status.BAD_OP, f"op {Op(header.op).name} is not served here"
                ) from None
            await handler(self, conn, header, msg)
        except StoreError as exc:
            # A refused request's unread payload is skipped before the answer.
            await payload.skip_rest()
            await self._error(conn, header, exc.status, exc.message)
        else:
            await payload.skip_rest()
        return True

    # -- replication gates ----------------------------------------------------

    def _check_ready(self) -> None:
        """Client data requests need a daemon that is current and in the majority."""
        m = self.membership
        if not m.replicated:
            return
        if not m.ready:
            raise StoreError(
                Status.RECOVERING,
                f"{self.node.name} is catching up from its replicas; ask another replica",
            )
        if not m.has_quorum():
            raise StoreError(
                Status.NO_QUORUM,
                f"{self.node.name} cannot reach a majority of the cluster "
                f"({self.config.quorum} of {len(self.config.nodes)} daemons)",
            )

    def _check_primary(self, key: int, shard: int) -> None:
        """Updates are applied by the shard's acting primary only."""
        self._check_ready()
        if not self.membership.replicated:
            return
        primary = self.membership.acting_primary(key, shard)
        if primary is None or primary.name != self.node.name:
            where = primary.name if primary is not None else "none ready"
            raise StoreError(
                Status.NOT_OWNER,
                f"{self.node.name} is not the primary of shard {shard} (primary: {where})",
            )

    def _behind(self, key: int, index: int, seen: int, have: int) -> bool:
        """True when this copy lacks an update the client saw acknowledged.

        The shard's acting primary is never behind: it applied every
        acknowledged update, so a client that saw more saw an older tensor
        of the same name (recreated since), and follows this one.
        """
        if seen <= have:
            return False
        primary = self.membership.acting_primary(key, index)
        return primary is None or primary.name != self.node.name

    def _check_fresh(self, key: int, version: int, have: int, index: int) -> None:
        if self._behind(key, index, version, have):
            raise StoreError(
                Status.BEHIND,
                f"{self.node.name} has shard {index} at version {have}, the client saw "
                f"{version} acknowledged",
            )

    def _forward(self) -> list:
        """Queue what was just applied for the backups (call with no await in between)."""
        commits = self.store.take_commits()
        return self.replicator.forward(commits) if commits else []

    async def _payload_json(self, conn: _Conn, limit: int = MAX_META_PAYLOAD):
        length = conn.payload.left
        if length > limit:
            raise StoreError(Status.TOO_LARGE, f"metadata of {length} bytes over {limit}")
        data = await conn.payload.read_bytes(length)
        try:
            return decode_json(data)
        except ProtocolError as exc:
            raise StoreError(Status.BAD_ARGUMENT, str(exc)) from None

    @staticmethod
    def _no_payload(conn: _Conn, msg: Request) -> None:
        if conn.payload.left:
            raise StoreError(Status.BAD_FRAME, f"op {msg.op.name} takes no payload")

    async def _hello(self, conn: _Conn, header: Header, msg: Hello) -> None:
        # Any payload is ignored (skipped by dispatch).
        # node, version, protocol, pid, ready, tensors, shards, arena, snapshot,
        # replication: see state.DaemonState.hello.
        info = self.state.read().hello() | {
            "shard_size": self.config.shard_size,
            "max_payload": self.max_payload,
            "view": self.membership.describe(),
        }
        await self._reply(conn, header, [encode_json(info)])

    async def _create(self, conn: _Conn, header: Header, msg: Create) -> None:
        raw = await self._payload_json(conn)
        try:
            meta = TensorMeta.from_dict(raw)
        except ValueError as exc:
            raise StoreError(Status.BAD_ARGUMENT, f"bad tensor metadata: {exc}") from None
        if meta.key != msg.key:
            raise StoreError(Status.BAD_ARGUMENT, "header key does not match the tensor name")
        tensor, created = self.store.create(meta, replace=msg.replace, exclusive=msg.exclusive)
        info = self.store.info(tensor) | {"created": created}
        await self._reply(conn, header, [encode_json(info)], version=tensor.version)

    async def _delete(self, conn: _Conn, header: Header, msg: Delete) -> None:
        self._no_payload(conn, msg)
        self.store.delete(msg.key)
        await self._reply(conn, header, [])

    async def _stat(self, conn: _Conn, header: Header, msg: Stat) -> None:
        self._no_payload(conn, msg)
        tensor = self.store.get(msg.key)
        info = self.store.info(tensor) | {"node": self.node.name}
        await self._reply(conn, header, [encode_json(info)], version=tensor.version)

    async def _list(self, conn: _Conn, header: Header, msg: ListTensors) -> None:
        if conn.payload.left > MAX_NAME_BYTES:
            raise StoreError(Status.BAD_ARGUMENT, "list prefix is too long")
        raw = await conn.payload.read_bytes(conn.payload.left)
        try:
            prefix = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise StoreError(Status.BAD_ARGUMENT, "list prefix is not UTF-8") from None
        data = encode_json(self.store.list(prefix))
        if len(data) > MAX_META_PAYLOAD:
            raise StoreError(Status.TOO_LARGE, "listing is too large; use a longer prefix")
        await self._reply(conn, header, [data])

    async def _read(self, conn: _Conn, header: Header, msg: Read) -> None:
        self._no_payload(conn, msg)
        self._check_ready()
        if msg.worker != NO_WORKER and self.store.waits_for(
            msg.key, msg.shard, msg.worker, msg.step, msg.layout
        ):
            conn.deferred = True
            conn.nursery.start_soon(
                self._wait_then,
                conn,
                header,
                msg,
                {msg.key: [msg.shard]},
                partial(self._read_now, conn, header, msg),
            )
            return
        await self._read_now(conn, header, msg)

    async def _wait_then(
        self,
        conn: _Conn,
        header: Header,
        msg: Read | ReadBatch,
        shards: dict[int, list[int]],
        answer: Callable[[], Awaitable[None]],
    ) -> None:
        """Answer a read once its training step is reached, or NOT_READY after ``poll``.

        Runs in its own task, so the connection serves other requests
        (the pushes this read may be waiting for among them) meanwhile.
        ``shards`` maps tensor keys to the shards the read waits on.
        """
        started = perf_counter()
        try:
            try:
                if await self._wait_for_step(msg.worker, msg.step, shards):
                    await answer()
                else:
                    await self._error(
                        conn,
                        header,
                        Status.NOT_READY,
                        f"step {msg.step} not reached within {self.poll:g} s; ask again",
                    )
            except StoreError as exc:
                await self._error(conn, header, exc.status, exc.message)
        except (StreamBroken, StreamClosed):
            pass  # the connection task notices and cleans up
        finally:
            self.metrics.series(header.op, conn.transport).observe(perf_counter() - started)

    def _still_waiting(self, worker: int, step: int, shards: dict[int, list[int]]) -> bool:
        return any(
            self.store.waits_for(key, s, worker, step) for key, ss in shards.items() for s in ss
        )

    async def _wait_for_step(self, worker: int, step: int, shards: dict[int, list[int]]) -> bool:
        """Wait until no shard's read waits for anyone; False if ``poll`` ran out first.

        When it runs out, workers silent past the mode's timeout are
        reported (StoreError WORKER_LOST) or evicted, per the mode.
        """
        with trio.move_on_after(self.poll):
            while True:
                changed = self._changed
                if not self._still_waiting(worker, step, shards):
                    return True
                await changed.wait()
        for key, ss in shards.items():
            for s in ss:
                lost = self.store.expire(key, s, worker, step)
                self._forward()  # a step applied without the evicted workers
                if lost:
                    log.warning(
                        "%s: evicted silent worker(s) %s from tensor %s",
                        self.node.name,
                        lost,
                        self.store.tensors[key].meta.name,
                    )
        return not self._still_waiting(worker, step, shards)

    async def _read_now(self, conn: _Conn, header: Header, msg: Read) -> None:
        shard, view = self.store.read_view(
            msg.key, msg.shard, msg.offset, msg.size, msg.layout, msg.dtype
        )
        self._check_fresh(msg.key, msg.min_version, shard.version, shard.index)
        if msg.wire:
            # Narrowed: new bytes, sent inline (nothing in the arena to map or pin).
            narrowed = self.store.read_narrowed(msg.key, msg.offset, view, msg.wire)
            await self._reply(conn, header, [narrowed], version=shard.version)
            return
        block = self.store.pin(shard.block)
        rid = msg.request_id
        if conn.memory is not None and msg.size >= conn.memory.mapped_min and rid not in conn.pins:
            # Same host: say where the bytes are; the pin keeps them there
            # (an update writes a new block) until the client's RELEASE.
            conn.pins[rid] = block
            where = LOCATION.pack(block.offset + msg.offset)
            flags = Flag.PINNED | Flag.MAPPED
            frame = pack_response(header, 0, len(where), flags, shard.version)
            self.metrics.series(msg.op, conn.transport).sent += msg.size
            await conn.send([frame, where])
            return
        if msg.size >= ZERO_COPY_MIN and rid not in conn.pins:
            # The kernel keeps referring to these pages until the client has
            # received them; the pin holds the block until it says RELEASE.
            conn.pins[rid] = block
            frame = pack_response(header, 0, msg.size, Flag.PINNED, shard.version)
            self.metrics.series(msg.op, conn.transport).sent += msg.size
            await acquire_soon(conn.send_lock)
            try:
                await conn.stream.send_all([frame])
                await conn.stream.sendfile(self.store.arena.fd, block.offset + msg.offset, msg.size)
            finally:
                conn.send_lock.release()
            return
        try:
            await self._reply(conn, header, [view], version=shard.version)
        finally:
            self.store.unpin(block)

    async def _release(self, conn: _Conn, header: Header, msg: Release) -> None:
        block = conn.pins.pop(msg.request_id, None)
        if block is not None:
            self.store.unpin(block)

    async def _receive_update(
        self, conn: _Conn, msg: Update | ReplicaUpdate, *, wire: int = 0, staged: bool = False
    ) -> StoreUpdate:
        """Validate an update and take in its payload (inline or STAGED); not applied yet."""
        location = await self._staged_location(conn) if staged else None
        update = self.store.begin_update(
            msg.op,
            msg.key,
            msg.shard,
            msg.offset,
            msg.size,
            alpha=msg.alpha,
            layout=msg.layout,
            dtype=msg.dtype,
            wire=wire,
        )
        try:
            landing = update.landing
            if location is None:
                if conn.payload.left != len(landing):
                    raise StoreError(
                        Status.BAD_FRAME,
                        f"payload is {conn.payload.left} bytes but the op covers {len(landing)}",
                    )
                await conn.payload.read_into(landing)
            else:
                assert conn.memory is not None
                conn.memory.read_staged(location, len(landing), landing)
                self.metrics.series(msg.op, conn.transport).received += len(landing)
            self.store.received(update)
        except BaseException:
            self.store.abort(update)
            raise
        return update

    async def _update(self, conn: _Conn, header: Header, msg: Update) -> None:
        self._check_primary(msg.key, msg.shard)
        update = await self._receive_update(conn, msg, wire=msg.wire, staged=msg.staged)
        update.txn = msg.txn
        # The connection was idle while the payload came in: check again.
        try:
            self._check_primary(msg.key, msg.shard)
        except StoreError:
            self.store.abort(update)
            raise
        version, retried = self._apply_once(update, msg.worker, msg.step)
        await self.replicator.wait(self._forward())
        if retried:
            await self.replicator.flush()
        await self._reply(conn, header, [], version=version)

    async def _replica_update(self, conn: _Conn, header: Header, msg: ReplicaUpdate) -> None:
        self.replicator.check_sender(msg.sender, msg.key, msg.shard)
        update = await self._receive_update(conn, msg)
        update.txn = msg.txn
        try:
            # The view may have moved while the payload came in.
            self.replicator.check_sender(msg.sender, msg.key, msg.shard)
        except StoreError:
            self.store.abort(update)
            raise
        version = self.store.commit_replica(update, msg.produces)
        await self._reply(conn, header, [], version=version)

    def _apply_once(self, update: Update, worker: int, step: int) -> tuple[int, bool]:
        """Apply a client's update unless its txn was applied before: (version, was a retry).

        A retry is not applied twice; its caller answers it only after
        ``replicator.flush()``, once the backups surely have the original.
        """
        done = self.store.applied(update)
        if done is not None:
            self.store.abort(update)
            return done, True
        return self.store.push(update, worker, step), False

    async def _staged_location(self, conn: _Conn) -> int:
        """Where a STAGED update's data sits in the client's staging memory."""
        if conn.memory is None or conn.payload.left != LOCATION.size:
            raise StoreError(
                Status.BAD_FRAME,
                "STAGED data needs a shm or rdma connection and an 8-byte location"
                if conn.memory is None
                else f"STAGED location is {conn.payload.left} bytes, not {LOCATION.size}",
            )
        (offset,) = LOCATION.unpack(await conn.payload.read_bytes(LOCATION.size))
        return offset

    async def _batch_entries(self, conn: _Conn, msg: ReadBatch | UpdateBatch) -> list[BatchEntry]:
        need = msg.count * ENTRY_SIZE
        if need > conn.payload.left:
            raise StoreError(Status.BAD_FRAME, f"{msg.count} entries need {need} bytes of payload")
        return unpack_entries(await conn.payload.read_bytes(need), msg.count)

    async def _read_batch(self, conn: _Conn, header: Header, msg: ReadBatch) -> None:
        entries = await self._batch_entries(conn, msg)
        if conn.payload.left:
            raise StoreError(Status.BAD_FRAME, "a read batch carries only its entries")
        self._check_ready()
        if msg.worker != NO_WORKER:
            # One training step for the whole batch: wait on the entries that
            # wait (all belong to tensors of one model, pulled together).
            waiting: dict[int, list[int]] = {}
            for e in entries:
                if self._entry_waits(msg, e):
                    waiting.setdefault(e.key, []).append(e.shard)
            if waiting:
                answer = partial(self._read_batch_now, conn, header, msg, entries)
                conn.deferred = True
                conn.nursery.start_soon(self._wait_then, conn, header, msg, waiting, answer)
                return
        await self._read_batch_now(conn, header, msg, entries)

    def _entry_waits(self, msg: ReadBatch, e: BatchEntry) -> bool:
        try:
            return bool(self.store.waits_for(e.key, e.shard, msg.worker, msg.step))
        except StoreError as exc:
            if exc.status == Status.NOT_FOUND:
                return False  # answered per entry by the read
            raise

    async def _read_batch_now(
        self, conn: _Conn, header: Header, msg: ReadBatch, entries: list[BatchEntry]
    ) -> None:
        answers: list[BatchEntry] = []
        views = []
        blocks: list[Block] = []
        total = len(entries) * ENTRY_SIZE
        try:
            for e in entries:
                try:
                    shard, view = self.store.read_view(
                        e.key, e.shard, e.offset, self._entry_range(msg.wire, e), dtype=e.dtype
                    )
                    if msg.wire:
                        view = self.store.read_narrowed(e.key, e.offset, view, msg.wire)
                except StoreError as exc:
                    answers.append(BatchEntry(e.key, e.shard, e.offset, 0, status=exc.status))
                    continue
                if self._behind(e.key, e.shard, e.version, shard.version):
                    answers.append(BatchEntry(e.key, e.shard, e.offset, 0, status=Status.BEHIND))
                    continue
                total += len(view)
                if total > self.max_payload:
                    raise StoreError(
                        Status.TOO_LARGE, f"batch answer over the {self.max_payload} byte limit"
                    )
                if not msg.wire:
                    blocks.append(self.store.pin(shard.block))
                views.append(view)
                answers.append(BatchEntry(e.key, e.shard, e.offset, e.length, shard.version))
            await self._reply(conn, header, [pack_entries(answers), *views])
        finally:
            for block in blocks:
                self.store.unpin(block)

    def _entry_range(self, wire: int, e: BatchEntry) -> int:
        """The tensor bytes a batch entry covers: its length, or more if narrowed.

        With a wire dtype an entry's length counts wire bytes (what follows
        it in the frame), so a frame can be cut without knowing the tensor.
        """
        return self.store.stored_nbytes(e.key, wire, e.length) if wire else e.length

    async def _update_batch(self, conn: _Conn, header: Header, msg: UpdateBatch) -> None:
        op = msg.single
        entries = await self._batch_entries(conn, msg)
        if sum(e.length for e in entries) != conn.payload.left:
            raise StoreError(Status.BAD_FRAME, "batch entry lengths do not add up to the payload")
        # Receive everything before applying anything: a batch cut short by a
        # broken connection changes nothing.
        updates: list[Update | StoreError] = []
        try:
            for e in entries:
                try:
                    self._check_primary(e.key, e.shard)
                    upd = self.store.begin_update(
                        op,
                        e.key,
                        e.shard,
                        e.offset,
                        self._entry_range(msg.wire, e),
                        alpha=e.alpha,
                        dtype=e.dtype,
                        wire=msg.wire,
                    )
                except StoreError as exc:
                    await conn.payload.skip(e.length)  # this entry is refused, not the batch
                    updates.append(exc)
                    continue
                updates.append(upd)
                await conn.payload.read_into(upd.landing)
                self.store.received(upd)
        except BaseException:
            for u in updates:
                if isinstance(u, Update):
                    self.store.abort(u)
            raise
        answers = []
        retried = False
        for i, (e, u) in enumerate(zip(entries, updates, strict=True)):
            if isinstance(u, StoreError):
                answers.append(BatchEntry(e.key, e.shard, e.offset, 0, status=u.status))
                continue
            # Entry i of a batch has update id txn + i (the same on a retry).
            u.txn = (msg.txn + i) % (1 << 64) if msg.txn else 0
            try:
                self._check_primary(e.key, e.shard)
                version, again = self._apply_once(u, msg.worker, msg.step)
                retried = retried or again
            except StoreError as exc:
                self.store.abort(u)
                answers.append(BatchEntry(e.key, e.shard, e.offset, 0, status=exc.status))
                continue
            answers.append(BatchEntry(e.key, e.shard, e.offset, e.length, version))
        await self.replicator.wait(self._forward())
        if retried:
            await self.replicator.flush()
        await self._reply(conn, header, [pack_entries(answers)])

    # -- replication ops ------------------------------------------------------

    async def _ping(self, conn: _Conn, header: Header, msg: Ping) -> None:
        body = await self._payload_json(conn)
        answer = await self.replicator.received_ping(body)
        await self._reply(conn, header, [answer])

    async def _catchup(self, conn: _Conn, header: Header, msg: Catchup) -> None:
        body = await self._payload_json(conn)
        await self._reply(conn, header, [self.replicator.catchup_answer(body)])

    async def _sync_request(self, conn: _Conn, header: Header, msg: SyncRequest) -> None:
        body = await self._payload_json(conn)
        await self.replicator.serve_sync_request(body)
        await self._reply(conn, header, [])

    async def _sync(self, conn: _Conn, header: Header, msg: ShardCopy) -> None:
        length = conn.payload.left
        if msg.meta_length > MAX_META_PAYLOAD or msg.meta_length + msg.size != length:
            raise StoreError(Status.BAD_FRAME, "shard copy: lengths do not add up")
        self.replicator.check_sender(msg.sender, msg.key, msg.shard)
        staging = self.store.reserve(length)
        try:
            if staging is None:  # arena full: the copy waits in process memory
                buf = np.empty(length, dtype=np.uint8)
            else:
                buf = self.store.arena.view(staging, 0, length)
            await conn.payload.read_into(buf)
            self.replicator.check_sender(msg.sender, msg.key, msg.shard)
            self.replicator.install(msg, memoryview(buf))
        finally:
            if staging is not None:
                self.store.arena.free(staging)
        await self._reply(conn, header, [], version=msg.version)

    async def _rdma_connect(self, conn: _Conn, header: Header, msg: RdmaConnect) -> None:
        raw = await self._payload_json(conn)
        if self.rdma is None:
            raise StoreError(Status.BAD_OP, f"{self.node.name} serves no RDMA (see its log)")
        if conn.memory is not None:
            raise StoreError(Status.BAD_ARGUMENT, f"connection already uses {conn.transport}")
        try:
            request = ConnectRequest.parse(raw)
        except ValueError as exc:
            raise StoreError(Status.BAD_ARGUMENT, str(exc)) from None
        try:
            session, answer = self.rdma.accept(request, conn.stream.peer)
        except VerbsError as exc:
            log.warning("%s: RDMA setup for %s failed: %s", self.node.name, conn.stream.peer, exc)
            raise StoreError(Status.BAD_ARGUMENT, f"RDMA setup failed: {exc}") from None
        conn.memory = session
        await self._reply(conn, header, [encode_json(answer)])

    async def _auth(self, conn: _Conn, header: Header, msg: Auth) -> None:
        """AUTH past the gate: this daemon has no secret, or the connection passed already."""
        if self.secret is None:
            raise StoreError(
                Status.AUTH_FAILED,
                f"{self.node.name} has no secret_file in its config, so it cannot prove it "
                "belongs to the cluster; give every daemon and client the same secret_file",
            )
        raise StoreError(Status.AUTH_FAILED, "this connection is authenticated already")

    # One handler per message kind (irdma.protocol.messages).
    _handlers: ClassVar[dict[type, Callable[..., Awaitable[None]]]] = {
        Auth: _auth,
        Hello: _hello,
        Create: _create,
        Delete: _delete,
        ListTensors: _list,
        Stat: _stat,
        Read: _read,
        Update: _update,
        ReplicaUpdate: _replica_update,
        ReadBatch: _read_batch,
        UpdateBatch: _update_batch,
        Release: _release,
        Ping: _ping,
        Catchup: _catchup,
        SyncRequest: _sync_request,
        ShardCopy: _sync,
        RdmaConnect: _rdma_connect,
    }


def _peer_name(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
