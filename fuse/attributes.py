"""What the mount answers for a path's attributes (stat), and the short-lived
answers it keeps.

Attributes are built from what a path is now (``resolve``), with the modes
and times set through this mount. The times: modification, the tensor's last
write (or one set with utime(2) for that version); access, the one set with
utime(2) for that version, else the modification time (reads do not change
it, as with ``noatime``); change, the later of the modification time and the
last change of the file's attributes through this mount (a chmod, a utime, a
rename).

The kernel caches attributes only briefly (``ATTR_TIMEOUT``) so every lookup
sees the daemons' current state; two answers are kept here a little longer,
each where asking again would cost the most: getattr answers for files held
open only for reading, and lookups that failed because a daemon did not
answer. Both use the clock given (``time.monotonic`` by default), so tests
can move time themselves.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from irdma.errors import ClientClosed, DaemonUnavailable

from .content import file_size
from .errors import FsError, errno_for
from .handles import OpenFiles
from .inodes import InodeTable
from .paths import Kind
from .resolve import Resolved

# How long the kernel may use the attributes a lookup or getattr returned
# before asking again. A path is looked up afresh on every access
# (entry_timeout 0), so this only spares the getattr the kernel sends right
# after a lookup (a stat, a permission check) and bounds how old an fstat()
# of an open file may be.
ATTR_TIMEOUT = 0.05
WORKER_DIR_TIMEOUT = 300.0
# How old a getattr answer for a file held open only for reading may be.
OPEN_ATTR_REUSE = 0.5
# How long a lookup that failed because a daemon did not answer is answered
# from memory. The kernel asks twice for one path (revalidating its cached
# entry fails, so it drops the entry and looks the name up afresh), and each
# ask would otherwise wait the whole client timeout again.
LOOKUP_FAILURE_REUSE = 1.0
BLOCK_SIZE = 1 << 20  # st_blksize: the size of I/O the mount prefers

Resolve = Callable[[str], Awaitable[Resolved]]


@dataclass(frozen=True, slots=True)
class Attributes:
    """A file's attributes and how long the kernel may keep them (and its entry)."""

    st_ino: int
    st_mode: int
    st_nlink: int
    st_uid: int
    st_gid: int
    st_size: int
    st_blocks: int
    mtime_ns: int
    atime_ns: int
    ctime_ns: int
    entry_timeout: float
    attr_timeout: float
    st_blksize: int = BLOCK_SIZE
    generation: int = 0


@dataclass(frozen=True)
class Changes:
    """What a setattr asks to change (None: unchanged)."""

    mode: int | None = None
    size: int | None = None
    uid: int | None = None
    gid: int | None = None
    mtime_ns: int | None = None
    atime_ns: int | None = None


