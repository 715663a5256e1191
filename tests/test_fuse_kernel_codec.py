"""The own FUSE session's codec (fuse/kernel/requests.py, replies.py), without a mount.

Messages are built here from include/uapi/linux/fuse.h's layouts with ``struct``
directly, so a decoder that read a field from the wrong place fails.
"""

from __future__ import annotations

import errno
import os
import stat
import struct

import pytest
from irdma_fuse.attributes import Attributes
from irdma_fuse.filesystem import Statfs
from irdma_fuse.kernel import abi, replies
from irdma_fuse.kernel import requests as rq


def message(op: int, body: bytes, unique: int = 7, nodeid: int = 5) -> bytes:
    """A request as the kernel writes it: fuse_in_header then the body."""
    return struct.pack("<IIQQIIIHH", 40 + len(body), op, unique, nodeid, 11, 12, 13, 0, 0) + body


def attrs(ino: int = 9, mode: int = stat.S_IFREG | 0o644, size: int = 1000) -> Attributes:
    return Attributes(
        st_ino=ino,
        st_mode=mode,
        st_nlink=1,
        st_uid=3,
        st_gid=4,
        st_size=size,
        st_blocks=2,
        mtime_ns=1_700_000_000_123_456_789,
        atime_ns=1_600_000_000_000_000_001,
        ctime_ns=1_800_000_000_000_000_002,
        entry_timeout=0.0,
        attr_timeout=0.05,
    )


def test_a_lookup_carries_its_header_and_name() -> None:
    req = rq.decode(message(1, b"w.npy\0", unique=42, nodeid=1))
    assert req == rq.Lookup(42, 1, 11, 12, 13, b"w.npy")


def test_a_write_carries_its_bytes_and_a_read_its_range() -> None:
    data = bytes(range(256)) * 3
    body = struct.pack("<QQIIQII", 8, 4096, len(data), 0, 0, 0, 0) + data
    req = rq.decode(message(16, body))
    assert isinstance(req, rq.Write)
    assert (req.fh, req.offset, req.data) == (8, 4096, data)
    body = struct.pack("<QQIIQII", 8, 1 << 20, 131072, 0, 0, 0, 0)
    assert rq.decode(message(15, body)) == rq.Read(7, 5, 11, 12, 13, 8, 1 << 20, 131072)


def test_a_borrowed_write_is_a_view_of_the_message_and_nothing_else_is() -> None:
    """With ``borrow`` a WRITE's data is the message's own bytes (the session lends
    the buffer to the request), and every other request is copied out."""
    data = bytes(range(200))
    msg = bytearray(message(16, struct.pack("<QQIIQII", 8, 0, 200, 0, 0, 0, 0) + data))
    w = rq.decode(msg, borrow=True)
    assert isinstance(w, rq.Write) and isinstance(w.data, memoryview) and w.data == data
    msg[-1] = 0  # the next read into the same buffer would change it
    assert w.data[-1] == 0
    copied = rq.decode(bytes(msg))
    assert isinstance(copied, rq.Write) and isinstance(copied.data, bytes)
    x = bytearray(message(21, struct.pack("<II", 3, 0) + b"user.x\0abc"))
    s = rq.decode(x, borrow=True)
    x[-1] = 0
    assert isinstance(s, rq.Setxattr) and s.value == b"abc"


def test_requests_that_drop_set_id_bits_say_so() -> None:
    """With HANDLE_KILLPRIV_V2 the kernel leaves dropping set-id bits to the
    filesystem and flags the writes, opens and setattrs that must."""
    body = struct.pack("<QQIIQII", 8, 0, 3, abi.WRITE_KILL_SUIDGID, 0, 0, 0) + b"abc"
    w = rq.decode(message(16, body))
    assert isinstance(w, rq.Write) and w.kill_suidgid and w.data == b"abc"
    o = rq.decode(message(14, struct.pack("<II", os.O_WRONLY | os.O_TRUNC, abi.OPEN_KILL_SUIDGID)))
    assert o == rq.Open(7, 5, 11, 12, 13, os.O_WRONLY | os.O_TRUNC, True)
    assert rq.decode(message(14, struct.pack("<II", os.O_RDONLY, 0))) == rq.Open(
        7, 5, 11, 12, 13, os.O_RDONLY, False
    )
    c = rq.decode(message(35, struct.pack("<IIII", 0o1101, 0o644, 0o22, 1) + b"n.npy\0"))
    assert isinstance(c, rq.Create) and c.kill_suidgid


