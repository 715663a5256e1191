"""A writer's backing file as the session sees it (``WrittenFile``): the kernel writes
it (here: os.pwrite on the same file, as a passthrough write does), the session
reads its length, its bytes and whether it changed since it last looked."""

from __future__ import annotations

import os

from irdma_fuse.kernel.backing import WrittenFile


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
        f.close()
        os.close(kernel)
