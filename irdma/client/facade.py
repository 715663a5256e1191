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
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial, wraps
from typing import Any, TypeVar

import numpy as np
import trio

from .. import narrowing
from ..agreement import Runner, Served, agree, settle_at
from ..cluster import ClusterConfig, Node, load_config, parse_size
from ..devices import Transfers, is_device_array
from ..errors import (
    ConfigError,
    DaemonError,
    DtypeMismatch,
    ShapeMismatch,
    StaleLayout,
    TensorNotFound,
)
from ..modes import Mode
from ..protocol import (
    DTYPE_CODES,
    MAX_NAME_BYTES,
    NO_WORKER,
    Op,
    Status,
    TensorMeta,
    decode_json,
    dtype_code,
    validate_name,
)
from ..protocol.messages import (
    Hello,
    ListTensors,
    Read,
    Update,
    served_stamps,
)
from ..ranges import Piece, shard_pieces
from ..registry import current_epoch
from ..sinks import IntoSink
from ..sizes import PARALLEL_COPY_MIN
from ..transport.base import (
    Buffer,
    StreamBroken,
    StreamClosed,
    StreamTimeout,
)
from ..transport.blocking import BlockingConnection
from ..transport.direct import Copier
from ..transport.select import forced_transport
from ..transport.shared import SharedRegion
from ..transport.tcp import FramedConnection
from .batching import Batches
from .cache import MetaCache
from .lookup import Lookup, TensorInfo
from .namespace import Namespace
from .retry import rerouted, with_fresh_meta
from .routing import Router, asks_primary, new_stamp, new_txn, several_copies, worker_field
from .session import Session

Progress = Callable[[int], None]
T = TypeVar("T")
# A daemon connection as the shells open them: TrioShell's (tcp, shm, rdma) or
# BlockingShell's (the calling thread's tcp or shm).
Conn = FramedConnection | BlockingConnection


# The dtypes irdma stores, as arrays carry them (little-endian): checking a
# dtype by name costs microseconds on every small write otherwise.
_STORED_DTYPES = frozenset(np.dtype(name).newbyteorder("<") for name in DTYPE_CODES)


def as_stored_array(array: Any) -> np.ndarray:
    """A C-contiguous little-endian array of a dtype irdma stores (copies only if needed)."""
    arr = np.asarray(array)
    if arr.dtype not in _STORED_DTYPES:
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        dtype_code(arr.dtype)  # raises ValueError for object, string, structured dtypes
    # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def shared_region(value: int | str | SharedRegion | None) -> SharedRegion | None:
    """A client's shared region: the one given, a new one of the size given, or none."""
    if value is None or isinstance(value, SharedRegion):
        return value
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"shared_memory: {exc}") from None
    return SharedRegion(size) if size else None


def _byte_view(arr: np.ndarray) -> memoryview:
    return arr.reshape(-1).view(np.uint8).data


