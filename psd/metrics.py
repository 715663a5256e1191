"""A daemon's Prometheus metrics: request counters kept by the server, gauges read at scrape.

Request metrics (labels ``op``, the lower-case op name, and ``transport``:
tcp, shm or rdma, from the connection that carried the request):

- ``irdma_requests_total``: requests handled.
- ``irdma_request_bytes_total``: payload bytes that came with requests
  (for a STAGED write, the bytes copied from the client's staging memory).
- ``irdma_response_bytes_total``: payload bytes answered (for a MAPPED read,
  the bytes the client copies out of the arena).
- ``irdma_request_duration_seconds``: histogram, from the request's header
  to its answer (a read waiting for a training step counts its wait).
- ``irdma_errors_total`` (labels ``op`` and ``code``, the status name):
  requests answered with an error status.

Headers (112 bytes each way) are not in the byte counts. The counters are
plain integers, updated from the event loop only and turned into
prometheus_client metric families when scraped: prometheus_client's own
``Counter`` takes a lock on every update (about 1 us each, 2 us for a
histogram observation, on a 2-core machine), which the daemon does not need.

Gauges (read from ``state.DaemonState`` at scrape time): see ``StateCollector``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from irdma.protocol import Op, Status

from .state import StateReader

# Seconds: from a same-host round trip (tens of us) to a read waiting a
# whole training step (the daemon answers those within a second or so).
LATENCY_BUCKETS = (
    25e-6,
    50e-6,
    100e-6,
    250e-6,
    500e-6,
    1e-3,
    2.5e-3,
    5e-3,
    10e-3,
    25e-3,
    50e-3,
    100e-3,
    250e-3,
    500e-3,
    1.0,
    2.5,
    5.0,
    10.0,
)
_LE = (*(floatToGoString(b) for b in LATENCY_BUCKETS), "+Inf")
_OP_LABELS = {int(op): op.name.lower() for op in Op}
_UNKNOWN_OP = -1  # every op number the daemon does not know shares one series
_STATUS_LABELS = {int(s): s.name for s in Status}


class OpSeries:
    """The counters of one (op, transport): updated by the server on every request."""

    __slots__ = ("buckets", "labels", "received", "requests", "seconds", "sent")

    def __init__(self, op: str, transport: str) -> None:
        self.labels = (op, transport)
        self.requests = 0
        self.received = 0
        self.sent = 0
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.seconds = 0.0

    def observe(self, seconds: float) -> None:
        """Record one request's latency (a bucket holds values up to its bound)."""
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.seconds += seconds


class RequestMetrics(Collector):
    """The request counters of one daemon, by (op, transport), and errors by (op, code)."""

    def __init__(self) -> None:
        self._series: dict[tuple[int, str], OpSeries] = {}
        self._errors: dict[tuple[str, str], int] = {}

    def series(self, op: int, transport: str) -> OpSeries:
        """The counters for ``op`` (a header's op number) over ``transport``."""
        found = self._series.get((op, transport))
        if found is None:
            if op not in _OP_LABELS:
                op = _UNKNOWN_OP
            found = self._series.get((op, transport))
            if found is None:
                found = OpSeries(_OP_LABELS.get(op, "unknown"), transport)
                self._series[(op, transport)] = found
        return found

    def error(self, op: int, status: int) -> None:
        """Count a request answered with error ``status``."""
        key = (_OP_LABELS.get(op, "unknown"), _STATUS_LABELS.get(int(status), str(int(status))))
        self._errors[key] = self._errors.get(key, 0) + 1

    def collect(self) -> Iterator[Metric]:
        labels = ["op", "transport"]
        requests = CounterMetricFamily("irdma_requests", "Requests handled.", labels=labels)
        received = CounterMetricFamily(
            "irdma_request_bytes", "Payload bytes received with requests.", labels=labels
        )
        sent = CounterMetricFamily(
            "irdma_response_bytes", "Payload bytes sent in answers.", labels=labels
        )
        latency = HistogramMetricFamily(
            "irdma_request_duration_seconds",
            "Seconds from a request's header to its answer.",
            labels=labels,
        )
        for s in sorted(self._series.values(), key=lambda s: s.labels):
            requests.add_metric(s.labels, s.requests)
            received.add_metric(s.labels, s.received)
            sent.add_metric(s.labels, s.sent)
            cumulative, running = [], 0
            for le, n in zip(_LE, s.buckets, strict=True):
                running += n
                cumulative.append((le, running))
            latency.add_metric(s.labels, cumulative, s.seconds)
        errors = CounterMetricFamily(
            "irdma_errors", "Requests answered with an error status.", labels=["op", "code"]
        )
        for key, n in sorted(self._errors.items()):
            errors.add_metric(key, n)
        yield from (requests, received, sent, latency, errors)


