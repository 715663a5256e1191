"""``psd --config FILE --node NAME``: run one parameter-server daemon in the foreground."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

import trio

from irdma import __version__
from irdma.auth import cluster_secret
from irdma.cluster import LOG_LEVELS, ClusterConfig, ConfigInForce, Node, load_config
from irdma.errors import ConfigError

from .arena import Arena
from .lifecycle import Lifecycle, log_level_for
from .metrics_http import start_metrics
from .presence import Presence
from .rdma import RdmaService
from .replication import Replicator
from .server import Server
from .shm import ShmListener
from .snapshot import SnapshotError, load_snapshot, write_snapshot
from .store import Store

log = logging.getLogger("psd")


def build_store(in_force: ConfigInForce, node: Node) -> Store:
    """The node's arena and store; shards are held where the placement in force
    puts them."""
    arena = Arena(node.arena_size, name=f"irdma-arena-{node.name}")

    def owns(key: int, shard: int) -> bool:
        return in_force.config.holds(node.name, key, shard)

    return Store(arena, owns, replicated=in_force.config.replicated)


def restore(store: Store, node: Node) -> None:
    """Load the node's last snapshot; a bad one is set aside and the replicas fill in."""
    try:
        info = load_snapshot(store, node.data_dir)
    except SnapshotError as exc:
        log.error("%s: %s; starting without it (replicas supply the shards)", node.name, exc)
        return
    if info is None:
        log.info("%s: no snapshot in %s; starting empty", node.name, node.data_dir)
    else:
        log.info(
            "%s: loaded snapshot %d (%d tensors, %d shards, %d bytes) from %s",
            node.name,
            info.seq,
            info.tensors,
            info.shards,
            info.nbytes,
            info.path,
        )


async def snapshot(store: Store, node: Node) -> bool:
    try:
        info = await write_snapshot(store, node.data_dir)
    except SnapshotError as exc:
        log.error("%s: snapshot failed, the previous one is kept: %s", node.name, exc)
        return False
    log.info(
        "%s: snapshot %d written (%d shards, %d bytes)",
        node.name,
        info.seq,
        info.shards,
        info.nbytes,
    )
    return True


async def periodic_snapshots(
    config: ClusterConfig, store: Store, node: Node, lifecycle: Lifecycle
) -> None:
    if config.snapshot_interval <= 0:
        return
    while True:
        await trio.sleep(config.snapshot_interval)
        with lifecycle.activity("snapshotting"):
            await snapshot(store, node)


async def run_daemon(
    in_force: ConfigInForce,
    node: Node,
    store: Store,
    lifecycle: Lifecycle | None = None,
    rdma: RdmaService | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then write a final snapshot and stop.

    SIGHUP reloads the log level; ``lifecycle`` tells systemd what happens.
    """
    config = in_force.config  # its settings; the epoch in force is read from ``in_force``
    lifecycle = lifecycle or Lifecycle(node, config)
    replicator = Replicator(in_force, node, store)
    server = Server(in_force, node, store, replicator, rdma)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:
                # systemd stops expecting pings once it is told STOPPING=1, so
                # the watchdog goes with the serving tasks, before the final snapshot.
                nursery.start_soon(lifecycle.watchdog)
                # The unix socket first: once the TCP port answers (which is
                # what clients and tests wait for), shm answers too.
                try:
                    await nursery.start(ShmListener(server).serve)
                except OSError as exc:
                    log.warning("%s: no shm transport for same-host clients: %s", node.name, exc)
                await nursery.start(server.serve)
                await start_metrics(nursery, server)  # when the node has a metrics_address
                await nursery.start(replicator.run)
                if config.etcd is not None:  # up while registered, not by heartbeats
                    nursery.start_soon(Presence(in_force, node, replicator).run)
                nursery.start_soon(periodic_snapshots, config, store, node, lifecycle)
                # Every listener answers now: READY=1 (with replicas, maybe still catching up).
                lifecycle.started(replicator.membership.ready)
                nursery.start_soon(lifecycle.follow, lambda: replicator.membership.ready)
                print(f"psd {node.name} ready on {node.address}", file=sys.stderr, flush=True)
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        lifecycle.reload()
                        continue
                    log.info("%s: %s received, stopping", node.name, signal.Signals(signum).name)
                    lifecycle.stopping()
                    nursery.cancel_scope.cancel()
                    break
            # Serving has stopped, so the image is final.
            with trio.CancelScope(shield=True):
                await snapshot(store, node)
    finally:
        if rdma is not None:
            rdma.close()  # deregisters the arena before it is unmapped
        store.arena.close()
        lifecycle.close()
    log.info("%s stopped", node.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="psd", description=__doc__)
    parser.add_argument("--version", action="version", version=f"psd {__version__}")
    parser.add_argument(
        "--config", help="cluster config (default: $IRDMA_CONFIG or /etc/irdma/cluster.toml)"
    )
    parser.add_argument("--node", required=True, help="this daemon's node name in the config")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        help="DEBUG, INFO, WARNING or ERROR (default: the config's log_level, else INFO; "
        "without this option SIGHUP re-reads log_level from the config)",
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        node = config.node(args.node)
        cluster_secret(config)  # a missing or exposed secret file stops the daemon here
    except ConfigError as exc:
        print(f"psd: {exc}", file=sys.stderr)
        return 2
    # Under systemd the journal stamps each line; run by hand (or by tests that
    # compare daemons' logs), IRDMA_LOG_TIME=1 adds the time.
    stamp = "%(asctime)s " if os.environ.get("IRDMA_LOG_TIME") == "1" else ""
    logging.basicConfig(
        level=log_level_for(args.log_level, config),
        format=f"{stamp}psd[{args.node}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    lifecycle = Lifecycle(node, config, cli_log_level=args.log_level)
    lifecycle.loading()
    try:
        in_force = ConfigInForce(config)
        store = build_store(in_force, node)
        restore(store, node)
    except OSError as exc:
        print(
            f"psd: {node.name}: cannot reserve an arena of {node.arena_size} bytes: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    try:
        rdma = RdmaService.open(config, node, store)
    except ConfigError as exc:
        print(f"psd: {exc}", file=sys.stderr)
        store.arena.close()
        return 1
    status = 0
    try:
        trio.run(run_daemon, in_force, node, store, lifecycle, rdma)
    except* OSError as group:  # binding the address failed
        first = group.exceptions[0]  # not `exc`: that name is unbound after the except above
        reason = getattr(first, "strerror", None) or first
        print(f"psd: {node.name}: cannot serve on {node.address}: {reason}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
