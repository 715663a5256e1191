"""Which transport a client uses for a daemon: forced, by address, or automatic.

``IRDMA_TRANSPORT=tcp|shm`` (or the client's ``transport`` argument) forces
one for every daemon; a ``shm://`` address asks for shared memory for that
daemon; otherwise shared memory is used when the daemon runs on this host
(same boot and network namespace, its socket reachable), TCP when not.
A forced or requested shm that cannot be had fails with the reason rather
than quietly using TCP.
"""

from __future__ import annotations

import logging
import os

import trio

from ..cluster import Node
from ..errors import ConfigError
from .base import Connection, StreamBroken
from .shm import STAGING_MIN, ShmConnection, ShmUnavailable, socket_path
from .tcp import TcpConnection

log = logging.getLogger("irdma")

CHOICES = ("auto", "tcp", "shm")
ENV = "IRDMA_TRANSPORT"


def forced_transport(value: str | None = None) -> str:
    """The transport asked for (argument, else $IRDMA_TRANSPORT, else auto)."""
    choice = (value or os.environ.get(ENV) or "auto").strip().lower()
    if choice == "rdma":
        raise ConfigError(f"{ENV}=rdma: this build of irdma has no RDMA transport; use tcp or shm")
    if choice not in CHOICES:
        raise ConfigError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    return choice


def choice_for(node: Node, forced: str) -> str:
    if forced != "auto":
        return forced
    return "shm" if node.address.scheme == "shm" else "auto"


async def open_connection(
    node: Node, nursery: trio.Nursery, *, forced: str, timeout: float, shard_size: int
) -> Connection:
    """A connection to ``node`` over the transport ``forced`` and its address call for."""
    choice = choice_for(node, forced)
    peer = f"{node.name} ({node.address})"
    if choice != "tcp":
        try:
            return await ShmConnection.attach(
                socket_path(node.data_dir),
                nursery,
                peer=f"{node.name} (shm)",
                timeout=timeout,
                staging_size=max(STAGING_MIN, 4 * shard_size),
                node=node.name,
            )
        except ShmUnavailable as exc:
            if choice == "shm":
                raise StreamBroken(f"shm transport: {exc}") from None
            log.debug("%s: using tcp (%s)", node.name, exc)
    return await TcpConnection.open(
        node.address.host, node.address.port, nursery, peer=peer, timeout=timeout
    )
