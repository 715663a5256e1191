"""The own session's trio loop: read /dev/fuse, answer each request in a task of its own.

One task reads requests (into one buffer as large as the largest WRITE the
kernel may send, or with a WRITE's data where it belongs: ``landing``). A
WRITE's bytes are placed as it arrives, so writes take effect in the order
the kernel sent them; it is answered then, or by a task once the pushes the
writer waits for are made. Every other request but FORGET, INTERRUPT and
DESTROY is answered by a task in the session's nursery, under a cancel scope
that the kernel's INTERRUPT for it cancels (the answer is then EINTR). A handler's failure is
its request's errno reply (``filesystem.answer``), never the loop's end. The
loop ends when the kernel says DESTROY, when the connection goes (unmounted:
ENODEV), or when ``stop`` is called; ``close`` unmounts and closes the
connection, which ends every request still waiting in the kernel.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import trio

from ..filesystem import Filesystem, answer
from . import device, replies
from . import requests as rq
from .adapter import Adapter, Body
from .backing import DEFAULT_LIMIT, Backings
from .init import PAGE, Negotiated, UnsupportedKernel, kernel_max_pages, negotiate
from .landing import Landing
from .tmpfs import BackingFiles

log = logging.getLogger("irdma.fuse")


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
            size = (self._max_pages + 1) * PAGE
            buf = bytearray(size)
            landing = Landing(size)
            async with trio.open_nursery() as nursery:

                def parts() -> list[bytearray | memoryview]:
                    # The expected write's data is read where it belongs (``landing``).
                    # Its room is taken here, once the connection is readable, with
                    # nothing awaited before the read and the write's placing: no
                    # other task can change that file meanwhile (grow it over the
                    # room, where another request's bytes may go).
                    room = None
                    if landing.expected is not None:
                        room = self.fs.fileops.landing(*landing.expected, size)
                    return landing.parts(room, buf)

                while True:
                    n = await self._read(parts)
                    if n is None:
                        break
                    try:
                        # Else a WRITE's data is a view of ``buf``, placed (``_write``)
                        # before the next read.
                        req = landing.placed(n) or rq.decode(landing.message(n, buf), borrow=True)
                    except rq.ProtocolError as exc:
                        # An opcode not served (IOCTL, locks, ...) is answered ENOSYS,
                        # which the kernel remembers or turns into the caller's answer.
                        level = logging.DEBUG if exc.errno == errno.ENOSYS else logging.ERROR
                        log.log(level, "%s", exc)
                        if exc.unique is not None:
                            self._reply(replies.message(exc.unique, error=exc.errno))
                        continue
                    if isinstance(req, rq.Write):
                        landing.wrote(req)
                        self._write(req, nursery)
                        continue
                    if not self._dispatch(req, nursery):
                        break
                nursery.cancel_scope.cancel()

    def _write(self, req: rq.Write, nursery: trio.Nursery) -> None:
        """Place a WRITE's bytes now, in the order the kernel sent the writes (so two
        that overlap end as the later one says, and a write read in place is in its
        file before anything else can touch that memory); answered at once
        unless pushes of the writer's are to be waited for."""
        try:
            handle = self.adapter.place_write(req)
        except Exception as exc:
            self._reply(replies.message(req.unique, error=answer("write", exc)))
            return
        done = replies.write_out(len(req.data))
        if not self.fs.fileops.flows(handle):
            self._reply(replies.message(req.unique, [done]))
            return
        scope = trio.CancelScope()
        self._running[req.unique] = scope

        async def flow() -> Body:
            await self.fs.fileops.flow(handle)
            return [done]

        nursery.start_soon(self._answer, req, scope, flow, name="Write")

    async def _read(self, parts: Callable[[], list[bytearray | memoryview]]) -> int | None:
        """One request into the buffers ``parts()`` gives once the connection is
        readable, front to back; its length, None once the connection is gone."""
        while True:
            await trio.lowlevel.wait_readable(self.fd)
            try:
                return os.readv(self.fd, parts())
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                if exc.errno == errno.ENODEV:  # unmounted
                    return None
                raise

    def _dispatch(self, req: rq.Request, nursery: trio.Nursery) -> bool:
        """Start answering ``req`` (not a WRITE: ``_write``); False when the session
        is over."""
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
                respond = partial(self.adapter.answer, req)
                nursery.start_soon(self._answer, req, scope, respond, name=type(req).__name__)
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
        respond: Callable[[], Awaitable[Body]],
    ) -> None:
        try:
            with scope:
                try:
                    body = await respond()
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