def test_setattr_fields_and_times_in_nanoseconds() -> None:
    valid = abi.SetattrValid.SIZE | abi.SetattrValid.MTIME | abi.SetattrValid.FH
    body = struct.pack(
        "<IIQQQQQQIIIIIIII", valid, 0, 3, 999, 0, 10, 20, 30, 1, 2, 3, 0o100600, 0, 5, 6, 0
    )
    req = rq.decode(message(4, body))
    assert isinstance(req, rq.Setattr)
    assert (req.valid, req.fh, req.size, req.mode) == (valid, 3, 999, 0o100600)
    assert (req.atime_ns, req.mtime_ns) == (10 * 10**9 + 1, 20 * 10**9 + 2)
    assert (req.uid_to, req.gid_to) == (5, 6)


def test_rename2_create_xattrs_and_forgets() -> None:
    r = rq.decode(message(45, struct.pack("<QII", 77, abi.RENAME_NOREPLACE, 0) + b"a\0bb\0"))
    assert r == rq.Rename(7, 5, 11, 12, 13, b"a", 77, b"bb", abi.RENAME_NOREPLACE)
    r = rq.decode(message(12, struct.pack("<Q", 77) + b"a\0bb\0"))
    assert isinstance(r, rq.Rename) and (r.newname, r.flags) == (b"bb", 0)
    c = rq.decode(message(35, struct.pack("<IIII", 0o1101, 0o644, 0o22, 0) + b"n.npy\0"))
    assert c == rq.Create(7, 5, 11, 12, 13, b"n.npy", 0o1101, 0o644, 0o22)
    g = rq.decode(message(22, struct.pack("<II", 0, 0) + b"user.irdma.dtype\0"))
    assert g == rq.Getxattr(7, 5, 11, 12, 13, b"user.irdma.dtype", 0)
    s = rq.decode(message(21, struct.pack("<II", 3, 0) + b"user.x\0abc"))
    assert s == rq.Setxattr(7, 5, 11, 12, 13, b"user.x", b"abc", 0)
    f = rq.decode(message(42, struct.pack("<II", 2, 0) + struct.pack("<QQQQ", 5, 1, 6, 2)))
    assert isinstance(f, rq.BatchForget) and f.forgets == ((5, 1), (6, 2))
    assert rq.decode(message(36, struct.pack("<Q", 99))) == rq.Interrupt(7, 5, 11, 12, 13, 99)


def test_init_carries_flags2_as_the_high_bits() -> None:
    flags = abi.InitFlag.INIT_EXT | abi.InitFlag.ASYNC_READ
    body = struct.pack("<IIIII44x", 7, 45, 131072, int(flags), 1 << 5)  # PASSTHROUGH is 37
    req = rq.decode(message(26, body))
    assert isinstance(req, rq.Init) and (req.major, req.minor) == (7, 45)
    assert req.flags == int(flags) | abi.InitFlag.PASSTHROUGH


def test_a_truncated_message_is_refused_by_name() -> None:
    with pytest.raises(rq.ProtocolError, match="truncated message: 12 bytes") as caught:
        rq.decode(message(1, b"x\0")[:12])
    assert caught.value.unique is None  # nothing to answer
    whole = message(16, struct.pack("<QQIIQII", 1, 0, 100, 0, 0, 0, 0) + b"short")
    with pytest.raises(rq.ProtocolError, match=r"WRITE request 7: .* too short for 100 bytes"):
        rq.decode(whole)
    with pytest.raises(rq.ProtocolError, match="header says 46 bytes, the message has 45"):
        rq.decode(message(1, b"abcde\0")[:-1])
    with pytest.raises(rq.ProtocolError, match=r"LOOKUP .* NUL-terminated name") as caught:
        rq.decode(message(1, b"abc"))
    assert (caught.value.unique, caught.value.errno) == (7, errno.EINVAL)


def test_an_unknown_opcode_is_answered_enosys() -> None:
    with pytest.raises(rq.ProtocolError, match="unknown opcode 39") as caught:
        rq.decode(message(39, bytes(32)))
    assert (caught.value.unique, caught.value.errno) == (7, errno.ENOSYS)


