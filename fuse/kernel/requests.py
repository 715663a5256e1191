"""The kernel's requests, decoded: bytes from /dev/fuse in, one frozen dataclass out.

``decode`` reads one message (a header and the opcode's body) and returns the
request it carries; a message it cannot read raises ``ProtocolError`` naming
what is wrong, with the request's ``unique`` when the header was whole (so the
session can still answer it: ENOSYS for an opcode it does not know, EINVAL for
a body too short for its opcode).
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Callable
from dataclasses import dataclass

from . import abi
from .abi import Op

Base = tuple[int, int, int, int, int]  # what every request carries, in Request's order


class ProtocolError(Exception):
    """A message from the kernel that cannot be read; ``errno`` is the answer to
    give it when ``unique`` is known (None: the header itself is unreadable)."""

    def __init__(self, message: str, unique: int | None = None, code: int = errno.EINVAL) -> None:
        super().__init__(message)
        self.unique = unique
        self.errno = code


@dataclass(frozen=True)
class Request:
    """What every request carries: its id, the inode it is about and the caller."""

    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int


@dataclass(frozen=True)
class Init(Request):
    major: int
    minor: int
    max_readahead: int
    flags: int  # flags | flags2 << 32


@dataclass(frozen=True)
class Destroy(Request):
    pass


@dataclass(frozen=True)
class Interrupt(Request):
    target: int  # the unique of the request to interrupt


@dataclass(frozen=True)
class Lookup(Request):
    name: bytes


@dataclass(frozen=True)
class Forget(Request):
    nlookup: int


@dataclass(frozen=True)
class BatchForget(Request):
    forgets: tuple[tuple[int, int], ...]  # (nodeid, nlookup)


@dataclass(frozen=True)
class Getattr(Request):
    fh: int | None


@dataclass(frozen=True)
class Setattr(Request):
    valid: int  # abi.SetattrValid
    fh: int
    size: int
    atime_ns: int
    mtime_ns: int
    mode: int
    uid_to: int
    gid_to: int


@dataclass(frozen=True)
class Open(Request):
    flags: int
    # The writer lacks CAP_FSETID: an executable's set-user/group-id bits go
    # (O_TRUNC; HANDLE_KILLPRIV_V2 makes them the filesystem's to drop).
    kill_suidgid: bool = False


@dataclass(frozen=True)
class Opendir(Request):
    flags: int


@dataclass(frozen=True)
class Read(Request):
    fh: int
    offset: int
    size: int


@dataclass(frozen=True)
class Readdir(Request):
    fh: int
    offset: int
    size: int
    plus: bool  # READDIRPLUS: each entry with its attributes


@dataclass(frozen=True)
class Write(Request):
    fh: int
    offset: int
    data: bytes | memoryview  # a view of the message read when decoded with borrow
    kill_suidgid: bool = False  # as Open's


@dataclass(frozen=True)
class Release(Request):
    fh: int
    flags: int


@dataclass(frozen=True)
class Releasedir(Request):
    fh: int


@dataclass(frozen=True)
class Flush(Request):
    fh: int


@dataclass(frozen=True)
class Fsync(Request):
    fh: int
    datasync: bool


@dataclass(frozen=True)
class Fsyncdir(Request):
    fh: int


@dataclass(frozen=True)
class Mkdir(Request):
    name: bytes
    mode: int
    umask: int


@dataclass(frozen=True)
class Mknod(Request):
    name: bytes
    mode: int
    rdev: int
    umask: int


@dataclass(frozen=True)
class Create(Request):
    name: bytes
    flags: int
    mode: int
    umask: int
    kill_suidgid: bool = False  # as Open's


@dataclass(frozen=True)
class Unlink(Request):
    name: bytes


@dataclass(frozen=True)
class Rmdir(Request):
    name: bytes


@dataclass(frozen=True)
class Rename(Request):
    """RENAME and RENAME2 (``flags``: abi.RENAME_NOREPLACE, abi.RENAME_EXCHANGE)."""

    name: bytes
    newdir: int
    newname: bytes
    flags: int


@dataclass(frozen=True)
class Symlink(Request):
    name: bytes
    target: bytes


@dataclass(frozen=True)
class Link(Request):
    oldnodeid: int
    name: bytes


@dataclass(frozen=True)
class Readlink(Request):
    pass


@dataclass(frozen=True)
class Statfs(Request):
    pass


@dataclass(frozen=True)
class Getxattr(Request):
    name: bytes
    size: int  # 0: the kernel asks for the value's size


@dataclass(frozen=True)
class Listxattr(Request):
    size: int


@dataclass(frozen=True)
class Setxattr(Request):
    name: bytes
    value: bytes
    flags: int


@dataclass(frozen=True)
class Removexattr(Request):
    name: bytes


@dataclass(frozen=True)
class Access(Request):
    mask: int


class _Body:
    """A request's body, read front to back; short bodies raise ProtocolError."""

    def __init__(self, data: memoryview, op: Op, unique: int, borrow: bool = False) -> None:
        self._data, self._pos, self._op, self._unique = data, 0, op, unique
        self.borrow = borrow  # a WRITE's data may be a view of the message (``decode``)

    def _short(self, what: str) -> ProtocolError:
        return ProtocolError(
            f"{self._op.name} request {self._unique}: body of {len(self._data)} bytes is "
            f"too short for {what}",
            self._unique,
        )

    def take(self, s: struct.Struct) -> tuple:
        if self._pos + s.size > len(self._data):
            raise self._short(f"its {s.size}-byte struct")
        out = s.unpack_from(self._data, self._pos)
        self._pos += s.size
        return out

    def name(self) -> bytes:
        """A NUL-terminated name."""
        rest = self._data[self._pos :]
        end = bytes(rest).find(b"\0")
        if end < 0:
            raise self._short("a NUL-terminated name")
        self._pos += end + 1
        return bytes(rest[:end])

    def rest(self, size: int) -> bytes:
        return bytes(self.view(size))

    def view(self, size: int) -> memoryview:
        """The next ``size`` bytes, not copied: valid while the message is."""
        if self._pos + size > len(self._data):
            raise self._short(f"{size} bytes of data")
        out = self._data[self._pos : self._pos + size]
        self._pos += size
        return out


