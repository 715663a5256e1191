"""Where backing files are made: a private tmpfs with huge pages, else memfds.

A backing file's pages are the cost of a first open: the kernel allocates and
zeroes each one as it is first written. memfds come from the kernel's internal
shmem mount, whose huge pages ``/sys/kernel/mm/transparent_hugepage/
shmem_enabled`` decides for the whole host (``never`` by default on Debian):
256 MiB then costs 65,536 faults of 4 KiB pages, 180-230 ms to fill here
against 30 ms with 2 MiB pages, and the kernel's read of it is slower too. A
tmpfs mount has its own ``huge=`` option, so as root (which passthrough needs
anyway) the session mounts one with ``huge=within_size``, keeps a descriptor
of its root, detaches it at once (nothing is left in the mount table; the
files live as long as their descriptors) and makes every backing file there
with ``O_TMPFILE``. ``size=0``: no limit of its own, as memfds have none (a
full tmpfs would fault the mapping that loads a file instead of failing it).
"""

from __future__ import annotations

import logging
import os

from . import device

log = logging.getLogger("irdma.fuse")

TMPFS_OPTIONS = "huge=within_size,size=0,mode=0700"


class BackingFiles:
    """Makes backing files: in a private huge-page tmpfs where it can be mounted
    (root), else with memfd_create."""

    def __init__(self, private_tmpfs: bool = True) -> None:
        self._dirfd = -1
        if private_tmpfs and os.geteuid() == 0:
            try:
                self._dirfd = device.private_tmpfs(TMPFS_OPTIONS)
            except device.DeviceError as exc:
                log.info("backing files are memfds (%s)", exc)

    @property
    def huge_pages(self) -> bool:
        """Whether files are made in the private tmpfs (huge pages)."""
        return self._dirfd >= 0

    def new(self, name: str) -> int:
        """A new empty file's descriptor (read-write, close-on-exec); ``name`` names
        a memfd in /proc (a tmpfs file has none: it was never linked)."""
        if self._dirfd >= 0:
            flags = os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC
            return os.open(".", flags, 0o600, dir_fd=self._dirfd)
        return os.memfd_create(name, os.MFD_CLOEXEC)

    @staticmethod
    def emptied(fd: int) -> int:
        """Empty a kept file for new content, keeping its memory: its pages are freed
        and allocated again at once (``device.preallocate``), so the next writer
        writes into pages already there. Fresh pages cost more than the copy
        into them (the kernel zeroes each one; in a VM whose balloon reports
        free memory to its host, pages freed a while ago fault on the host
        again: 0.75 s per 256 MiB here, against 35 ms into pages kept this
        way). The bytes kept allocated past the file's end."""
        kept = os.fstat(fd).st_blocks * 512
        os.ftruncate(fd, 0)
        try:
            device.preallocate(fd, kept)
        except OSError as exc:  # the memory is taken as written instead
            log.info("could not keep a backing file's memory: %s", exc)
            return 0
        return kept

    def close(self) -> None:
        """Let the tmpfs go once its last file is closed."""
        if self._dirfd >= 0:
            os.close(self._dirfd)
            self._dirfd = -1
