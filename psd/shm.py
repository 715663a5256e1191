"""The daemon's side of the shm transport: its unix socket and the ATTACH handshake.

The socket is ``<data_dir>/psd.sock`` with mode 0660, so only the daemon's
user and group (and root) can connect; the peer's credentials are checked
again (SO_PEERCRED) before anything is sent. With a cluster secret, the
peer must also pass the same AUTH handshake as a TCP one (``.auth``) before
ATTACH: membership of the daemon's group is not enough. An attached client gets a
read-only descriptor of the arena; the daemon keeps the client's staging
descriptor for the connection's life. After the handshake the connection is
served like a TCP one (``Server.handle_connection``) with the session
attached, which turns large reads into MAPPED answers and accepts STAGED
writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket as stdsocket
import stat
import struct
from typing import TYPE_CHECKING

import trio

from irdma.protocol import Header, Op, ProtocolError, Status
from irdma.protocol.bodies import AttachAnswer, AttachOffer
from irdma.sizes import ZERO_COPY_MIN
from irdma.transport.base import StreamBroken
from irdma.transport.tcp import to_stdlib
from irdma.transport.unix import (
    framed_view,
    host_identity,
    map_shared,
    recv_fds_frame,
    send_fds_frame,
    short_address,
    socket_path,
)

from .auth import admit
from .staged import StagedMemory

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger("psd")

SOCKET_MODE = 0o660
# Reads this large are answered MAPPED; below it, inline bytes cost less than
# the extra RELEASE (the same size the daemon starts sending zero-copy at).
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class ShmSession(StagedMemory):
    """What the daemon keeps for one attached client: read-only mappings of its staging
    memory and, if it offered one, its shared region (STAGED offsets past the
    staging area are in it)."""

    transport = "shm"
    mapped_min = ZERO_COPY_MIN

    def __init__(
        self,
        staging_fd: int,
        staging_size: int,
        peer: str,
        shared_fd: int = -1,
        shared_size: int = 0,
    ) -> None:
        self.peer = peer
        self._map, view = map_shared(staging_fd, staging_size, writable=False)
        self._shared_map = None
        shared = None
        if shared_fd >= 0:
            self._shared_map, shared = map_shared(shared_fd, shared_size, writable=False)
        super().__init__(view, shared)

    def close(self) -> None:
        self.view = None  # type: ignore[assignment]
        self.shared = None
        for mapping in (self._map, self._shared_map):
            if mapping is None:  # no shared region
                continue
            with contextlib.suppress(BufferError):  # a live view keeps it mapped
                mapping.close()


def authorised(uid: int, gid: int) -> bool:
    """Root, the daemon's own user, or its group (what the socket's mode lets in)."""
    return uid in (0, os.geteuid()) or gid == os.getegid()


class ShmListener:
    """Accepts same-host clients on the daemon's unix socket."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.path = socket_path(server.node.data_dir)
        self.timeout = server.in_force.config.timeout

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listener = trio.socket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
        with listener:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._remove_stale()
            with short_address(self.path) as address:
                await listener.bind(address)
                os.chmod(address, SOCKET_MODE)
            listener.listen(128)
            log.info("%s: same-host clients attach at %s", self.server.node.name, self.path)
            task_status.started()
            try:
                async with trio.open_nursery() as nursery:
                    while True:
                        try:
                            sock, _ = await listener.accept()
                        except OSError as exc:
                            log.warning("shm accept failed: %s", exc)
                            await trio.sleep(0.1)
                            continue
                        nursery.start_soon(self._attach_then_serve, sock)
            finally:
                with contextlib.suppress(OSError):
                    self.path.unlink()

    def _remove_stale(self) -> None:
        """A socket left by an earlier run of this daemon is removed; any other file is not."""
        try:
            mode = self.path.lstat().st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise OSError(f"{self.path} exists and is not a socket; remove it or move data_dir")
        self.path.unlink()

    async def _attach_then_serve(self, sock: trio.socket.SocketType) -> None:
        session: ShmSession | None = None
        try:
            raw = sock.getsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_PEERCRED, _PEERCRED.size)
            pid, uid, gid = _PEERCRED.unpack(raw)
            peer = f"pid {pid} (uid {uid})"
            with trio.move_on_after(self.timeout):
                # With a secret, the peer proves it first: ATTACH hands out the arena.
                if await self._authenticate(sock, f"shm {peer}"):
                    session = await self._handshake(sock, peer, uid, gid)
            if session is None:
                return
            stream = to_stdlib(sock)
            await self.server.handle_connection(
                stream, f"shm {peer}", memory=session, authenticated=True
            )
        except (OSError, StreamBroken, ProtocolError) as exc:
            log.info("shm client dropped during attach: %s", exc)
        finally:
            if session is not None:
                session.close()
            sock.close()

    async def _authenticate(self, sock: trio.socket.SocketType, peer: str) -> bool:
        """The gate every TCP connection passes, run before ATTACH (True with no secret)."""
        secret = self.server.secret
        if secret is None:
            return True
        view = framed_view(sock, peer)
        try:
            return await admit(view, secret, self.server.node.name, self.timeout)
        finally:
            view.close()

    async def _handshake(
        self, sock: trio.socket.SocketType, peer: str, uid: int, gid: int
    ) -> ShmSession | None:
        header, body, fds = await recv_fds_frame(sock)
        staging_fd = fds[0] if fds else -1
        shared_fd = fds[1] if len(fds) > 1 else -1
        for extra in fds[2:]:
            os.close(extra)
        try:
            offer = self._check(header, body, staging_fd, uid, gid)
            if isinstance(offer, str):
                problem = offer
                log.warning("%s: refused shm client %s: %s", self.server.node.name, peer, problem)
                msg = problem.encode()
                await sock.send(header.response(Status.BAD_ARGUMENT, length=len(msg)).pack() + msg)
                return None
            shared_size = self._shared_offer(offer, shared_fd)
            session = ShmSession(
                staging_fd, offer.staging, peer, shared_fd if shared_size else -1, shared_size
            )
        finally:
            for fd in (staging_fd, shared_fd):  # the mappings keep the memory
                if fd >= 0:
                    os.close(fd)
        store = self.server.store
        answer = AttachAnswer(
            self.server.node.name,
            host_identity(),
            store.arena.size,  # the whole memfd: the blocks, then the shard directory
            (store.directory.offset, store.directory.slots),
            shared_size,  # mapped: STAGED offsets may point into the client's region
        ).encode()
        # A read-only open of the arena: the client can copy out, never write.
        arena_ro = os.open(f"/proc/self/fd/{store.arena.fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            frame = header.response(Status.OK, length=len(answer)).pack() + answer
            await send_fds_frame(sock, frame, [arena_ro])
        except BaseException:
            session.close()
            raise
        finally:
            os.close(arena_ro)
        return session

    def _shared_offer(self, offer: AttachOffer, fd: int) -> int:
        """The size of the shared region a client offered, if it can be mapped; else 0
        (its writes then go through staging, as from a client without one)."""
        size = offer.shared
        if fd < 0 or size <= 0:
            return 0
        problem = memfd_problem(fd, size, "shared region")
        if problem is not None:
            log.warning(
                "%s: not mapping a client's shared region: %s", self.server.node.name, problem
            )
            return 0
        return size

    @staticmethod
    def _check(
        header: Header, body: bytes, staging_fd: int, uid: int, gid: int
    ) -> AttachOffer | str:
        """The client's offer, or why it is refused."""
        if not authorised(uid, gid):
            return f"uid {uid} is not the daemon's user or group"
        if header.op == Op.AUTH:
            return "this daemon has no secret_file in its config, so it cannot authenticate"
        if header.op != Op.ATTACH:
            return f"expected ATTACH first, got op {header.op}"
        try:
            offer = AttachOffer.parse(body)
        except ProtocolError as exc:
            return str(exc)
        if staging_fd < 0:
            return "no staging descriptor came with ATTACH"
        return memfd_problem(staging_fd, offer.staging, "staging") or offer


def memfd_problem(fd: int, size: int, what: str) -> str | None:
    """Why a client's memory descriptor cannot be mapped safely for ``size`` bytes, if not."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        seals = 0
    if not seals & fcntl.F_SEAL_SHRINK:
        # Cut shorter under our mapping, it would crash us (SIGBUS).
        return f"{what} memory must be a memfd sealed against shrinking (F_SEAL_SHRINK)"
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size < size:
        return f"{what} descriptor is not a file of at least {size} bytes"
    return None