def _init(b: _Body, base: Base) -> Request:
    major, minor, readahead, flags = b.take(abi.INIT_IN_OLD)
    flags2 = 0
    if major == abi.KERNEL_MAJOR and minor >= 36 and flags & abi.InitFlag.INIT_EXT:
        (flags2,) = b.take(struct.Struct("<I44x"))  # INIT_IN's tail
    return Init(*base, major, minor, readahead, flags | flags2 << 32)


def _forgets(b: _Body, base: Base) -> Request:
    count, _ = b.take(abi.BATCH_FORGET_IN)
    return BatchForget(*base, tuple(b.take(abi.FORGET_ONE) for _ in range(count)))


def _getattr(b: _Body, base: Base) -> Request:
    flags, _, fh = b.take(abi.GETATTR_IN)
    return Getattr(*base, fh if flags & abi.GETATTR_FH else None)


def _setattr(b: _Body, base: Base) -> Request:
    (valid, _, fh, size, _, atime, mtime, _, atime_ns, mtime_ns, _, mode, _, uid, gid, _) = b.take(
        abi.SETATTR_IN
    )
    return Setattr(
        *base, valid, fh, size, atime * 10**9 + atime_ns, mtime * 10**9 + mtime_ns, mode, uid, gid
    )


def _read(b: _Body, base: Base, plus: bool | None = None) -> Request:
    fh, offset, size, *_ = b.take(abi.READ_IN)
    if plus is None:
        return Read(*base, fh, offset, size)
    return Readdir(*base, fh, offset, size, plus)


def _open(b: _Body, base: Base) -> Request:
    flags, open_flags = b.take(abi.OPEN_IN)
    return Open(*base, flags, bool(open_flags & abi.OPEN_KILL_SUIDGID))


def _write_in(fields: tuple) -> tuple[int, int, int, bool]:
    """fuse_write_in's fh, offset, size and whether set-id bits are to be dropped."""
    fh, offset, size, write_flags, *_ = fields
    return fh, offset, size, bool(write_flags & abi.WRITE_KILL_SUIDGID)


