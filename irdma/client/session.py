"""A client's session: its connections to the daemons, and the one place a stream's
failure or a daemon's refusal becomes an irdma error.

The session holds the shell requests run in (``shells.TrioShell`` inside
``async with``, ``shells.BlockingShell`` for the blocking ``Client``) and
offers the rest of the client what it needs of it: one request to one daemon
(``request``), the shell's clock, sleeps and concurrency, and the open
connections (for the one-sided reader and for ``transport_of``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio

from ..auth import cluster_secret
from ..cluster import ClusterConfig, ConfigInForce, Node
from ..cluster.epochs import Epoch, epoch_tag
from ..errors import (
    ClientClosed,
    DaemonTimeout,
    DaemonUnavailable,
    StaleStamp,
    error_for_status,
)
from ..protocol import Header, Status
from ..transport.base import Buffer, Reply, Sink, StreamBroken, StreamClosed, StreamTimeout
from ..transport.blocking import BlockingConnection
from ..transport.shared import SharedRegion
from ..transport.tcp import FramedConnection
from .routing import several_copies
from .shells import BlockingShell, Dialing, Shell, TrioShell

# A daemon connection as the shells open them: TrioShell's (tcp, shm, rdma) or
# BlockingShell's (the calling thread's tcp or shm).
Conn = FramedConnection | BlockingConnection

CLOSED = "client is closed (use it inside 'async with')"


class Session:
    """One client's connections and requests (see the module docstring)."""

    def __init__(
        self,
        config: ClusterConfig,
        *,
        timeout: float,
        transport: str,
        shared: SharedRegion | None,
    ) -> None:
        # The config in force: replaced whole when a daemon brings a newer epoch.
        self.in_force = ConfigInForce(config)
        self.timeout = timeout
        # The secret is read now, so a missing or exposed file is reported at once.
        self.dialing = Dialing(config, transport, timeout, cluster_secret(config), shared)
        self._shell: Shell | None = None
        self._closed = False

    # -- the shell ----------------------------------------------------------

    def run_under_trio(self, nursery: trio.Nursery) -> None:
        """Run requests under trio, connections' tasks in ``nursery``."""
        self._shell = TrioShell(self.dialing, nursery)

    def run_blocking(self) -> None:
        """Run every request in the calling thread (the blocking ``Client``)."""
        self._shell = BlockingShell(self.dialing)

    async def aclose(self) -> None:
        """Close every connection (pending requests fail with ClientClosed)."""
        self._closed = True
        if isinstance(self._shell, TrioShell):
            await self._shell.aclose()

    def close_blocking(self) -> None:
        """``aclose`` for a session that ``run_blocking``: every thread's connections."""
        self._closed = True
        if isinstance(self._shell, BlockingShell):
            self._shell.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def shell(self) -> Shell | None:
        """The shell requests run in (None before the client is opened)."""
        return self._shell

    @property
    def _running(self) -> Shell:
        if self._shell is None:
            raise ClientClosed(CLOSED)
        return self._shell

    def now(self) -> float:
        """The shell's clock (trio's before there is a shell)."""
        return trio.current_time() if self._shell is None else self._shell.now()

    async def sleep(self, seconds: float) -> None:
        await self._running.sleep(seconds)

    async def gather(self, calls: Iterable[Callable[[], Any]]) -> list[Any]:
        """Run calls concurrently; return results in order, or raise the first error."""
        return await self._running.gather(list(calls))

    def shielded(self) -> contextlib.AbstractContextManager[Any]:
        return self._running.shielded()

    # -- connections --------------------------------------------------------

    @property
    def conns(self) -> dict[str, Conn]:
        """Open connections by daemon name (the calling thread's, for ``Client``)."""
        return self._shell.conns if self._shell is not None else {}

    async def connection(self, node: Node) -> Conn:
        if self._closed or self._shell is None:
            raise ClientClosed(CLOSED)
        conn: Conn = await self._shell.connection(node)
        return conn

    def transport_of(self, node: Node) -> str | None:
        """How this client reaches ``node`` ("tcp", "shm" or "rdma"); None before it connects."""
        conn = self.conns.get(node.name)
        if conn is None or conn.broken:
            return None
        return conn.transport

    # -- requests -------------------------------------------------------------

    async def request(
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
                conn = await self.connection(node)
                reply = await conn.request(header, payload, sink)
                if reply.header.status != Status.NOT_READY:
                    break
        except StreamTimeout as exc:
            raise DaemonTimeout(node.name, str(node.address), self.timeout) from exc
        except StreamClosed as exc:
            if self._closed:
                raise ClientClosed("client was closed during the request") from exc
            raise self._unavailable(node, exc) from exc
        except StreamBroken as exc:
            raise self._unavailable(node, exc) from exc
        status = reply.header.status
        if status != Status.OK:
            text = reply.data.decode("utf-8", "replace")
            if status == Status.STALE_EPOCH:
                text = self._follow_epoch(text)
            error = error_for_status(status, f"{node.name}: {text}")
            if isinstance(error, StaleStamp):
                error.held = reply.header.stamp  # the later write the shard holds
            raise error
        return reply

    @property
    def config(self) -> ClusterConfig:
        """The config in force (keep it for one decision: a newer epoch replaces it)."""
        return self.in_force.config

    def _unavailable(self, node: Node, exc: Exception) -> DaemonUnavailable:
        single = not several_copies(self.config)
        return DaemonUnavailable(node.name, str(node.address), str(exc), single_copy=single)

    def _follow_epoch(self, record: str) -> str:
        """A daemon refused a request routed with another epoch and sent its own:
        take it if it is newer (the next try routes with it). Returns what to say."""
        try:
            epoch = Epoch.from_json(record)
        except ValueError as exc:
            return f"refused the request's epoch, with a bad epoch record ({exc})"
        if self.in_force.adopt(epoch):
            return f"the cluster is at epoch {epoch.number}; routed again"
        return f"is at epoch {epoch.number}, not newer than this client's; asked again"
