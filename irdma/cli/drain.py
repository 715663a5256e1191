"""``irdma drain NODE``: move every shard off a daemon and take it out of the cluster.

Only for clusters whose membership is in etcd (``[etcd]``). The command
records the request in etcd; the steward daemon starts a move to the member
list without NODE (its copies are made on the others while it still serves),
then switches the epoch. By default the command waits for that and says
what happened; NODE may then be stopped. It stays out while the request
stands: ``irdma drain --cancel NODE`` lets it back in (it joins again).
"""

from __future__ import annotations

import argparse
import sys

import trio

from ..cluster import load_config
from ..cluster.registry import Registry
from ..errors import ConfigError

DESCRIPTION = __doc__.split("\n\n", 1)[1]
POLL = 0.2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node", metavar="NODE", help="the daemon to drain")
    p.add_argument("--cancel", action="store_true", help="withdraw a drain: NODE may join again")
    p.add_argument("--no-wait", action="store_true", help="return once the request is recorded")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if config.etcd is None:
        raise ConfigError(
            f"{config.path}: irdma drain needs membership in etcd ([etcd]); with a static "
            "[[nodes]] list, remove the node from every host's config instead"
        )
    registry = Registry.of(config.etcd, args.timeout or config.timeout)
    return trio.run(_drain, registry, args)


async def _drain(registry: Registry, args: argparse.Namespace) -> int:
    node = args.node
    if args.cancel:
        if await registry.undrain(node):
            print(f"{node}: drain withdrawn; it joins again while it is registered")
        else:
            print(f"{node}: was not being drained")
        return 0
    epoch, _ = await registry.epoch()
    if epoch is None or node not in epoch.names:
        members = ", ".join(epoch.members) if epoch is not None else "none yet"
        print(f"irdma: {node} is not a member of the cluster (members: {members})", file=sys.stderr)
        return 1
    await registry.drain(node)
    print(f"{node}: drain requested at epoch {epoch.number}")
    if args.no_wait:
        return 0
    seen = epoch.number
    while True:
        epoch, _ = await registry.epoch()
        assert epoch is not None
        if epoch.number != seen:
            seen = epoch.number
            if epoch.target is not None:
                print(f"epoch {epoch.number}: copying to {', '.join(epoch.target)}")
            else:
                print(f"epoch {epoch.number}: members {', '.join(epoch.members)}")
        if node not in epoch.names:
            print(f"{node}: drained; it holds no shards and may be stopped")
            return 0
        await trio.sleep(POLL)
