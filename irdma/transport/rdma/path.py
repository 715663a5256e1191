"""The rdma transport, client side: an RC queue pair next to the daemon's TCP connection.

The connection opens (and authenticates) as TCP, then asks RDMA_CONNECT:
both sides create a queue pair and exchange (QP number, PSN, GID, MTU); the
daemon adds its arena's address and read-only key and a staging area of its
arena with a write-only key for this connection alone. The client checks
the path with one small RDMA READ before it trusts it, so a wrong GID or an
unroutable peer is an error naming the cause rather than a later timeout.
Requests and answers keep travelling over TCP; the bytes do not:

- **Pulls**: the daemon answers a READ with MAPPED: where the shard's bytes
  sit in its arena, pinned (an update writes a new block; the pinned bytes
  never change, so a pull is never torn). The client RDMA READs them into
  its registered buffer, hands them to the sink, and only then sends
  RELEASE. The daemon's CPU never touches the bytes.
- **Pushes**: the client copies the payload into its registered buffer,
  RDMA WRITEs it to the same offset of its staging area in the daemon, then
  sends the request naming the offset (STAGED); the daemon applies it from
  there and answers as for any write.

Transfers larger than ``CHUNK`` are posted as a chain of work requests with
only the last one signalled; many transfers are in flight at once (one per
concurrent request, e.g. the shards of one tensor). Registration happens
once per connection: the client's buffer is sized for the staging area and
shared by pulls and pushes.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import trio

from ...protocol import (
    LOCATION,
    RDMA_ANSWER_KEYS,
    Flag,
    Header,
    Op,
    ProtocolError,
    Status,
    decode_json,
    encode_json,
)
from ...protocol.conversation import STAGEABLE, staged
from ...protocol.directory import (
    EMPTY,
    ONE_SIDED_ARCH,
    SERVING_WORD,
    SLOT,
    SLOT_BYTES,
    probe,
    slot_record,
)
from ...protocol.messages import RdmaConnect
from ...sizes import RDMA_BATCH_BYTES, RDMA_STAGING_MIN, STAGING_ALIGN
from ..base import (
    Buffer,
    ByteStream,
    MemoryStream,
    Reply,
    Sink,
    StreamBroken,
    StreamClosed,
    StreamTimeout,
    for_this_task,
)
from ..direct import TRIES as DIRECT_TRIES
from ..direct import DirectReader
from ..shm import directory_of
from ..staging import StagingArea
from ..tcp import SOCKET, FramedConnection
from ..verbs import (
    MTU_BYTES,
    WC_REMOTE_ACCESS_ERROR,
    WC_STATUS,
    Endpoint,
    NoDevice,
    PinnedBuffer,
    QpInfo,
    VerbsError,
    find_gid,
    ipv4_of,
)
from ..verbs_compat import VerbsUnavailable, comp_channel_fd

log = logging.getLogger("irdma")

MAPPED = int(Flag.MAPPED)
# Largest single work request; longer transfers are chains of these.
CHUNK = 1 << 20
SEND_DEPTH = 256
CQ_DEPTH = 2 * SEND_DEPTH
POLL_BATCH = 32
# Adaptive polling (where pyverbs does not expose the completion channel's
# fd): spin this long after the last completion, then sleep, doubling.
SPIN_SECONDS = 50e-6
SLEEP_MIN = 200e-6
SLEEP_MAX = 2e-3
PROBE_BYTES = 8
# One-sided pulls in flight per connection, each with a cell of the registered
# buffer for the directory words it READs: they do not take room from the
# staging area, which then holds whole shards for the bytes. A cell holds the
# slot (64 bytes at 0), its seq word before and after (8 bytes each at
# SEQ_BEFORE and SEQ_AFTER) and, for the first pull of a chain, the directory's
# header slot (at HEADER_AT).
SCRATCH_CELLS = 64
SCRATCH_CELL = 3 * 64
SEQ_BEFORE, SEQ_AFTER, HEADER_AT = 64, 72, 128
SEQ_BYTES = 8


class RdmaUnavailable(Exception):
    """RDMA cannot be used for this daemon here.

    ``expected`` when there simply is none (no pyverbs, no device for the
    route, a daemon without RDMA); otherwise something is wrong with a setup
    that has it (memlock, GID index, MTU, a path that does not work).
    """

    def __init__(self, reason: str, *, expected: bool = False) -> None:
        super().__init__(reason)
        self.expected = expected


class _Completions:
    """Work completions of one completion queue, waited for under trio.

    Each signalled work request gets an event; a task drains the queue and
    sets them. Any failed completion fails them all: the queue pair is in the
    error state from then on.
    """

    def __init__(self, cq: Any, channel: Any, peer: str) -> None:
        self.cq = cq
        self.channel = channel
        self.fd = comp_channel_fd(channel)
        self.peer = peer
        self._waiters: dict[int, trio.Event] = {}
        self._next_id = 1
        self._posted = trio.Event()
        self.failure: Exception | None = None
        # Set when the queue is destroyed: nothing may poll it after that.
        self.closed = False

    def expect(self) -> tuple[int, trio.Event]:
        """A fresh work request id and the event set when it completes."""
        wr_id = self._next_id
        self._next_id += 1
        event = trio.Event()
        self._waiters[wr_id] = event
        self._posted.set()
        return wr_id, event

    def forget(self, wr_id: int) -> None:
        self._waiters.pop(wr_id, None)

    def fail(self, exc: Exception) -> None:
        if self.failure is None:
            self.failure = exc
        for event in self._waiters.values():
            event.set()
        self._waiters.clear()
        self._posted.set()

    def _drain(self) -> int:
        if self.closed:
            raise StreamClosed(f"RDMA resources for {self.peer} closed")
        n, wcs = self.cq.poll(POLL_BATCH)
        for wc in wcs:
            if wc.status != 0:
                status = int(wc.status)
                reason = WC_STATUS.get(status, f"status {status}")
                if status == WC_REMOTE_ACCESS_ERROR:
                    reason += " (the daemon refused the key or address)"
                raise StreamBroken(f"RDMA transfer with {self.peer} failed: {reason}")
            event = self._waiters.pop(int(wc.wr_id), None)
            if event is not None:
                event.set()
        return n

    async def run(self) -> None:
        try:
            if self.fd is not None:
                await self._run_channel(self.fd)
            else:
                await self._run_polling()
        except Exception as exc:
            self.fail(exc)
            raise

    async def _run_polling(self) -> None:
        """Poll while work is outstanding: spin briefly, then back off to short sleeps."""
        while True:
            if not self._waiters:
                self._posted = trio.Event()
                await self._posted.wait()
                continue
            if self._drain():
                await trio.lowlevel.checkpoint()
                continue
            idle_since = trio.current_time()
            delay = SLEEP_MIN
            while self._waiters and not self._drain():
                if trio.current_time() - idle_since < SPIN_SECONDS:
                    await trio.sleep(0)
                else:
                    await trio.sleep(delay)
                    delay = min(2 * delay, SLEEP_MAX)

    async def _run_channel(self, fd: int) -> None:
        """Sleep on the completion channel's fd (rdma-core >= 57); drain on every event."""
        os.set_blocking(fd, False)
        self.cq.req_notify()
        while True:
            self._drain()
            await trio.lowlevel.wait_readable(fd)
            try:
                self.channel.get_cq_event(self.cq)
            except Exception:  # EAGAIN: woken without an event
                continue
            self.cq.ack_events(1)
            # Re-arm before draining, so a completion arriving in between still wakes us.
            self.cq.req_notify()


