"""The blocking client: the async core driven in the calling thread, or on a loop thread.

``Client`` runs ``AsyncClient``'s core with every request made in the calling
thread (``shells.BlockingShell``, ``shells.drive``); where RDMA may be used,
on a trio loop in one background thread instead (``_LoopThread``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import trio

from ..cluster import ClusterConfig, Node
from ..devices import Transfers, is_device_array
from ..errors import ClientClosed
from ..transport.base import Buffer
from ..transport.select import may_use_rdma
from ..transport.shared import SharedRegion
from .facade import AsyncClient
from .lookup import TensorInfo
from .manifests import DEFAULT_KEEP
from .shells import drive
from .versions import BlockingModelVersions


class _LoopThread:
    """Runs an AsyncClient on a trio loop in one background thread, for a blocking
    client that may use RDMA (its completions are awaited under trio)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name="irdma-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except Exception as exc:  # reported to the constructor or close()
            self._error = exc
            self._ready.set()
        except BaseException as exc:  # handed to another thread only as an Exception
            self._error = ClientClosed(f"the client's loop thread ended: {exc!r}")
            self._ready.set()
            raise

    async def _main(self) -> None:
        self._stop = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        async with self._client:
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._token is None or not self._thread.is_alive():
            raise ClientClosed("client is closed")
        try:
            return trio.from_thread.run(partial(fn, *args, **kwargs), trio_token=self._token)
        except trio.RunFinishedError:
            raise ClientClosed("client is closed") from None

    def close(self) -> None:
        # _main sets _stop before _token: a token means there is an event to set.
        if self._token is not None and self._stop is not None and self._thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            self._thread.join()


class Client:
    """Blocking client, for scripts, training loops and threads.

    ``Client()`` finds the config like the CLI; ``Client(path)`` uses that
    file. It runs the same core as ``AsyncClient`` (routing, failover,
    read-your-writes, the metadata cache) with every request made in the
    calling thread over blocking sockets and shared memory: no event loop
    and no hand-off to another thread (``irdma.client.shells.BlockingShell``). Each
    thread that uses a Client gets connections of its own. Where RDMA may be
    used (forced, ``rdma://`` addresses, or a verbs device on this host), the
    requests run on a trio loop in one background thread instead.
    """

    def __init__(
        self,
        config: ClusterConfig | str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = None,
        transport: str | None = None,
        shared_memory: int | str | SharedRegion | None = None,
    ) -> None:
        self._client = AsyncClient(
            config, timeout=timeout, transport=transport, shared_memory=shared_memory
        )
        in_force = self._client.session.in_force
        if in_force.needs_epoch:  # trio.run only then: this client may be made inside trio
            trio.run(in_force.adopt_stored_epoch, self._client.timeout)
        self._loop: _LoopThread | None = None
        if may_use_rdma(self.config.nodes, self._client.transport):
            self._loop = _LoopThread(self._client)
        else:
            self._client.run_blocking()

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._loop is not None:
            return self._loop.call(fn, *args, **kwargs)
        if self._client.closed:
            raise ClientClosed("client is closed")
        return drive(fn(*args, **kwargs))

    def close(self) -> None:
        """Close every connection (and stop the loop thread, where there is one)."""
        if self._loop is not None:
            self._loop.close()
        else:
            self._client.close_blocking()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def config(self) -> ClusterConfig:
        """The cluster's config in force (``AsyncClient.config``)."""
        return self._client.config

    @property
    def async_client(self) -> AsyncClient:
        """The ``AsyncClient`` this client runs (its counters, connections and routing,
        for tools and tests that look inside; calling it directly bypasses this
        client's loop)."""
        return self._client

    @property
    def transfers(self) -> Transfers:
        """How this client stages tensors through its host memory (``irdma.devices``)."""
        return self._client.transfers

    def shared_empty(self, shape: Sequence[int] | int, dtype: Any = np.float32) -> np.ndarray:
        """See AsyncClient.shared_empty."""
        return self._client.shared_empty(shape, dtype)

    def model(self, prefix: str, *, keep: int = DEFAULT_KEEP) -> BlockingModelVersions:
        """The model under ``prefix``, committed and read as numbered versions
        (``AsyncClient.model``)."""
        return BlockingModelVersions(self._client.model(prefix, keep=keep), self._call)

    def create(
        self, name: str, shape: Sequence[int] | int, dtype: Any = np.float32, **kwargs: Any
    ) -> TensorInfo:
        """See AsyncClient.create."""
        return self._call(self._client.create, name, shape, dtype, **kwargs)

    def read(self, name: str, out: np.ndarray | None = None, **kwargs: Any) -> np.ndarray:
        """See AsyncClient.read."""
        if not kwargs and self._loop is None:
            host, land = self._client.transfers.sink(out)
            got = self._client.read_now(name, host)
            if got is not None:
                if not is_device_array(out):
                    return got
                assert out is not None  # a tensor
                return out if land is None else land()
        return self._call(self._client.read, name, out, **kwargs)

    def read_bytes(
        self, name: str, offset: int, size: int, out: Buffer | None = None
    ) -> memoryview:
        """See AsyncClient.read_bytes."""
        return self._call(self._client.read_bytes, name, offset, size, out)

    def read_range(self, name: str, offset: int, out: Buffer, *, at: int = 0) -> int:
        """See AsyncClient.read_range."""
        return self._call(self._client.read_range, name, offset, out, at=at)

    def write(self, name: str, array: Any, **kwargs: Any) -> None:
        """See AsyncClient.write."""
        return self._call(self._client.write, name, array, **kwargs)

    def write_bytes(self, name: str, offset: int, data: Buffer) -> None:
        """See AsyncClient.write_bytes."""
        return self._call(self._client.write_bytes, name, offset, data)

    def accumulate(self, name: str, delta: Any, alpha: float = 1.0, **kwargs: Any) -> None:
        """See AsyncClient.accumulate."""
        return self._call(self._client.accumulate, name, delta, alpha, **kwargs)

    def stat(self, name: str, *, everywhere: bool = False) -> TensorInfo:
        """See AsyncClient.stat."""
        return self._call(self._client.stat, name, everywhere=everywhere)

    def list(self, prefix: str = "", *, limit: int = 0) -> list[TensorInfo]:
        """See AsyncClient.list."""
        return self._call(self._client.list, prefix, limit=limit)

    def delete(self, name: str) -> None:
        """See AsyncClient.delete."""
        return self._call(self._client.delete, name)

    def rename(self, old: str, new: str, *, replace: bool = False) -> TensorInfo:
        """See AsyncClient.rename."""
        return self._call(self._client.rename, old, new, replace=replace)

    def read_into(self, outs: Mapping[str, np.ndarray]) -> None:
        """See AsyncClient.read_into."""
        return self._call(self._client.read_into, outs)

    def read_many(self, names: Iterable[str], **kwargs: Any) -> dict[str, np.ndarray]:
        """See AsyncClient.read_many."""
        return self._call(self._client.read_many, list(names), **kwargs)

    def write_many(self, arrays: Mapping[str, Any]) -> None:
        """See AsyncClient.write_many."""
        return self._call(self._client.write_many, arrays)

    def accumulate_many(self, deltas: Mapping[str, Any], alpha: float = 1.0, **kwargs: Any) -> None:
        """See AsyncClient.accumulate_many."""
        return self._call(self._client.accumulate_many, deltas, alpha, **kwargs)

    def hello(self, node: Node) -> dict[str, Any]:
        """See AsyncClient.hello."""
        return self._call(self._client.hello, node)
