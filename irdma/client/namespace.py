"""Namespace changes: create, delete, rename and list tensors, on every daemon.

Each change goes to every daemon (those holding no shard of a tensor check
its name) and updates the metadata cache and the router's read-your-writes
record, as a new layout makes what was seen of the old one meaningless.
Each runs again while daemons say the cluster's epoch changed
(``retry.rerouted``).

A write defines the tensor it stores when the cached layout does not fit
its array (``Definition``, ``Namespace.defined``), and again when a daemon
says that layout went stale under it (``Namespace.redefine``).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import numpy as np

from ..cluster import Node
from ..errors import DaemonUnavailable, TensorExists, TensorMoved, TensorNotFound
from ..protocol import (
    MAX_NAME_BYTES,
    Header,
    TensorMeta,
    encode_json,
    tensor_key,
    validate_name,
)
from ..protocol.bodies import CreateAnswer, RenameBody, StatRecord
from ..protocol.messages import Create, Delete, ListTensors, Rename
from ..training.modes import Mode
from .arrays import fits
from .cache import MetaCache
from .lookup import Lookup, TensorInfo, info_from, nodes_holding
from .retry import rerouted
from .routing import Router, several_copies
from .session import Session

T = TypeVar("T")

# Salted keys a new tensor's name may take when renamed tensors hold its own
# (each is one more round of creates; a name needs one only while a tensor
# renamed away from it still holds the key).
PLACES_TRIED = 16


def delete_frame(key: int, name: str) -> tuple[Header, list[bytes]]:
    """A DELETE of tensor ``name`` at ``key`` (not of another renamed to it since)."""
    raw = name.encode()
    return Delete(key).frame(len(raw)), [raw]


@dataclasses.dataclass(frozen=True, slots=True)
class Definition:
    """What a write of an array defines tensor ``name`` as when it must: the array's
    dtype and shape, with what the write asks of a tensor it creates.

    ``cached`` is the layout cached when the write began: the write goes by
    it if it fits the array. ``shard_size`` is a created tensor's (None: the
    config's).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    cached: TensorMeta | None = None
    shard_size: int | None = None
    replace: bool = False
    options: Mapping[str, Any] | None = None
    mode: Mode | None = None


