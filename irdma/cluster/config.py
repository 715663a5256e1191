"""A cluster's settings and its daemons: the records a config file becomes.

``ClusterConfig`` is what every client and daemon holds: the settings of
``cluster.toml`` (read by ``irdma.cluster.configfile``), the daemons, and
where each shard lives (``irdma.cluster.placement``). With ``[etcd]`` the
daemons follow the epoch in force (``ClusterConfig.following``, held by
``irdma.cluster.in_force.ConfigInForce``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import ConfigError
from .epochs import Epoch
from .placement import Placement

DEFAULT_SHARD_SIZE = 4 << 20
DEFAULT_TIMEOUT = 10.0
DEFAULT_HEARTBEAT = 0.2
DEFAULT_FAILURE_TIMEOUT = 1.0
DEFAULT_SNAPSHOT_INTERVAL = 60.0
DEFAULT_ETCD_PREFIX = "/irdma/default"
DEFAULT_LEASE_TTL = 2
DEFAULT_REPLACE_AFTER = 30.0
# Seconds a daemon keeps a whole-tensor write a reader holds a lease on
# (``psd/store/leases.py``) unless the reader renews it (every third of it).
DEFAULT_READ_LEASE = 10.0
# shm: same-host clients must use shared memory; rdma: clients use RDMA
# verbs where they can. Either way the daemon listens on TCP at that host and
# port, for its peers, for clients without them, and (rdma) to set up queue pairs.
SCHEMES = ("tcp", "shm", "rdma")


@dataclass(frozen=True, slots=True)
class Address:
    scheme: str
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address:
        m = re.fullmatch(r"(?:(\w+)://)?(\[[0-9a-fA-F:.]+\]|[^:/\[\]]+):(\d+)", text)
        if not m:
            raise ValueError(f"address {text!r} is not of the form tcp://HOST:PORT")
        scheme = m.group(1) or "tcp"
        if scheme not in SCHEMES:
            raise ValueError(f"address {text!r}: unknown transport {scheme!r}")
        port = int(m.group(3))
        if not 0 < port < 65536:
            raise ValueError(f"address {text!r}: port out of range")
        return cls(scheme, m.group(2).strip("[]"), port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    address: Address
    data_dir: Path
    arena_size: int
    # Where the daemon serves Prometheus metrics (scheme "http"); None: nowhere.
    metrics_address: Address | None = None


@dataclass(frozen=True, slots=True)
class EtcdSettings:
    """Where the cluster's membership lives when it is kept in etcd (``[etcd]``)."""

    endpoints: tuple[str, ...]  # http://host:port of etcd members
    prefix: str = DEFAULT_ETCD_PREFIX  # every key of this cluster is under it
    lease_ttl: int = DEFAULT_LEASE_TTL  # seconds a daemon's registration outlives it
    # Seconds a member may stay unregistered (down) before its copies are made
    # again on the others; a daemon restarted sooner keeps its shards.
    replace_after: float = DEFAULT_REPLACE_AFTER


