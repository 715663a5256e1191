"""The kernel's FUSE ABI (include/uapi/linux/fuse.h), defined once.

Every struct the session reads or writes is a ``struct.Struct`` here, named as
in the header; opcodes, INIT flags, FOPEN flags and setattr's ``valid`` bits
are ``enum`` members. Little-endian and packed as the header's 64-bit-padded
layouts are.
"""

from __future__ import annotations

import enum
import struct

KERNEL_MAJOR = 7
# The minor this session speaks: 7.40 brought passthrough (fuse_open_out's
# backing_id, fuse_init_out's max_stack_depth).
OUR_MINOR = 40
# The oldest kernel protocol served: 7.36 sends INIT's flags2 (FUSE_INIT_EXT),
# which every flag above bit 31 needs; the structs below have kept their
# layout since (Linux 5.17).
MIN_MINOR = 36
ROOT_ID = 1  # FUSE_ROOT_ID

# The kernel refuses a read of /dev/fuse into a buffer smaller than this.
MIN_READ_BUFFER = 8192


class Op(enum.IntEnum):
    LOOKUP = 1
    FORGET = 2
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36
    DESTROY = 38
    BATCH_FORGET = 42
    READDIRPLUS = 44
    RENAME2 = 45


class InitFlag(enum.IntFlag):
    """fuse_init_in/out ``flags`` and, shifted by 32, ``flags2``."""

    ASYNC_READ = 1 << 0
    ATOMIC_O_TRUNC = 1 << 3
    BIG_WRITES = 1 << 5
    AUTO_INVAL_DATA = 1 << 12
    DO_READDIRPLUS = 1 << 13
    READDIRPLUS_AUTO = 1 << 14
    ASYNC_DIO = 1 << 15
    WRITEBACK_CACHE = 1 << 16
    PARALLEL_DIROPS = 1 << 18
    HANDLE_KILLPRIV_V2 = 1 << 28
    MAX_PAGES = 1 << 22
    INIT_EXT = 1 << 30
    DIRECT_IO_ALLOW_MMAP = 1 << 36
    PASSTHROUGH = 1 << 37


class OpenFlag(enum.IntFlag):
    """fuse_open_out ``open_flags`` (FOPEN_*)."""

    DIRECT_IO = 1 << 0
    KEEP_CACHE = 1 << 1
    NOFLUSH = 1 << 5
    PASSTHROUGH = 1 << 7


class SetattrValid(enum.IntFlag):
    """fuse_setattr_in ``valid`` (FATTR_*)."""

    MODE = 1 << 0
    UID = 1 << 1
    GID = 1 << 2
    SIZE = 1 << 3
    ATIME = 1 << 4
    MTIME = 1 << 5
    FH = 1 << 6
    ATIME_NOW = 1 << 7
    MTIME_NOW = 1 << 8
    KILL_SUIDGID = 1 << 11


WRITE_KILL_SUIDGID = 1 << 2  # fuse_write_in.write_flags
OPEN_KILL_SUIDGID = 1 << 0  # fuse_open_in/fuse_create_in.open_flags

GETATTR_FH = 1 << 0  # fuse_getattr_in.getattr_flags: ``fh`` is valid
RENAME_NOREPLACE = 1 << 0  # rename2 flags, as renameat2(2)
RENAME_EXCHANGE = 1 << 1

# /dev/fuse ioctls (_IOW(229, 1, struct fuse_backing_map), _IOW(229, 2, uint32_t)).
DEV_IOC_BACKING_OPEN = 0x4010E501
DEV_IOC_BACKING_CLOSE = 0x4004E502
# fuse_init_out.max_stack_depth for a backing file on a filesystem that is not
# stacked itself (a memfd's tmpfs).
BACKING_STACK_DEPTH = 1

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid total_extlen pad
OUT_HEADER = struct.Struct("<IiQ")  # len error unique
INIT_IN_OLD = struct.Struct("<IIII")  # major minor max_readahead flags
INIT_IN = struct.Struct("<IIIII44x")  # ... flags2 unused[11]
# major minor max_readahead flags max_background congestion_threshold max_write
# time_gran max_pages map_alignment flags2 max_stack_depth request_timeout unused[11]
INIT_OUT = struct.Struct("<IIIIHHIIHHIIH22x")
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr
ENTRY_OUT_HEAD = struct.Struct("<QQQQII")  # nodeid generation entry_valid attr_valid nsecs
ATTR_OUT_HEAD = struct.Struct("<QII")  # attr_valid attr_valid_nsec dummy
FORGET_IN = struct.Struct("<Q")
BATCH_FORGET_IN = struct.Struct("<II")
FORGET_ONE = struct.Struct("<QQ")
GETATTR_IN = struct.Struct("<IIQ")
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
OPEN_IN = struct.Struct("<II")
OPEN_OUT = struct.Struct("<QIi")  # fh open_flags backing_id
CREATE_IN = struct.Struct("<IIII")
MKNOD_IN = struct.Struct("<IIII")
MKDIR_IN = struct.Struct("<II")
RENAME_IN = struct.Struct("<Q")
RENAME2_IN = struct.Struct("<QII")
READ_IN = struct.Struct("<QQIIQII")
WRITE_IN = struct.Struct("<QQIIQII")
WRITE_OUT = struct.Struct("<II")
RELEASE_IN = struct.Struct("<QIIQ")
FLUSH_IN = struct.Struct("<QIIQ")
FSYNC_IN = struct.Struct("<QII")
SETXATTR_IN = struct.Struct("<II")  # FUSE_COMPAT_SETXATTR_IN_SIZE: SETXATTR_EXT not asked
GETXATTR_IN = struct.Struct("<II")
GETXATTR_OUT = struct.Struct("<II")
ACCESS_IN = struct.Struct("<II")
INTERRUPT_IN = struct.Struct("<Q")
KSTATFS = struct.Struct("<QQQQQIIII24x")
DIRENT_HEAD = struct.Struct("<QQII")  # ino off namelen type, then the name padded to 8
BACKING_MAP = struct.Struct("<iIQ")  # fd flags padding
