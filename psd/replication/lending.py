"""Large forwards to a backup on the primary's own host go by reference, not by value.

The primary sends a REPLICA_UPDATE flagged STAGED whose body (``LentBytes``)
says where the update's bytes lie in its arena, with a loan on them
(``psd/loans.py``); the backup copies them straight out of its read-only
mapping of the primary's arena memfd (opened as ``/proc/<pid>/fd/<fd>``,
checked to be that file) into its own landing block, then checks the loan.
The bytes cross memory once, with no loopback TCP send and receive around
them, and the primary keeps its send path free for the next shard.

What the loan guards: the primary holds the block until the forward is done
(answered or given up) and revokes the loan before it lets go, so a backup
that reads late (after its link failed or it was declared down) finds the
loan revoked and answers BEHIND; the primary then sends the shard whole, as
for any backup that could not apply an update.

Only bytes the store kept in its arena for the backups are lent (a staged
update's block), only to a peer whose heartbeats say it runs on this kernel
(its boot id; network namespaces do not matter here, and a peer in another
pid namespace cannot open the arena: it answers so once and gets bytes from
then on), and only from ``LEND_MIN`` bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import uuid
from pathlib import Path

import numpy as np

from ..arena import Arena
from ..loans import Loan
from .bodies import LentBytes

# Forwards this large and up are lent to a same-host backup. Once the backup has
# the primary's arena mapped, a lent forward costs it one copy and the token's
# read, less than receiving the bytes from a few KiB up; the shards of the
# nemesis's tensors (16 KiB) are lent, so its faults reach the loans.
LEND_MIN = 16 << 10


def boot_id() -> bytes:
    """The running kernel's boot id (16 bytes): which host a loan's pid is on."""
    return uuid.UUID(Path("/proc/sys/kernel/random/boot_id").read_text().strip()).bytes


def kernel() -> str:
    """The running kernel's boot id as heartbeats carry it (``Heartbeat.kernel``)."""
    return boot_id().hex()


class LentUnreadable(Exception):
    """A backup cannot read a primary's lent bytes at all (another host or process
    namespace, no access to its descriptors): lending to it is stopped."""


class LoanRevoked(Exception):
    """The lent bytes changed, or may have, before the backup had read them all."""


class Lender:
    """The primary's side: which forwards can be lent, and their bodies."""

    def __init__(self, arena: Arena, *, enabled: bool = True) -> None:
        self.arena = arena
        self.enabled = enabled  # the config's lend_forwards
        self._boot = boot_id()
        self.kernel = self._boot.hex()  # as ``kernel()`` says it: one read of the boot id
        self._pid = os.getpid()

    def lend(self, payload: np.ndarray) -> tuple[Loan, LentBytes] | None:
        """A loan on ``payload`` and the body that sends it, if it lies in the arena
        and is large enough to lend (the caller revokes the loan before the bytes
        may change)."""
        if not self.enabled or payload.nbytes < LEND_MIN:
            return None
        offset = self.arena.offset_of(payload)
        if offset is None:
            return None
        loan = self.arena.loans.lend()
        dev, ino = self.arena.identity
        body = LentBytes(
            self._boot,
            self._pid,
            self.arena.fd,
            dev,
            ino,
            offset,
            payload.nbytes,
            loan.word,
            loan.token,
        )
        return loan, body


class Borrower:
    """The backup's side: reads a primary's lent bytes out of a mapping of its arena,
    then checks the loan.

    The mapping of each primary's arena is kept (mapping it for every forward
    costs more than the copy) and dropped once that arena is no longer open in
    its daemon (``prune``, at heartbeats): a mapping keeps a dead daemon's memory.
    """

    def __init__(self) -> None:
        self._boot = boot_id()
        self._arenas: dict[tuple[int, int, int, int], _Mapped] = {}

    def read(self, lent: LentBytes, into: np.ndarray) -> None:
        """Copy the lent bytes into ``into``. Raises LentUnreadable when the primary's
        arena cannot be read from here, LoanRevoked when the bytes read may not be
        the ones lent."""
        if lent.boot != self._boot:
            raise LentUnreadable("the sender runs on another host")
        if lent.nbytes != into.nbytes:
            raise LentUnreadable(f"{lent.nbytes} bytes lent for an update of {into.nbytes}")
        arena = self._arena(lent).view
        end = lent.offset + lent.nbytes
        if end > len(arena) or lent.word % 8 or lent.word + 8 > len(arena):
            raise LentUnreadable("the lent bytes or their loan lie outside the sender's arena")
        np.copyto(into, arena[lent.offset : end])
        # After the bytes, the token: still the loan's, so they were what was lent.
        token = int(arena[lent.word : lent.word + 8].view(np.uint64)[0])
        if token != lent.token:
            raise LoanRevoked("the sender took back the lent bytes before they were read")

    def _arena(self, lent: LentBytes) -> _Mapped:
        key = (lent.pid, lent.fd, lent.dev, lent.ino)
        found = self._arenas.get(key)
        if found is not None:
            return found
        path = f"/proc/{lent.pid}/fd/{lent.fd}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            # Gone (the primary died), or another pid namespace, or no access.
            raise LentUnreadable(f"cannot open the sender's arena {path}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (lent.dev, lent.ino):
                raise LentUnreadable(f"{path} is not the sender's arena (its pid was reused?)")
            if not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK:
                # Cut shorter under the mapping, it would crash this daemon (SIGBUS).
                raise LentUnreadable(f"{path} is not sealed against shrinking")
            mapping = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        # One arena per daemon: one of the same pid is an older run's descriptor.
        for other in [k for k in self._arenas if k[0] == lent.pid]:
            self._arenas.pop(other).close()
        found = self._arenas[key] = _Mapped(mapping)
        return found

    def prune(self) -> None:
        """Drop the mappings of arenas no longer open in their daemon (it exited)."""
        for key in list(self._arenas):
            pid, fd, dev, ino = key
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                st = None
            if st is None or (st.st_dev, st.st_ino) != (dev, ino):
                self._arenas.pop(key).close()

    def close(self) -> None:
        while self._arenas:
            self._arenas.popitem()[1].close()


class _Mapped:
    """A read-only mapping of another daemon's arena."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self._mapping = mapping
        self.view = np.frombuffer(mapping, dtype=np.uint8)

    def close(self) -> None:
        self.view = None  # type: ignore[assignment]
        with contextlib.suppress(BufferError):  # a copy still running keeps it mapped
            self._mapping.close()
