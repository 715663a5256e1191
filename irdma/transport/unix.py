"""Same-host plumbing that clients and daemons share: where a daemon's unix socket
is, who counts as "this host", frames carrying file descriptors (SCM_RIGHTS),
and shared mappings of memfds. The shm transport (client, ``shm.py``) and the
daemon's listener (``psd/shm.py``) both build on these; no protocol rules here.
"""

from __future__ import annotations

import array
import contextlib
import mmap
import os
import socket as stdsocket
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from ..protocol import HEADER_SIZE, Header, ProtocolError, unpack_header
from .base import TRIO_WAITS, StreamBroken, Waits
from .tcp import FramedSocket

SOCKET_NAME = "psd.sock"
# sun_path holds 108 bytes; longer paths are reached through /proc/self/fd.
SUN_PATH_MAX = 100


def socket_path(data_dir: Path) -> Path:
    return Path(data_dir) / SOCKET_NAME


def host_identity() -> str:
    """This host and network namespace: a daemon must match it to be 'on the same host'.

    Network namespaces stand in for hosts in tests and containers; a client
    in another one reaches the daemon over the network, as a remote one would.
    """
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}/{os.stat('/proc/self/ns/net').st_ino}"


@contextlib.contextmanager
def short_address(path: Path) -> Iterator[str]:
    """A sun_path for ``path``, through an O_PATH descriptor of its directory if too long."""
    text = os.fsencode(path)
    if len(text) < SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


async def send_fds_frame(sock: AttachSocket, frame: bytes, fds: list[int]) -> None:
    """Send a small frame with descriptors attached to its first byte."""
    anc = [(stdsocket.SOL_SOCKET, stdsocket.SCM_RIGHTS, array.array("i", fds))]
    sent = await sock.sendmsg([frame], anc)
    while sent < len(frame):
        sent += await sock.send(frame[sent:])


async def recv_fds_frame(
    sock: AttachSocket, max_length: int = 1 << 16
) -> tuple[Header, bytes, list[int]]:
    """Receive one frame and the descriptors that came with it."""
    fds: list[int] = []
    buf = bytearray()
    want = HEADER_SIZE
    header: Header | None = None
    while len(buf) < want:
        data, anc, _, _ = await sock.recvmsg(want - len(buf), stdsocket.CMSG_SPACE(4 * 4))
        for level, kind, payload in anc:
            if level == stdsocket.SOL_SOCKET and kind == stdsocket.SCM_RIGHTS:
                n = len(payload) - len(payload) % 4
                fds.extend(array.array("i", payload[:n]))
        if not data:
            for fd in fds:
                os.close(fd)
            raise StreamBroken("closed during the shm handshake")
        buf += data
        if header is None and len(buf) >= HEADER_SIZE:
            header = unpack_header(bytes(buf[:HEADER_SIZE]))
            if header.length > max_length:
                for fd in fds:
                    os.close(fd)
                raise ProtocolError(f"handshake frame of {header.length} bytes")
            want = HEADER_SIZE + header.length
    assert header is not None
    return header, bytes(buf[HEADER_SIZE:]), fds


def framed_view(sock: AttachSocket, peer: str, waits: Waits = TRIO_WAITS) -> FramedSocket:
    """A FramedSocket on a duplicate of ``sock``'s descriptor, for the AUTH handshake.

    It reads and writes the same connection (exactly the handshake's frames),
    which goes on through ``sock`` afterwards; closing the view leaves
    ``sock`` open.
    """
    dup = stdsocket.socket(fileno=os.dup(sock.fileno()))
    dup.setblocking(False)
    return FramedSocket(dup, peer, waits)


def map_shared(fd: int, size: int, *, writable: bool) -> tuple[mmap.mmap, np.ndarray]:
    """Map a memfd shared; return the mapping and a uint8 view of it."""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
    return mapping, np.frombuffer(mapping, dtype=np.uint8)


class AttachSocket(Protocol):
    """What the ATTACH exchange needs of a unix socket (trio's, or a WaitingSocket).

    Positional-only, returning awaitables: trio's socket methods are typed so."""

    def connect(self, address: str, /) -> Awaitable[None]: ...

    def sendmsg(self, buffers: list[bytes], ancdata: list, /) -> Awaitable[int]: ...

    def send(self, data: bytes, /) -> Awaitable[int]: ...

    def recvmsg(self, bufsize: int, ancbufsize: int, /) -> Awaitable[tuple]: ...

    def fileno(self) -> int: ...