class _Located(Sink):
    """Holds where a MAPPED answer's bytes are; passes an inline answer to the real sink."""

    __slots__ = ("offset", "sink")

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.offset: int | None = None

    async def receive(self, stream: ByteStream, header: Header) -> None:
        await self.sink.receive(stream, header)


@dataclasses.dataclass(slots=True)
class _Remote:
    """What the daemon's RDMA_CONNECT answer gave this connection."""

    arena_addr: int
    arena_rkey: int
    arena_size: int
    staging_addr: int
    staging_rkey: int
    staging_size: int

    # Where the shard directory is in the arena (offset, slots), if the daemon has one.
    directory: tuple[int, int] | None = None

    @classmethod
    def from_answer(cls, answer: dict[str, Any]) -> _Remote:
        # Six ints for the six int fields; mypy cannot count a starred generator.
        remote = cls(*(int(answer[k]) for k in RDMA_ANSWER_KEYS[2:]))  # type: ignore[arg-type]
        remote.directory = directory_of(answer, remote.arena_size)
        return remote


class _Retry(enum.Enum):
    """A one-sided pull to send again (the shard changed or moved); an enum so
    that the type checker can tell the sentinel from an answer."""

    RETRY = enum.auto()


_RETRY = _Retry.RETRY
SEQ_WORD = struct.Struct("<Q")


def fenced(piece: tuple[int, int, int, int], fence: int) -> tuple[int, int, int, int]:
    """A work request (local, remote, length, flags) that starts once every READ
    posted before it has completed."""
    local, remote, length, flags = piece
    return local, remote, length, flags | fence


