"""INIT: the protocol version and the features agreed with the kernel.

The kernel offers its version and flags; ``negotiate`` checks the version
(major 7, minor at least ``abi.MIN_MINOR``: an older kernel is refused with
an error naming both), keeps the flags the session uses that the kernel
offers, and sizes requests as large as the kernel allows (``max_pages``
pages per READ/WRITE, read from /proc/sys/fs/fuse/max_pages_limit where the
kernel has it).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

from . import abi
from .abi import InitFlag
from .requests import Init

PAGE = mmap.PAGESIZE
# The kernel's limit on pages per request before it was a sysctl (Linux < 6.13)
# and its default since.
DEFAULT_MAX_PAGES = 256
MAX_PAGES_LIMIT = Path("/proc/sys/fs/fuse/max_pages_limit")
# Requests the kernel keeps in flight for async reads and direct I/O (its own
# default is 12): readers of several files, and read-ahead, overlap.
MAX_BACKGROUND = 64
CONGESTION_THRESHOLD = MAX_BACKGROUND * 3 // 4

# What the session asks for where the kernel offers it. No WRITEBACK_CACHE:
# writes reach the session as they are made, and passthrough refuses it.
WANTED = (
    InitFlag.ASYNC_READ
    | InitFlag.ATOMIC_O_TRUNC  # open(O_TRUNC) reaches OPEN, not a setattr first
    | InitFlag.BIG_WRITES
    | InitFlag.AUTO_INVAL_DATA  # a changed size or mtime drops cached pages
    | InitFlag.DO_READDIRPLUS
    | InitFlag.READDIRPLUS_AUTO
    | InitFlag.ASYNC_DIO
    | InitFlag.PARALLEL_DIROPS
    # The filesystem drops set-id bits itself, so the kernel may mark an inode
    # without them as having no privileges to drop (SB_NOSEC): without this,
    # every write() asks the mount for security.capability first, a round trip
    # per call that a passthrough write would otherwise never make.
    | InitFlag.HANDLE_KILLPRIV_V2
    | InitFlag.MAX_PAGES
    | InitFlag.INIT_EXT
    # A shared mapping of a file opened with direct I/O (--direct-io, writers) is
    # allowed (else ENODEV): np.memmap and np.load(mmap_mode=...) map shared.
    | InitFlag.DIRECT_IO_ALLOW_MMAP
)


class UnsupportedKernel(Exception):
    """The kernel speaks a FUSE protocol this session cannot."""


@dataclass(frozen=True)
class Negotiated:
    """What the session and the kernel agreed at INIT."""

    major: int
    minor: int  # the lower of the kernel's and ours
    kernel_minor: int
    flags: int  # InitFlag bits both use
    max_readahead: int
    max_pages: int
    max_write: int

    @property
    def passthrough(self) -> bool:
        return bool(self.flags & InitFlag.PASSTHROUGH)

    @property
    def read_buffer(self) -> int:
        """The buffer one read of /dev/fuse needs: the largest WRITE and its headers."""
        return max(abi.MIN_READ_BUFFER, self.max_write + PAGE)

    def reply(self) -> bytes:
        """``fuse_init_out``."""
        return abi.INIT_OUT.pack(
            self.major,
            self.minor,
            self.max_readahead,
            self.flags & 0xFFFFFFFF,
            MAX_BACKGROUND,
            CONGESTION_THRESHOLD,
            self.max_write,
            1,  # time_gran: nanoseconds
            self.max_pages,
            0,  # map_alignment
            self.flags >> 32,
            abi.BACKING_STACK_DEPTH if self.passthrough else 0,
            0,  # request_timeout: none
        )


def kernel_max_pages() -> int:
    """The most pages the kernel lets one request carry."""
    try:
        return max(1, int(MAX_PAGES_LIMIT.read_text()))
    except (OSError, ValueError):
        return DEFAULT_MAX_PAGES


def negotiate(req: Init, *, passthrough: bool, max_pages: int = DEFAULT_MAX_PAGES) -> Negotiated:
    """Agree on ``req``'s offer; ``passthrough``: ask for it (the kernel must offer
    it, and the session must be able to register backing files: root)."""
    if req.major != abi.KERNEL_MAJOR or req.minor < abi.MIN_MINOR:
        raise UnsupportedKernel(
            f"the kernel speaks FUSE {req.major}.{req.minor}; irdma's own session needs "
            f"{abi.KERNEL_MAJOR}.{abi.MIN_MINOR} or later (Linux 5.17); use --session pyfuse3"
        )
    wanted = WANTED | (InitFlag.PASSTHROUGH if passthrough else 0)
    flags = int(wanted) & req.flags
    if not flags & InitFlag.INIT_EXT:
        flags &= 0xFFFFFFFF  # no flags2 without it
    max_pages = min(max_pages, 0xFFFF) if flags & InitFlag.MAX_PAGES else 32
    return Negotiated(
        major=abi.KERNEL_MAJOR,
        minor=min(req.minor, abi.OUR_MINOR),
        kernel_minor=req.minor,
        flags=flags,
        max_readahead=req.max_readahead,
        max_pages=max_pages,
        max_write=max_pages * PAGE,
    )
