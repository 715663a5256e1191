"""Name resolution: which tensor a name stands for now, and what ``stat`` reports.

A tensor's shards are placed by the key of its name, unless it was renamed
(it keeps the key it had) or created at a salted key (its name's own was
held): then it is looked for by name on every daemon. Every answer lands in
the metadata cache (``cache.MetaCache``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import numpy as np

from ..cluster import ClusterConfig, Node
from ..errors import DaemonUnavailable, TensorNotFound
from ..protocol import MAX_NAME_BYTES, TensorMeta, tensor_key, validate_name
from ..protocol.bodies import StatRecord
from ..protocol.messages import ListTensors, Stat
from .arrays import fits
from .cache import MetaCache
from .retry import rerouted, with_fresh_meta
from .routing import Router, several_copies
from .session import Session

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """What ``stat`` and ``list`` report about a tensor."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    shard_size: int
    num_shards: int
    version: int
    mtime: float
    ctime: float
    options: dict[str, Any] = field(default_factory=dict)
    # The key its shards are placed by when not its name's (it was renamed).
    place: int = 0

    @property
    def meta(self) -> TensorMeta:
        return TensorMeta(
            self.name, self.dtype, self.shape, self.shard_size, self.options, place=self.place
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "nbytes": self.nbytes,
            "shard_size": self.shard_size,
            "num_shards": self.num_shards,
            "version": self.version,
            "mtime": self.mtime,
            "ctime": self.ctime,
            "options": self.options,
        }


def info_from(records: list[StatRecord], meta: TensorMeta | None = None) -> TensorInfo:
    """A tensor's TensorInfo from the daemons' stat records of it."""
    meta = meta or records[0].meta
    return TensorInfo(
        name=meta.name,
        dtype=meta.dtype,
        shape=meta.shape,
        nbytes=meta.nbytes,
        shard_size=meta.shard_size,
        num_shards=meta.num_shards,
        version=merged_version(records),
        mtime=max((r.mtime for r in records), default=0.0),
        ctime=min((r.ctime for r in records), default=0.0),
        options=meta.options,
        place=meta.place,
    )


def merged_version(records: list[StatRecord]) -> int:
    """A tensor's version: the sum over its shards of the newest replica's version."""
    shards: dict[int, int] = {}
    plain = 0
    for r in records:
        if r.shards is not None:
            for index, v in r.shards.items():
                shards[index] = max(shards.get(index, 0), v)
        else:
            plain += r.version
    return sum(shards.values()) + plain


def nodes_holding(config: ClusterConfig, meta: TensorMeta) -> list[Node]:
    """The daemons that keep a copy of some shard (in a move under way, too)."""
    names = {n.name for s in range(meta.num_shards) for n in config.copies_for(meta.key, s)}
    return [n for n in config.nodes if n.name in names]


