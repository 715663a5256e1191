"""/dev/fuse and the system calls around it: mounting, unmounting, backing files
(and their memory: ``preallocate``).

As root the session mounts with mount(2) and ``fd=`` (no fusermount3, no
libfuse). Any other user mounts the way libfuse does for them: fusermount3
(set-uid root, from the fuse3 package) opens /dev/fuse, mounts it where the
user may, and hands the descriptor back over a socket (``_FUSE_COMMFD``,
SCM_RIGHTS); it unmounts for them too (``fusermount3 -u``). A backing file is
registered with ``FUSE_DEV_IOC_BACKING_OPEN`` (CAP_SYS_ADMIN, so root only)
for the kernel to serve a passthrough open's reads from.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import struct
import subprocess
import tempfile
from pathlib import Path

from irdma import mounts

from . import abi

FALLOC_FL_KEEP_SIZE = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2
FSNAME = "irdma"
FSTYPE = mounts.FSTYPE  # what /proc/mounts shows, as pyfuse3's subtype=irdma does
SUBTYPE = FSTYPE.removeprefix("fuse.")  # fusermount3 makes the type fuse.SUBTYPE
FUSERMOUNT = "fusermount3"
# The environment variable naming the socket fusermount3 hands the descriptor over.
COMMFD_ENV = "_FUSE_COMMFD"
# Longest fusermount3 may take to mount or unmount (it only makes system calls).
FUSERMOUNT_TIMEOUT = 30.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


class DeviceError(Exception):
    """/dev/fuse cannot be opened, or the mount cannot be made."""


def open_device() -> int:
    """A new FUSE connection's descriptor (non-blocking: the session waits with trio)."""
    try:
        return os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise DeviceError(f"cannot open /dev/fuse: {exc.strerror}") from None


def mount(mountpoint: Path, *, allow_other: bool, max_read: int) -> int:
    """A new FUSE connection mounted at ``mountpoint``: its descriptor, non-blocking
    (the session waits with trio). Root mounts with mount(2), others through
    fusermount3."""
    if os.geteuid() != 0:
        fd = mount_through_fusermount(mountpoint, allow_other=allow_other, max_read=max_read)
    else:
        fd = open_device()
        try:
            mount_as_root(fd, mountpoint, allow_other=allow_other, max_read=max_read)
        except BaseException:
            os.close(fd)
            raise
    os.set_blocking(fd, False)
    return fd


def mount_through_fusermount(mountpoint: Path, *, allow_other: bool, max_read: int) -> int:
    """Mount with fusermount3's descriptor handoff (any user; libfuse's way): the
    connection's descriptor."""
    options = ["default_permissions", f"max_read={max_read}", f"fsname={FSNAME}"]
    options.append(f"subtype={SUBTYPE}")
    if allow_other:  # fusermount3 allows it only with user_allow_other in /etc/fuse.conf
        options.append("allow_other")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        try:
            done = subprocess.run(
                [FUSERMOUNT, "-o", ",".join(options), "--", str(mountpoint)],
                env=dict(os.environ, **{COMMFD_ENV: str(theirs.fileno())}),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=FUSERMOUNT_TIMEOUT,
            )
        except FileNotFoundError:
            raise DeviceError(
                f"{FUSERMOUNT} is not installed (the fuse3 package): only root mounts without it"
            ) from None
        except subprocess.TimeoutExpired:
            raise DeviceError(
                f"{FUSERMOUNT} did not finish within {FUSERMOUNT_TIMEOUT:g} s"
            ) from None
        if done.returncode != 0:
            said = done.stderr.strip() or f"exit status {done.returncode}"
            raise DeviceError(f"mount {mountpoint}: {said}")
        theirs.close()  # so a handoff that never comes reads as the end of the socket
        ours.settimeout(FUSERMOUNT_TIMEOUT)
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    if not fds:
        _fusermount_unmount(mountpoint)
        raise DeviceError(f"{FUSERMOUNT} mounted {mountpoint} but handed over no descriptor")
    for extra in fds[1:]:
        os.close(extra)
    os.set_inheritable(fds[0], False)
    return fds[0]


def mount_as_root(fd: int, mountpoint: Path, *, allow_other: bool, max_read: int) -> None:
    """Mount the connection ``fd`` at ``mountpoint`` with mount(2) (root only)."""
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
    that is no longer mounted is left alone. Root detaches it itself, others ask
    fusermount3."""
    if os.geteuid() != 0:
        _fusermount_unmount(mountpoint)
    elif _libc.umount2(os.fsencode(mountpoint), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            raise DeviceError(f"unmount {mountpoint}: {os.strerror(err)}")


def _fusermount_unmount(mountpoint: Path) -> None:
    if not _mounted(mountpoint):  # already gone: nothing to ask fusermount3
        return
    try:
        done = subprocess.run(
            [FUSERMOUNT, "-u", "-z", "--", str(mountpoint)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=FUSERMOUNT_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeviceError(f"unmount {mountpoint}: {FUSERMOUNT}: {exc}") from None
    if done.returncode != 0 and _mounted(mountpoint):
        raise DeviceError(f"unmount {mountpoint}: {done.stderr.strip()}")


def _mounted(mountpoint: Path) -> bool:
    """Whether an irdma mount is at ``mountpoint`` (a dead one too)."""
    return os.path.abspath(mountpoint) in mounts.mounted_here()


def private_tmpfs(options: str) -> int:
    """A descriptor of the root of a new tmpfs mounted with ``options`` and detached
    at once (root only): nothing shows in the mount table, and the filesystem
    lives as long as descriptors of it do. Raises DeviceError if it cannot be
    mounted."""
    where = tempfile.mkdtemp(prefix="irdma-backing-")
    try:
        if _libc.mount(b"irdma-backing", os.fsencode(where), b"tmpfs", 0, options.encode()):
            err = ctypes.get_errno()
            raise DeviceError(f"mount tmpfs at {where}: {os.strerror(err)}")
        try:
            return os.open(where, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        finally:
            _libc.umount2(os.fsencode(where), MNT_DETACH)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(where)


def backing_open(fd: int, file_fd: int) -> int:
    """Register ``file_fd`` with connection ``fd`` as a passthrough backing file;
    its backing id."""
    arg = bytearray(abi.BACKING_MAP.pack(file_fd, 0, 0))
    return fcntl.ioctl(fd, abi.DEV_IOC_BACKING_OPEN, arg, True)  # the id is the result


def backing_close(fd: int, backing_id: int) -> None:
    """Drop the registration ``backing_id`` (opens made with it keep the file)."""
    fcntl.ioctl(fd, abi.DEV_IOC_BACKING_CLOSE, bytearray(struct.pack("<I", backing_id)), True)


def preallocate(fd: int, size: int) -> None:
    """Allocate the first ``size`` bytes of file ``fd``'s memory without changing its
    size (fallocate with FALLOC_FL_KEEP_SIZE); raises OSError."""
    if size and _libc.fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"fallocate: {os.strerror(err)}")
