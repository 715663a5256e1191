"""What a path is now: a directory, a tensor's file, a shard, a step file, or nothing.

Each lookup asks the daemons (the kernel keeps no entry: close-to-open), in
as few round trips as the path allows. A file this mount is creating is
answered from memory, and so is the layout of a tensor pulled or pushed
through ``.worker`` paths (``step_info``).
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from irdma import TensorInfo, manifests
from irdma.errors import TensorNotFound

from . import paths
from .backend import Backend
from .content import is_raw
from .errors import FsError
from .handles import OpenFiles
from .paths import Kind, Target

# Model versions the resolver remembers as committed (a long-lived mount sees
# one per step of a trainer that publishes every step).
COMMITTED_KEPT = 4096


@dataclass
class Resolved:
    """A path with what it is now: a target, and the tensor behind it if any."""

    path: str
    target: Target
    info: TensorInfo | None = None


class Resolver:
    """Paths to what they are, asking the daemons through ``backend``."""

    def __init__(self, backend: Backend, files: OpenFiles[Any]) -> None:
        self._backend = backend
        self._files = files
        # Layouts of tensors pulled and pushed through .worker paths.
        self._step_infos: dict[str, TensorInfo] = {}
        # Model versions found committed (they stay so until pruned, and then
        # their tensors are gone); forgotten past COMMITTED_KEPT, at one STAT each.
        self._committed: set[tuple[str, int]] = set()

    def keep_step_info(self, name: str, info: TensorInfo) -> None:
        """A step's pull found tensor ``name``'s layout: its later step paths use it."""
        self._step_infos[name] = info

    async def stat(self, name: str) -> TensorInfo | None:
        """Tensor ``name``'s info, None if there is no such tensor (or name)."""
        try:
            # Lookups often find nothing (a new file, the other candidate name):
            # one round trip to every daemon either way.
            return await self._backend.c.stat(name, everywhere=True)
        except TensorNotFound:
            return None
        except ValueError:  # not a valid tensor name: nothing can be there
            return None

    async def shown(self, path: str) -> bool:
        """Whether ``path`` may be found: not a model's bookkeeping, and not in a
        model version that is not committed (being written, or left by a
        writer that died). A version once committed is remembered as such."""
        parts = [p for p in path.split("/") if p]
        if any(p in paths.MODEL_INTERNAL for p in parts):
            return False
        found = paths.model_version(path)
        if found is None or found in self._committed:
            return True
        prefix, version = found
        try:
            info = await self._backend.c.stat(manifests.manifest_name(prefix, version))
        except (TensorNotFound, ValueError):
            return False
        if not info.nbytes:
            return False
        if len(self._committed) >= COMMITTED_KEPT:
            self._committed.clear()
        self._committed.add(found)
        return True

    async def dir_exists(self, prefix: str) -> bool:
        if not prefix:
            return True
        # One record at most: a directory's size must not make every path
        # through it cost a listing of all it holds.
        return bool(await self._backend.c.list(prefix + "/", limit=1))

    async def resolve(self, path: str) -> Resolved:
        """What ``path`` is now; raises FsError(ENOENT) if nothing."""
        pending = self._files.pending(path)
        if pending is not None:
            return Resolved(path, pending.target)
        t = paths.parse(path)
        if t is None:
            raise FsError(errno.ENOENT)
        if t.kind == Kind.ROOT:
            return Resolved(path, t)
        if not await self.shown(path):
            raise FsError(errno.ENOENT)
        if t.kind == Kind.WORKER_DIR:
            # Virtual: the kernel resolved the model directory above it, and a
            # pull or push opens a new step directory every step (no listing).
            return Resolved(path, t)
        if t.kind in (Kind.SHARDS_DIR, Kind.ACCUMULATE_DIR):
            if await self.dir_exists(t.name):
                return Resolved(path, t)
        elif t.kind == Kind.STEP:
            # Pulls and pushes need only the layout, not the current version:
            # keep it per tensor (a pull that finds it changed fetches it again).
            info = self._step_infos.get(t.name) or await self.stat(t.name)
            if info is not None:
                self._step_infos[t.name] = info
                return Resolved(path, t, info)
        elif t.kind in (Kind.SHARD_TENSOR_DIR, Kind.SHARD, Kind.ACCUMULATE):
            info = await self.stat(t.name)
            if info is not None and (t.kind != Kind.SHARD or t.index < info.num_shards):
                return Resolved(path, t, info)
        else:  # a plain path: a typed tensor, a raw file or a directory
            # A .npy name is most likely its typed tensor: asked alone first
            # (one message per daemon). A name that is not a tensor costs a
            # round trip to every daemon (a tensor renamed to it may be
            # anywhere), so the other candidates and the directory are then
            # asked together. A name without .npy is a raw file or, far more
            # often (every path walks through its directories), a directory:
            # both are asked at once.
            rest = paths.file_candidates(path)
            if rest[0].typed:
                first, *rest = rest
                info = await self.stat(first.name)
                if info is not None and is_raw(info) != first.typed:
                    return Resolved(path, first, info)
            asks: list[Callable[[], Awaitable[Any]]] = [
                *(functools.partial(self.stat, c.name) for c in rest),
                functools.partial(self.dir_exists, t.name),
            ]
            *infos, is_dir = await _all_at_once(asks)
            for cand, info in zip(rest, infos, strict=True):
                if info is not None and is_raw(info) != cand.typed:
                    return Resolved(path, cand, info)
            if is_dir:
                return Resolved(path, t)
        raise FsError(errno.ENOENT)

    async def find(self, path: str) -> Resolved | None:
        """What ``path`` is now, None if nothing (or no client to ask)."""
        try:
            return await self.resolve(path)
        except FsError:
            return None


async def _all_at_once(calls: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Each call's result, the calls run together; the first one's error is raised as
    it is (not in an exception group) once all have ended, so none is cut short.

    (The client's gathers cancel the others at the first error, and a cancelled
    request drops a connection the client's other calls share; the mount may
    not import them either: ``tests/test_layering.py``.)
    """
    results: list[Any] = [None] * len(calls)
    errors: list[Exception | None] = [None] * len(calls)

    async def run(i: int) -> None:
        try:
            results[i] = await calls[i]()
        except Exception as exc:
            errors[i] = exc

    async with trio.open_nursery() as nursery:
        for i in range(len(calls)):
            nursery.start_soon(run, i)
    for exc in errors:
        if exc is not None:
            raise exc
    return results