class Lookup:
    """Finds tensors by name for one client (see the module docstring)."""

    def __init__(self, session: Session, router: Router, cache: MetaCache) -> None:
        self.session = session
        self.router = router
        self.cache = cache

    async def holdings(self, node: Node, prefix: str = "") -> list[StatRecord]:
        """``AsyncClient.holdings``: one daemon's stat records (no failover)."""
        raw = prefix.encode()
        if len(raw) > MAX_NAME_BYTES:
            raise ValueError("prefix is too long")
        reply = await self.session.request(node, ListTensors().frame(len(raw)), [raw])
        return StatRecord.parse_list(reply.data)

    async def stat_rerouted(self, name: str, *, everywhere: bool = False) -> TensorInfo:
        """``stat``, run again while daemons say the cluster's epoch changed."""
        stat = partial(self.stat, name, everywhere=everywhere)
        return await rerouted(self.session, self.router.patience, stat)

    async def meta_for(self, name: str) -> TensorMeta:
        """The tensor's metadata: cached, else asked for."""
        meta = self.cache.get(name)
        if meta is None:
            meta = (await self.stat_rerouted(name)).meta
        return meta

    async def fresh_meta(self, name: str) -> TensorMeta:
        """The tensor's metadata asked for again (the cached one was stale)."""
        self.cache.drop(name)
        return (await self.stat_rerouted(name)).meta

    async def with_fresh_meta(self, name: str, fn: Callable[[TensorMeta], Awaitable[T]]) -> T:
        """Run ``fn(meta)`` with the tensor's metadata (``meta_for``); if the layout was
        stale, ask for it again and run again, within the client timeout
        (``retry.with_fresh_meta``)."""
        meta = await self.meta_for(name)
        refresh = partial(self.fresh_meta, name)
        return await with_fresh_meta(self.session, self.session.timeout, meta, refresh, fn)

    def drop_unless_fits(self, name: str, out: np.ndarray) -> None:
        """Drop the cached layout of ``name`` if ``out`` is not its dtype and shape:
        another process may have redefined the tensor to what ``out`` is, so the
        daemons are asked before a read calls it a mismatch."""
        cached = self.cache.get(name)
        if cached is not None and not fits(cached, out.dtype, out.shape):
            self.cache.drop(name)

    async def metas(self, names: Iterable[str]) -> dict[str, TensorMeta]:
        """Several tensors' metadata, those not cached asked for at once."""
        names = list(dict.fromkeys(names))
        missing = [n for n in names if n not in self.cache]
        await self.session.gather(partial(self.stat_rerouted, n) for n in missing)
        return {n: await self.meta_for(n) for n in names}

    async def stat(self, name: str, *, everywhere: bool = False) -> TensorInfo:
        """``AsyncClient.stat``: the tensor's metadata and version, now cached."""
        validate_name(name)
        try:
            if everywhere:
                records = await self._stat_everywhere(name)
            else:
                records = await self._stat_placed(name)
        except TensorNotFound:
            self.cache.drop(name)
            raise TensorNotFound(f"no tensor named {name!r}") from None
        meta = records[0].meta
        self.cache.put(meta, name)
        return info_from(records, meta)

    async def find(self, name: str) -> TensorMeta | None:
        """The metadata of the tensor called ``name`` as stored now, or None."""
        try:
            return (await self.locate(name)).meta
        except TensorNotFound:
            return None

    async def locate(self, name: str) -> StatRecord:
        """One daemon's stat record of the tensor called ``name``; TensorNotFound.

        Asked first where the name's own key places it; a tensor renamed to
        the name (it kept its key) or placed by a salted key is then looked
        for by name on every daemon.
        """
        key = tensor_key(name)
        try:
            reply = await self.router.on_replicas(key, 0, Stat(key), update=False, track=False)
        except TensorNotFound:
            pass
        else:
            rec = StatRecord.parse(reply.data)
            if rec.meta.name == name:
                return rec
        # Renamed to the name: on any daemon (one that is down is not waited for:
        # the name's own place answered).
        found, _ = await self.ask_by_name(name)
        if not found:
            raise TensorNotFound(f"no tensor named {name!r}")
        return found[0]

    async def ask_by_name(self, name: str) -> tuple[list[StatRecord], dict[str, DaemonUnavailable]]:
        """Every daemon's stat record of the tensor called ``name`` (those that hold
        it), and the daemons that did not answer."""
        raw = name.encode()
        down: dict[str, DaemonUnavailable] = {}

        async def find_on(node: Node) -> StatRecord | None:
            try:
                r = await self.session.request(node, Stat(0).frame(len(raw)), [raw])
            except TensorNotFound:
                return None
            except DaemonUnavailable as exc:
                down[node.name] = exc
                return None
            return StatRecord.parse(r.data)

        records = await self.session.gather(partial(find_on, n) for n in self.session.config.nodes)
        return [r for r in records if r is not None], down

    async def _stat_placed(self, name: str) -> list[StatRecord]:
        """``stat``'s records: found by ``locate``, then every other holder's."""
        rec = await self.locate(name)
        meta = rec.meta
        others = [n for n in nodes_holding(self.session.config, meta) if n.name != rec.node]

        async def stat_on(node: Node) -> StatRecord | None:
            try:
                r = await self.session.request(node, Stat(meta.key).frame())
            except TensorNotFound:
                # Not caught up yet (the other replicas answer), or deleted since
                # (a read with this metadata then finds out and asks again).
                return None
            except DaemonUnavailable:
                if not several_copies(self.session.config):
                    raise
                return None  # down: the other replicas answer
            got = StatRecord.parse(r.data)
            # A daemon a rename has not reached yet still has it under the old name.
            return got if got.meta.name == name else None

        records = [rec, *await self.session.gather(partial(stat_on, n) for n in others)]
        return [r for r in records if r is not None]

    async def _stat_everywhere(self, name: str) -> list[StatRecord]:
        """``stat``'s records from every daemon asked by name at once (of the tensor
        the first answer describes: two exist for a moment during a rename)."""
        found, down = await self.ask_by_name(name)
        if not found:
            # As the placed stat says: unknown if the name's own place did not answer.
            homes = [n.name for n in self.session.config.replicas_for(tensor_key(name), 0)]
            if all(h in down for h in homes):
                raise down[homes[0]]
            raise TensorNotFound(f"no tensor named {name!r}")
        first = found[0].meta
        return [r for r in found if r.meta == first]
