"""Inode numbers for paths: assigned on first sight, kept for the mount's life.

The kernel names files by inode; the mount knows them by path. A number
stays with its path until a rename moves it (with everything under a moved
directory), or a replaced file that is still open takes it to a name no
lookup can produce. Numbers are never reused: ``forget`` is not needed to
keep the table small enough (one entry per path ever seen).
"""

from __future__ import annotations

import errno
import os

from . import paths
from .errors import FsError

ROOT_INODE = 1  # FUSE's root (FUSE_ROOT_ID)


class InodeTable:
    """Path <-> inode number, both ways."""

    def __init__(self) -> None:
        self._paths: dict[int, str] = {ROOT_INODE: ""}
        self._inos: dict[str, int] = {"": ROOT_INODE}
        self._next_ino = ROOT_INODE + 1

    def ino(self, path: str) -> int:
        """``path``'s number, assigned now if it has none."""
        ino = self._inos.get(path)
        if ino is None:
            ino = self._next_ino
            self._next_ino += 1
            self._inos[path] = ino
            self._paths[ino] = path
        return ino

    def find(self, path: str) -> int | None:
        """``path``'s number, None if it has none yet."""
        return self._inos.get(path)

    def renumber(self, path: str) -> int:
        """Give ``path`` a new number; the old one still names it (for what the
        kernel holds open under it)."""
        ino = self._next_ino
        self._next_ino += 1
        self._inos[path] = ino
        self._paths[ino] = path
        return ino

    def path(self, ino: int) -> str:
        """The path inode ``ino`` stands for; ENOENT if none."""
        try:
            return self._paths[ino]
        except KeyError:
            raise FsError(errno.ENOENT) from None

    def child(self, parent: int, name: str) -> str:
        """The path of ``name`` in directory ``parent``; EINVAL for a name that is
        not one entry (a slash, ``.`` or ``..``), ENAMETOOLONG for one over
        NAME_MAX bytes or a path over PATH_MAX."""
        if "/" in name or name in (".", ".."):
            raise FsError(errno.EINVAL)
        if len(os.fsencode(name)) > paths.NAME_MAX:
            raise FsError(errno.ENAMETOOLONG)
        path = paths.join(self.path(parent), name)
        if len(os.fsencode(path)) > paths.PATH_MAX:
            raise FsError(errno.ENAMETOOLONG)
        return path

    def detach(self, path: str, to: str) -> None:
        """Point ``path``'s number at ``to`` (a replaced file kept for its open
        handles); ``path`` keeps the number until a rename gives it another."""
        ino = self._inos.get(path)
        if ino is not None:
            self._paths[ino] = to

    def move(self, old: str, new: str) -> list[tuple[str, str]]:
        """Renumber ``old`` and everything under it as ``new``: the numbers go with
        the files. Returns the paths moved, as (old, new)."""
        moved: list[tuple[str, str]] = []
        for path in [p for p in self._inos if p == old or p.startswith(old + "/")]:
            ino = self._inos.pop(path)
            to = new + path[len(old) :]
            # The replaced file's inode keeps a path (an open of it racing with
            # the rename then gets the new content, not ENOENT).
            self._inos[to] = ino
            self._paths[ino] = to
            moved.append((path, to))
        return moved