def test_a_reply_header_counts_its_body_and_an_error_has_none() -> None:
    parts = replies.message(42, [b"abc", memoryview(b"defg")])
    assert struct.unpack("<IiQ", parts[0]) == (16 + 7, 0, 42)
    assert b"".join(bytes(p) for p in parts[1:]) == b"abcdefg"
    assert replies.message(42, [b"abc"], error=errno.ENOENT) == [
        struct.pack("<IiQ", 16, -errno.ENOENT, 42)
    ]


def test_entry_and_attr_replies_round_trip() -> None:
    a = attrs()
    out = replies.entry(a)
    assert len(out) == 128  # sizeof(struct fuse_entry_out)
    nodeid, gen, ev, av, evn, avn = struct.unpack_from("<QQQQII", out)
    assert (nodeid, gen, ev, av, evn, avn) == (9, 0, 0, 0, 0, 50_000_000)
    f = struct.unpack_from("<QQQQQQIIIIIIIIII", out, 40)
    # ino, size, blocks; atime, mtime, ctime seconds; their nanoseconds.
    assert f[:6] == (9, 1000, 2, 1_600_000_000, 1_700_000_000, 1_800_000_000)
    assert f[6:9] == (1, 123_456_789, 2)
    assert (f[9], f[10], f[11], f[12], f[14]) == (a.st_mode, 1, 3, 4, a.st_blksize)
    assert replies.attr_out(a)[16:] == out[40:]  # fuse_attr_out: 16 bytes, then the attr
    assert replies.open_out(5, abi.OpenFlag.PASSTHROUGH, 3) == struct.pack("<QIi", 5, 128, 3)
    s = struct.unpack("<QQQQQIIII24x", replies.statfs_out(Statfs(10, 4, 4, 100, 90)))
    assert s == (10, 4, 4, 100, 90, 4096, 255, 4096, 0)


def test_dirents_fit_the_size_asked_and_carry_their_offsets() -> None:
    entries = [("a", attrs(2)), ("dir", attrs(3, stat.S_IFDIR | 0o755)), ("long.npy", attrs(4))]
    out = replies.dirents(entries, 0, 4096, plus=False)
    records = []
    pos = 0
    while pos < len(out):
        ino, off, namelen, kind = struct.unpack_from("<QQII", out, pos)
        records.append((ino, off, out[pos + 24 : pos + 24 + namelen], kind))
        pos += 24 + namelen + (-namelen % 8)
    assert records == [(2, 1, b"a", 8), (3, 2, b"dir", 4), (4, 3, b"long.npy", 8)]
    assert replies.dirents(entries, 1, 4096, plus=False) == out[32:]  # from offset 1
    assert replies.dirents(entries, 0, 60, plus=False) == out[: 64 - 32]  # whole records only
    plus = replies.dirents(entries, 2, 4096, plus=True)
    assert plus[:128] == replies.entry(attrs(4)) and plus[128 + 24 :].rstrip(b"\0") == b"long.npy"


def test_a_write_read_apart_from_its_headers_keeps_its_data_where_it_was_read() -> None:
    data = bytearray(range(200))
    msg = message(16, struct.pack("<QQIIQII", 8, 4096, 200, abi.WRITE_KILL_SUIDGID, 0, 0, 0))
    assert len(msg) == rq.WRITE_HEADERS
    head = bytearray(msg)
    struct.pack_into("<I", head, 0, rq.WRITE_HEADERS + 200)  # the message's whole length
    assert rq.write_of(head) == (8, 4096, 200)
    w = rq.decode_write(head, memoryview(data))
    assert (w.fh, w.offset, w.kill_suidgid, w.unique) == (8, 4096, True, 7)
    data[0] = 99
    assert w.data[0] == 99  # a view of where it was read, not a copy
    with pytest.raises(rq.ProtocolError):
        rq.decode_write(head, memoryview(data)[:10])  # not the size the header says
    # Not a WRITE, or a WRITE followed by more than its data: no write.
    assert rq.write_of(message(15, struct.pack("<QQIIQII", 8, 0, 10, 0, 0, 0, 0))) is None
    assert rq.write_of(head[:40]) is None
    longer = bytearray(head)
    struct.pack_into("<I", longer, 0, rq.WRITE_HEADERS + 201)
    assert rq.write_of(longer) is None
