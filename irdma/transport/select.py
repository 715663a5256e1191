"""Which transport a client uses for a daemon: forced, by address, or automatic.

``IRDMA_TRANSPORT=tcp|shm|rdma`` (or the client's ``transport`` argument)
forces one for every daemon; a forced transport that cannot be had fails
with the reason rather than quietly using another. Otherwise:

- a ``shm://`` address requires shared memory for that daemon;
- an ``rdma://`` address asks for RDMA verbs, falling back to TCP with one
  warning (the reason) where this host or the daemon has no RDMA;
- a ``tcp://`` address gets shared memory when the daemon runs on this host
  (same boot and network namespace, its socket reachable), else RDMA when
  this host has a device for the route to the daemon and the daemon serves
  RDMA, else TCP.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import trio

from ..cluster import Node
from ..errors import ConfigError
from ..sizes import rdma_staging_size, shm_staging_size
from . import rdma
from .base import Connection, StreamBroken
from .blocking import BlockingConnection, BlockingWaits, attach_shm, open_tcp
from .shared import SharedRegion
from .shm import ShmUnavailable, attach_connection
from .tcp import FramedConnection
from .unix import socket_path

log = logging.getLogger("irdma")

CHOICES = ("auto", "tcp", "shm", "rdma")
ENV = "IRDMA_TRANSPORT"


def forced_transport(value: str | None = None) -> str:
    """The transport asked for (argument, else $IRDMA_TRANSPORT, else auto)."""
    choice = (value or os.environ.get(ENV) or "auto").strip().lower()
    if choice not in CHOICES:
        raise ConfigError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    return choice


def choice_for(node: Node, forced: str) -> str:
    """ "tcp", "shm" or "rdma" when one is required; "auto" or "rdma?" (preferred) otherwise."""
    if forced != "auto":
        return forced
    scheme = node.address.scheme
    return {"shm": "shm", "rdma": "rdma?"}.get(scheme, "auto")


async def open_connection(
    node: Node,
    nursery: trio.Nursery,
    *,
    forced: str,
    timeout: float,
    shard_size: int,
    secret: bytes | None = None,
    rdma_gid_index: int | None = None,
    rdma_mtu: int | None = None,
    shared: SharedRegion | None = None,
) -> Connection:
    """A connection to ``node`` over the transport ``forced`` and its address call for.

    With ``secret`` (the cluster's, ``irdma.auth``) it authenticates before
    anything else; AuthFailed when that fails, whatever the transport.
    ``shared`` is the client's shared region, offered to a same-host daemon.
    """
    choice = choice_for(node, forced)
    peer = f"{node.name} ({node.address})"
    if choice in ("shm", "auto"):
        try:
            return await attach_connection(
                socket_path(node.data_dir),
                nursery,
                peer=f"{node.name} (shm)",
                timeout=timeout,
                staging_size=shm_staging_size(shard_size),
                node=node.name,
                secret=secret,
                shared=shared,
            )
        except ShmUnavailable as exc:
            if choice == "shm":
                raise StreamBroken(f"shm transport: {exc}") from None
            log.debug("%s: no shm (%s)", node.name, exc)
    if choice in ("rdma", "rdma?", "auto"):
        return await rdma.connect(
            node.address.host,
            node.address.port,
            nursery,
            peer=peer,
            timeout=timeout,
            secret=secret,
            staging_size=rdma_staging_size(shard_size),
            gid_index=rdma_gid_index,
            mtu=rdma_mtu,
            required=choice == "rdma",
            # Asked for by address or by name: say why it is not used.
            quiet=choice == "auto",
        )
    return await FramedConnection.open(
        node.address.host, node.address.port, nursery, peer=peer, timeout=timeout, secret=secret
    )


def may_use_rdma(nodes: Sequence[Node], forced: str) -> bool:
    """Whether a client with these daemons and this choice may reach one over RDMA.

    The blocking client runs requests in the calling thread over TCP and shm
    only; where RDMA may be used it runs them on a trio loop instead.
    """
    if forced in ("tcp", "shm"):
        return False
    if forced == "rdma" or any(n.address.scheme == "rdma" for n in nodes):
        return True
    try:
        return any(os.scandir("/sys/class/infiniband"))
    except OSError:
        return False


async def open_blocking_connection(
    node: Node,
    *,
    forced: str,
    waits: BlockingWaits,
    shard_size: int,
    secret: bytes | None,
    shared: SharedRegion | None = None,
) -> BlockingConnection:
    """A blocking client's connection to ``node``: shm or TCP by the same rules as above."""
    choice = choice_for(node, forced)
    if choice not in ("shm", "tcp", "auto"):
        raise StreamBroken(f"{node.name}: the blocking client has no {choice} transport")
    if choice in ("shm", "auto"):
        try:
            return await attach_shm(
                socket_path(node.data_dir),
                f"{node.name} (shm)",
                node.name,
                waits,
                secret,
                shm_staging_size(shard_size),
                shared,
            )
        except ShmUnavailable as exc:
            if choice == "shm":
                raise StreamBroken(f"shm transport: {exc}") from None
            log.debug("%s: no shm (%s)", node.name, exc)
    peer = f"{node.name} ({node.address})"
    return await open_tcp(node.address.host, node.address.port, peer, waits, secret)
