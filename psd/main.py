"""``psd --config FILE --node NAME``: run one parameter-server daemon in the foreground."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import trio

from irdma.cluster import ClusterConfig, Node, load_config
from irdma.errors import ConfigError

from .arena import Arena
from .server import Server
from .store import Store

log = logging.getLogger("psd")


def build_store(config: ClusterConfig, node: Node) -> Store:
    """The node's arena and store; shards are held where placement puts them."""
    arena = Arena(node.arena_size, name=f"irdma-arena-{node.name}")

    def owns(key: int, shard: int) -> bool:
        return config.primary_for(key, shard).name == node.name

    return Store(arena, owns)


async def run_daemon(config: ClusterConfig, node: Node, store: Store) -> None:
    """Serve until SIGTERM or SIGINT, then stop cleanly."""
    server = Server(config, node, store)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve)
                print(f"psd {node.name} ready on {node.address}", file=sys.stderr, flush=True)
                async for signum in signals:
                    log.info("%s: %s received, stopping", node.name, signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break
    finally:
        store.arena.close()
    log.info("%s stopped", node.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="psd", description=__doc__)
    parser.add_argument(
        "--config", help="cluster config (default: $IRDMA_CONFIG or /etc/irdma/cluster.toml)"
    )
    parser.add_argument("--node", required=True, help="this daemon's node name in the config")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"psd[{args.node}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        config = load_config(args.config)
        node = config.node(args.node)
        if config.replicas > 1:
            raise ConfigError(
                f"{config.path}: replicas: {config.replicas} copies requested, but this "
                "version of psd keeps one copy of each shard (replication is not available "
                "yet); set replicas = 1"
            )
    except ConfigError as exc:
        print(f"psd: {exc}", file=sys.stderr)
        return 2
    try:
        store = build_store(config, node)
    except OSError as exc:
        print(
            f"psd: {node.name}: cannot reserve an arena of {node.arena_size} bytes: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    status = 0
    try:
        trio.run(run_daemon, config, node, store)
    except* OSError as group:  # binding the address failed
        exc = group.exceptions[0]
        reason = getattr(exc, "strerror", None) or exc
        print(f"psd: {node.name}: cannot serve on {node.address}: {reason}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
