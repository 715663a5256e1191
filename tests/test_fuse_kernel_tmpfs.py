"""Where the own session makes backing files: a private tmpfs with huge pages as
root (mounted, detached at once), memfds otherwise."""

from __future__ import annotations

import mmap
import os

from irdma_fuse.kernel.tmpfs import BackingFiles


def mounts() -> str:
    with open("/proc/self/mounts") as f:
        return f.read()


def shmem_huge_pages() -> int:
    """Bytes of shmem (tmpfs, memfds) in huge pages on the host now."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("ShmemHugePages:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no ShmemHugePages in /proc/meminfo")


def test_backing_files_live_in_a_detached_tmpfs_with_huge_pages() -> None:
    assert os.geteuid() == 0  # the suite runs as root (README); so does passthrough
    files = BackingFiles()
    try:
        assert files.huge_pages
        assert "irdma-backing" not in mounts()  # detached at once: nothing to unmount
        fd = files.new("irdma:m/w")
        try:
            before = shmem_huge_pages()
            os.ftruncate(fd, 4 << 20)
            with mmap.mmap(fd, 4 << 20) as m:
                m[:] = b"\x01" * (4 << 20)  # writable memory of its own
            assert shmem_huge_pages() - before >= 4 << 20  # in 2 MiB pages
            st = os.fstat(fd)
            assert st.st_size == 4 << 20 and st.st_nlink == 0  # never linked anywhere
        finally:
            os.close(fd)
    finally:
        files.close()


def test_without_the_tmpfs_backing_files_are_memfds() -> None:
    files = BackingFiles(private_tmpfs=False)
    assert not files.huge_pages
    fd = files.new("irdma:m/w")
    try:
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:irdma:m/w")
    finally:
        os.close(fd)
        files.close()
