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

import logging
from collections.abc import Awaitable, Callable, Sequence

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
from ...protocol.messages import RdmaConnect
from ...sizes import RDMA_STAGING_MIN, STAGING_ALIGN
from ..base import (
    Buffer,
    ByteStream,
    MemoryStream,
    Reply,
    Sink,
    StreamBroken,
    StreamTimeout,
)
from ..direct import DirectReader
from ..staging import StagingArea
from ..tcp import SOCKET, FramedConnection
from ..verbs import (
    MTU_BYTES,
    Endpoint,
    NoDevice,
    QpInfo,
    VerbsError,
    find_gid,
    ipv4_of,
)
from ..verbs_compat import VerbsUnavailable
from .link import Link, Remote
from .onesided import OneSidedReader

log = logging.getLogger("irdma")

MAPPED = int(Flag.MAPPED)
PROBE_BYTES = 8


class RdmaUnavailable(Exception):
    """RDMA cannot be used for this daemon here.

    ``expected`` when there simply is none (no pyverbs, no device for the
    route, a daemon without RDMA); otherwise something is wrong with a setup
    that has it (memlock, GID index, MTU, a path that does not work).
    """

    def __init__(self, reason: str, *, expected: bool = False) -> None:
        super().__init__(reason)
        self.expected = expected


class _Located(Sink):
    """Holds where a MAPPED answer's bytes are; passes an inline answer to the real sink."""

    __slots__ = ("offset", "sink")

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.offset: int | None = None

    async def receive(self, stream: ByteStream, header: Header) -> None:
        await self.sink.receive(stream, header)


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
        self.link: Link | None = None
        # One-sided reads, once the link is up.
        self.reader: OneSidedReader | None = None
        self.mapped_pulls = 0  # reads the daemon answered MAPPED (not one-sided)
        # The daemon took RDMA_CONNECT: it answers reads MAPPED from now on.
        self.daemon_attached = False
        self.staging: StagingArea | None = None
        # Bytes moved by RDMA READ (of MAPPED answers: one-sided pulls count in
        # ``reader``) and RDMA WRITE rather than the socket.
        self._mapped_bytes = 0
        self.pushed_bytes = 0

    # How the one-sided reads went (as DirectReader counts them).
    @property
    def direct_batches(self) -> int:
        """Chains of READs the one-sided pulls went out in."""
        return self.reader.batches if self.reader is not None else 0

    @property
    def direct_reads(self) -> int:
        return self.reader.reads if self.reader is not None else 0

    @property
    def direct_retries(self) -> int:
        return self.reader.retries if self.reader is not None else 0

    @property
    def direct_contended(self) -> int:
        return self.reader.contended if self.reader is not None else 0

    @property
    def pulled_bytes(self) -> int:
        """Bytes moved by RDMA READ, MAPPED answers and one-sided pulls."""
        return self._mapped_bytes + (self.reader.pulled_bytes if self.reader is not None else 0)

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
            link = Link(endpoint, staging_size, peer)
        except BaseException as exc:
            endpoint.close()
            if isinstance(exc, VerbsError):
                raise RdmaUnavailable(str(exc)) from None
            raise
        reader: OneSidedReader | None = None
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
            link.remote = remote = Remote.from_answer(answer)
            if remote.staging_size != staging_size:
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
            reader = OneSidedReader(link, remote, self.staging, peer, self.timeout)
            self.reader = reader
            # Requests use the link from now on; its completions are drained by
            # the loop ``use`` starts (the probe waits for one).
            conn.use(self)
            await self._probe(link, remote_qp, path_mtu)
        except BaseException:
            if conn.bulk is self:
                conn.use(SOCKET)
            self.link = None
            self.staging = None
            self.reader = None
            link.close()
            if reader is not None:
                reader.stop()  # its pull loop, started or not, sees the link closed
            raise
        log.info(
            "%s: RDMA via %s (GID %s -> %s, MTU %d)",
            peer,
            endpoint.name,
            gid.gid,
            remote_qp.gid,
            path_mtu,
        )

    async def _probe(self, link: Link, remote_qp: QpInfo, mtu: int) -> None:
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

    def background(self) -> list[Callable[[], Awaitable[None]]]:
        # The reader's loop as it is now: should the set-up fail later, it still
        # runs, sees the link closed and fails what was queued.
        loops: list[Callable[[], Awaitable[None]]] = [self._completion_loop]
        if self.reader is not None:
            loops.append(self.reader.run)
        return loops

    async def _completion_loop(self) -> None:
        link = self.link
        if link is not None and not link.closed:
            await link.completions.run()

    def close(self) -> None:
        if self.link is not None:
            # Every later use of the link checks ``closed`` first.
            self.link.close()
        if self.reader is not None:
            self.reader.stop()  # its pull loop sees the link closed and ends

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
        """One-sided: the shard's bytes by RDMA READ, no message to the daemon
        (``OneSidedReader.read``); None where the daemon must answer."""
        if self.reader is None:
            return None
        return await self.reader.read(conn, key, layout, index, offset, out, min_version)

    async def _pull(self, conn: FramedConnection, link: Link, header: Header, sink: Sink) -> Reply:
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
        self._mapped_bytes += n
        return reply

    async def _push(
        self,
        conn: FramedConnection,
        link: Link,
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
