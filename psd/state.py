"""One daemon's state at an instant: what HELLO answers and what the metrics gauges show.

Both read the same record, so ``irdma status`` and a Prometheus scrape
never disagree on what a daemon holds. Building it walks every local shard
once (to tell primaries from backups) and every forward queue; it runs on
the event loop, so it is kept to plain loops over what is in memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

from irdma import __version__, manifests
from irdma.cluster.epochs import Epoch
from irdma.protocol import PROTOCOL_VERSION

from .replication import CopyCounts, Replicator
from .snapshot import SnapshotHistory, snapshot_history


@dataclass(frozen=True, slots=True)
class PeerReport:
    """Another daemon as this one sees it, and what waits to be forwarded to it."""

    name: str
    state: str  # "ready", "catching-up" or "down"
    queued: int  # updates and shard copies not yet acknowledged by the peer
    queued_bytes: int
    lag: float  # seconds the oldest of them has waited (0 when none)
    # This daemon acknowledged updates without the peer and owes it a resync
    # (``replication.debts``): its copies may be stale until it has caught up.
    resync: bool = False
    in_flight: int = 0  # of those queued, forwards sent and not answered yet


@dataclass(frozen=True, slots=True)
class DaemonState:
    node: str
    version: str  # the irdma release the daemon runs
    protocol: int
    pid: int
    started: float  # unix time the daemon started
    ready: bool  # serving clients (caught up, with replicas)
    quorum: bool  # hears from a majority (always, with one copy per shard)
    tensors: int
    shards_primary: int  # local shards this daemon is the acting primary of
    shards_backup: int  # the other local shards
    arena_capacity: int
    arena_used: int
    snapshots: SnapshotHistory
    now: float  # unix time the state was read
    peers: tuple[PeerReport, ...]
    # With etcd: the epoch this daemon follows (None: a static node list).
    epoch: Epoch | None = None
    settled: bool = True  # every registered peer reported that epoch (``Membership``)
    copies: CopyCounts = field(default_factory=CopyCounts)
    # The models whose bookkeeping this daemon holds (``irdma.manifests``).
    models: tuple[ModelFigures, ...] = ()

    @property
    def snapshot_age(self) -> float:
        """Seconds of updates not in a snapshot: since the newest one written or loaded,
        or since the daemon started when it has none."""
        last = self.snapshots.last
        since = last.created if last is not None else self.started
        return max(0.0, self.now - since)

    def hello(self) -> dict:
        """The state as HELLO's JSON fields (HELLO adds the protocol limits)."""
        last = self.snapshots.last
        return {
            "node": self.node,
            "version": self.version,
            "protocol": self.protocol,
            "pid": self.pid,
            "started": self.started,
            "ready": self.ready,
            "quorum": self.quorum,
            "tensors": self.tensors,
            "shards": {"primary": self.shards_primary, "backup": self.shards_backup},
            "arena_size": self.arena_capacity,
            "arena_used": self.arena_used,
            "snapshot": None
            if last is None
            else {"created": last.created, "seq": last.seq, "age": self.snapshot_age},
            "replication": {
                p.name: {
                    "queued": p.queued,
                    "bytes": p.queued_bytes,
                    "lag": p.lag,
                    "resync": p.resync,
                    "in_flight": p.in_flight,
                }
                for p in self.peers
            },
            "epoch": None
            if self.epoch is None
            else {
                "number": self.epoch.number,
                "members": list(self.epoch.members),
                "target": list(self.epoch.target) if self.epoch.target is not None else None,
                "settled": self.settled,
            },
            "copies": asdict(self.copies),
            "models": [asdict(m) for m in self.models],
        }


@dataclass(frozen=True, slots=True)
class ModelFigures:
    """What one daemon holds of a model's bookkeeping (``irdma.manifests``)."""

    model: str
    newest: int  # the newest version whose manifest is written here (0: none)
    pins: int  # pins on its versions held here (run-out ones until the next prune)
    oldest_pinned: int  # the oldest version pinned here (0: none)