def _write(b: _Body, base: Base) -> Request:
    fh, offset, size, kill = _write_in(b.take(abi.WRITE_IN))
    return Write(*base, fh, offset, b.view(size) if b.borrow else b.rest(size), kill)


def _rename(b: _Body, base: Base, two: bool) -> Request:
    if two:
        newdir, flags, _ = b.take(abi.RENAME2_IN)
    else:
        (newdir,), flags = b.take(abi.RENAME_IN), 0
    old = b.name()
    return Rename(*base, old, newdir, b.name(), flags)


def _setxattr(b: _Body, base: Base) -> Request:
    size, flags = b.take(abi.SETXATTR_IN)
    name = b.name()
    return Setxattr(*base, name, b.rest(size), flags)


def _symlink(b: _Body, base: Base) -> Request:
    name = b.name()
    return Symlink(*base, name, b.name())


def _link(b: _Body, base: Base) -> Request:
    (old,) = b.take(abi.RENAME_IN)
    return Link(*base, old, b.name())


def _fsync(b: _Body, base: Base) -> Request:
    fh, flags, _ = b.take(abi.FSYNC_IN)
    return Fsync(*base, fh, bool(flags & 1))  # FUSE_FSYNC_FDATASYNC


def _mkdir(b: _Body, base: Base) -> Request:
    mode, umask = b.take(abi.MKDIR_IN)
    return Mkdir(*base, b.name(), mode, umask)


def _mknod(b: _Body, base: Base) -> Request:
    mode, rdev, umask, _ = b.take(abi.MKNOD_IN)
    return Mknod(*base, b.name(), mode, rdev, umask)


def _create(b: _Body, base: Base) -> Request:
    flags, mode, umask, open_flags = b.take(abi.CREATE_IN)
    kill = bool(open_flags & abi.OPEN_KILL_SUIDGID)
    return Create(*base, b.name(), flags, mode, umask, kill)


def _getxattr(b: _Body, base: Base) -> Request:
    size, _ = b.take(abi.GETXATTR_IN)
    return Getxattr(*base, b.name(), size)


_DECODERS: dict[Op, Callable[[_Body, Base], Request]] = {
    Op.INIT: _init,
    Op.DESTROY: lambda b, base: Destroy(*base),
    Op.INTERRUPT: lambda b, base: Interrupt(*base, *b.take(abi.INTERRUPT_IN)),
    Op.LOOKUP: lambda b, base: Lookup(*base, b.name()),
    Op.FORGET: lambda b, base: Forget(*base, *b.take(abi.FORGET_IN)),
    Op.BATCH_FORGET: _forgets,
    Op.GETATTR: _getattr,
    Op.SETATTR: _setattr,
    Op.OPEN: _open,
    Op.OPENDIR: lambda b, base: Opendir(*base, b.take(abi.OPEN_IN)[0]),
    Op.READ: _read,
    Op.READDIR: lambda b, base: _read(b, base, plus=False),
    Op.READDIRPLUS: lambda b, base: _read(b, base, plus=True),
    Op.WRITE: _write,
    Op.RELEASE: lambda b, base: Release(*base, *b.take(abi.RELEASE_IN)[:2]),
    Op.RELEASEDIR: lambda b, base: Releasedir(*base, b.take(abi.RELEASE_IN)[0]),
    Op.FLUSH: lambda b, base: Flush(*base, b.take(abi.FLUSH_IN)[0]),
    Op.FSYNC: _fsync,
    Op.FSYNCDIR: lambda b, base: Fsyncdir(*base, b.take(abi.FSYNC_IN)[0]),
    Op.MKDIR: _mkdir,
    Op.MKNOD: _mknod,
    Op.CREATE: _create,
    Op.UNLINK: lambda b, base: Unlink(*base, b.name()),
    Op.RMDIR: lambda b, base: Rmdir(*base, b.name()),
    Op.RENAME: lambda b, base: _rename(b, base, two=False),
    Op.RENAME2: lambda b, base: _rename(b, base, two=True),
    Op.SYMLINK: _symlink,
    Op.LINK: _link,
    Op.READLINK: lambda b, base: Readlink(*base),
    Op.STATFS: lambda b, base: Statfs(*base),
    Op.GETXATTR: _getxattr,
    Op.LISTXATTR: lambda b, base: Listxattr(*base, b.take(abi.GETXATTR_IN)[0]),
    Op.SETXATTR: _setxattr,
    Op.REMOVEXATTR: lambda b, base: Removexattr(*base, b.name()),
    Op.ACCESS: lambda b, base: Access(*base, b.take(abi.ACCESS_IN)[0]),
}


