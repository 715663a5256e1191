"""INIT negotiation of the own FUSE session (fuse/kernel/init.py), without a mount."""

from __future__ import annotations

import struct

import pytest
from irdma_fuse.kernel import abi
from irdma_fuse.kernel.abi import InitFlag
from irdma_fuse.kernel.init import PAGE, UnsupportedKernel, negotiate
from irdma_fuse.kernel.requests import Init

OFFERED_6_18 = (  # flags Linux 6.18 (FUSE 7.45) offers, among others
    InitFlag.ASYNC_READ
    | InitFlag.ATOMIC_O_TRUNC
    | InitFlag.BIG_WRITES
    | InitFlag.AUTO_INVAL_DATA
    | InitFlag.DO_READDIRPLUS
    | InitFlag.READDIRPLUS_AUTO
    | InitFlag.ASYNC_DIO
    | InitFlag.WRITEBACK_CACHE
    | InitFlag.PARALLEL_DIROPS
    | InitFlag.HANDLE_KILLPRIV_V2
    | InitFlag.MAX_PAGES
    | InitFlag.INIT_EXT
    | InitFlag.DIRECT_IO_ALLOW_MMAP
    | InitFlag.PASSTHROUGH
)


def init(minor: int = 45, flags: int = OFFERED_6_18, major: int = 7) -> Init:
    return Init(1, 0, 0, 0, 0, major, minor, 128 << 10, int(flags))


def test_passthrough_is_agreed_when_offered_and_asked() -> None:
    n = negotiate(init(), passthrough=True, max_pages=256)
    assert n.passthrough and (n.major, n.minor, n.kernel_minor) == (7, 40, 45)
    assert not n.flags & InitFlag.WRITEBACK_CACHE  # passthrough refuses it; never asked
    assert n.max_write == 256 * PAGE == 1 << 20 and n.read_buffer >= n.max_write + 40 + 40
    out = struct.unpack("<IIIIHHIIHHIIH22x", n.reply())
    major, minor, readahead, flags, _, _, max_write, gran, pages, _, flags2, depth, _ = out
    assert (major, minor, readahead, max_write, gran, pages) == (7, 40, 128 << 10, 1 << 20, 1, 256)
    assert flags | flags2 << 32 == n.flags and flags2 & (1 << 5)  # PASSTHROUGH, in flags2
    assert flags2 & (1 << 4)  # DIRECT_IO_ALLOW_MMAP: direct-I/O files map shared
    # The mount drops set-id bits itself: no security.capability probe per write().
    assert flags & InitFlag.HANDLE_KILLPRIV_V2
    assert depth == abi.BACKING_STACK_DEPTH


def test_passthrough_is_off_when_not_offered_or_not_asked() -> None:
    assert not negotiate(
        init(flags=OFFERED_6_18 & ~InitFlag.PASSTHROUGH), passthrough=True
    ).passthrough
    n = negotiate(init(), passthrough=False)
    assert not n.passthrough and struct.unpack_from("<I", n.reply(), 44) == (0,)  # no depth


def test_only_flags_the_kernel_offers_are_kept() -> None:
    n = negotiate(init(flags=InitFlag.ASYNC_READ | InitFlag.BIG_WRITES), passthrough=True)
    assert n.flags == InitFlag.ASYNC_READ | InitFlag.BIG_WRITES
    assert n.max_pages == 32  # no MAX_PAGES: the kernel's old limit of 128 KiB requests


def test_an_old_kernel_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedKernel, match=r"speaks FUSE 7\.31; .* needs 7\.36 or later"):
        negotiate(init(minor=31), passthrough=True)
    with pytest.raises(UnsupportedKernel, match=r"speaks FUSE 8\.0"):
        negotiate(init(major=8, minor=0), passthrough=True)