def _chunks(n: int) -> int:
    """Work requests that READ ``n`` bytes (at most CHUNK each)."""
    return max(1, -(-n // CHUNK))


@dataclasses.dataclass(eq=False, slots=True)
class _Posted:
    """A chain of work requests posted and not yet waited for."""

    wr_id: int
    done: trio.Event
    count: int  # its work requests, holding room in the send queue until waited for


@dataclasses.dataclass(eq=False, slots=True)
class _Pull:
    """One one-sided pull waiting in (or answered by) a batch of READs."""

    key: int
    layout: int
    index: int
    offset: int
    n: int
    data: int  # where its bytes land in the staging area
    cell: int  # its scratch cell: the slot read before, after, and (first of a batch) the header
    min_version: int
    slot: int = 0
    block: int = 0
    tries: int = 0
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    answer: tuple[int, int, int] | _Retry | None = None
    # Why its chain failed: always an Exception (never the loop's own Cancelled,
    # which belongs to the loop's task and would cancel the reader's scope).
    error: Exception | None = None


@dataclasses.dataclass(eq=False, slots=True)
class _Chain:
    """One-sided pulls posted as one chain of READs."""

    pulls: list[_Pull]
    posted: _Posted


class _Link:
    """The verbs side of one connection: endpoint, queue pair, buffer, completions."""

    def __init__(self, endpoint: Endpoint, staging_size: int, peer: str) -> None:
        e = endpoint.e
        self.endpoint = endpoint
        self.e = e
        self.channel = endpoint.completion_channel()
        self.cq = endpoint.completion_queue(CQ_DEPTH, self.channel)
        self.qp = endpoint.queue_pair(self.cq, SEND_DEPTH)
        # The staging area (pushes land at the same offset in the daemon's), then
        # room for the directory words one-sided pulls READ (``SCRATCH_CELLS``).
        self.buffer: PinnedBuffer = endpoint.buffer(
            staging_size + SCRATCH_CELLS * SCRATCH_CELL, e.IBV_ACCESS_LOCAL_WRITE
        )
        self.scratch = [staging_size + i * SCRATCH_CELL for i in range(SCRATCH_CELLS)]
        self.scratch_free = trio.Semaphore(SCRATCH_CELLS)
        self.local = endpoint.local_info(self.qp)
        self.completions = _Completions(self.cq, self.channel, peer)
        self.slots = trio.Semaphore(SEND_DEPTH)
        self.remote: _Remote | None = None
        self.closed = False

    async def transfer(
        self, opcode: int, local: int, remote_addr: int, rkey: int, nbytes: int, timeout: float
    ) -> None:
        """Move ``nbytes`` between ``local`` (offset in our buffer) and ``remote_addr``."""
        pieces = [
            (local + o, remote_addr + o, min(CHUNK, nbytes - o), 0) for o in range(0, nbytes, CHUNK)
        ]
        await self.chain(opcode, pieces, rkey, nbytes, timeout)

    async def chain(
        self,
        opcode: int,
        pieces: Sequence[tuple[int, int, int, int]],
        rkey: int,
        nbytes: int,
        timeout: float,
    ) -> None:
        """Post (local offset, remote address, length, send flags) work requests as one
        chain, only the last signalled (completions arrive in order, so it stands for
        the whole chain), and wait for it."""
        await self.wait(await self.post(opcode, pieces, rkey), nbytes, timeout)

    async def post(
        self, opcode: int, pieces: Sequence[tuple[int, int, int, int]], rkey: int
    ) -> _Posted:
        """Post a chain (as ``chain``) without waiting; ``wait`` for it afterwards, always
        (it gives the chain's room in the send queue back)."""
        from pyverbs.wr import SGE, SendWR

        await self.take_room(len(pieces))
        wr_id, done = self.completions.expect()
        posted = _Posted(wr_id, done, len(pieces))
        try:
            if self.closed or self.completions.failure is not None:
                raise StreamBroken(f"RDMA to {self.completions.peer}: queue pair closed or failed")
            wrs: list[Any] = []
            after = None
            # Built last to first: each names the next.
            for i, (local, remote, length, flags) in reversed(list(enumerate(pieces))):
                last = i == len(pieces) - 1
                wr = SendWR(
                    wr_id=wr_id,
                    opcode=opcode,
                    num_sge=1,
                    sg=[SGE(self.buffer.addr + local, length, self.buffer.lkey)],
                    send_flags=flags | (self.e.IBV_SEND_SIGNALED if last else 0),
                    **({"next_wr": after} if after is not None else {}),
                )
                wr.set_wr_rdma(rkey, remote)
                wrs.append(wr)
                after = wr
            try:
                self.qp.post_send(wrs[-1])
            except Exception as exc:
                raise StreamBroken(f"posting an RDMA transfer failed: {exc}") from exc
        except BaseException:
            self._done_with(posted)
            raise
        return posted

    async def take_room(self, n: int) -> None:
        """Take ``n`` places in the send queue, all or none: cancelled while it is
        full, it gives back those it took (``_done_with`` gives back the rest)."""
        taken = 0
        try:
            for _ in range(n):
                await self.slots.acquire()
                taken += 1
        except BaseException:
            for _ in range(taken):
                self.slots.release()
            raise

    async def wait(self, posted: _Posted, nbytes: int, timeout: float) -> None:
        """Wait for a posted chain to complete; raise if it failed or timed out."""
        try:
            with trio.move_on_after(timeout) as scope:
                await posted.done.wait()
            if scope.cancelled_caught:
                raise StreamTimeout(f"RDMA transfer of {nbytes} bytes took over {timeout:g} s")
            if self.completions.failure is not None:
                raise StreamBroken(str(self.completions.failure)) from self.completions.failure
        finally:
            self._done_with(posted)

    def _done_with(self, posted: _Posted) -> None:
        if posted.count:
            self.completions.forget(posted.wr_id)
            for _ in range(posted.count):
                self.slots.release()
            posted.count = 0

    def close(self) -> None:
        """Destroy the verbs resources; every later use raises instead of touching them."""
        if self.closed:
            return
        self.closed = True
        self.completions.closed = True
        self.completions.fail(StreamClosed(f"RDMA resources for {self.completions.peer} closed"))
        if self.completions.fd is not None:
            trio.lowlevel.notify_closing(self.completions.fd)
        # Queue pair first: nothing may write our buffer once it is unmapped.
        for obj in (self.qp, self.cq, self.channel):
            try:
                obj.close()
            except Exception as exc:  # closing is best effort; the process keeps going
                log.debug("closing RDMA resource: %s", exc)
        self.buffer.close()
        self.endpoint.close()


async def connect(
    host: str,
    port: int,
    nursery: trio.Nursery,
    *,
    peer: str = "",
    timeout: float = 10.0,
    secret: bytes | None = None,
    staging_size: int = RDMA_STAGING_MIN,
    gid_index: int | None = None,
    mtu: int | None = None,
    required: bool = False,
    quiet: bool = False,
) -> FramedConnection:
    """Open the TCP connection, then move its bulk data to RDMA (``RdmaPath``).

    Where RDMA cannot be had, or fails to set up (the reason is in one log
    line), the connection keeps its socket path: this one, or a new one when
    the daemon had already attached RDMA to it. With ``required`` it raises
    StreamBroken naming the reason instead. ``quiet``: RDMA was only tried
    because it might be there, so its plain absence is logged at debug level.
    """
    conn = await FramedConnection.open(
        host, port, nursery, peer=peer, timeout=timeout, secret=secret
    )
    path = RdmaPath(conn.stream.peer, timeout)
    try:
        await path.attach(conn, staging_size, gid_index, mtu)
    except RdmaUnavailable as exc:
        peer = conn.stream.peer
        if required:
            await conn.aclose()
            raise StreamBroken(f"rdma transport to {peer}: {exc}") from None
        level = logging.DEBUG if quiet and exc.expected else logging.WARNING
        log.log(level, "%s: RDMA not used, using TCP: %s", peer, exc)
        if conn.broken or path.daemon_attached:
            # The daemon answers this connection for RDMA now: start afresh.
            await conn.aclose()
            return await FramedConnection.open(
                host, port, nursery, peer=peer, timeout=timeout, secret=secret
            )
    except BaseException:
        await conn.aclose()
        raise
    return conn


class RdmaPath:
    """The RDMA bulk path of one connection: pulls are RDMA READs of MAPPED
    answers, pushes RDMA WRITEs into the daemon's staging block then STAGED."""

    transport = "rdma"
    # No arena mapped here: one-sided reads are RDMA READs (``read_direct``).
    directory: DirectReader | None = None

    def __init__(self, peer: str, timeout: float) -> None:
        self.peer = peer
        self.timeout = timeout
        self.link: _Link | None = None
        # One-sided reads: each shard's directory slot and block offset, as last seen,
        # and how the reads went (as DirectReader counts them).
        self._slots: dict[tuple[int, int], tuple[int, int]] = {}
        # One-sided pulls queued for the next chain of READs (``_pull_loop`` sends
        # them), and the event that wakes it when one is queued.
        self._batch: list[_Pull] = []
        self._queued = trio.Event()
        self._pulls_ended = False
        self.direct_batches = 0  # chains of READs those pulls went out in
        self.direct_reads = 0
        self.direct_retries = 0
        self.direct_contended = 0
        self.mapped_pulls = 0  # reads the daemon answered MAPPED (not one-sided)
        # The daemon took RDMA_CONNECT: it answers reads MAPPED from now on.
        self.daemon_attached = False
        self.staging: StagingArea | None = None
        # Bytes moved by RDMA READ and RDMA WRITE rather than the socket.
        self.pulled_bytes = 0
        self.pushed_bytes = 0

    async def attach(
        self,
        conn: FramedConnection,
        staging_size: int,
        gid_index: int | None,
        mtu: int | None,
    ) -> None:
        """Set up the queue pair with the daemon over ``conn``, check the path, and
        make this the connection's bulk path. Raises RdmaUnavailable with the reason."""
        peer = self.peer
        local_ip = conn.stream.sock.getsockname()[0]
        try:
            gid = find_gid(local_ip, index=gid_index)
            endpoint = Endpoint(gid, mtu=mtu)
        except (NoDevice, VerbsUnavailable) as exc:
            raise RdmaUnavailable(str(exc), expected=True) from None
        except VerbsError as exc:
            raise RdmaUnavailable(str(exc)) from None
        try:
            link = _Link(endpoint, staging_size, peer)
        except BaseException as exc:
            endpoint.close()
            if isinstance(exc, VerbsError):
                raise RdmaUnavailable(str(exc)) from None
            raise
        try:
            body = encode_json(
                {"qp": link.local.to_json(), "mtu": endpoint.mtu, "staging": staging_size}
            )
            reply = await conn.exchange(RdmaConnect().frame(len(body)), [body])
            said = reply.data.decode(errors="replace")
            if reply.header.status == Status.BAD_OP:
                raise RdmaUnavailable(said, expected=True)
            if reply.header.status != Status.OK:
                raise RdmaUnavailable(f"the daemon refused: {said}")
            self.daemon_attached = True
            answer = decode_json(reply.data)
            if not isinstance(answer, dict) or any(k not in answer for k in RDMA_ANSWER_KEYS):
                raise ProtocolError(f"{peer}: malformed RDMA_CONNECT answer")
            remote_qp = QpInfo.from_json(answer["qp"])
            path_mtu = int(answer["mtu"])
            if path_mtu not in MTU_BYTES.values() or path_mtu > endpoint.mtu:
                raise ProtocolError(f"{peer} chose MTU {path_mtu}; this side takes {endpoint.mtu}")
            link.remote = _Remote.from_answer(answer)
            if link.remote.staging_size != staging_size:
                raise ProtocolError(f"{peer} gave a staging area of another size")
            access = link.e.IBV_ACCESS_LOCAL_WRITE
            try:
                endpoint.connect(link.qp, link.local, remote_qp, access, path_mtu)
            except VerbsError as exc:
                raise RdmaUnavailable(str(exc)) from None
            self.link = link
            self.staging = StagingArea(
                link.buffer.view[:staging_size], STAGING_ALIGN, "RDMA buffer"
            )
            # Requests use the link from now on; its completions are drained by
            # the loop ``use`` starts (the probe waits for one).
            conn.use(self)
            await self._probe(link, remote_qp, path_mtu)
        except BaseException:
            if conn.bulk is self:
                conn.use(SOCKET)
            self.link = None
            self.staging = None
            link.close()
            self._queued.set()  # a pull loop already started sees the link closed
            raise
        log.info(
            "%s: RDMA via %s (GID %s -> %s, MTU %d)",
            peer,
            endpoint.name,
            gid.gid,
            remote_qp.gid,
            path_mtu,
        )

    async def _probe(self, link: _Link, remote_qp: QpInfo, mtu: int) -> None:
        """One small RDMA READ: the path works, or an error says why it does not."""
        assert link.remote is not None
        try:
            await link.transfer(
                link.e.IBV_WR_RDMA_READ,
                0,
                link.remote.arena_addr,
                link.remote.arena_rkey,
                PROBE_BYTES,
                min(self.timeout, 5.0),
            )
        except (StreamBroken, StreamTimeout) as exc:
            raise RdmaUnavailable(
                f"the RDMA path to {self.peer} does not work ({exc}); the daemon is at "
                f"GID {remote_qp.gid} ({ipv4_of(remote_qp.gid)}), MTU {mtu}: check that this "
                "host routes to that address over its RDMA device, that both ports use RoCE v2 "
                "GIDs, and rdma_gid_index / rdma_mtu in the config"
            ) from None

    def background(self) -> list[Any]:
        return [self._completion_loop, self._pull_loop]

    async def _completion_loop(self) -> None:
        link = self.link
        if link is not None and not link.closed:
            await link.completions.run()

    def close(self) -> None:
        if self.link is not None:
            # Every later use of the link checks ``closed`` first.
            self.link.close()
        self._queued.set()  # the pull loop sees it and ends

    async def _pull_loop(self) -> None:
        """Send the queued one-sided pulls, one chain of READs at a time; answer each.

        One chain at a time: a fenced chain never waits behind another's READs.
        When a chain completes, the next one is posted before the finished
        pulls are woken, so their bytes are copied out of the staging area
        while the next chain's READs are in flight. A chain that fails or times
        out fails the connection; the pulls still queued then fail too.
        """
        link = self.link
        sending: _Chain | None = None
        chain: _Chain | None = None
        try:
            if link is None or link.remote is None:
                return  # no link (set-up failed): the finally fails what was queued
            remote = link.remote
            while not link.closed:
                if sending is None:
                    if not self._batch:
                        self._queued = trio.Event()
                        await self._queued.wait()
                        continue
                    await trio.lowlevel.checkpoint()  # the other pieces of the read queue up
                    sending = await self._post_batch(link, remote, self._next_batch())
                    continue
                chain, sending = sending, None
                error = await self._settle(link, remote, chain)
                try:
                    if error is None and self._batch:
                        sending = await self._post_batch(link, remote, self._next_batch())
                finally:
                    for p in chain.pulls:
                        p.done.set()
                if error is not None:
                    raise error
        finally:
            self._pulls_ended = True
            closed = StreamClosed(f"RDMA to {self.peer}: the connection's pulls stopped")
            for c in (chain, sending):
                self._batch += c.pulls if c is not None else []
            for p in self._batch:
                if not p.done.is_set():
                    p.error = p.error or closed
                    p.done.set()
            self._batch.clear()

    # -- requests -------------------------------------------------------------

    async def receive(self, conn: FramedConnection, header: Header, sink: Sink) -> bool:
        if header.flags & MAPPED and isinstance(sink, _Located):
            # check_answer made sure of the length.
            (sink.offset,) = LOCATION.unpack(await conn.stream.recv_bytes(LOCATION.size))
            return True  # RELEASE once the RDMA READ has the bytes
        if header.flags & MAPPED:
            raise ProtocolError(f"{self.peer} answered MAPPED to a request that cannot take it")
        await sink.receive(conn.stream, header)
        return False

    async def request(
        self,
        conn: FramedConnection,
        header: Header,
        payload: Sequence[Buffer],
        sink: Sink | None,
    ) -> Reply:
        link = self.link
        if link is None or link.remote is None:
            return await conn.exchange(header, payload, sink)
        if header.op == Op.READ and sink is not None:
            return await self._pull(conn, link, header, sink)
        if header.op in STAGEABLE and header.length:
            return await self._push(conn, link, header, payload, sink)
        return await conn.exchange(header, payload, sink)

    async def read_direct(
        self,
        conn: FramedConnection,
        key: int,
        layout: int,
        index: int,
        offset: int,
        out: np.ndarray,
        min_version: int = 0,
    ) -> tuple[int, int, int] | None:
        """One-sided: READ the shard's directory slot, its bytes and the slot again,
        with no message to the daemon.

        Pulls that run at once on this connection (the pieces of one read) go
        out in chains of READs (``_pull_loop``): the header and every slot, then
        all the bytes, then every slot again, one fence before each phase. Small
        pulls share a chain; a large one has its own, so its bytes are copied
        out while the next chain's are in flight. Returns (version, stamp,
        previous copy's stamp) with the bytes in ``out``, or None when the
        daemon must answer (see ``DirectReader.read``).
        """
        link = self.link
        remote = link.remote if link is not None else None
        if link is None or remote is None or remote.directory is None or not ONE_SIDED_ARCH:
            return None
        n = len(out)
        staging = self.staging
        assert staging is not None
        if n > staging.allocator.capacity // 2:
            return None  # more than a pull may hold of the staging area: ask the daemon
        async with link.scratch_free:
            cell = link.scratch.pop()
            try:
                local = await staging.take(n, conn)
                try:
                    got = await self._read_direct(
                        link, remote, key, layout, index, offset, n, local, cell, min_version
                    )
                    if got is not None:
                        # From the staging area's own view: the connection may have
                        # failed (the link closed) since the READs completed; their
                        # bytes are whole, and the memory stays while views of it do.
                        np.copyto(out, staging.view[local : local + n])
                    return got
                except BaseException as exc:
                    conn.abandon(exc)
                    raise
                finally:
                    staging.give(local, n, conn)
            finally:
                link.scratch.append(cell)

    async def _read_direct(
        self,
        link: _Link,
        remote: _Remote,
        key: int,
        layout: int,
        index: int,
        offset: int,
        n: int,
        data: int,
        cell: int,
        min_version: int,
    ) -> tuple[int, int, int] | None:
        """Queue one pull for the next chain and wait for its answer (the bytes land at
        ``data`` of the staging area, the slot words in ``cell`` of the scratch room)."""
        where = (key, index)
        pull = _Pull(key, layout, index, offset, n, data, cell, min_version)
        while pull.tries < DIRECT_TRIES:
            known = self._slots.get(where)
            if known is None:
                known = await self._find_slot(link, remote, key, index, layout, cell)
                if known is None:
                    return None
                self._slots[where] = known
            pull.slot, pull.block = known
            pull.done = trio.Event()
            if self._pulls_ended:
                raise StreamClosed(f"RDMA to {self.peer}: the connection's pulls stopped")
            self._batch.append(pull)
            self._queued.set()
            # The bytes may still be on their way into ``data``: this waits for
            # the chain (bounded by its timeout) even if the caller is cancelled.
            with trio.CancelScope(shield=True):
                await pull.done.wait()
            if pull.error is not None:
                raise for_this_task(pull.error)
            if pull.answer is not _RETRY:
                return pull.answer
        self.direct_contended += 1
        return None

    def _next_batch(self) -> list[_Pull]:
        """The queued pulls that go out in the next chain: small ones together, up to
        RDMA_BATCH_BYTES and the send queue's depth; a larger one alone, so its
        bytes are handed on (copied out) while the next chain's are in flight."""
        batch = [self._batch.pop(0)]
        # The header, then per pull its seq twice, its slot and its bytes.
        nbytes, wrs = batch[0].n, 1 + 3 + _chunks(batch[0].n)
        while self._batch:
            p = self._batch[0]
            if nbytes + p.n > RDMA_BATCH_BYTES or wrs + 3 + _chunks(p.n) > SEND_DEPTH:
                break
            batch.append(self._batch.pop(0))
            nbytes, wrs = nbytes + p.n, wrs + 3 + _chunks(p.n)
        return batch

    async def _post_batch(self, link: _Link, remote: _Remote, batch: list[_Pull]) -> _Chain:
        """Post one chain of READs for ``batch``, a seqlock read in three phases, each
        fenced behind the one before: the directory header and every slot's seq word;
        then every slot and all their bytes; then every seq word again.

        The seq word is READ alone, before and after: one RDMA READ has no order
        inside it (soft-RoCE's responder is a memcpy that may copy the seq word
        last), so a 64-byte slot READ can pair a new seq with older words; the slot
        and the bytes READ between two equal, even seq words are one version.

        A pull larger than RDMA_BATCH_BYTES (alone in its batch) first READs the
        header, its seq and its slot and waits for them, then posts its bytes where
        the slot says they are: a shard written since the last read is in another
        block, and reading the kept one would waste a whole transfer.
        """
        assert remote.directory is not None
        table_at, header_slot = remote.directory
        base = remote.arena_addr
        fence = link.e.IBV_SEND_FENCE
        read = link.e.IBV_WR_RDMA_READ
        header = (batch[0].cell + HEADER_AT, base + table_at + header_slot * SLOT_BYTES)
        slots = [base + table_at + p.slot * SLOT_BYTES for p in batch]
        seqs = [(header[0], header[1], SLOT_BYTES, 0)]
        seqs += [(p.cell + SEQ_BEFORE, a, SEQ_BYTES, 0) for p, a in zip(batch, slots, strict=True)]
        images = [(p.cell, a, SLOT_BYTES, 0) for p, a in zip(batch, slots, strict=True)]
        again = [(p.cell + SEQ_AFTER, a, SEQ_BYTES, 0) for p, a in zip(batch, slots, strict=True)]
        try:
            large = len(batch) == 1 and batch[0].n > RDMA_BATCH_BYTES
            if large:
                p = batch[0]
                first = [*seqs, fenced(images[0], fence)]
                await link.chain(read, first, remote.arena_rkey, 2 * SLOT_BYTES, self.timeout)
                rec = slot_record(link.buffer.view[p.cell : p.cell + SLOT_BYTES])
                if rec is not None and rec.names(p.key, p.index, p.layout):
                    p.block = rec.offset
                    self._slots[(p.key, p.index)] = (p.slot, rec.offset)
            data = [
                (p.data + o, base + p.block + p.offset + o, min(CHUNK, p.n - o), 0)
                for p in batch
                for o in range(0, p.n, CHUNK)
            ]
            middle = data if large else [fenced(images[0], fence), *images[1:], *data]
            pieces = [*([] if large else seqs), *middle, fenced(again[0], fence), *again[1:]]
            posted = await link.post(read, pieces, remote.arena_rkey)
        except BaseException as exc:
            # The pulls' readers get an Exception of their own to raise; this task's
            # cancellation (the connection failing) goes on up this task only.
            failure = (
                exc
                if isinstance(exc, Exception)
                else StreamClosed(f"RDMA to {self.peer}: the connection's pulls stopped")
            )
            for p in batch:
                p.error = failure
                p.done.set()
            raise
        return _Chain(batch, posted)

    async def _settle(self, link: _Link, remote: _Remote, chain: _Chain) -> Exception | None:
        """Wait for a chain and judge each of its pulls (their ``done`` is the caller's
        to set); the error it failed with, if it did (each pull has it too)."""
        assert remote.directory is not None
        try:
            await link.wait(chain.posted, sum(p.n for p in chain.pulls), self.timeout)
        except Exception as exc:
            for p in chain.pulls:
                p.error = exc
            return exc
        self.direct_batches += 1
        view = link.buffer.view
        serving = SLOT.unpack_from(view.data, chain.pulls[0].cell + HEADER_AT)[SERVING_WORD] == 1
        for p in chain.pulls:
            p.answer = self._judge(p, serving, remote.directory[0], view)
        return None

    def _judge(
        self, p: _Pull, serving: bool, table_at: int, view: np.ndarray
    ) -> tuple[int, int, int] | _Retry | None:
        """What a pull's READs say: its answer, None (ask the daemon) or _RETRY."""
        if not serving:
            return None  # the daemon would refuse the read now: let it say why
        where = (p.key, p.index)
        first = slot_record(view[p.cell : p.cell + SLOT_BYTES])
        (before,) = SEQ_WORD.unpack_from(view.data, p.cell + SEQ_BEFORE)
        (after,) = SEQ_WORD.unpack_from(view.data, p.cell + SEQ_AFTER)
        p.tries += 1
        if first is None or not before == first.seq == after:
            self.direct_retries += 1
            return _RETRY  # the daemon changed the shard meanwhile (or was, at the start)
        if not first.names(p.key, p.index, p.layout):
            self._slots.pop(where, None)  # freed, reused, or the tensor recreated
            return _RETRY
        if first.offset != p.block:
            self._slots[where] = (p.slot, first.offset)  # moved: read it there
            self.direct_retries += 1
            return _RETRY
        if p.block + p.offset + p.n > table_at or first.version < p.min_version:
            return None
        self.direct_reads += 1
        self.pulled_bytes += p.n
        return first.version, first.stamp, first.prev

    async def _find_slot(
        self, link: _Link, remote: _Remote, key: int, index: int, layout: int, local: int
    ) -> tuple[int, int] | None:
        """The shard's slot and block offset, probing the daemon's directory by RDMA READ
        (one slot at a time into the read's scratch cell; only on a cache miss)."""
        assert remote.directory is not None
        table_at, slots = remote.directory
        view = link.buffer.view
        for slot in probe(key, index, slots):
            addr = remote.arena_addr + table_at + slot * SLOT_BYTES
            piece = [(local, addr, SLOT_BYTES, 0)]
            await link.chain(
                link.e.IBV_WR_RDMA_READ, piece, remote.arena_rkey, SLOT_BYTES, self.timeout
            )
            rec = slot_record(view[local : local + SLOT_BYTES])
            if rec is None:
                continue  # changing: it may be this one; probing on costs little
            if rec.names(key, index, layout):
                return slot, rec.offset
            if rec.state == EMPTY:
                return None
        return None

    async def _pull(self, conn: FramedConnection, link: _Link, header: Header, sink: Sink) -> Reply:
        located = _Located(sink)
        reply = await conn.exchange(header, (), located)
        if located.offset is None:
            return reply  # answered inline, or refused
        assert link.remote is not None
        n = reply.header.size
        rid = reply.header.request_id
        if located.offset + n > link.remote.arena_size:
            broken = StreamBroken(f"{self.peer}: MAPPED answer past the arena's end")
            conn.abandon(broken)
            raise broken
        staging = self.staging
        assert staging is not None
        local = await staging.take(n, conn)
        try:
            await link.transfer(
                link.e.IBV_WR_RDMA_READ,
                local,
                link.remote.arena_addr + located.offset,
                link.remote.arena_rkey,
                n,
                self.timeout,
            )
            conn.release(rid)
            self.mapped_pulls += 1
            await sink.receive(MemoryStream(staging.view, local), reply.header._replace(length=n))
        except BaseException as exc:
            conn.abandon(exc)
            raise
        finally:
            staging.give(local, n, conn)
        self.pulled_bytes += n
        return reply

    async def _push(
        self,
        conn: FramedConnection,
        link: _Link,
        header: Header,
        payload: Sequence[Buffer],
        sink: Sink | None,
    ) -> Reply:
        assert link.remote is not None
        n = header.length
        staging = self.staging
        assert staging is not None
        local = await staging.take(n, conn)
        try:
            staging.fill(local, payload)
            try:
                await link.transfer(
                    link.e.IBV_WR_RDMA_WRITE,
                    local,
                    link.remote.staging_addr + local,
                    link.remote.staging_rkey,
                    n,
                    self.timeout,
                )
            except BaseException as exc:
                conn.abandon(exc)
                raise
            reply = await conn.exchange(staged(header), [LOCATION.pack(local)], sink)
            self.pushed_bytes += n
            return reply
        finally:
            staging.give(local, n, conn)
