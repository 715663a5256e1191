"""The client's choice of replicas (no daemons needed: placement is pure)."""

from __future__ import annotations

from pathlib import Path

from irdma.cli.local import write_config
from irdma.client import AsyncClient
from irdma.protocol import tensor_key


def client_for(tmp_path: Path, nodes: int, replicas: int) -> AsyncClient:
    path = write_config(tmp_path, nodes, replicas=replicas, ports=list(range(7001, 7001 + nodes)))
    return AsyncClient(path)


async def test_reads_of_one_tensor_spread_evenly_over_the_replicas(tmp_path: Path) -> None:
    client = client_for(tmp_path, 4, 2)
    key = tensor_key("m/w")
    load: dict[str, int] = {}
    for shard in range(64):
        first = client.router.candidates(key, shard, False, load)[0]
        assert first in client.config.replicas_for(key, shard)
        load[first.name] = load.get(first.name, 0) + 1
    # Placement alone put 18 of 64 primaries on one daemon in the bench;
    # choosing the less loaded of two copies keeps every daemon near 16.
    assert max(load.values()) <= 64 // 4 + 1, load
    assert sum(load.values()) == 64


async def test_updates_start_at_the_primary_and_follow_a_failover(tmp_path: Path) -> None:
    client = client_for(tmp_path, 3, 2)
    key = tensor_key("m/w")
    replicas = client.config.replicas_for(key, 0)
    assert client.router.candidates(key, 0, True)[0] == replicas[0]
    client.router.primary_hint[replicas[0].name] = replicas[1]  # the backup took over
    assert client.router.candidates(key, 0, True) == [replicas[1], replicas[0]]