class Namespace:
    """The namespace changes of one client (see the module docstring)."""

    def __init__(self, session: Session, router: Router, cache: MetaCache, lookup: Lookup) -> None:
        self.session = session
        self.router = router
        self.cache = cache
        self.lookup = lookup

    @property
    def several_copies(self) -> bool:
        return several_copies(self.session.config)

    def meta_of(
        self,
        name: str,
        shape: Sequence[int] | int,
        dtype: Any,
        shard_size: int | None,
        options: Mapping[str, Any] | None,
        mode: Mode | None,
    ) -> TensorMeta:
        """The metadata ``AsyncClient.create`` asks the daemons for."""
        shape_t = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        return TensorMeta(
            validate_name(name),
            np.dtype(dtype).name,  # the name carries no byte order: stored little-endian
            shape_t,
            shard_size or self.session.config.shard_size,
            dict(options or {}) | (mode.to_options() if mode is not None else {}),
        )

    async def _rerouted(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await rerouted(self.session, self.router.patience, fn)

    def definition(
        self,
        name: str,
        arr: np.ndarray,
        *,
        keep_shard_size: bool = False,
        replace: bool = False,
        options: Mapping[str, Any] | None = None,
        mode: Mode | None = None,
    ) -> Definition:
        """What a write of ``arr`` defines tensor ``name`` as, with the layout cached now.

        ``keep_shard_size`` (``AsyncClient.write``): a tensor the write creates
        has the shard size of the one cached under the name (it is redefined
        to another dtype or shape), else the config's (``write_many``).
        """
        cached = self.cache.get(name)
        shard_size = cached.shard_size if keep_shard_size and cached is not None else None
        return Definition(name, arr.dtype, arr.shape, cached, shard_size, replace, options, mode)

    async def defined(self, d: Definition) -> TensorMeta:
        """The layout a write by ``d`` goes by: the cached one if it is the array's dtype
        and shape (it was checked when it was defined), unless ``replace``; else
        ``define``'s."""
        if d.cached is None or d.replace or not fits(d.cached, d.dtype, d.shape):
            return await self.define(d)
        return d.cached

    async def define(self, d: Definition) -> TensorMeta:
        """Create the tensor ``d`` describes, or take the one of its dtype and shape there
        is (``create`` with ``exist_ok``); its metadata."""
        meta = self.meta_of(d.name, d.shape, d.dtype, d.shard_size, d.options, d.mode)
        return (await self.create(meta, exist_ok=True, replace=d.replace)).meta

    async def redefine(self, d: Definition) -> TensorMeta:
        """``define`` again, the cached layout dropped: a write by it was refused as
        stale (the tensor was redefined or deleted meanwhile)."""
        self.cache.drop(d.name)
        return await self.define(d)

    async def create(self, meta: TensorMeta, *, exist_ok: bool, replace: bool) -> TensorInfo:
        """``AsyncClient.create`` of the tensor ``meta`` describes."""
        create = partial(self._create, meta, exist_ok=exist_ok, replace=replace)
        return await self._rerouted(create)

    async def _create(self, meta: TensorMeta, *, exist_ok: bool, replace: bool) -> TensorInfo:
        """``create`` once: at the name's key, or at the one its tries lead to."""
        name = meta.name
        for salt in range(1, PLACES_TRIED + 1):
            try:
                return await self._create_at(meta, exist_ok=exist_ok, replace=replace)
            except TensorMoved:
                # Renamed tensors keep their keys: this name is held under another
                # key (then that tensor is the one to keep, refuse or replace), or
                # this key under another name (then the name takes a salted key).
                found = await self.lookup.find(name)
                if found is not None and found.key != meta.key:
                    meta = dataclasses.replace(meta, place=found.key)
                elif found is None:
                    meta = dataclasses.replace(meta, place=tensor_key(name, salt))
        raise TensorExists(f"no free key for tensor {name!r} after {PLACES_TRIED} tries")

    async def _create_at(self, meta: TensorMeta, *, exist_ok: bool, replace: bool) -> TensorInfo:
        """``create`` at the key ``meta`` names; TensorMoved if a daemon holds its name
        under another key or its key under another name."""
        name = meta.name
        holders = nodes_holding(self.session.config, meta)
        body = encode_json(meta.to_dict())
        exclusive = not exist_ok and not replace
        created_on: list[Node] = []
        results: list[StatRecord] = []

        async def on_every_daemon(create: Create) -> None:
            """Send ``create`` to every daemon (those holding no shard of it only check
            the name); raise the first refusal once all have answered (one must not
            cancel the others' answers, or what they created is never undone)."""
            header = create.frame(len(body))
            refused: list[Exception] = []

            async def create_on(node: Node) -> None:
                try:
                    reply = await self.session.request(node, header, [body])
                except DaemonUnavailable as exc:
                    if not self.several_copies and node in holders:
                        refused.append(exc)
                    return  # with replicas it gets the tensor from one when it is back
                except Exception as exc:
                    refused.append(exc)
                    return
                answer = CreateAnswer.parse(reply.data)
                if answer.created:
                    created_on.append(node)
                if not create.check and answer.record is not None:
                    results.append(answer.record)

            await self.session.gather(partial(create_on, n) for n in self.session.config.nodes)
            if refused:
                moved = [e for e in refused if isinstance(e, TensorMoved)]
                raise (moved or refused)[0]

        if replace:
            # A replace changes nothing until every daemon says it can take the
            # new layout: one with no room would otherwise refuse after the
            # others had dropped the old tensor, which would then be lost.
            await on_every_daemon(Create(meta.key, replace, exclusive, check=True))
        try:
            await on_every_daemon(Create(meta.key, replace, exclusive))
            if self.several_copies and not results:
                raise DaemonUnavailable("cluster", "", "no replica of the tensor answered")
        except BaseException:
            # All or nothing: remove what this call created.
            with self.session.shielded():
                for node in created_on:
                    with contextlib.suppress(Exception):
                        await self.session.request(node, *delete_frame(meta.key, name))
            raise
        if replace and created_on:
            # A redefinition with fewer shards (or another shard size) leaves
            # the old tensor on daemons that hold none of the new shards.
            await self._drop_elsewhere(meta.key, name, holders)
        # A tensor kept as it was may be placed by another key than asked for.
        meta = results[0].meta if results else meta
        self.cache.put(meta, name)
        # Versions start again with a new layout: what this client saw of
        # the old one says nothing about the new.
        self.router.forget(meta.key)
        return info_from(results, meta)

    async def _drop_elsewhere(self, key: int, name: str, holders: Sequence[Node]) -> None:
        """Delete tensor ``name`` at ``key`` on every daemon not in ``holders`` (best
        effort)."""

        async def drop_on(node: Node) -> None:
            with contextlib.suppress(TensorNotFound, DaemonUnavailable):
                await self.session.request(node, *delete_frame(key, name))

        keep = {n.name for n in holders}
        await self.session.gather(
            partial(drop_on, n) for n in self.session.config.nodes if n.name not in keep
        )

    async def list(self, prefix: str = "", *, limit: int = 0) -> list[TensorInfo]:
        """``AsyncClient.list``."""
        return await self._rerouted(partial(self._list, prefix, limit=limit))

    async def _list(self, prefix: str, *, limit: int) -> builtins.list[TensorInfo]:
        raw = prefix.encode()
        if len(raw) > MAX_NAME_BYTES:
            raise ValueError("prefix is too long")
        if not 0 <= limit < 1 << 63:
            raise ValueError(f"limit must be 0 (none) or a positive count, not {limit}")

        down: list[DaemonUnavailable] = []
        config = self.session.config  # the daemons asked, and what their answers cover
        known: dict[str, TensorMeta] = {}  # each tensor's metadata parsed once

        async def list_on(node: Node) -> list[StatRecord]:
            hdr = ListTensors(limit).frame(len(raw))
            try:
                r = await self.session.request(node, hdr, [raw])
            except DaemonUnavailable as exc:
                if not self.several_copies:
                    raise
                down.append(exc)
                return []  # its replicas answer for it
            return StatRecord.parse_list(r.data, known)

        per_node = await self.session.gather(partial(list_on, n) for n in config.nodes)
        # Each shard's copies are on distinct daemons: with fewer daemons down than
        # copies, every tensor has a copy that answered; with as many, some may be
        # missing, and an empty or partial listing would read as a fact.
        if down and len(down) >= min(config.replicas, len(config.nodes)):
            raise down[0]
        by_name: dict[str, list[StatRecord]] = defaultdict(list)
        for records in per_node:
            for rec in records:
                by_name[rec.meta.name].append(rec)
        return [info_from(by_name[name]) for name in sorted(by_name)[: limit or None]]

    async def delete(self, name: str) -> None:
        """``AsyncClient.delete``."""
        await self._rerouted(partial(self._delete, name))

    async def _delete(self, name: str) -> None:
        validate_name(name)
        cached = self.cache.drop(name)
        key = cached.key if cached is not None else tensor_key(name)
        if not await self._delete_at(key, name):
            found = await self.lookup.find(name)  # renamed to this name, or at a salted key
            if found is None or not await self._delete_at(found.key, name):
                raise TensorNotFound(f"no tensor named {name!r}")
            key = found.key
        self.router.forget(key)

    async def _delete_at(self, key: int, name: str) -> bool:
        """Delete tensor ``name`` at ``key`` from every daemon; whether any had it."""

        async def delete_on(node: Node) -> bool:
            try:
                await self.session.request(node, *delete_frame(key, name))
            except TensorNotFound:
                return False
            except DaemonUnavailable:
                if not self.several_copies:
                    raise
                return False  # it learns of the delete from a replica when it is back
            return True

        return any(
            await self.session.gather(partial(delete_on, n) for n in self.session.config.nodes)
        )

    async def rename(self, old: str, new: str, *, replace: bool = False) -> TensorInfo:
        """``AsyncClient.rename``."""
        return await self._rerouted(partial(self._rename, old, new, replace=replace))

    async def _rename(self, old: str, new: str, *, replace: bool) -> TensorInfo:
        validate_name(old)
        validate_name(new)
        src = await self.lookup.find(old)
        if src is None:
            raise TensorNotFound(f"no tensor named {old!r}")
        if new == old:
            return await self.lookup.stat(old)
        dst = await self.lookup.find(new)
        if dst is not None and dst.key == src.key:
            dst = None  # this rename, begun before (on the daemons that answered then)
        if dst is not None and not replace:
            raise TensorExists(f"tensor {new!r} exists (pass replace=True to replace it)")
        body = RenameBody(old, new).encode()
        holders = nodes_holding(self.session.config, src)
        records: list[StatRecord] = []
        failed: list[Exception] = []

        async def rename_on(node: Node) -> None:
            try:
                header = Rename(src.key).frame(len(body))
                reply = await self.session.request(node, header, [body])
            except TensorNotFound:
                return
            except DaemonUnavailable as exc:
                if not self.several_copies and node in holders:
                    failed.append(exc)
                return  # with replicas it catches up from one (the rename bumps versions)
            except Exception as exc:
                failed.append(exc)
                return
            records.append(StatRecord.parse(reply.data))

        await self.session.gather(partial(rename_on, n) for n in self.session.config.nodes)
        self.cache.drop(old)
        self.cache.drop(new)
        if failed:
            # Some daemons have the new name and some the old: renaming again
            # once they answer finishes it (each daemon renames what it holds).
            raise failed[0]
        if not records:
            raise TensorNotFound(f"no tensor named {old!r}")
        if dst is not None:
            await self._delete_at(dst.key, new)
            self.router.forget(dst.key)
        meta = records[0].meta
        self.cache.put(meta, new)
        return info_from(records, meta)
