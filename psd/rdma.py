"""The daemon's side of the rdma transport: its registered arena and one queue pair per client.

At start the daemon opens the RDMA device whose RoCE v2 GID is the address
it listens on and registers its whole arena once, for remote READ only:
clients pull shards with one-sided RDMA READs and no daemon CPU touches the
bytes. A client asks for RDMA with RDMA_CONNECT on its (authenticated) TCP
connection; the daemon then creates an RC queue pair for it and a staging
block in the arena, registered on its own for remote WRITE, so a client can
write into its staging area and nowhere else. Both live as long as that TCP
connection. The daemon posts no work requests: its queue pairs only answer
the client's.

What a client is given is the arena's key (read-only) and its own staging
area's key. A forged key, a key of a closed connection, or an address
outside those regions gets a remote access error on the client's queue
pair; the daemon's state is untouched and it keeps serving.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from irdma.cluster import ClusterConfig, Node
from irdma.errors import ConfigError
from irdma.protocol import Status
from irdma.sizes import RDMA_MAPPED_MIN, RDMA_STAGING_ACCEPTED
from irdma.transport.verbs import (
    MTU_BYTES,
    Endpoint,
    NoDevice,
    QpInfo,
    VerbsError,
    find_gid,
    memlock_problem,
)
from irdma.transport.verbs_compat import VerbsUnavailable

from .arena import Block
from .errors import Refusal
from .staged import StagedMemory
from .store import Store

log = logging.getLogger("psd")

# Bounds on the staging area one client may ask for.
STAGING_MIN, STAGING_MAX = RDMA_STAGING_ACCEPTED
# The daemon posts nothing on its queue pairs; they need no depth.
SERVER_QP_DEPTH = 1


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """What a client sends in RDMA_CONNECT (JSON)."""

    qp: QpInfo
    mtu: int
    staging: int

    @classmethod
    def parse(cls, obj: Any) -> ConnectRequest:
        if not isinstance(obj, dict):
            raise ValueError("RDMA_CONNECT body must be a JSON object")
        try:
            mtu, staging = int(obj["mtu"]), int(obj["staging"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"RDMA_CONNECT needs integer mtu and staging: {exc}") from None
        if mtu not in MTU_BYTES.values():
            raise ValueError(f"RDMA_CONNECT mtu {mtu} is not one of {sorted(MTU_BYTES.values())}")
        if not STAGING_MIN <= staging <= STAGING_MAX:
            raise ValueError(
                f"RDMA_CONNECT staging {staging} is outside [{STAGING_MIN}, {STAGING_MAX}]"
            )
        return cls(QpInfo.from_json(obj.get("qp")), mtu, staging)


class RdmaSession(StagedMemory):
    """One client's queue pair and staging block, for the life of its TCP connection."""

    transport = "rdma"
    # Every read is answered MAPPED: the client pulls even small ones with RDMA READ.
    mapped_min = RDMA_MAPPED_MIN

    def __init__(self, service: RdmaService, qp: Any, staging: Block, mr: Any, peer: str) -> None:
        super().__init__(service.store.arena.view(staging))
        self.service = service
        self.qp = qp
        self.staging = staging
        self.mr = mr
        self.peer = peer

    def close(self) -> None:
        # The queue pair goes first: nothing may write the staging block once
        # it is back in the allocator.
        for obj in (self.qp, self.mr):
            with contextlib.suppress(Exception):
                obj.close()
        self.service.store.arena.free(self.staging)