def _epoch_rerouted(method: Callable[..., Any]) -> Callable[..., Any]:
    """An operation over several daemons, run again when the cluster's epoch changed."""

    @wraps(method)
    async def run(self: AsyncClient, *args: Any, **kwargs: Any) -> Any:
        return await self._rerouted(lambda: method(self, *args, **kwargs))

    return run


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
        self.config = config if isinstance(config, ClusterConfig) else load_config(config)
        self.shared = shared_region(shared_memory)
        # Tensors (CUDA ones too) in and out through host memory of this client's.
        self.transfers = Transfers(self.shared)
        self.timeout = timeout if timeout is not None else self.config.timeout
        self.transport = forced_transport(transport)
        self.session = Session(
            self.config, timeout=self.timeout, transport=self.transport, shared=self.shared
        )
        # One-sided reads from same-host arenas (``IRDMA_ONE_SIDED=0``: always ask the daemon).
        self._direct = os.environ.get("IRDMA_ONE_SIDED", "1") != "0"
        # Reads of several shards that met two whole-tensor writes and read
        # pieces again to get one (a measure of write/read contention).
        self.reads_reconciled = 0
        self._copier = Copier()
        self._cache = MetaCache()
        self._router = Router(self.config, self.timeout, self.session)
        self._lookup = Lookup(self.session, self._router, self._cache)
        self._namespace = Namespace(self.session, self._router, self._cache, self._lookup)
        self._batches = Batches(self._router, self.session, self._cache)
        # How reads of several shards are made to agree on one whole-tensor write.
        self._runner = Runner(
            self.session.gather, self.session.sleep, self.session.now, self.timeout
        )
        self._stack: contextlib.AsyncExitStack | None = None

    async def __aenter__(self) -> AsyncClient:
        etcd = self.config.etcd
        if etcd is not None and self.needs_epoch:
            self.config.adopt(await current_epoch(etcd, self.timeout))
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
    def needs_epoch(self) -> bool:
        """A config naming only etcd: the daemons come from the epoch stored there.
        (With ``[[nodes]]`` too, a daemon's refusal brings the epoch in force.)"""
        return self.config.etcd is not None and self.config.epoch is None and not self.config.nodes

    async def aclose(self) -> None:
        """Close every connection (pending requests fail with ClientClosed)."""
        self._copier.close()
        await self.session.aclose()

    def run_blocking(self) -> None:
        """Run every request in the calling thread from now on (``BlockingShell``:
        the blocking ``Client`` drives the coroutines itself)."""
        self.session.run_blocking()

    def close_blocking(self) -> None:
        """``aclose`` for a client that ``run_blocking``: close every thread's connections."""
        self._copier.close()
        self.session.close_blocking()

    @property
    def closed(self) -> bool:
        return self.session.closed

    def shared_empty(self, shape: Sequence[int] | int, dtype: Any = np.float32) -> np.ndarray:
        """An uninitialised array in this client's shared memory: same-host daemons
        copy a write of it straight from there (no staging copy).

        Do not change it while a write of it is under way. Its memory goes back
        when nothing refers to it. Raises ConfigError if the client was made
        without ``shared_memory``, SharedMemoryFull if no room is left.
        """
        if self.shared is None:
            raise ConfigError("this client has no shared memory: make it with shared_memory=SIZE")
        dt = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        return self.shared.empty(nbytes).view(dt).reshape(shape)

    def transport_of(self, node: Node) -> str | None:
        """How this client reaches ``node`` ("tcp", "shm" or "rdma"); None before it connects."""
        return self.session.transport_of(node)

    async def _rerouted(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await rerouted(self.session, self._router.patience, fn)

    # -- metadata ---------------------------------------------------------

    async def hello(self, node: Node) -> dict[str, Any]:
        """A daemon's self-description: version, readiness, shards by role, arena use,
        last snapshot, replication queues (see psd's ``state.DaemonState.hello``)."""
        reply = await self.session.request(node, Hello().frame())
        return decode_json(reply.data)

    async def holdings(self, node: Node, prefix: str = "") -> builtins.list[dict[str, Any]]:
        """One daemon's stat records of the tensors it holds shards of (no failover).

        Each record has the tensor's ``meta`` and ``shards``, mapping the local
        shard indices (as strings) to their versions: ``irdma status`` compares
        replicas with them. Raises like any request to that daemon.
        """
        raw = prefix.encode()
        if len(raw) > MAX_NAME_BYTES:
            raise ValueError("prefix is too long")
        reply = await self.session.request(node, ListTensors().frame(len(raw)), [raw])
        return decode_json(reply.data)

    @_epoch_rerouted
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
        shape_t = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        meta = TensorMeta(
            validate_name(name),
            np.dtype(dtype).name,  # the name carries no byte order: stored little-endian
            shape_t,
            shard_size or self.config.shard_size,
            dict(options or {}) | (mode.to_options() if mode is not None else {}),
        )
        return await self._namespace.create(meta, exist_ok=exist_ok, replace=replace)

    @_epoch_rerouted
    async def stat(self, name: str, *, everywhere: bool = False) -> TensorInfo:
        """Metadata and version of a tensor; raises TensorNotFound.

        ``everywhere``: ask every daemon at once, by name: one round trip
        whether the tensor exists or not, one message per daemon (a lookup
        that often finds nothing, as a filesystem's). Otherwise the daemons
        where the name's own key places it are asked first, and the others
        only if it is not there (renamed to the name) or to add their shards.
        """
        return await self._lookup.stat(name, everywhere=everywhere)

    @_epoch_rerouted
    async def list(self, prefix: str = "", *, limit: int = 0) -> builtins.list[TensorInfo]:
        """Every tensor whose name starts with ``prefix``, sorted by name; only the
        first ``limit`` of them if it is not 0 (``limit=1``: is there any?).

        Raises DaemonUnavailable when the daemons that answered may not hold a
        copy of every tensor: one down with one copy, as many as the copies with
        replicas."""
        return await self._namespace.list(prefix, limit=limit)

    @_epoch_rerouted
    async def delete(self, name: str) -> None:
        """Delete a tensor from every daemon; raises TensorNotFound if none had it."""
        await self._namespace.delete(name)

    @_epoch_rerouted
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

    async def _meta_for(self, name: str) -> TensorMeta:
        meta = self._cache.get(name)
        if meta is None:
            meta = (await self.stat(name)).meta
        return meta

    async def _fresh_meta(self, name: str) -> TensorMeta:
        self._cache.drop(name)
        return (await self.stat(name)).meta

    # -- data ---------------------------------------------------------------

    async def _with_fresh_meta(self, name: str, fn: Callable[[TensorMeta], Any]) -> Any:
        """Run ``fn(meta)``; if the cached layout was stale, refresh it and run again
        (``retry.with_fresh_meta``)."""
        meta = await self._meta_for(name)
        refresh = partial(self._fresh_meta, name)
        return await with_fresh_meta(self.session, self.timeout, meta, refresh, fn)

    async def _move(
        self,
        op: Op,
        meta: TensorMeta,
        offset: int,
        buf: memoryview,
        *,
        alpha: float = 1.0,
        progress: Progress | None = None,
        worker: int | None = None,
        step: int = 0,
        wire: int = 0,
        at: int = 0,
    ) -> builtins.list[Served]:
        """Move ``buf`` to or from bytes at ``offset`` of a tensor; return each piece's answer.

        ``worker`` and ``step`` name a training worker's step (see ``irdma.modes``).
        With a ``wire`` dtype, ``buf`` holds the values in that dtype
        (``irdma.narrowing``) while ``offset`` still counts the tensor's bytes.
        A read of several shards gets them all from one whole-tensor write;
        with ``at``, from that write (TornRead if a daemon no longer has it).
        """
        wid = worker_field(worker, step)
        held = narrowing.check(meta.np_dtype, wire).itemsize if wire else 0
        itemsize = meta.np_dtype.itemsize
        size = len(buf) // held * itemsize if wire else len(buf)
        pieces = shard_pieces(meta, offset, size)
        direct = op == Op.READ and not wire and self._direct_ok(meta, wid)
        if direct and len(pieces) == 1:
            # The most common small read: one piece, one-sided, nothing else to set up.
            got = await self._read_direct(meta, pieces[0], buf)
            if got is not None and (not at or got.stamp == at):
                if progress is not None:
                    progress(len(buf))
                return [got]
            direct = False  # tried: the daemon answers it
        code = meta.dtype_code

        update = op != Op.READ
        # Reads: choose each shard's replica so the bytes spread evenly
        # (reads for a training step go to the primary: _on_replicas).
        choice: dict[int, list[Node]] = {}
        if not asks_primary(update, wid) and several_copies(self.config):
            load: dict[str, int] = {}
            for p in pieces:
                choice[p.shard] = self._router.candidates(meta.key, p.shard, False, load)
                first = choice[p.shard][0].name
                load[first] = load.get(first, 0) + p.length
        # A write of the whole tensor is one write for its readers: every
        # shard carries its stamp (see psd/store.py).
        stamp = new_stamp() if op == Op.WRITE and len(pieces) > 1 and size == meta.nbytes else 0
        # A large one-sided read copies its shards on two threads first; what
        # they could not copy goes the usual way below.
        copied: dict[int, Served] = {}
        if direct and len(pieces) > 1 and size >= PARALLEL_COPY_MIN:
            copied = await self._copy_direct(meta, pieces, buf, choice)

        async def one(p: Piece, want: int = 0, floor: bool = True) -> Served:
            """Move one piece; ``want``: re-read it from that whole-tensor write's copy,
            no older than this client saw unless ``floor`` is off (an explicit ``at``)."""
            if wire:
                start, n = p.buf_offset // itemsize * held, p.length // itemsize * held
            else:
                start, n = p.buf_offset, p.length
            view = buf[start : start + n]
            if op == Op.READ:
                if direct and not want:
                    got = copied.pop(p.shard, None) or await self._read_direct(
                        meta, p, view, choice.get(p.shard)
                    )
                    if got is not None:
                        if progress is not None:
                            progress(n)
                        return got
                read = Read(
                    meta.key,
                    p.shard,
                    p.shard_offset,
                    p.length,
                    # A kept copy must not be older than what this client saw.
                    min_version=self._router.seen(meta.key, p.shard) if want and floor else 0,
                    layout=meta.layout,
                    dtype=code,
                    wire=wire,
                    worker=wid,
                    step=step,
                    stamp=want,
                )
                reply = await self._router.on_replicas(
                    meta.key,
                    p.shard,
                    read,
                    sink=IntoSink(view, None if want else progress),
                    update=False,
                    # An older write's copy says nothing about what this client saw.
                    track=not want,
                    candidates=choice.get(p.shard),
                )
                return Served(reply.header.version, *served_stamps(reply.header))
            change = Update(
                op,
                meta.key,
                p.shard,
                p.shard_offset,
                p.length,
                alpha,
                meta.layout,
                code,
                wire,
                wid,
                step,
                txn=new_txn() if self._router.fails_over else 0,
                stamp=stamp,
            )
            reply = await self._router.on_replicas(
                # A whole-tensor write's versions count as seen once all of it is
                # in (below): one that fails half-way leaves the write before it.
                meta.key,
                p.shard,
                change,
                [view],
                length=n,
                update=True,
                track=not stamp,
            )
            if progress is not None:
                progress(n)
            return Served(reply.header.version, stamp, 0)

        if len(pieces) == 1:  # most small requests: no fan-out to set up
            served = [await one(pieces[0])]
        else:
            kept = await self.session.gather(partial(_refusal_kept, one, p) for p in pieces)
            refused = [s for s in kept if isinstance(s, DaemonError)]
            if refused:
                raise refused[0]
            served = kept
        if stamp:
            # Read-your-writes for the whole write, and the floor for reads of
            # kept copies of older writes (with one replica too).
            for p, s in zip(pieces, served, strict=True):
                self._router.saw(meta.key, p.shard, s.version, update=True)
        if at:
            return await settle_at(meta.name, at, pieces, served, one, self._runner)
        if op == Op.READ and len({s.stamp for s in served}) > 1:
            self.reads_reconciled += 1
            return await agree(meta.name, pieces, served, one, self._runner)
        return served

    def _direct_ok(self, meta: TensorMeta, wid: int) -> bool:
        """Whether reads of this tensor may copy straight out of a daemon's arena.

        Not for a training pull that may have to wait for its step. With
        replicas, the daemon's own gates (caught up, in the majority) are in
        its directory's serving word, and read-your-writes is the version check.
        """
        if not self._direct:
            return False
        if wid == NO_WORKER:
            return True
        # A training pull goes to the primary (only it keeps the step's state).
        return not several_copies(self.config) and Mode.from_options(meta.options).kind == "async"

    async def _copy_direct(
        self,
        meta: TensorMeta,
        pieces: builtins.list[Piece],
        buf: memoryview,
        choice: dict[int, builtins.list[Node]],
    ) -> dict[int, Served]:
        """Copy the pieces that are in same-host arenas on two threads (``Copier``);
        return what each copied piece is, by shard."""
        jobs: list[tuple[int, Callable[[], tuple[int, int, int] | None]]] = []
        for p in pieces:
            found = await self._direct_connection(meta, p, choice.get(p.shard))
            if found is None:
                continue
            conn, seen = found
            reader = getattr(conn.bulk, "directory", None)
            if reader is None:
                continue
            out = np.frombuffer(buf[p.buf_offset : p.buf_offset + p.length], dtype=np.uint8)
            args = (meta.key, meta.layout, p.shard, p.shard_offset, out, seen)
            jobs.append((p.shard, partial(reader.read, *args)))
        results = self._copier.run([call for _, call in jobs])
        copied = {}
        for (shard, _), got in zip(jobs, results, strict=True):
            if got is not None:
                copied[shard] = self._served_direct(meta, shard, got)
        return copied

    async def _direct_connection(
        self, meta: TensorMeta, p: Piece, choice: builtins.list[Node] | None
    ) -> tuple[Conn, int] | None:
        """The connection a one-sided read of ``p`` goes over, and the least version the
        shard may have there; None when that daemon cannot be reached or trusted now
        (asked the usual way, the read says what went wrong)."""
        node, seen = self._direct_node(meta, p.shard, choice)
        try:
            conn = await self.session.connection(node)
        except (StreamBroken, StreamClosed, StreamTimeout):
            return None
        return (conn, seen) if conn.daemon_alive() else None

    def _direct_node(
        self, meta: TensorMeta, shard: int, choice: builtins.list[Node] | None = None
    ) -> tuple[Node, int]:
        """The daemon a one-sided read of ``shard`` copies from, and the least version
        the shard may have there: with replicas, the replica the read would ask
        first (``choice``), no older than this client saw."""
        if several_copies(self.config):
            node = (choice or self._router.candidates(meta.key, shard, False))[0]
            return node, self._router.seen(meta.key, shard)
        return self.config.primary_for(meta.key, shard), 0

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
        if meta is None or self.closed or meta.num_shards != 1:
            return None
        if not self._direct_ok(meta, NO_WORKER):
            return None
        if out is None:
            out = np.empty(meta.shape, dtype=meta.np_dtype)
        else:
            try:
                _check_out(meta, out)
            except (DtypeMismatch, ShapeMismatch, ValueError):
                return None  # the usual read raises it
        node, seen = self._direct_node(meta, 0)
        conn = self.session.conns.get(node.name)
        if conn is None:
            return None
        reader = getattr(conn.bulk, "directory", None)
        if reader is None or conn.broken or not conn.daemon_alive():
            return None
        got = reader.read(meta.key, meta.layout, 0, 0, out.reshape(-1).view(np.uint8), seen)
        if got is None:
            return None
        self._served_direct(meta, 0, got)
        return out

    def _served_direct(self, meta: TensorMeta, shard: int, got: tuple[int, int, int]) -> Served:
        """A one-sided read's answer; with replicas, its version is what this client saw."""
        if several_copies(self.config):
            self._router.saw(meta.key, shard, got[0], update=False)
        return Served(*got)

    async def _read_all_direct(self, meta: TensorMeta, buf: memoryview, wid: int) -> bool:
        """Read a whole tensor one-sided, shard by shard (per shard, as a batch is);
        False when any shard must be asked for (the caller then asks for all)."""
        if not self._direct_ok(meta, wid):
            return False
        for p in shard_pieces(meta, 0, meta.nbytes):
            view = buf[p.buf_offset : p.buf_offset + p.length]
            if await self._read_direct(meta, p, view) is None:
                return False
        return True

    async def _read_direct(
        self,
        meta: TensorMeta,
        p: Piece,
        view: memoryview,
        choice: builtins.list[Node] | None = None,
    ) -> Served | None:
        """One-sided: copy the piece out of its daemon's arena (mapped over shm, or by
        RDMA READ), where the connection's bulk path can. With replicas, from the
        replica the read would ask first (``choice``), no older than this client saw."""
        found = await self._direct_connection(meta, p, choice)
        if found is None:
            return None
        conn, seen = found
        read_direct = getattr(conn.bulk, "read_direct", None)
        if read_direct is None:
            return None
        out = np.frombuffer(view, dtype=np.uint8)
        try:
            got = await read_direct(conn, meta.key, meta.layout, p.shard, p.shard_offset, out, seen)
        except (StreamBroken, StreamClosed, StreamTimeout):
            return None  # the connection is given up; asked the usual way, it says why
        return None if got is None else self._served_direct(meta, p.shard, got)

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
        cached = self._cache.get(name)
        if out is not None and cached is not None and not _fits_out(cached, out):
            # Another process may have redefined the tensor to what ``out`` is:
            # ask before calling it a mismatch.
            self._cache.drop(name)

        async def go(meta: TensorMeta) -> np.ndarray:
            arr = out
            if arr is None:
                arr = np.empty(meta.shape, dtype=meta.np_dtype)
            else:
                _check_out(meta, arr)
            wcode = _wire_for(meta, code)
            if not wcode:
                await self._move(
                    Op.READ, meta, 0, _byte_view(arr), progress=progress, worker=worker, step=step
                )
                return arr
            held = np.empty(arr.size, dtype=narrowing.check(meta.np_dtype, wcode))
            await self._move(
                Op.READ,
                meta,
                0,
                _byte_view(held),
                progress=progress,
                worker=worker,
                step=step,
                wire=wcode,
            )
            narrowing.widen_into(held, wcode, arr.reshape(-1))
            return arr

        return await self._with_fresh_meta(name, go)

    async def read_bytes(
        self, name: str, offset: int, size: int, out: Buffer | None = None
    ) -> memoryview:
        """Raw bytes ``[offset, offset+size)`` of a tensor (spanning shards as needed)."""

        async def go(meta: TensorMeta) -> memoryview:
            n = max(0, min(size, meta.nbytes - offset))
            buf = memoryview(out if out is not None else bytearray(n)).cast("B")[:n]
            await self._move(Op.READ, meta, offset, buf)
            return buf

        return await self._with_fresh_meta(name, go)

    async def read_range(self, name: str, offset: int, out: Buffer, at: int = 0) -> int:
        """Fill ``out`` with the tensor's bytes from ``offset``; return the stamp of the
        whole-tensor write they come from (as reads carry it).

        With ``at`` (a stamp an earlier ``read_range`` returned), the bytes come
        from that write even if the tensor was rewritten since, so ranges read
        one after another make up one version (TornRead once the daemons no
        longer hold it: the tensor was rewritten twice meanwhile).
        """

        async def go(meta: TensorMeta) -> int:
            buf = memoryview(out).cast("B")
            n = max(0, min(len(buf), meta.nbytes - offset))
            served = await self._move(Op.READ, meta, offset, buf[:n], at=at)
            return served[0].stamp if served else 0

        return await self._with_fresh_meta(name, go)

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
        meta = self._cache.get(name)
        shard_size = meta.shard_size if meta else self.config.shard_size
        buf = _byte_view(arr)

        async def define() -> TensorMeta:
            info = await self.create(
                name,
                arr.shape,
                arr.dtype,
                exist_ok=True,
                replace=replace,
                shard_size=shard_size,
                options=options,
                mode=mode,
            )
            return info.meta

        # A cached tensor of this dtype and shape was checked when it was defined.
        if meta is None or replace or meta.np_dtype != arr.dtype or meta.shape != arr.shape:
            meta = await define()
        try:
            await self._move(Op.WRITE, meta, 0, buf, progress=progress)
        except (StaleLayout, TensorNotFound):
            self._cache.drop(name)
            await self._move(Op.WRITE, await define(), 0, buf, progress=progress)

    async def write_bytes(self, name: str, offset: int, data: Buffer) -> None:
        """Overwrite raw bytes at ``offset`` of an existing tensor."""
        buf = memoryview(data).cast("B")
        await self._with_fresh_meta(name, lambda meta: self._move(Op.WRITE, meta, offset, buf))

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
        arr = delta if code and _is_wire_array(delta, code) else as_stored_array(delta)

        async def go(meta: TensorMeta) -> None:
            wcode = _wire_for(meta, code)
            data = _narrowed_delta(meta, arr, wcode)
            await self._move(
                Op.ACCUMULATE,
                meta,
                0,
                _byte_view(data),
                alpha=alpha,
                progress=progress,
                worker=worker,
                step=step,
                wire=wcode,
            )

        await self._with_fresh_meta(name, go)

    # -- batched forms -------------------------------------------------------

    async def _metas(self, names: Iterable[str]) -> dict[str, TensorMeta]:
        names = list(dict.fromkeys(names))
        missing = [n for n in names if n not in self._cache]
        await self.session.gather(partial(self.stat, n) for n in missing)
        return {n: await self._meta_for(n) for n in names}

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
        metas = await self._metas(names)
        out = {n: np.empty(m.shape, dtype=m.np_dtype) for n, m in metas.items()}
        code = narrowing.wire_code(wire)
        if not code:
            items = [(metas[n], _byte_view(a)) for n, a in out.items()]
            wid = worker_field(worker, step)
            # Same-host tensors are copied one-sided; the batches carry the rest.
            items = [it for it in items if not await self._read_all_direct(*it, wid)]
            if items:
                await self._batches.run(Op.READ_BATCH, items, worker=worker, step=step)
            return out
        _batch_wire(metas.values(), code)
        held = {n: np.empty(a.size, narrowing.holder(code)) for n, a in out.items()}
        items = [(metas[n], _byte_view(h)) for n, h in held.items()]
        await self._batches.run(Op.READ_BATCH, items, worker=worker, step=step, wire=code)
        for n, h in held.items():
            narrowing.widen_into(h, code, out[n].reshape(-1))
        return out

    async def write_many(self, arrays: Mapping[str, Any]) -> None:
        """Write many tensors (creating new ones) with one batch frame per daemon."""
        arrs = {n: as_stored_array(self.transfers.source(a)) for n, a in arrays.items()}
        metas: dict[str, TensorMeta] = {}

        async def ensure(name: str, arr: np.ndarray) -> None:
            meta = self._cache.get(name)
            if meta is None or meta.dtype != arr.dtype.name or meta.shape != arr.shape:
                meta = (await self.create(name, arr.shape, arr.dtype, exist_ok=True)).meta
            metas[name] = meta

        await self.session.gather(partial(ensure, n, a) for n, a in arrs.items())
        await self._batches.run(
            Op.WRITE_BATCH, [(metas[n], _byte_view(a)) for n, a in arrs.items()]
        )

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
        arrs = {
            n: a if code and _is_wire_array(a, code) else as_stored_array(a)
            for n, a in sources.items()
        }
        metas = await self._metas(arrs)
        _batch_wire(metas.values(), code)
        data = {n: _narrowed_delta(metas[n], a, code) for n, a in arrs.items()}
        items = [(metas[n], _byte_view(a)) for n, a in data.items()]
        await self._batches.run(Op.ACCUMULATE_BATCH, items, alpha, worker, step, wire=code)


async def _refusal_kept(
    one: Callable[[Piece], Awaitable[Served]], p: Piece
) -> Served | DaemonError:
    """``one(p)``, or the daemon's refusal of it as a value: a refused piece (a stale
    layout, say) must not cancel its siblings, whose connections (shared with
    the client's other calls) a cancelled request would have to drop."""
    try:
        return await one(p)
    except DaemonError as exc:
        return exc


def _fits_out(meta: TensorMeta, out: np.ndarray) -> bool:
    return out.dtype == meta.np_dtype and out.shape == meta.shape


def _check_out(meta: TensorMeta, out: np.ndarray) -> None:
    if out.dtype != meta.np_dtype:
        raise DtypeMismatch(f"out has dtype {out.dtype}, tensor {meta.name!r} is {meta.dtype}")
    if out.shape != meta.shape:
        raise ShapeMismatch(f"out has shape {out.shape}, tensor {meta.name!r} is {meta.shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous array")


def _wire_for(meta: TensorMeta, code: int) -> int:
    """The wire code to use for ``meta`` (0 where it is the tensor's own dtype)."""
    if not code or narrowing.WIRE_NAMES[code] == meta.dtype:
        return 0
    try:
        narrowing.check(meta.np_dtype, code)
    except ValueError as exc:
        raise DtypeMismatch(f"{meta.name!r}: {exc}", Status.DTYPE_MISMATCH) from None
    return code


def _batch_wire(metas: Iterable[TensorMeta], code: int) -> None:
    """One wire dtype goes for a whole batch: every tensor must be a wider float."""
    if code:
        for meta in metas:
            if not _wire_for(meta, code):
                raise DtypeMismatch(
                    f"{meta.name!r} is {meta.dtype} already; a batch with wire "
                    f"{narrowing.WIRE_NAMES[code]} needs wider float tensors",
                    Status.DTYPE_MISMATCH,
                )


def _is_wire_array(delta: Any, code: int) -> bool:
    """Whether ``delta`` already holds values in wire dtype ``code`` (float16, bfloat16)."""
    return narrowing.is_held(delta, code)


def _narrowed_delta(meta: TensorMeta, arr: np.ndarray, code: int) -> np.ndarray:
    """A delta checked against ``meta`` and, with a wire code, in that dtype."""
    code = _wire_for(meta, code)
    if code and narrowing.is_held(arr, code):
        if arr.shape != meta.shape:
            raise ShapeMismatch(
                f"delta has shape {arr.shape}, tensor {meta.name!r} is {meta.shape}",
                Status.SHAPE_MISMATCH,
            )
        return narrowing.narrow(np.ascontiguousarray(arr), code)
    _check_delta(meta, arr)
    return narrowing.narrow(arr, code) if code else arr


def _check_delta(meta: TensorMeta, arr: np.ndarray) -> None:
    if arr.dtype != meta.np_dtype:
        raise DtypeMismatch(
            f"delta has dtype {arr.dtype}, tensor {meta.name!r} is {meta.dtype}",
            Status.DTYPE_MISMATCH,
        )
    if arr.shape != meta.shape:
        raise ShapeMismatch(
            f"delta has shape {arr.shape}, tensor {meta.name!r} is {meta.shape}",
            Status.SHAPE_MISMATCH,
        )
