"""A writer's backing file as the session sees it (``WrittenFile``): the kernel writes
it (here: os.pwrite on the same file, as a passthrough write does), the session
reads its length, its bytes and whether it changed since it last looked; and
writers' files kept for the next writer (``Backings.writer_file``)."""

from __future__ import annotations

import os
import subprocess
import sys

from irdma_fuse.kernel.backing import Backings, WrittenFile


def test_the_session_sees_what_the_kernel_wrote_and_when() -> None:
    fd = os.memfd_create("written", os.MFD_CLOEXEC)
    kernel = os.dup(fd)  # the kernel's side: the same file
    f = WrittenFile(fd)
    try:
        assert len(f) == 0 and bytes(f.view()) == b"" and not f.written_outside()
        os.pwrite(kernel, b"a" * 4096, 0)
        assert f.written_outside() and not f.written_outside()  # seen once
        assert len(f) == 4096 and bytes(f.view()) == b"a" * 4096
        held = f.view()  # a push still reading the first map
        os.pwrite(kernel, b"b" * 4096, 4096)  # grown: mapped again at the new size
        assert bytes(f.view()) == b"a" * 4096 + b"b" * 4096
        assert bytes(held) == b"a" * 4096  # the older map stays while a view holds it
        del held
        os.pwrite(kernel, b"c" * 10, 100)  # in place, right after a look
        assert f.written_outside()
        assert bytes(f.read(98, 4)) == b"aacc"
        f.resize(50)  # a truncate that reached the session
        assert len(f) == 50 and os.fstat(kernel).st_size == 50
        f.write(60, b"xyz")  # a WRITE that reached the session
        assert bytes(f.view()) == b"a" * 50 + bytes(10) + b"xyz"
    finally:
        os.close(f.release())
        os.close(kernel)


def written(files: Backings, size: int) -> int:
    """A writer's file, taken and written with ``size`` bytes, as the kernel would."""
    fd = files.writer_file("irdma:w")
    os.pwrite(fd, b"\x07" * size, 0)
    return fd


def test_a_large_writers_file_is_kept_empty_with_its_memory_for_the_next_writer() -> None:
    files = Backings(lambda: None, limit=80 << 20)  # type: ignore[arg-type,return-value]
    try:
        fd = written(files, 32 << 20)
        files.writer_closed(fd, exposed=False)
        assert files.used == 32 << 20
        ino = os.fstat(fd).st_ino
        again = files.writer_file("irdma:w")
        assert os.fstat(again).st_ino == ino  # the same file, empty, its pages still allocated
        st = os.fstat(again)
        assert st.st_size == 0 and st.st_blocks * 512 >= 32 << 20
        assert files.used == 0  # taken: counted again once closed
        small = written(files, 4096)
        assert os.fstat(small).st_ino != ino
        files.writer_closed(small, exposed=False)  # small: not worth keeping
        assert files.used == 0
        files.writer_closed(again, exposed=False)
        three = [written(files, 32 << 20) for _ in range(3)]  # the kept one, two new
        inodes = [os.fstat(fd).st_ino for fd in three]
        for fd in three:
            files.writer_closed(fd, exposed=False)
        assert files.used == 64 << 20  # past the limit: the longest kept went first
        kept = [os.fstat(files.writer_file("irdma:w")).st_ino for _ in range(2)]
        assert kept == inodes[:0:-1]  # the most recently kept first
    finally:
        files.close()
    assert files.used == 0


def test_a_writers_file_another_process_maps_is_not_kept() -> None:
    files = Backings(lambda: None)  # type: ignore[arg-type,return-value]
    fd = written(files, 32 << 20)
    reader = subprocess.Popen(
        [sys.executable, "-c", MAPPER, f"/proc/{os.getpid()}/fd/{fd}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "mapped"
        ino = os.fstat(fd).st_ino
        files.writer_closed(fd, exposed=True)  # closed: the reader's map keeps what it shows
        assert files.used == 0 and os.fstat(files.writer_file("irdma:w")).st_ino != ino
    finally:
        reader.kill()
        reader.communicate()
        files.close()


# A reader that maps a file (by its /proc path) and holds the map until killed.
MAPPER = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
m = mmap.mmap(fd, 4096, prot=mmap.PROT_READ)
print("mapped", flush=True)
time.sleep(60)
"""