def model_figures(names: Iterable[tuple[str, int]]) -> list[ModelFigures]:
    """Figures of every model among (tensor name, bytes) of the tensors a daemon holds."""
    newest: dict[str, int] = {}
    pinned: dict[str, list[int]] = {}
    for name, nbytes in names:
        if "/@" not in name:
            continue
        found = manifests.bookkeeping_of(name)
        if found is None:
            continue
        model, kind, version = found
        if kind == manifests.PINS_DIR:
            pinned.setdefault(model, []).append(version)
            newest.setdefault(model, 0)
        elif nbytes:  # a claim is empty until its commit writes it
            newest[model] = max(newest.get(model, 0), version)
    return [
        ModelFigures(m, v, len(pinned.get(m, ())), min(pinned.get(m, ()), default=0))
        for m, v in sorted(newest.items())
    ]


class StateReader:
    """Reads a daemon's state from its replicator (which knows the store and membership)."""

    def __init__(self, replicator: Replicator) -> None:
        self.replicator = replicator
        self.started = time.time()
        self.history = snapshot_history(replicator.node.data_dir)

    def models(self) -> list[ModelFigures]:
        """The models whose bookkeeping this daemon holds (scanned when asked: metrics)."""
        tensors = self.replicator.store.tensors.values()
        return model_figures((t.meta.name, t.meta.nbytes) for t in tensors)

    def read(self) -> DaemonState:
        r = self.replicator
        store, membership = r.store, r.membership
        primary, backup = self._roles()
        now_mono = time.monotonic()
        view = membership.describe()
        peers = tuple(
            PeerReport(
                name,
                view.get(name, "down"),
                *_queue_figures(r, name, now_mono),
                resync=r.forwarding.debts.owes(name),
                in_flight=r.peers[name].in_flight,
            )
            for name in (r.peers if membership.replicated else ())
        )
        return DaemonState(
            node=r.node.name,
            version=__version__,
            protocol=PROTOCOL_VERSION,
            pid=os.getpid(),
            started=self.started,
            ready=membership.ready,
            quorum=membership.has_quorum(),
            tensors=len(store.tensors),
            shards_primary=primary,
            shards_backup=backup,
            arena_capacity=store.arena.capacity,
            arena_used=store.arena.used,
            snapshots=self.history,
            now=time.time(),
            peers=peers,
            epoch=r.in_force.config.epoch,
            settled=membership.settled(),
            copies=replace(r.copies),
            models=tuple(self.models()),
        )

    def _roles(self) -> tuple[int, int]:
        """(primary, backup) counts of the local shards, by the acting primary of each."""
        r = self.replicator
        store, membership, config = r.store, r.membership, r.in_force.config
        total = sum(len(t.shards) for t in store.tensors.values())
        if not membership.replicated:
            return total, 0
        if not membership.ready:
            return 0, total
        me = r.node.name
        now = membership.clock()
        ready = {n.name: membership.peer_ready(n.name, now) for n in config.nodes}
        primary = 0
        for key, tensor in store.tensors.items():
            for index in tensor.shards:
                # The acting primary is the first replica in placement order that is ready.
                for node in config.replicas_for(key, index):
                    if ready[node.name]:
                        primary += node.name == me
                        break
        return primary, total - primary


def _queue_figures(r: Replicator, name: str, now: float) -> tuple[int, int, float]:
    """(items, bytes, age of the oldest) of what is queued for peer ``name``."""
    queue = r.peers[name].queue
    if not queue:
        return 0, 0, 0.0
    nbytes = 0
    for item in queue:
        if item.commit is not None:
            nbytes += item.commit.payload.nbytes
        else:  # a whole shard
            tensor = r.store.tensors.get(item.key)
            shard = tensor.shards.get(item.shard) if tensor is not None else None
            nbytes += shard.nbytes if shard is not None else 0
    return len(queue), nbytes, max(0.0, now - queue[0].queued)