@dataclass(frozen=True, eq=False)
class ClusterConfig:
    """A cluster's settings and its daemons, never changed once made. With ``[etcd]``
    the daemons and their placement follow the epoch in force: ``following(epoch)``
    gives the config of a newer epoch (``nodes`` are then the epoch's members and
    target daemons, and shards are placed over its members), and a process holds
    the one in force in a ``ConfigInForce`` (``irdma.cluster.in_force``). A caller that
    keeps a config keeps one epoch's view whole, however the cluster moves on."""

    nodes: tuple[Node, ...]
    shard_size: int = DEFAULT_SHARD_SIZE
    replicas: int = 1
    timeout: float = DEFAULT_TIMEOUT
    heartbeat: float = DEFAULT_HEARTBEAT
    failure_timeout: float = DEFAULT_FAILURE_TIMEOUT
    snapshot_interval: float = DEFAULT_SNAPSHOT_INTERVAL
    read_lease: float = DEFAULT_READ_LEASE
    # A backup on the primary's kernel copies large forwards out of the primary's
    # arena (psd/replication/lending.py); False: every forward's bytes are sent.
    lend_forwards: bool = True
    secret_file: Path | None = None
    log_level: str | None = None
    # RDMA: the GID index to use (default: the RoCE v2 GID of the address)
    # and the path MTU in bytes (default: the smaller active MTU of the two ports).
    rdma_gid_index: int | None = None
    rdma_mtu: int | None = None
    # Membership in etcd: daemons register under leases, and a daemon is up while
    # its lease is (not by heartbeats); None: the embedded heartbeat scheme.
    etcd: EtcdSettings | None = None
    path: Path | None = None
    # The epoch in force (``irdma.cluster.epochs``; None: the static node list places shards).
    epoch: Epoch | None = None
    # The [[nodes]] of the file: where a node's data_dir and arena live (None: ``nodes``).
    configured: tuple[Node, ...] | None = field(default=None, repr=False)
    _by_name: dict[str, Node] = field(init=False, repr=False)
    # Where shards live: over the nodes, or the epoch's members (and target).
    _placement: Placement[Node] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # The frozen dataclass's own way to fill derived fields once.
        by_name = {n.name: n for n in self.nodes}
        object.__setattr__(self, "_by_name", by_name)
        if self.configured is None:
            object.__setattr__(self, "configured", self.nodes)
        if self.epoch is None:
            placement = Placement(self.nodes, self.replicas)
        else:
            placement = Placement(
                tuple(by_name[n] for n in self.epoch.members),
                self.replicas,
                tuple(by_name[n] for n in self.epoch.target or ()),
            )
        object.__setattr__(self, "_placement", placement)

    def following(self, epoch: Epoch) -> ClusterConfig | None:
        """The config of ``epoch``, or None if it is not newer than the one in force:
        its members and target daemons become the nodes, its members place the
        shards. A node of the file keeps its data_dir and arena."""
        if self.epoch is not None and epoch.number <= self.epoch.number:
            return None
        configured = {n.name: n for n in self.configured or ()}
        nodes = []
        for name in epoch.names:
            known = configured.get(name) or self._by_name.get(name)
            address = epoch.address_of(name)
            if address is not None:
                where = Address.parse(address)
            elif known is not None:
                where = known.address
            else:
                raise ConfigError(f"epoch {epoch.number}: no address for member {name!r}")
            if known is not None:
                nodes.append(replace(known, address=where))
            else:
                nodes.append(Node(name, where, Path(f"/var/lib/irdma/{name}"), 0))
        return replace(self, nodes=tuple(nodes), replicas=epoch.replicas, epoch=epoch)

    @property
    def members(self) -> tuple[Node, ...]:
        """The nodes shards are placed on (all nodes, without an epoch)."""
        return self._placement.members

    @property
    def replicated(self) -> bool:
        """Whether daemons run replication (several copies, or members that can change)."""
        return self.replicas > 1 or self.etcd is not None

    def node(self, name: str) -> Node:
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(
                f"{self.path or 'config'}: no node named {name!r} "
                f"(nodes: {', '.join(self._by_name)})"
            ) from None

    def replicas_for(self, key: int, shard: int) -> tuple[Node, ...]:
        """The shard's replicas in preference order (first is the primary)."""
        return self._placement.replicas_for(key, shard)

    def target_replicas_for(self, key: int, shard: int) -> tuple[Node, ...]:
        """The shard's replicas in the target of a move under way (none without one)."""
        return self._placement.target_replicas_for(key, shard)

    def copies_for(self, key: int, shard: int) -> tuple[Node, ...]:
        """Every daemon that keeps a copy of the shard: its replicas, then those that
        gain it in a move under way (updates are forwarded to all of them)."""
        return self._placement.copies_for(key, shard)

    def primary_for(self, key: int, shard: int) -> Node:
        """The shard's preferred primary (the acting one may differ while it is down)."""
        return self.replicas_for(key, shard)[0]

    def holds(self, node: str, key: int, shard: int) -> bool:
        """Whether ``node`` keeps a copy of the shard (now, or in a move under way)."""
        return any(n.name == node for n in self.copies_for(key, shard))

    @property
    def failure_detection(self) -> float:
        """Seconds the cluster may take to take a dead daemon as down: its lease's TTL
        with etcd, else the heartbeats' failure timeout."""
        return float(self.etcd.lease_ttl) if self.etcd is not None else self.failure_timeout

    @property
    def quorum(self) -> int:
        """Daemons (counting oneself) a daemon must reach to accept updates, with replicas."""
        return len(self.nodes) // 2 + 1
