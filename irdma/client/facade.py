"""The async client: ``AsyncClient``, the facade every call goes through.

A tensor's bytes are cut into shards placed by rendezvous hashing; the client
moves every shard to or from its daemon in parallel, each straight between
the caller's array and the socket. Metadata is cached per tensor name and
revalidated when a daemon says the layout changed or the tensor is gone.
"""

from __future__ import annotations

import builtins
import contextlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import trio

from .. import narrowing
from ..cluster import ClusterConfig, Node, load_config, parse_size
from ..devices import Transfers, is_device_array
from ..errors import ConfigError
from ..protocol import Op, TensorMeta, decode_json
from ..protocol.bodies import StatRecord
from ..protocol.messages import Hello
from ..training.modes import Mode
from ..transport.base import Buffer
from ..transport.select import forced_transport
from ..transport.shared import SharedRegion
from .arrays import as_stored_array, byte_view, delta_array, shared_array
from .batching import Batches
from .cache import MetaCache
from .datapath import Contention, DataPath
from .leases import ReadLease
from .lookup import Lookup, TensorInfo
from .manifests import DEFAULT_KEEP
from .namespace import Namespace
from .onesided import OneSidedReader
from .retry import redefined
from .routing import Router
from .session import Session
from .versions import ModelVersions

Progress = Callable[[int], None]


def shared_region(value: int | str | SharedRegion | None) -> SharedRegion | None:
    """A client's shared region: the one given, a new one of the size given, or none."""
    if value is None or isinstance(value, SharedRegion):
        return value
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"shared_memory: {exc}") from None
    return SharedRegion(size) if size else None