# What precedes a WRITE's data: the header and fuse_write_in.
WRITE_HEADERS = abi.IN_HEADER.size + abi.WRITE_IN.size


def write_of(headers: bytes | bytearray | memoryview) -> tuple[int, int, int] | None:
    """``(fh, offset, size)`` of the WRITE whose message starts with ``headers``
    (its first WRITE_HEADERS bytes, or more); None if it is not a WRITE's with
    nothing but its data after them."""
    if len(headers) < WRITE_HEADERS:
        return None
    length, opcode, *_, extlen, _ = abi.IN_HEADER.unpack_from(headers)
    if opcode != Op.WRITE or extlen:
        return None
    fh, offset, size, _ = _write_in(abi.WRITE_IN.unpack_from(headers, abi.IN_HEADER.size))
    return (fh, offset, size) if length == WRITE_HEADERS + size else None


def decode_write(headers: bytes | bytearray | memoryview, data: memoryview) -> Write:
    """The WRITE whose message was read in two parts: its WRITE_HEADERS bytes of
    headers and ``data`` (the session reads a write's data apart, where it
    belongs: ``kernel.landing``). Its ``data`` is ``data`` itself. ProtocolError
    if the headers are not a WRITE's of ``len(data)`` bytes."""
    got = write_of(headers)
    if got is None or got[2] != len(data):
        raise ProtocolError(
            f"not a WRITE of {len(data)} bytes read apart from its headers",
            abi.IN_HEADER.unpack_from(headers)[2] if len(headers) >= abi.IN_HEADER.size else None,
        )
    _, _, unique, nodeid, uid, gid, pid, _, _ = abi.IN_HEADER.unpack_from(headers)
    fh, offset, _, kill = _write_in(abi.WRITE_IN.unpack_from(headers, abi.IN_HEADER.size))
    return Write(unique, nodeid, uid, gid, pid, fh, offset, data, kill)


def decode(message: bytes | bytearray | memoryview, *, borrow: bool = False) -> Request:
    """The request one message from /dev/fuse carries (``message``: what one read
    returned). Raises ProtocolError for a message that cannot be read.

    ``borrow``: a WRITE's ``data`` is a view of ``message`` instead of a copy (the
    caller keeps the message as it is until the WRITE is answered); every other
    field of every request is copied out."""
    data = memoryview(message).cast("B")
    if len(data) < abi.IN_HEADER.size:
        raise ProtocolError(
            f"truncated message: {len(data)} bytes, a request header is {abi.IN_HEADER.size}"
        )
    length, opcode, unique, nodeid, uid, gid, pid, extlen, _ = abi.IN_HEADER.unpack_from(data)
    if length != len(data):
        raise ProtocolError(
            f"request {unique}: header says {length} bytes, the message has {len(data)}", unique
        )
    try:
        op = Op(opcode)
        decoder = _DECODERS[op]
    except (ValueError, KeyError):
        raise ProtocolError(
            f"request {unique}: unknown opcode {opcode}", unique, errno.ENOSYS
        ) from None
    # Extensions (security context, supplementary groups) follow the body; none
    # is asked for at INIT, so any present are ignored.
    end = length - extlen * 8
    if end < abi.IN_HEADER.size:
        raise ProtocolError(f"request {unique}: extensions longer than the message", unique)
    body = _Body(data[abi.IN_HEADER.size : end], op, unique, borrow)
    return decoder(body, (unique, nodeid, uid, gid, pid))
