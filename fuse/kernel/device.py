"""/dev/fuse and the system calls around it: mount(2), umount2(2), backing files.

The session mounts as root with mount(2) and ``fd=`` (no fusermount3, no
libfuse). A backing file is registered with ``FUSE_DEV_IOC_BACKING_OPEN``
(CAP_SYS_ADMIN) for the kernel to serve a passthrough open's reads from.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from pathlib import Path

from . import abi

MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2
FSNAME = "irdma"
FSTYPE = "fuse.irdma"  # what /proc/mounts shows, as pyfuse3's subtype=irdma does

_libc = ctypes.CDLL(None, use_errno=True)


class DeviceError(Exception):
    """/dev/fuse cannot be opened, or the mount cannot be made."""


def open_device() -> int:
    """A new FUSE connection's descriptor (non-blocking: the session waits with trio)."""
    try:
        return os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise DeviceError(f"cannot open /dev/fuse: {exc.strerror}") from None


def mount(fd: int, mountpoint: Path, *, allow_other: bool, max_read: int) -> None:
    """Mount the connection ``fd`` at ``mountpoint`` (root only)."""
    if os.geteuid() != 0:
        raise DeviceError(
            "irdma's own session mounts with mount(2), which needs root "
            "(fusermount3's handoff is not built yet); use --session pyfuse3"
        )
    st = os.stat(mountpoint)
    options = [
        f"fd={fd}",
        f"rootmode={st.st_mode & 0o170000:o}",
        f"user_id={os.getuid()}",
        f"group_id={os.getgid()}",
        "default_permissions",
        f"max_read={max_read}",
    ]
    if allow_other:
        options.append("allow_other")
    rc = _libc.mount(
        FSNAME.encode(),
        os.fsencode(mountpoint),
        FSTYPE.encode(),
        MS_NOSUID | MS_NODEV,
        ",".join(options).encode(),
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise DeviceError(f"mount {mountpoint}: {os.strerror(err)}")


def unmount(mountpoint: Path) -> None:
    """Detach the mount (lazily: a process inside it does not keep it up); a path
    that is no longer mounted is left alone."""
    if _libc.umount2(os.fsencode(mountpoint), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            raise DeviceError(f"unmount {mountpoint}: {os.strerror(err)}")


def backing_open(fd: int, file_fd: int) -> int:
    """Register ``file_fd`` with connection ``fd`` as a passthrough backing file;
    its backing id."""
    arg = bytearray(abi.BACKING_MAP.pack(file_fd, 0, 0))
    return fcntl.ioctl(fd, abi.DEV_IOC_BACKING_OPEN, arg, True)  # the id is the result


def backing_close(fd: int, backing_id: int) -> None:
    """Drop the registration ``backing_id`` (opens made with it keep the file)."""
    fcntl.ioctl(fd, abi.DEV_IOC_BACKING_CLOSE, bytearray(struct.pack("<I", backing_id)), True)