class AsyncClient:
    """Async client. Use as ``async with AsyncClient(config) as client:``.

    ``config`` is a ClusterConfig, a path to a cluster TOML file, or None to
    find one via ``$IRDMA_CONFIG`` or ``/etc/irdma/cluster.toml``.
    ``timeout`` bounds how long any one request waits for its daemon.
    ``transport`` (``auto``, ``tcp`` or ``shm``; default ``$IRDMA_TRANSPORT``,
    else ``auto``) picks how it reaches daemons: ``auto`` uses shared memory
    for daemons on this host and TCP for the rest (``irdma.transport.select``).
    With the config's ``secret_file`` every connection authenticates
    (``irdma.auth``). Raises ConfigError for a bad config or secret file;
    requests raise AuthFailed when a daemon and this client do not share the secret.
    Reads from a daemon attached over shared memory (or RDMA) copy straight out
    of its arena after a version check, without a message to it (one-sided);
    ``IRDMA_ONE_SIDED=0`` makes every read ask the daemon.
    ``shared_memory`` (a size such as ``"1GiB"``, or a SharedRegion to share
    with another client) gives the client memory that same-host daemons read
    directly: arrays from ``shared_empty`` are written without being copied
    into staging first (``irdma.transport.shared``).
    """

    def __init__(
        self,
        config: ClusterConfig | str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = None,
        transport: str | None = None,
        shared_memory: int | str | SharedRegion | None = None,
    ) -> None:
        config = config if isinstance(config, ClusterConfig) else load_config(config)
        self.shared = shared_region(shared_memory)
        # Tensors (CUDA ones too) in and out through host memory of this client's.
        self.transfers = Transfers(self.shared)
        self.timeout = timeout if timeout is not None else config.timeout
        self.transport = forced_transport(transport)
        self.session = Session(
            config, timeout=self.timeout, transport=self.transport, shared=self.shared
        )
        self._cache = MetaCache()
        self._router = Router(self.session.in_force, self.timeout, self.session)
        self._lookup = Lookup(self.session, self._router, self._cache)
        self._namespace = Namespace(self.session, self._router, self._cache, self._lookup)
        # One-sided reads from same-host arenas (``IRDMA_ONE_SIDED=0``: always ask the daemon).
        self.one_sided = OneSidedReader(self.session, self._router)
        self._data = DataPath(self.session, self._router, self.one_sided)
        self._batches = Batches(self._router, self.session, self._cache, self.one_sided)
        self._stack: contextlib.AsyncExitStack | None = None

    async def __aenter__(self) -> AsyncClient:
        await self.session.in_force.adopt_stored_epoch(self.timeout)
        self._stack = contextlib.AsyncExitStack()
        nursery = await self._stack.enter_async_context(trio.open_nursery())
        self.session.run_under_trio(nursery)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        # Close connections first so their tasks end, then leave the nursery
        # without handing it the body's exception: that propagates as it is,
        # not wrapped in an exception group.
        await self.aclose()
        assert self._stack is not None
        await self._stack.aclose()

    @property
    def config(self) -> ClusterConfig:
        """The cluster's config in force: that of the newest epoch this client follows."""
        return self.session.config

    async def aclose(self) -> None:
        """Close every connection (pending requests fail with ClientClosed)."""
        self.one_sided.close()
        await self.session.aclose()

    def run_blocking(self) -> None:
        """Run every request in the calling thread from now on (``BlockingShell``:
        the blocking ``Client`` drives the coroutines itself)."""
        self.session.run_blocking()

    def close_blocking(self) -> None:
        """``aclose`` for a client that ``run_blocking``: close every thread's connections."""
        self.one_sided.close()
        self.session.close_blocking()

    @property
    def router(self) -> Router:
        """Replica choice and failover (for tools and tests that look inside)."""
        return self._router

    @property
    def closed(self) -> bool:
        return self.session.closed

    @property
    def contention(self) -> Contention:
        """How often this client's whole-tensor reads and writes met other writers."""
        return self._data.contention

    def shared_empty(self, shape: Sequence[int] | int, dtype: Any = np.float32) -> np.ndarray:
        """An uninitialised array in this client's shared memory: same-host daemons
        copy a write of it straight from there (no staging copy).

        Do not change it while a write of it is under way. Its memory goes back
        when nothing refers to it. Raises ConfigError if the client was made
        without ``shared_memory``, SharedMemoryFull if no room is left.
        """
        if self.shared is None:
            raise ConfigError("this client has no shared memory: make it with shared_memory=SIZE")
        return shared_array(self.shared, shape, dtype)

    def model(self, prefix: str, *, keep: int = DEFAULT_KEEP) -> ModelVersions:
        """The model under ``prefix``: its tensors committed together as numbered
        versions (``irdma.client.versions``); ``keep``: how many versions its
        commits keep."""
        return ModelVersions(self, prefix, keep=keep)

    def transport_of(self, node: Node) -> str | None:
        """How this client reaches ``node`` ("tcp", "shm" or "rdma"); None before it connects."""
        return self.session.transport_of(node)

    # -- metadata ---------------------------------------------------------

    async def hello(self, node: Node) -> dict[str, Any]:
        """A daemon's self-description: version, readiness, shards by role, arena use,
        last snapshot, replication queues (see psd's ``state.DaemonState.hello``)."""
        reply = await self.session.request(node, Hello().frame())
        return decode_json(reply.data)

    async def holdings(self, node: Node, prefix: str = "") -> builtins.list[StatRecord]:
        """One daemon's stat records of the tensors it holds shards of (no failover).

        Each record (``irdma.protocol.bodies.StatRecord``) has the tensor's
        ``meta`` and ``shards``, mapping the local shard indices to their
        versions: ``irdma status`` compares replicas with them. Raises like
        any request to that daemon.
        """
        return await self._lookup.holdings(node, prefix)

    async def create(
        self,
        name: str,
        shape: Sequence[int] | int,
        dtype: Any = np.float32,
        *,
        shard_size: int | None = None,
        options: Mapping[str, Any] | None = None,
        mode: Mode | None = None,
        exist_ok: bool = False,
        replace: bool = False,
    ) -> TensorInfo:
        """Create a zero-filled tensor, in training ``mode`` (async when None).

        Raises TensorExists if it exists (unless ``exist_ok``, which accepts
        an existing tensor of the same layout), DtypeMismatch or ShapeMismatch
        if it exists with another layout (unless ``replace``), ArenaFull when
        the daemons have no room (nothing is left behind then).
        """
        meta = self._namespace.meta_of(name, shape, dtype, shard_size, options, mode)
        return await self._namespace.create(meta, exist_ok=exist_ok, replace=replace)

    async def stat(self, name: str, *, everywhere: bool = False) -> TensorInfo:
        """Metadata and version of a tensor; raises TensorNotFound.

        ``everywhere``: ask every daemon at once, by name: one round trip
        whether the tensor exists or not, one message per daemon (a lookup
        that often finds nothing, as a filesystem's). Otherwise the daemons
        where the name's own key places it are asked first, and the others
        only if it is not there (renamed to the name) or to add their shards.
        """
        return await self._lookup.stat_rerouted(name, everywhere=everywhere)

    async def meta(self, name: str) -> TensorMeta:
        """Tensor ``name``'s layout and key (cached; asked for when not): for code
        that makes its own requests of the daemons, as ``irdma.client.versions``."""
        return await self._lookup.meta_for(name)

    async def list(self, prefix: str = "", *, limit: int = 0) -> builtins.list[TensorInfo]:
        """Every tensor whose name starts with ``prefix``, sorted by name; only the
        first ``limit`` of them if it is not 0 (``limit=1``: is there any?).

        Raises DaemonUnavailable when the daemons that answered may not hold a
        copy of every tensor: one down with one copy, as many as the copies with
        replicas."""
        return await self._namespace.list(prefix, limit=limit)

    async def delete(self, name: str) -> None:
        """Delete a tensor from every daemon; raises TensorNotFound if none had it."""
        await self._namespace.delete(name)

    async def rename(self, old: str, new: str, *, replace: bool = False) -> TensorInfo:
        """Give tensor ``old`` the name ``new``; its bytes do not move.

        A metadata step on the daemons: the tensor keeps the key its shards
        are placed by, so a rename costs a round trip, not a copy. Raises
        TensorNotFound if ``old`` does not exist, TensorExists if ``new``
        does (unless ``replace``: then ``new``'s old tensor is deleted once
        the name is ``old``'s, so a reader of ``new`` finds the one or the
        other, whole). Readers still holding ``old`` are told it is stale
        (``StaleLayout``, then TensorNotFound), as after a delete.
        """
        return await self._namespace.rename(old, new, replace=replace)

    # -- data ---------------------------------------------------------------

    def read_now(self, name: str, out: np.ndarray | None = None) -> np.ndarray | None:
        """Read a tensor (into ``out`` if given) one-sided without awaiting anything:
        a tensor of one shard whose layout this client knows, from a daemon this
        thread is already attached to over shared memory. None when any of that
        does not hold, or the daemon must be asked (the caller then reads the
        usual way, which also says what went wrong).

        The blocking ``Client`` tries it first for small reads: the coroutine
        and the general read's set-up cost more than the copy itself.
        """
        meta = self._cache.get(name)
        if meta is None or self.closed:
            return None
        return self.one_sided.read_now(meta, out)

    async def read(
        self,
        name: str,
        out: np.ndarray | None = None,
        *,
        progress: Progress | None = None,
        worker: int | None = None,
        step: int = 0,
        wire: str | None = None,
    ) -> np.ndarray:
        """The whole tensor, into ``out`` if given (same shape and dtype, C-contiguous;
        or a torch tensor of them, on the CPU or a GPU, which is returned).

        With ``worker``, the read is that training worker's pull for ``step``:
        it waits until the tensor's mode lets the step proceed (sync: step
        reached; ssp: the slowest worker within the slack). ``wire``
        (``"float16"``, ``"bfloat16"``) sends a float tensor's values rounded
        to that narrower dtype, widened again here (``irdma.narrowing``).
        """
        if is_device_array(out):  # a tensor: read into host memory, then land it there
            host, land = self.transfers.sink(out)
            await self.read(name, host, progress=progress, worker=worker, step=step, wire=wire)
            assert out is not None  # a tensor, handed back as read() hands back out
            return out if land is None else land()
        code = narrowing.wire_code(wire)
        if out is not None:
            self._lookup.drop_unless_fits(name, out)
        whole = partial(
            self._data.read_whole, out=out, code=code, progress=progress, worker=worker, step=step
        )
        return await self._lookup.with_fresh_meta(name, whole)

    async def read_bytes(
        self, name: str, offset: int, size: int, out: Buffer | None = None
    ) -> memoryview:
        """Raw bytes ``[offset, offset+size)`` of a tensor (spanning shards as needed)."""
        read = partial(self._data.read_bytes, offset=offset, size=size, out=out)
        return await self._lookup.with_fresh_meta(name, read)

    async def read_range(self, name: str, offset: int, out: Buffer, at: int = 0) -> int:
        """Fill ``out`` with the tensor's bytes from ``offset``; return the stamp of the
        whole-tensor write they come from (as reads carry it).

        With ``at`` (a stamp an earlier ``read_range`` returned), the bytes come
        from that write even if the tensor was rewritten since, so ranges read
        one after another make up one version (TornRead once the daemons no
        longer hold it: the tensor was rewritten twice meanwhile).
        """
        read = partial(self._data.read_range, offset=offset, out=out, at=at)
        return await self._lookup.with_fresh_meta(name, read)

    async def lease(self, name: str, nursery: trio.Nursery) -> ReadLease:
        """A reader's lease on tensor ``name``: the daemons keep every copy of its
        shards they hold now or replace from now on, until ``ReadLease.keep``
        narrows it to one whole-tensor write (a stamp ``read_range`` returned)
        and ``ReadLease.release`` ends it; renewed in ``nursery`` meanwhile, and
        run out (the config's ``read_lease``) if this client stops renewing. So
        ranges read with ``at=`` that stamp make up one version however often the
        tensor is rewritten while they are read (``irdma.client.leases``)."""
        meta = await self._lookup.meta_for(name)
        return await ReadLease.take(self.session, meta, nursery)

    async def write(
        self,
        name: str,
        array: Any,
        *,
        replace: bool = False,
        options: Mapping[str, Any] | None = None,
        mode: Mode | None = None,
        progress: Progress | None = None,
    ) -> None:
        """Store ``array`` (an array, or a torch tensor on the CPU or a GPU) as tensor
        ``name``, creating it from the array's dtype and shape.

        An existing tensor of another dtype or shape raises DtypeMismatch or
        ShapeMismatch unless ``replace``. ``options`` and ``mode`` are stored
        with a tensor this call creates.
        """
        arr = as_stored_array(self.transfers.source(array))
        buf = byte_view(arr)
        d = self._namespace.definition(
            name, arr, keep_shard_size=True, replace=replace, options=options, mode=mode
        )
        move = partial(self._data.move, Op.WRITE, offset=0, buf=buf, progress=progress)
        again = partial(self._namespace.redefine, d)
        await redefined(await self._namespace.defined(d), again, move)

    async def write_bytes(self, name: str, offset: int, data: Buffer) -> None:
        """Overwrite raw bytes at ``offset`` of an existing tensor."""
        buf = memoryview(data).cast("B")
        move = partial(self._data.move, Op.WRITE, offset=offset, buf=buf)
        await self._lookup.with_fresh_meta(name, move)

    async def accumulate(
        self,
        name: str,
        delta: Any,
        alpha: float = 1.0,
        *,
        progress: Progress | None = None,
        worker: int | None = None,
        step: int = 0,
        wire: str | None = None,
    ) -> None:
        """``tensor += alpha * delta`` on the daemons.

        ``delta`` must have the tensor's dtype and shape (DtypeMismatch,
        ShapeMismatch otherwise). With ``worker``, it is that training
        worker's gradient for ``step``, applied as the tensor's mode says.
        ``wire`` (``"float16"``, ``"bfloat16"``) sends a float delta rounded
        to that narrower dtype; the daemon widens it before adding, so the
        sum keeps the tensor's precision. A delta may also come already
        narrowed: float16 values, or bfloat16 as uint16 bit patterns.
        """
        delta = self.transfers.source(delta)
        code = narrowing.wire_code(wire)
        arr = delta_array(delta, code)
        add = partial(
            self._data.accumulate_array,
            arr=arr,
            alpha=alpha,
            code=code,
            progress=progress,
            worker=worker,
            step=step,
        )
        await self._lookup.with_fresh_meta(name, add)

    # -- batched forms -------------------------------------------------------

    async def read_into(self, outs: Mapping[str, np.ndarray]) -> None:
        """Read each named tensor into its array (as ``read`` with ``out``), all at
        once: one-sided where they can be, the requests to different daemons in
        flight together. For large tensors; ``read_many`` batches small ones."""
        await self.session.gather(partial(self.read, name, out) for name, out in outs.items())

    async def read_many(
        self,
        names: Iterable[str],
        *,
        worker: int | None = None,
        step: int = 0,
        refresh: bool = False,
        wire: str | None = None,
    ) -> dict[str, np.ndarray]:
        """Read many tensors with one batch frame per daemon (for many small tensors).

        ``worker`` and ``step`` make it a training pull, as in ``read``.
        Batch entries carry no layout fingerprint: pass ``refresh`` when
        another process may have redefined the tensors since this client
        last looked (their metadata is then fetched again). ``wire``
        narrows the float tensors' values on the way, as in ``read``.
        """
        names = list(names)
        if refresh:
            for n in names:
                self._cache.drop(n)
        metas = await self._lookup.metas(names)
        code = narrowing.wire_code(wire)
        return await self._batches.read_arrays(metas, code, worker, step)

    async def write_many(self, arrays: Mapping[str, Any]) -> None:
        """Write many tensors (creating new ones) with one batch frame per daemon."""
        arrs = {n: as_stored_array(self.transfers.source(a)) for n, a in arrays.items()}
        defs = [self._namespace.definition(n, a) for n, a in arrs.items()]
        metas = await self.session.gather(partial(self._namespace.defined, d) for d in defs)
        bufs = [byte_view(a) for a in arrs.values()]
        await self._batches.run(Op.WRITE_BATCH, list(zip(metas, bufs, strict=True)))

    async def accumulate_many(
        self,
        deltas: Mapping[str, Any],
        alpha: float = 1.0,
        *,
        worker: int | None = None,
        step: int = 0,
        wire: str | None = None,
    ) -> None:
        """Accumulate into many tensors with one batch frame per daemon.

        ``worker`` and ``step`` make it a training push, as in ``accumulate``;
        ``wire`` narrows the deltas on the way, as there (one wire dtype for
        the whole call, so every tensor must be a float wider than it).
        """
        code = narrowing.wire_code(wire)
        sources = {n: self.transfers.source(a) for n, a in deltas.items()}
        arrs = {n: delta_array(a, code) for n, a in sources.items()}
        metas = await self._lookup.metas(arrs)
        await self._batches.accumulate_arrays(metas, arrs, alpha, code, worker, step)