class RdmaService:
    """The daemon's RDMA device port with the arena registered on it."""

    def __init__(self, endpoint: Endpoint, store: Store) -> None:
        self.endpoint = endpoint
        self.store = store
        e = endpoint.e
        arena = store.arena
        self.arena_addr = int(arena.buf.ctypes.data)
        # Remote READ only: nobody writes the arena except through staging.
        # The whole memfd: the blocks and the shard directory after them.
        self.arena_mr = endpoint.register(
            self.arena_addr,
            arena.size,
            e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ,
            f"the {arena.size}-byte arena",
        )
        self.cq = endpoint.completion_queue(SERVER_QP_DEPTH * 2)

    @classmethod
    def open(cls, config: ClusterConfig, node: Node, store: Store) -> RdmaService | None:
        """The service for ``node``, or None (logged once) when this host has no RDMA for it.

        An ``rdma://`` address on a host without pyverbs or a device is
        served over TCP (and shm) with a warning. A device that exists but
        cannot be used as configured (memlock, GID index, MTU) raises
        ConfigError naming the fix.
        """
        wanted = node.address.scheme == "rdma"
        try:
            gid = find_gid(node.address.host, index=config.rdma_gid_index)
        except (NoDevice, VerbsUnavailable) as exc:
            if wanted:
                log.warning("%s: no RDMA, serving TCP and shm only: %s", node.name, exc)
            else:
                log.debug("%s: no RDMA: %s", node.name, exc)
            return None
        except VerbsError as exc:
            raise ConfigError(f"{node.name}: {exc}") from None
        problem = memlock_problem(store.arena.size)
        if problem is not None:
            if wanted:
                raise ConfigError(f"{node.name}: cannot register the arena for RDMA: {problem}")
            log.warning("%s: RDMA device %s not used: %s", node.name, gid.device, problem)
            return None
        try:
            endpoint = Endpoint(gid, mtu=config.rdma_mtu)
        except VerbsUnavailable as exc:
            log.warning("%s: no RDMA: %s", node.name, exc)
            return None
        except VerbsError as exc:
            raise ConfigError(f"{node.name}: {exc}") from None
        try:
            service = cls(endpoint, store)
        except VerbsError as exc:
            endpoint.close()
            raise ConfigError(f"{node.name}: {exc}") from None
        log.info(
            "%s: RDMA on %s (GID index %d, %s, MTU %d), %d-byte arena registered",
            node.name,
            endpoint.name,
            gid.index,
            gid.gid,
            endpoint.mtu,
            store.arena.size,
        )
        return service

    def accept(self, request: ConnectRequest, peer: str) -> tuple[RdmaSession, dict[str, Any]]:
        """A connected queue pair and staging block for a client; and the answer to send it."""
        ep = self.endpoint
        e = ep.e
        staging = self.store.blocks.reserve(request.staging)
        if staging is None:
            raise Refusal(
                Status.NO_SPACE,
                f"arena full: no room for a {request.staging}-byte RDMA staging area",
            )
        qp = mr = None
        try:
            mr = ep.register(
                self.arena_addr + staging.offset,
                staging.size,
                e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE,
                f"staging for {peer}",
            )
            qp = ep.queue_pair(self.cq, SERVER_QP_DEPTH)
            local = ep.local_info(qp)
            mtu = min(request.mtu, ep.mtu)
            access = e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
            ep.connect(qp, local, request.qp, access, mtu)
        except BaseException:
            for obj in (qp, mr):
                if obj is not None:
                    with contextlib.suppress(Exception):
                        obj.close()
            self.store.arena.free(staging)
            raise
        answer = {
            "qp": local.to_json(),
            "mtu": mtu,
            "arena_addr": self.arena_addr,
            "arena_rkey": int(self.arena_mr.rkey),
            "arena_size": self.store.arena.size,
            "directory": [self.store.directory.offset, self.store.directory.slots],
            "staging_addr": self.arena_addr + staging.offset,
            "staging_rkey": int(mr.rkey),
            "staging_size": request.staging,
        }
        log.info(
            "RDMA queue pair %d for %s (peer QP %d, GID %s, MTU %d)",
            local.qpn,
            peer,
            request.qp.qpn,
            request.qp.gid,
            mtu,
        )
        return RdmaSession(self, qp, staging, mr, peer), answer

    def close(self) -> None:
        for obj in (self.cq, self.arena_mr):
            with contextlib.suppress(Exception):
                obj.close()
        self.endpoint.close()