class AttributeTable:
    """Builds attributes; keeps modes, modification times and short-lived answers."""

    def __init__(
        self,
        inodes: InodeTable,
        files: OpenFiles[Any],
        *,
        uid: int,
        gid: int,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._inodes = inodes
        self._files = files
        self.uid, self.gid = uid, gid
        self._clock = clock
        self._wall_ns = wall_ns
        self._start_ns = wall_ns()  # directories' times: when the mount began
        self._modes: dict[str, int] = {}
        # Times set with utime(2): path -> (tensor version they are for; None for a
        # directory, ns). A newer version shows its own write's time again.
        self._mtimes: dict[str, tuple[int | None, int]] = {}
        self._atimes: dict[str, tuple[int | None, int]] = {}
        # When the path's attributes were last changed through this mount (ctime).
        self._changed: dict[str, int] = {}
        # getattr answers for files held open for reading: path -> (when, attrs).
        self._open_attrs: dict[str, tuple[float, Attributes]] = {}
        # Lookups that failed on an unreachable daemon: path -> (when, errno).
        self._lookup_failures: dict[str, tuple[float, int]] = {}

    def of(self, res: Resolved) -> Attributes:
        """The attributes of what ``res`` is (numbering its path if new)."""
        ino = self._inodes.ino(res.path)
        entry_timeout, attr_timeout = 0.0, ATTR_TIMEOUT  # every lookup asks: close-to-open
        t = res.target
        if t.kind == Kind.WORKER_DIR:
            # Virtual directories that never change: let the kernel keep them.
            entry_timeout = attr_timeout = WORKER_DIR_TIMEOUT
        elif t.is_dir:
            # Every path walks through its directories: a burst of opens in one
            # asks whether it exists once per ATTR_TIMEOUT, not once per open.
            # (One removed elsewhere is seen that much later; files in it are
            # looked up afresh all the same.)
            entry_timeout = ATTR_TIMEOUT
        version: int | None = None
        if t.is_dir:
            mode = stat.S_IFDIR | self._modes.get(res.path, 0o755)
            nlink, size, ns = 2, 0, self._start_ns
        else:
            default = 0o200 if t.kind == Kind.ACCUMULATE else 0o644
            mode = stat.S_IFREG | self._modes.get(res.path, default)
            nlink = 1
            writer = self._files.writer(res.path)
            if writer is not None:
                size = writer.size()  # what this mount's open writer holds
                ns = self._wall_ns()
            else:
                assert res.info is not None
                size = file_size(t, res.info)
                ns = int(res.info.mtime * 1e9)
                version = res.info.version
        mtime, atime, ctime = self._times(res.path, version, ns)
        return Attributes(
            st_ino=ino,
            st_mode=mode,
            st_nlink=nlink,
            st_uid=self.uid,
            st_gid=self.gid,
            st_size=size,
            st_blocks=-(-size // 512),
            mtime_ns=mtime,
            atime_ns=atime,
            ctime_ns=ctime,
            entry_timeout=entry_timeout,
            attr_timeout=attr_timeout,
        )

    def _times(self, path: str, version: int | None, written_ns: int) -> tuple[int, int, int]:
        """(modification, access, change) times of ``path`` at ``version``, whose
        content was written at ``written_ns``."""
        mtime = self._set_time(self._mtimes, path, version, written_ns)
        atime = self._set_time(self._atimes, path, version, mtime)
        return mtime, atime, max(mtime, self._changed.get(path, 0))

    @staticmethod
    def _set_time(
        times: dict[str, tuple[int | None, int]], path: str, version: int | None, default: int
    ) -> int:
        """A time set for ``path`` at ``version``, else ``default``."""
        found = times.get(path)
        return found[1] if found is not None and found[0] == version else default

    async def lookup(self, path: str, resolve: Resolve) -> Attributes:
        """``path``'s attributes for a lookup: a failure to reach the daemons in the
        last ``LOOKUP_FAILURE_REUSE`` seconds is answered again without asking."""
        failed = self._lookup_failures.get(path)
        if failed is not None and self._clock() - failed[0] < LOOKUP_FAILURE_REUSE:
            raise FsError(failed[1])  # logged when it happened
        try:
            res = await resolve(path)
        except (DaemonUnavailable, ClientClosed) as exc:
            self._remember_lookup_failure(path, self._clock(), errno_for(exc))
            raise
        self._lookup_failures.pop(path, None)
        return self.of(res)

    def _remember_lookup_failure(self, path: str, when: float, code: int) -> None:
        # Old entries go as new ones come, so the table stays as small as the
        # set of paths that failed in the last LOOKUP_FAILURE_REUSE seconds.
        for p in [
            p for p, (t, _) in self._lookup_failures.items() if when - t >= LOOKUP_FAILURE_REUSE
        ]:
            del self._lookup_failures[p]
        self._lookup_failures[path] = (when, code)

    async def current(self, path: str, resolve: Resolve) -> Attributes:
        """``path``'s attributes for a getattr."""
        writer = self._files.writer(path)
        if writer is not None:
            # What this mount's writer holds is the file (its size, now as
            # its time): nothing to ask the daemons. The kernel asks before
            # each write to a file opened with O_TRUNC.
            return self.of(Resolved(path, writer.target))
        # The kernel asks before read()s of a cached file once the attributes
        # are ATTR_TIMEOUT old; while the file is open only for reading, an
        # answer up to OPEN_ATTR_REUSE old serves. open() itself always asks
        # the daemons.
        now = self._clock()
        cached = self._open_attrs.get(path)
        if (
            cached is not None
            and now - cached[0] < OPEN_ATTR_REUSE
            and self._files.only_readers(path)
        ):
            return cached[1]
        attrs = self.of(await resolve(path))
        if self._files.only_readers(path):
            self._open_attrs[path] = (now, attrs)
        else:
            self._open_attrs.pop(path, None)
        return attrs

    def drop_open(self, path: str) -> None:
        """The next getattr of ``path`` asks the daemons (it is being changed, or closed)."""
        self._open_attrs.pop(path, None)

    def forget(self, path: str) -> None:
        """``path``'s content changed: its kept answer and set times no longer hold."""
        self._open_attrs.pop(path, None)
        self._mtimes.pop(path, None)
        self._atimes.pop(path, None)
        self._changed.pop(path, None)

    def times_of(self, directory: str) -> dict[str, int]:
        """A directory's times (as ``of`` gives them), by Attributes field."""
        mtime, atime, ctime = self._times(directory, None, self._start_ns)
        return {"mtime_ns": mtime, "atime_ns": atime, "ctime_ns": ctime}

    def entries_changed(self, *dirs: str) -> None:
        """Entries were made or removed in these directories through this mount:
        their modification and change times are now."""
        now = self._wall_ns()
        for d in dirs:
            self._mtimes[d] = (None, now)
            self._changed[d] = now

    def set_mode(self, path: str, mode: int) -> None:
        self._modes[path] = stat.S_IMODE(mode)

    def drop_setid(self, path: str) -> None:
        """A write by a caller without CAP_FSETID: the set-id bits go, as on a local file."""
        if path in self._modes:
            self._modes[path] &= ~(stat.S_ISUID | stat.S_ISGID)
        self._changed[path] = self._wall_ns()

    def set_times(
        self, path: str, version: int | None, *, atime_ns: int | None, mtime_ns: int | None
    ) -> None:
        """``path`` shows these times (None: unchanged) while its tensor is at
        ``version`` (None: a directory, always)."""
        if mtime_ns is not None:
            self._mtimes[path] = (version, mtime_ns)
        if atime_ns is not None:
            self._atimes[path] = (version, atime_ns)
        self._changed[path] = self._wall_ns()

    def may_own(self, changes: Changes) -> bool:
        """Whether a change of owner only names the owner the mount shows (or none)."""
        return changes.uid in (None, self.uid, -1, 0xFFFFFFFF) and changes.gid in (
            None,
            self.gid,
            -1,
            0xFFFFFFFF,
        )

    def moved(self, pairs: list[tuple[str, str]]) -> None:
        """Paths renamed, as (old, new): their modes go with them."""
        for old, new in pairs:
            if old in self._modes:
                self._modes[new] = self._modes.pop(old)
            for times in (self._mtimes, self._atimes):
                if old in times:
                    times[new] = times.pop(old)
            self._changed.pop(old, None)
            self._changed[new] = self._wall_ns()  # a rename changes the file's ctime
