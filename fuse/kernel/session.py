"""The own session's trio loop: read /dev/fuse, answer each request in a task of its own.

One task reads requests (into one buffer as large as the largest WRITE the
kernel may send); each request but FORGET, INTERRUPT and DESTROY is answered
by a task in the session's nursery, under a cancel scope that the kernel's
INTERRUPT for it cancels (the answer is then EINTR). A handler's failure is
its request's errno reply (``filesystem.answer``), never the loop's end. The
loop ends when the kernel says DESTROY, when the connection goes (unmounted:
ENODEV), or when ``stop`` is called; ``close`` unmounts and closes the
connection, which ends every request still waiting in the kernel.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import trio

from ..filesystem import Filesystem, answer
from . import device, replies
from . import requests as rq
from .adapter import Adapter
from .backing import DEFAULT_LIMIT, Backings
from .init import PAGE, Negotiated, UnsupportedKernel, kernel_max_pages, negotiate
from .tmpfs import BackingFiles

log = logging.getLogger("irdma.fuse")


class RequestBuffers:
    """Buffers for reading requests, each as large as the largest WRITE with its
    headers: one is read into; a WRITE takes the one it was read into along while
    it is answered (its data is not copied out), and the next read gets another."""

    KEEP = 16  # buffers kept for reuse; more WRITEs in flight at once get new ones

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: list[bytearray] = []

    def take(self) -> bytearray:
        return self._free.pop() if self._free else bytearray(self.size)

    def give_back(self, buf: bytearray) -> None:
        if len(self._free) < self.KEEP:
            self._free.append(buf)


class Session:
    """One FUSE connection, mounted at ``mountpoint``, served with ``fs``."""

    def __init__(
        self,
        fs: Filesystem,
        mountpoint: Path,
        *,
        allow_other: bool = False,
        passthrough: bool = True,
        backing_limit: int = DEFAULT_LIMIT,
    ) -> None:
        self.fs = fs
        self.mountpoint = mountpoint
        self.allow_other = allow_other
        # Backing ids need CAP_SYS_ADMIN: a user's mount (through fusermount3) serves
        # reads itself.
        self.want_passthrough = passthrough and os.geteuid() == 0
        # Backing files in a private huge-page tmpfs where one can be mounted (root).
        self.files = BackingFiles(private_tmpfs=self.want_passthrough)
        self.backings = Backings(lambda: fs.backend.c, backing_limit, self.files)
        self.adapter = Adapter(fs, self.backings, self._register)
        self.backings.unregister = self._unregister
        fs.fileops.whole = self.backings  # readers get whole versions (one snapshot each)
        self.fd = -1
        self.negotiated: Negotiated | None = None
        self._max_pages = kernel_max_pages()
        self._running: dict[int, trio.CancelScope] = {}
        self._stop = trio.CancelScope()

    def mount(self) -> None:
        """Open a connection and mount it (the kernel then sends INIT)."""
        self.fd = device.mount(
            self.mountpoint, allow_other=self.allow_other, max_read=self._max_pages * PAGE
        )

    def stop(self) -> None:
        """End ``run`` (requests being answered are cancelled)."""
        self._stop.cancel()

    def close(self) -> None:
        """Unmount and close the connection (the kernel fails what still waits)."""
        try:
            device.unmount(self.mountpoint)
        finally:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            self.backings.close()
            self.files.close()

    async def run(self) -> None:
        """Serve until DESTROY, the connection's end, or ``stop``."""
        with self._stop:
            buffers = RequestBuffers((self._max_pages + 1) * PAGE)
            buf = buffers.take()
            async with trio.open_nursery() as nursery:
                while True:
                    n = await self._read(buf)
                    if n is None:
                        break
                    try:
                        # A WRITE's data stays in ``buf`` (no copy): the buffer goes
                        # with the request, given back once it is answered.
                        req = rq.decode(memoryview(buf)[:n], borrow=True)
                    except rq.ProtocolError as exc:
                        # An opcode not served (IOCTL, locks, ...) is answered ENOSYS,
                        # which the kernel remembers or turns into the caller's answer.
                        level = logging.DEBUG if exc.errno == errno.ENOSYS else logging.ERROR
                        log.log(level, "%s", exc)
                        if exc.unique is not None:
                            self._reply(replies.message(exc.unique, error=exc.errno))
                        continue
                    lent = None
                    if isinstance(req, rq.Write):
                        lent, buf = buf, buffers.take()
                    if not self._dispatch(req, nursery, buffers, lent):
                        break
                nursery.cancel_scope.cancel()

    async def _read(self, buf: bytearray) -> int | None:
        """One request into ``buf``; its length, None once the connection is gone."""
        while True:
            await trio.lowlevel.wait_readable(self.fd)
            try:
                return os.readv(self.fd, [buf])
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                if exc.errno == errno.ENODEV:  # unmounted
                    return None
                raise

    def _dispatch(
        self,
        req: rq.Request,
        nursery: trio.Nursery,
        buffers: RequestBuffers,
        lent: bytearray | None = None,
    ) -> bool:
        """Start answering ``req``; False when the session is over. ``lent``: the
        buffer ``req``'s data lies in, given back to ``buffers`` once answered."""
        match req:
            case rq.Init():
                self._init(req)
            case rq.Destroy():
                self._reply(replies.message(req.unique))
                return False
            case rq.Interrupt(target=target):
                scope = self._running.get(target)
                if scope is not None:  # not answered yet
                    scope.cancel()
            case rq.Forget() | rq.BatchForget():
                pass  # inode numbers stay assigned to their paths for the mount's life
            case _:
                scope = trio.CancelScope()
                self._running[req.unique] = scope
                nursery.start_soon(self._answer, req, scope, buffers, lent, name=type(req).__name__)
        return True

    def _init(self, req: rq.Init) -> None:
        try:
            self.negotiated = negotiate(
                req, passthrough=self.want_passthrough, max_pages=self._max_pages
            )
        except UnsupportedKernel:
            self._reply(replies.message(req.unique, error=errno.EPROTO))
            raise
        self.adapter.passthrough = self.negotiated.passthrough
        n = self.negotiated
        log.info(
            "FUSE %d.%d (kernel %d.%d); requests up to %d KiB; passthrough %s; backing files %s",
            n.major,
            n.minor,
            n.major,
            n.kernel_minor,
            n.max_write >> 10,
            "on (reads, and writes of new files)" if n.passthrough else "off (READ answered here)",
            "in a private tmpfs with huge pages" if self.files.huge_pages else "are memfds",
        )
        self._reply(replies.message(req.unique, [n.reply()]))

    async def _answer(
        self,
        req: rq.Request,
        scope: trio.CancelScope,
        buffers: RequestBuffers,
        lent: bytearray | None,
    ) -> None:
        try:
            with scope:
                try:
                    body = await self.adapter.answer(req)
                except Exception as exc:
                    # Logged under the call's name, as pyfuse3's adapter logs it.
                    code = answer(type(req).__name__.lower(), exc)
                    self._reply(replies.message(req.unique, error=code))
                    return
                self._reply(replies.message(req.unique, body))
                return
            self._reply(replies.message(req.unique, error=errno.EINTR))  # interrupted
        finally:
            del self._running[req.unique]
            if lent is not None:
                del req  # its view of the buffer goes first
                buffers.give_back(lent)

    def _reply(self, parts: list[replies.Buffer]) -> None:
        try:
            os.writev(self.fd, parts)
        except OSError as exc:
            # ENOENT: the kernel stopped waiting (interrupted, or the caller is
            # gone); ENODEV: the connection is gone.
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    def _register(self, fd: int) -> int:
        return device.backing_open(self.fd, fd)

    def _unregister(self, backing_id: int) -> None:
        try:
            device.backing_close(self.fd, backing_id)
        except OSError as exc:
            log.warning("could not release backing file %d: %s", backing_id, exc)
