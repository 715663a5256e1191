"""Directories: listings (read whole at opendir), mkdir and rmdir.

A directory is a name prefix; mkdir stores a marker tensor so an empty one
exists for every mount. Listings hide ``.shards``, ``.accumulate`` and
``.worker`` (opened by path only), a model's bookkeeping and its versions not
committed, and show the files this mount is creating.
"""

from __future__ import annotations

import contextlib
import errno

import numpy as np

from irdma import manifests
from irdma.errors import TensorNotFound

from . import paths
from .attributes import Attributes, AttributeTable
from .backend import Backend
from .content import is_raw
from .errors import FsError
from .handles import OpenFiles
from .paths import DIR_MARKER, NPY, Kind, Target
from .resolve import Resolved, Resolver

Entry = tuple[str, Attributes]


class Directories:
    """Directory calls over the daemons' names."""

    def __init__(
        self,
        backend: Backend,
        files: OpenFiles[Attributes],
        attrs: AttributeTable,
        resolver: Resolver,
    ) -> None:
        self._backend = backend
        self._files = files
        self._attrs = attrs
        self._resolver = resolver

    async def open(self, path: str) -> int:
        """List directory ``path`` for one opendir; the handle its reads use."""
        res = await self._resolver.resolve(path)
        if not res.target.is_dir:
            raise FsError(errno.ENOTDIR)
        return self._files.open_dir(await self.list(res))

    async def list(self, res: Resolved) -> list[Entry]:
        """The entries of directory ``res``, sorted by name, with their attributes."""
        t = res.target
        prefix = t.name
        out: dict[str, Attributes] = {}
        of = self._attrs.of
        if t.kind == Kind.SHARD_TENSOR_DIR:
            assert res.info is not None
            for i in range(res.info.num_shards):
                p = paths.join(res.path, str(i))
                out[str(i)] = of(Resolved(p, Target(Kind.SHARD, t.name, index=i), res.info))
            return list(out.items())
        infos = await self._backend.c.list(prefix + "/" if prefix else "")
        # The model versions committed under this directory (their manifests are
        # in the same listing): the others are being written, or abandoned.
        found = (manifests.version_of_manifest(prefix, i.name) for i in infos if i.nbytes)
        committed = {v for v in found if v is not None}
        for info in infos:
            entry = paths.entry_name(info.name, is_raw(info), prefix)
            if entry is None:
                continue
            if entry.endswith("/"):
                name = entry[:-1]
                if name in paths.RESERVED or t.kind in (Kind.ACCUMULATE_DIR, Kind.WORKER_DIR):
                    continue
                if name in paths.MODEL_INTERNAL:
                    continue
                version = manifests.version_of_dir(name)
                if version is not None and version not in committed:
                    continue
                if t.kind == Kind.SHARDS_DIR:
                    continue
                p = paths.join(res.path, name)
                out[name] = of(Resolved(p, Target(Kind.DIR, paths.join(prefix, name))))
            elif t.kind == Kind.SHARDS_DIR:
                base = info.name.rsplit("/", 1)[-1]
                p = paths.join(res.path, base)
                out[base] = of(Resolved(p, Target(Kind.SHARD_TENSOR_DIR, info.name), info))
            elif t.kind == Kind.WORKER_DIR:
                continue  # opened by path only: which steps exist is the workers' business
            elif t.kind == Kind.ACCUMULATE_DIR:
                if is_raw(info):
                    continue
                base = info.name.rsplit("/", 1)[-1] + NPY
                p = paths.join(res.path, base)
                out[base] = of(Resolved(p, Target(Kind.ACCUMULATE, info.name, typed=True), info))
            else:
                p = paths.join(res.path, entry)
                tgt = Target(Kind.TENSOR, info.name, typed=not is_raw(info))
                out[entry] = of(Resolved(p, tgt, info))
        if t.kind in (Kind.ROOT, Kind.DIR):
            for p, handle in self._files.pending_in(res.path):
                base = p.rpartition("/")[2]
                if base not in out:
                    out[base] = of(Resolved(p, handle.target))
        return sorted(out.items())

    async def make(self, path: str, mode: int) -> Attributes:
        """mkdir: EEXIST if ``path`` is anything already."""
        t = paths.parse(path)
        if t is None or t.kind != Kind.DIR:
            raise FsError(errno.EPERM)  # inside .shards/.accumulate, or reserved
        if await self._resolver.find(path) is not None:
            raise FsError(errno.EEXIST)
        await self._backend.c.create(paths.join(t.name, DIR_MARKER), (0,), np.uint8, exist_ok=True)
        self._attrs.set_mode(path, mode)
        return self._attrs.of(Resolved(path, t))

    async def remove(self, path: str) -> None:
        """rmdir: ENOTEMPTY while anything but its marker is in it."""
        res = await self._resolver.resolve(path)
        if res.target.kind != Kind.DIR:
            raise FsError(errno.ENOTDIR if not res.target.is_dir else errno.EPERM)
        # Two records tell: the directory's marker and anything else.
        c = self._backend.c
        inside = await c.list(res.target.name + "/", limit=2)
        marker = paths.join(res.target.name, DIR_MARKER)
        if any(i.name != marker for i in inside):
            raise FsError(errno.ENOTEMPTY)
        if self._files.pending_under(path):
            raise FsError(errno.ENOTEMPTY)
        with contextlib.suppress(TensorNotFound):
            await c.delete(marker)
