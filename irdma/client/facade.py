"""The async client: ``AsyncClient``, the facade every call goes through.

A tensor's bytes are cut into shards placed by rendezvous hashing; the client
moves every shard to or from its daemon in parallel, each straight between
the caller's array and the socket. Metadata is cached per tensor name and
revalidated when a daemon says the layout changed or the tensor is gone.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import os
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial, wraps
from typing import Any, TypeVar

import numpy as np
import trio

from .. import narrowing
from ..agreement import Runner, Served, agree, settle_at
from ..auth import cluster_secret
from ..cluster import ClusterConfig, Node, load_config, parse_size
from ..devices import Transfers, is_device_array
from ..epochs import Epoch, epoch_tag
from ..errors import (
    ClientClosed,
    ConfigError,
    DaemonError,
    DaemonTimeout,
    DaemonUnavailable,
    DtypeMismatch,
    ShapeMismatch,
    StaleEpoch,
    StaleLayout,
    TensorExists,
    TensorMoved,
    TensorNotFound,
    error_for_status,
)
from ..modes import Mode
from ..protocol import (
    DTYPE_CODES,
    MAX_NAME_BYTES,
    NO_WORKER,
    Header,
    Op,
    Status,
    TensorMeta,
    decode_json,
    dtype_code,
    encode_json,
    tensor_key,
    validate_name,
)
from ..protocol.messages import (
    Create,
    Delete,
    Hello,
    ListTensors,
    Read,
    Rename,
    Stat,
    Update,
    served_stamps,
)
from ..ranges import Piece, shard_pieces
from ..registry import current_epoch
from ..sinks import IntoSink
from ..sizes import PARALLEL_COPY_MIN
from ..transport.base import (
    Buffer,
    Reply,
    Sink,
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
from .routing import Router, asks_primary, new_stamp, new_txn, worker_field
from .shells import BlockingShell, Dialing, Shell, TrioShell

Progress = Callable[[int], None]
T = TypeVar("T")
# A daemon connection as the shells open them: TrioShell's (tcp, shm, rdma) or
# BlockingShell's (the calling thread's tcp or shm).
Conn = FramedConnection | BlockingConnection

# Salted keys a new tensor's name may take when renamed tensors hold its own
# (each is one more round of creates; a name needs one only while a tensor
# renamed away from it still holds the key).
PLACES_TRIED = 16
# Times a request refused for a stale layout is tried again when fresh metadata
# says the same (a rename under way), pausing this many seconds times the try.
STALE_RETRIES = 3
STALE_PAUSE = 0.002


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
        # One-sided reads from same-host arenas (``IRDMA_ONE_SIDED=0``: always ask the daemon).
        self._direct = os.environ.get("IRDMA_ONE_SIDED", "1") != "0"
        # Reads of several shards that met two whole-tensor writes and read
        # pieces again to get one (a measure of write/read contention).
        self.reads_reconciled = 0
        self._copier = Copier()
        # The secret is read now, so a missing or exposed file is reported at once.
        self._dialing = Dialing(
            self.config, self.transport, self.timeout, cluster_secret(self.config), self.shared
        )
        self._meta: dict[str, TensorMeta] = {}
        # Where requests run: TrioShell inside ``async with``, BlockingShell for ``Client``.
        self._shell: Shell | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._closed = False
        self._router = Router(
            self.config,
            self.timeout,
            self._request,
            self._clock,
            lambda seconds: self._running.sleep(seconds),
        )
        self._batches = Batches(
            self._router, self._request, self._gather, lambda name: self._meta.pop(name, None)
        )
        # How reads of several shards are made to agree on one whole-tensor write.
        self._runner = Runner(
            self._gather,
            lambda seconds: self._running.sleep(seconds),
            self._clock,
            self.timeout,
        )

    async def __aenter__(self) -> AsyncClient:
        etcd = self.config.etcd
        if etcd is not None and self.needs_epoch:
            self.config.adopt(await current_epoch(etcd, self.timeout))
        self._stack = contextlib.AsyncExitStack()
        nursery = await self._stack.enter_async_context(trio.open_nursery())
        self._shell = TrioShell(self._dialing, nursery)
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
        self._closed = True
        self._copier.close()
        if isinstance(self._shell, TrioShell):
            await self._shell.aclose()

    def run_blocking(self) -> None:
        """Run every request in the calling thread from now on (``BlockingShell``:
        the blocking ``Client`` drives the coroutines itself)."""
        self._shell = BlockingShell(self._dialing)

    def close_blocking(self) -> None:
        """``aclose`` for a client that ``run_blocking``: close every thread's connections."""
        self._closed = True
        self._copier.close()
        if isinstance(self._shell, BlockingShell):
            self._shell.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _clock(self) -> float:
        """The shell's clock (trio's before there is a shell)."""
        return trio.current_time() if self._shell is None else self._shell.now()

    # -- connections and requests --------------------------------------------

    @property
    def _conns(self) -> dict[str, Conn]:
        """Open connections by daemon name (the calling thread's, for ``Client``)."""
        return self._shell.conns if self._shell is not None else {}

    @property
    def _running(self) -> Shell:
        """The shell requests run in; ClientClosed outside ``async with``."""
        if self._shell is None:
            raise ClientClosed("client is closed (use it inside 'async with')")
        return self._shell

    async def _connection(self, node: Node) -> Conn:
        if self._closed or self._shell is None:
            raise ClientClosed("client is closed (use it inside 'async with')")
        return await self._shell.connection(node)

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
        conn = self._conns.get(node.name)
        if conn is None or conn.broken:
            return None
        return conn.transport

    async def _request(
        self,
        node: Node,
        header: Header,
        payload: Sequence[Buffer] = (),
        sink: Sink | None = None,
    ) -> Reply:
        """One request to one daemon, bounded by the timeout; errors named by cause.

        A read waiting for a training step is answered NOT_READY after a
        while (so a waiting client still hears from its daemon); it is asked
        again until the step is reached or the daemon reports an error.
        """
        if self.config.epoch is not None:
            header = header._replace(epoch=epoch_tag(self.config.epoch.number))
        try:
            while True:
                conn = await self._connection(node)
                reply = await conn.request(header, payload, sink)
                if reply.header.status != Status.NOT_READY:
                    break
        except StreamTimeout as exc:
            raise DaemonTimeout(node.name, str(node.address), self.timeout) from exc
        except StreamClosed as exc:
            if self._closed:
                raise ClientClosed("client was closed during the request") from exc
            raise DaemonUnavailable(
                node.name, str(node.address), str(exc), single_copy=not self.replicated
            ) from exc
        except StreamBroken as exc:
            raise DaemonUnavailable(
                node.name, str(node.address), str(exc), single_copy=not self.replicated
            ) from exc
        status = reply.header.status
        if status != Status.OK:
            text = reply.data.decode("utf-8", "replace")
            if status == Status.STALE_EPOCH:
                text = self._follow_epoch(node, text)
            raise error_for_status(status, f"{node.name}: {text}")
        return reply

    def _follow_epoch(self, node: Node, record: str) -> str:
        """A daemon refused a request routed with another epoch and sent its own:
        take it if it is newer (the next try routes with it). Returns what to say."""
        try:
            epoch = Epoch.from_json(record)
        except ValueError as exc:
            return f"refused the request's epoch, with a bad epoch record ({exc})"
        if self.config.adopt(epoch):
            return f"the cluster is at epoch {epoch.number}; routed again"
        return f"is at epoch {epoch.number}, not newer than this client's; asked again"

    async def _rerouted(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (an operation over several daemons) again while daemons say the
        cluster's epoch changed, for as long as a request may take."""
        deadline = self._clock() + self._router.patience
        while True:
            try:
                return await fn()
            except StaleEpoch:
                if self._clock() >= deadline:
                    raise
                await self._running.sleep(0.05)  # a daemon behind the epoch catches up

    async def _gather(self, calls: Iterable[Callable[[], Any]]) -> list[Any]:
        """Run calls concurrently; return results in order, or raise the first error."""
        return await self._running.gather(list(calls))

    def _nodes_holding(self, meta: TensorMeta) -> list[Node]:
        """The daemons that keep a copy of some shard (in a move under way, too)."""
        names = {
            n.name for s in range(meta.num_shards) for n in self.config.copies_for(meta.key, s)
        }
        return [n for n in self.config.nodes if n.name in names]

    @property
    def replicated(self) -> bool:
        return self.config.replicas > 1

    # -- metadata ---------------------------------------------------------

    async def hello(self, node: Node) -> dict[str, Any]:
        """A daemon's self-description: version, readiness, shards by role, arena use,
        last snapshot, replication queues (see psd's ``state.DaemonState.hello``)."""
        reply = await self._request(node, Hello().frame())
        return decode_json(reply.data)

    async def holdings(self, node: Node, prefix: str = "") -> list[dict[str, Any]]:
        """One daemon's stat records of the tensors it holds shards of (no failover).

        Each record has the tensor's ``meta`` and ``shards``, mapping the local
        shard indices (as strings) to their versions: ``irdma status`` compares
        replicas with them. Raises like any request to that daemon.
        """
        raw = prefix.encode()
        if len(raw) > MAX_NAME_BYTES:
            raise ValueError("prefix is too long")
        reply = await self._request(node, ListTensors().frame(len(raw)), [raw])
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
        for salt in range(1, PLACES_TRIED + 1):
            try:
                return await self._create_at(meta, exist_ok=exist_ok, replace=replace)
            except TensorMoved:
                # Renamed tensors keep their keys: this name is held under another
                # key (then that tensor is the one to keep, refuse or replace), or
                # this key under another name (then the name takes a salted key).
                found = await self._find(name)
                if found is not None and found.key != meta.key:
                    meta = dataclasses.replace(meta, place=found.key)
                elif found is None:
                    meta = dataclasses.replace(meta, place=tensor_key(name, salt))
        raise TensorExists(f"no free key for tensor {name!r} after {PLACES_TRIED} tries")

    async def _create_at(self, meta: TensorMeta, *, exist_ok: bool, replace: bool) -> TensorInfo:
        """``create`` at the key ``meta`` names; TensorMoved if a daemon holds its name
        under another key or its key under another name."""
        name = meta.name
        holders = self._nodes_holding(meta)
        body = encode_json(meta.to_dict())
        exclusive = not exist_ok and not replace
        created_on: list[Node] = []
        results: list[dict[str, Any]] = []

        async def on_every_daemon(create: Create) -> None:
            """Send ``create`` to every daemon (those holding no shard of it only check
            the name); raise the first refusal once all have answered (one must not
            cancel the others' answers, or what they created is never undone)."""
            header = create.frame(len(body))
            refused: list[Exception] = []

            async def create_on(node: Node) -> None:
                try:
                    reply = await self._request(node, header, [body])
                except DaemonUnavailable as exc:
                    if not self.replicated and node in holders:
                        refused.append(exc)
                    return  # with replicas it gets the tensor from one when it is back
                except Exception as exc:
                    refused.append(exc)
                    return
                info = decode_json(reply.data)
                if info.get("created"):
                    created_on.append(node)
                if not create.check and info.get("placed", True):
                    results.append(info)

            await self._gather(partial(create_on, n) for n in self.config.nodes)
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
            if self.replicated and not results:
                raise DaemonUnavailable("cluster", "", "no replica of the tensor answered")
        except BaseException:
            # All or nothing: remove what this call created.
            with self._running.shielded():
                for node in created_on:
                    with contextlib.suppress(Exception):
                        await self._request(node, *_delete_frame(meta.key, name))
            raise
        if replace and created_on:
            # A redefinition with fewer shards (or another shard size) leaves
            # the old tensor on daemons that hold none of the new shards.
            await self._drop_elsewhere(meta.key, name, holders)
        # A tensor kept as it was may be placed by another key than asked for.
        meta = TensorMeta.from_dict(results[0]["meta"]) if results else meta
        self._meta[name] = meta
        # Versions start again with a new layout: what this client saw of
        # the old one says nothing about the new.
        self._router.forget(meta.key)
        return self._info_from([r for r in results if r], meta)

    async def _drop_elsewhere(self, key: int, name: str, holders: Sequence[Node]) -> None:
        """Delete tensor ``name`` at ``key`` on every daemon not in ``holders`` (best
        effort)."""

        async def drop_on(node: Node) -> None:
            with contextlib.suppress(TensorNotFound, DaemonUnavailable):
                await self._request(node, *_delete_frame(key, name))

        keep = {n.name for n in holders}
        await self._gather(partial(drop_on, n) for n in self.config.nodes if n.name not in keep)

    def _info_from(
        self, records: list[dict[str, Any]], meta: TensorMeta | None = None
    ) -> TensorInfo:
        meta = meta or TensorMeta.from_dict(records[0]["meta"])
        return TensorInfo(
            name=meta.name,
            dtype=meta.dtype,
            shape=meta.shape,
            nbytes=meta.nbytes,
            shard_size=meta.shard_size,
            num_shards=meta.num_shards,
            version=_merged_version(records),
            mtime=max((float(r.get("mtime", 0.0)) for r in records), default=0.0),
            ctime=min((float(r.get("ctime", 0.0)) for r in records), default=0.0),
            options=meta.options,
            place=meta.place,
        )

    @_epoch_rerouted
    async def stat(self, name: str, *, everywhere: bool = False) -> TensorInfo:
        """Metadata and version of a tensor; raises TensorNotFound.

        ``everywhere``: ask every daemon at once, by name: one round trip
        whether the tensor exists or not, one message per daemon (a lookup
        that often finds nothing, as a filesystem's). Otherwise the daemons
        where the name's own key places it are asked first, and the others
        only if it is not there (renamed to the name) or to add their shards.
        """
        validate_name(name)
        try:
            if everywhere:
                records = await self._stat_everywhere(name)
            else:
                records = await self._stat_placed(name)
        except TensorNotFound:
            self._meta.pop(name, None)
            raise TensorNotFound(f"no tensor named {name!r}") from None
        meta = TensorMeta.from_dict(records[0]["meta"])
        self._meta[name] = meta
        return self._info_from(records, meta)

    async def _stat_placed(self, name: str) -> list[dict[str, Any]]:
        """``stat``'s records: found by ``_locate``, then every other holder's."""
        rec = await self._locate(name)
        meta = TensorMeta.from_dict(rec["meta"])
        others = [n for n in self._nodes_holding(meta) if n.name != rec.get("node")]

        async def stat_on(node: Node) -> dict[str, Any]:
            try:
                r = await self._request(node, Stat(meta.key).frame())
            except TensorNotFound:
                # Not caught up yet (the other replicas answer), or deleted since
                # (a read with this metadata then finds out and asks again).
                return {}
            except DaemonUnavailable:
                if not self.replicated:
                    raise
                return {}  # down: the other replicas answer
            got = decode_json(r.data)
            # A daemon a rename has not reached yet still has it under the old name.
            return got if got["meta"]["name"] == name else {}

        records = [rec, *await self._gather(partial(stat_on, n) for n in others)]
        return [r for r in records if r]

    async def _stat_everywhere(self, name: str) -> list[dict[str, Any]]:
        """``stat``'s records from every daemon asked by name at once (of the tensor
        the first answer describes: two exist for a moment during a rename)."""
        found, down = await self._ask_by_name(name)
        if not found:
            # As the placed stat says: unknown if the name's own place did not answer.
            homes = [n.name for n in self.config.replicas_for(tensor_key(name), 0)]
            if all(h in down for h in homes):
                raise down[homes[0]]
            raise TensorNotFound(f"no tensor named {name!r}")
        first = found[0]["meta"]
        return [r for r in found if r["meta"] == first]

    async def _ask_by_name(
        self, name: str
    ) -> tuple[list[dict[str, Any]], dict[str, DaemonUnavailable]]:
        """Every daemon's stat record of the tensor called ``name`` (those that hold
        it), and the daemons that did not answer."""
        raw = name.encode()
        down: dict[str, DaemonUnavailable] = {}

        async def find_on(node: Node) -> dict[str, Any]:
            try:
                r = await self._request(node, Stat(0).frame(len(raw)), [raw])
            except TensorNotFound:
                return {}
            except DaemonUnavailable as exc:
                down[node.name] = exc
                return {}
            return decode_json(r.data)

        records = await self._gather(partial(find_on, n) for n in self.config.nodes)
        return [r for r in records if r], down

    async def _locate(self, name: str) -> dict[str, Any]:
        """One daemon's stat record of the tensor called ``name``; TensorNotFound.

        Asked first where the name's own key places it; a tensor renamed to
        the name (it kept its key) or placed by a salted key is then looked
        for by name on every daemon.
        """
        key = tensor_key(name)
        try:
            reply = await self._router.on_replicas(key, 0, Stat(key), update=False, track=False)
        except TensorNotFound:
            pass
        else:
            rec = decode_json(reply.data)
            if rec["meta"]["name"] == name:
                return rec
        # Renamed to the name: on any daemon (one that is down is not waited for:
        # the name's own place answered).
        found, _ = await self._ask_by_name(name)
        if not found:
            raise TensorNotFound(f"no tensor named {name!r}")
        return found[0]

    async def _find(self, name: str) -> TensorMeta | None:
        """The metadata of the tensor called ``name`` as stored now, or None."""
        try:
            return TensorMeta.from_dict((await self._locate(name))["meta"])
        except TensorNotFound:
            return None

    @_epoch_rerouted
    async def list(self, prefix: str = "", *, limit: int = 0) -> list[TensorInfo]:
        """Every tensor whose name starts with ``prefix``, sorted by name; only the
        first ``limit`` of them if it is not 0 (``limit=1``: is there any?).

        Raises DaemonUnavailable when the daemons that answered may not hold a
        copy of every tensor: one down with one copy, as many as the copies with
        replicas."""
        raw = prefix.encode()
        if len(raw) > MAX_NAME_BYTES:
            raise ValueError("prefix is too long")
        if not 0 <= limit < 1 << 63:
            raise ValueError(f"limit must be 0 (none) or a positive count, not {limit}")

        down: list[DaemonUnavailable] = []

        async def list_on(node: Node) -> list[dict[str, Any]]:
            hdr = ListTensors(limit).frame(len(raw))
            try:
                r = await self._request(node, hdr, [raw])
            except DaemonUnavailable as exc:
                if not self.replicated:
                    raise
                down.append(exc)
                return []  # its replicas answer for it
            return decode_json(r.data)

        per_node = await self._gather(partial(list_on, n) for n in self.config.nodes)
        # Each shard's copies are on distinct daemons: with fewer daemons down than
        # copies, every tensor has a copy that answered; with as many, some may be
        # missing, and an empty or partial listing would read as a fact.
        if down and len(down) >= min(self.config.replicas, len(self.config.nodes)):
            raise down[0]
        by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for records in per_node:
            for rec in records:
                by_name[rec["meta"]["name"]].append(rec)
        return [self._info_from(by_name[name]) for name in sorted(by_name)[: limit or None]]

    @_epoch_rerouted
    async def delete(self, name: str) -> None:
        """Delete a tensor from every daemon; raises TensorNotFound if none had it."""
        validate_name(name)
        cached = self._meta.pop(name, None)
        key = cached.key if cached is not None else tensor_key(name)
        if not await self._delete_at(key, name):
            found = await self._find(name)  # renamed to this name, or at a salted key
            if found is None or not await self._delete_at(found.key, name):
                raise TensorNotFound(f"no tensor named {name!r}")
            key = found.key
        self._router.forget(key)

    async def _delete_at(self, key: int, name: str) -> bool:
        """Delete tensor ``name`` at ``key`` from every daemon; whether any had it."""

        async def delete_on(node: Node) -> bool:
            try:
                await self._request(node, *_delete_frame(key, name))
            except TensorNotFound:
                return False
            except DaemonUnavailable:
                if not self.replicated:
                    raise
                return False  # it learns of the delete from a replica when it is back
            return True

        return any(await self._gather(partial(delete_on, n) for n in self.config.nodes))

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
        validate_name(old)
        validate_name(new)
        src = await self._find(old)
        if src is None:
            raise TensorNotFound(f"no tensor named {old!r}")
        if new == old:
            return await self.stat(old)
        dst = await self._find(new)
        if dst is not None and dst.key == src.key:
            dst = None  # this rename, begun before (on the daemons that answered then)
        if dst is not None and not replace:
            raise TensorExists(f"tensor {new!r} exists (pass replace=True to replace it)")
        body = encode_json({"from": old, "to": new})
        holders = self._nodes_holding(src)
        records: list[dict[str, Any]] = []
        failed: list[Exception] = []

        async def rename_on(node: Node) -> None:
            try:
                reply = await self._request(node, Rename(src.key).frame(len(body)), [body])
            except TensorNotFound:
                return
            except DaemonUnavailable as exc:
                if not self.replicated and node in holders:
                    failed.append(exc)
                return  # with replicas it catches up from one (the rename bumps versions)
            except Exception as exc:
                failed.append(exc)
                return
            records.append(decode_json(reply.data))

        await self._gather(partial(rename_on, n) for n in self.config.nodes)
        self._meta.pop(old, None)
        self._meta.pop(new, None)
        if failed:
            # Some daemons have the new name and some the old: renaming again
            # once they answer finishes it (each daemon renames what it holds).
            raise failed[0]
        if not records:
            raise TensorNotFound(f"no tensor named {old!r}")
        if dst is not None:
            await self._delete_at(dst.key, new)
            self._router.forget(dst.key)
        meta = TensorMeta.from_dict(records[0]["meta"])
        self._meta[new] = meta
        return self._info_from(records, meta)

    async def _meta_for(self, name: str) -> TensorMeta:
        meta = self._meta.get(name)
        if meta is None:
            meta = (await self.stat(name)).meta
        return meta

    # -- data ---------------------------------------------------------------

    async def _with_fresh_meta(self, name: str, fn: Callable[[TensorMeta], Any]) -> Any:
        """Run ``fn(meta)``; if the cached layout was stale, refresh it and run again.

        Again for as long as each refresh finds another tensor under the name
        (saved over by a rename while this was reading: the next one may be
        read whole), within the client timeout. And a few times when it finds
        the same: a rename reaches the daemons one by one, so a reader may learn
        the new layout from one a moment before another has it.
        """
        meta = await self._meta_for(name)
        deadline = self._router.now() + self.timeout
        same = 0
        while True:
            try:
                return await fn(meta)
            except (StaleLayout, TensorNotFound):
                self._meta.pop(name, None)
                fresh = (await self.stat(name)).meta
                if (fresh.key, fresh.layout) == (meta.key, meta.layout):
                    same += 1
                    if same > STALE_RETRIES:
                        raise
                    await self._router.sleep(STALE_PAUSE * same)
                elif self._router.now() > deadline:
                    raise
                meta = fresh

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
        if not asks_primary(update, wid) and self.replicated:
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
                txn=new_txn() if self._router.replicated else 0,
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
            kept = await self._gather(partial(_refusal_kept, one, p) for p in pieces)
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
        return not self.replicated and Mode.from_options(meta.options).kind == "async"

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
            conn = await self._connection(node)
        except (StreamBroken, StreamClosed, StreamTimeout):
            return None
        return (conn, seen) if conn.daemon_alive() else None

    def _direct_node(
        self, meta: TensorMeta, shard: int, choice: builtins.list[Node] | None = None
    ) -> tuple[Node, int]:
        """The daemon a one-sided read of ``shard`` copies from, and the least version
        the shard may have there: with replicas, the replica the read would ask
        first (``choice``), no older than this client saw."""
        if self.replicated:
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
        meta = self._meta.get(name)
        if meta is None or self._closed or meta.num_shards != 1:
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
        conn = self._conns.get(node.name)
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
        if self.replicated:
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
        cached = self._meta.get(name)
        if out is not None and cached is not None and not _fits_out(cached, out):
            # Another process may have redefined the tensor to what ``out`` is:
            # ask before calling it a mismatch.
            del self._meta[name]

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
        meta = self._meta.get(name)
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
            self._meta.pop(name, None)
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
        missing = [n for n in names if n not in self._meta]
        await self._gather(partial(self.stat, n) for n in missing)
        return {n: self._meta[n] for n in names}

    async def read_into(self, outs: Mapping[str, np.ndarray]) -> None:
        """Read each named tensor into its array (as ``read`` with ``out``), all at
        once: one-sided where they can be, the requests to different daemons in
        flight together. For large tensors; ``read_many`` batches small ones."""
        await self._gather(partial(self.read, name, out) for name, out in outs.items())

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
                self._meta.pop(n, None)
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
            meta = self._meta.get(name)
            if meta is None or meta.dtype != arr.dtype.name or meta.shape != arr.shape:
                meta = (await self.create(name, arr.shape, arr.dtype, exist_ok=True)).meta
            metas[name] = meta

        await self._gather(partial(ensure, n, a) for n, a in arrs.items())
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


def _delete_frame(key: int, name: str) -> tuple[Header, list[bytes]]:
    """A DELETE of tensor ``name`` at ``key`` (not of another renamed to it since)."""
    raw = name.encode()
    return Delete(key).frame(len(raw)), [raw]


def _merged_version(records: list[dict[str, Any]]) -> int:
    """A tensor's version: the sum over its shards of the newest replica's version."""
    shards: dict[str, int] = {}
    plain = 0
    for r in records:
        if "shards" in r:
            for index, v in r["shards"].items():
                shards[index] = max(shards.get(index, 0), int(v))
        else:
            plain += int(r.get("version", 0))
    return sum(shards.values()) + plain


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