class StateCollector(Collector):
    """Gauges of a daemon's state, read when scraped.

    - ``irdma_build_info{node,version,protocol}``: 1.
    - ``irdma_start_time_seconds``: unix time the daemon started.
    - ``irdma_ready``: 1 while it serves clients (0 while catching up);
      ``irdma_quorum``: 1 while it hears from a majority (always 1 with one copy).
    - ``irdma_peer_up{peer}``, ``irdma_peer_ready{peer}``: other daemons as
      this one sees them (with replicas only).
    - ``irdma_arena_capacity_bytes``, ``irdma_arena_used_bytes``.
    - ``irdma_tensors``; ``irdma_shards{role}``: local shards by role
      (``primary``: this daemon is their acting primary; ``backup``).
    - ``irdma_replication_queue_items{peer}``, ``irdma_replication_queue_bytes{peer}``:
      updates and shard copies waiting to be acknowledged by a backup;
      ``irdma_replication_lag_seconds{peer}``: how long the oldest has waited;
      ``irdma_replication_in_flight{peer}``: of those, forwards sent and not answered.
    - ``irdma_snapshot_age_seconds``: seconds of updates in no snapshot
      (since the newest written or loaded, or since start when none);
      ``irdma_snapshot_timestamp_seconds``: unix time of the newest (0: none);
      ``irdma_snapshots_written_total``, ``irdma_snapshot_failures_total``.
    - ``irdma_shard_copies_total{direction}``, ``irdma_shard_copy_bytes_total{direction}``:
      whole shards sent to peers or received from them (``sent``, ``received``):
      catch-up, backups found behind, and moves between epochs.
    - Models (``irdma.manifests``) whose bookkeeping this daemon holds:
      ``irdma_model_version{model}`` (the newest version whose manifest is here),
      ``irdma_model_pins{model}`` and ``irdma_model_oldest_pinned_version{model}``
      (readers holding versions: a ``StateFollower`` pins the one it holds). Over
      the cluster, readers' lag is ``max by (model) (irdma_model_version) -
      min by (model) (irdma_model_oldest_pinned_version > 0)``.
    - With etcd: ``irdma_epoch`` (the epoch number followed), ``irdma_epoch_moving``
      (1 while it names a target: copies under way), ``irdma_epoch_settled``.
    """

    def __init__(self, reader: StateReader) -> None:
        self.reader = reader

    def collect(self) -> Iterator[Metric]:
        st = self.reader.read()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value)

        info = GaugeMetricFamily(
            "irdma_build_info",
            "The daemon's node name, irdma version and protocol version.",
            labels=["node", "version", "protocol"],
        )
        info.add_metric([st.node, st.version, str(st.protocol)], 1)
        yield info
        yield gauge("irdma_start_time_seconds", "Unix time the daemon started.", st.started)
        yield gauge("irdma_ready", "1 while the daemon serves clients.", st.ready)
        yield gauge("irdma_quorum", "1 while the daemon hears from a majority.", st.quorum)
        up = GaugeMetricFamily("irdma_peer_up", "1 while a peer is heard from.", labels=["peer"])
        ready = GaugeMetricFamily(
            "irdma_peer_ready", "1 while a peer is up and caught up.", labels=["peer"]
        )
        items = GaugeMetricFamily(
            "irdma_replication_queue_items",
            "Updates and shard copies queued for a backup, not yet acknowledged.",
            labels=["peer"],
        )
        nbytes = GaugeMetricFamily(
            "irdma_replication_queue_bytes", "Bytes queued for a backup.", labels=["peer"]
        )
        lag = GaugeMetricFamily(
            "irdma_replication_lag_seconds",
            "Seconds the oldest item queued for a backup has waited.",
            labels=["peer"],
        )
        flying = GaugeMetricFamily(
            "irdma_replication_in_flight",
            "Forwards sent to a backup whose answers are not in yet.",
            labels=["peer"],
        )
        resync = GaugeMetricFamily(
            "irdma_replication_resync_owed",
            "1 while this daemon owes a backup a resync (it acknowledged updates without it).",
            labels=["peer"],
        )
        for p in st.peers:
            up.add_metric([p.name], p.state != "down")
            ready.add_metric([p.name], p.state == "ready")
            items.add_metric([p.name], p.queued)
            nbytes.add_metric([p.name], p.queued_bytes)
            lag.add_metric([p.name], p.lag)
            flying.add_metric([p.name], p.in_flight)
            resync.add_metric([p.name], p.resync)
        yield from (up, ready, items, nbytes, lag, flying, resync)
        yield gauge("irdma_arena_capacity_bytes", "Bytes in the arena.", st.arena_capacity)
        yield gauge("irdma_arena_used_bytes", "Arena bytes allocated.", st.arena_used)
        yield gauge("irdma_tensors", "Tensors with metadata or shards here.", st.tensors)
        shards = GaugeMetricFamily("irdma_shards", "Local shards by role.", labels=["role"])
        shards.add_metric(["primary"], st.shards_primary)
        shards.add_metric(["backup"], st.shards_backup)
        yield shards
        copies = CounterMetricFamily(
            "irdma_shard_copies",
            "Whole shards sent to peers or received from them.",
            labels=["direction"],
        )
        copy_bytes = CounterMetricFamily(
            "irdma_shard_copy_bytes",
            "Bytes of whole shards sent to peers or received from them.",
            labels=["direction"],
        )
        copies.add_metric(["sent"], st.copies.sent)
        copies.add_metric(["received"], st.copies.received)
        copy_bytes.add_metric(["sent"], st.copies.sent_bytes)
        copy_bytes.add_metric(["received"], st.copies.received_bytes)
        lent = CounterMetricFamily(
            "irdma_replication_lent_bytes",
            "Bytes of forwarded updates a same-host backup read out of the primary's "
            "arena: lent by this daemon, or borrowed from its primaries.",
            labels=["direction"],
        )
        lent.add_metric(["lent"], st.copies.lent_bytes)
        lent.add_metric(["borrowed"], st.copies.borrowed_bytes)
        yield from (copies, copy_bytes, lent)
        newest = GaugeMetricFamily(
            "irdma_model_version",
            "The newest version of a model whose manifest this daemon holds.",
            labels=["model"],
        )
        pins = GaugeMetricFamily(
            "irdma_model_pins", "Pins on a model's versions held here.", labels=["model"]
        )
        oldest = GaugeMetricFamily(
            "irdma_model_oldest_pinned_version",
            "The oldest version of a model pinned here (0: none).",
            labels=["model"],
        )
        for m in st.models:
            newest.add_metric([m.model], m.newest)
            pins.add_metric([m.model], m.pins)
            oldest.add_metric([m.model], m.oldest_pinned)
        yield from (newest, pins, oldest)
        if st.epoch is not None:
            yield gauge("irdma_epoch", "The cluster epoch this daemon follows.", st.epoch.number)
            yield gauge(
                "irdma_epoch_moving",
                "1 while the epoch names a target member list (copies under way).",
                st.epoch.target is not None,
            )
            yield gauge(
                "irdma_epoch_settled",
                "1 once every registered peer reported this daemon's epoch.",
                st.settled,
            )
        last = st.snapshots.last
        yield gauge(
            "irdma_snapshot_age_seconds",
            "Seconds since the newest snapshot (or since start, when none).",
            st.snapshot_age,
        )
        yield gauge(
            "irdma_snapshot_timestamp_seconds",
            "Unix time the newest snapshot was cut (0: none).",
            last.created if last is not None else 0.0,
        )
        yield CounterMetricFamily(
            "irdma_snapshots_written", "Snapshots written.", value=st.snapshots.written
        )
        yield CounterMetricFamily(
            "irdma_snapshot_failures", "Snapshots that failed.", value=st.snapshots.failed
        )


def daemon_registry(requests: RequestMetrics, state: StateReader) -> CollectorRegistry:
    """A registry of one daemon's metrics (its own: several daemons may share a process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(requests)
    registry.register(StateCollector(state))
    return registry
