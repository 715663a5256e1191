"""irdma.cluster.placement: which daemons hold a shard (pure, no daemons, no config file)."""

from __future__ import annotations

from dataclasses import dataclass

from irdma.cluster import ClusterConfig, ConfigInForce, parse_config
from irdma.cluster.epochs import Epoch
from irdma.cluster.placement import Placement, rendezvous_order, rendezvous_weight

SHARDS = [(key, shard) for key in range(1, 51) for shard in range(8)]


@dataclass(frozen=True)
class Named:
    """Anything with a name is placed: the config's Node, or a bare name as here."""

    name: str


def names(nodes: tuple[Named, ...] | list[Named]) -> list[str]:
    return [n.name for n in nodes]


def test_replicas_are_the_highest_weights_first() -> None:
    members = tuple(Named(f"n{i}") for i in range(5))
    placement = Placement(members, replicas=3)
    for key, shard in SHARDS:
        got = placement.replicas_for(key, shard)
        weights = sorted((rendezvous_weight(n.name, key, shard) for n in members), reverse=True)
        assert [rendezvous_weight(n.name, key, shard) for n in got] == weights[:3]
        assert names(got) == names(rendezvous_order(members, key, shard)[:3])


def test_asking_twice_gives_the_same_answer() -> None:
    placement = Placement(tuple(Named(f"n{i}") for i in range(4)), replicas=2)
    first = [placement.replicas_for(k, s) for k, s in SHARDS]
    assert [placement.replicas_for(k, s) for k, s in SHARDS] == first


def test_without_a_target_nothing_moves() -> None:
    placement = Placement((Named("a"), Named("b"), Named("c")), replicas=2)
    for key, shard in SHARDS:
        assert placement.target_replicas_for(key, shard) == ()
        assert placement.copies_for(key, shard) == placement.replicas_for(key, shard)


def test_copies_are_the_replicas_then_the_target_daemons_gaining_the_shard() -> None:
    a, b, c, d = (Named(x) for x in "abcd")
    placement = Placement((a, b, c), replicas=2, target=(a, b, c, d))
    gains = 0
    for key, shard in SHARDS:
        now = placement.replicas_for(key, shard)
        then = placement.target_replicas_for(key, shard)
        copies = placement.copies_for(key, shard)
        assert names(then) == names(rendezvous_order((a, b, c, d), key, shard)[:2])
        assert copies[: len(now)] == now
        assert set(copies) == set(now) | set(then) and len(set(copies)) == len(copies)
        gains += d in copies
    assert gains > 0  # the new daemon gains some shards, or the test proves nothing


def test_the_config_and_an_epoch_place_alike() -> None:
    """One rule: a config following an epoch puts each shard where the epoch says."""
    config = parse_config(
        {
            "replicas": 2,
            "nodes": [
                {"name": f"n{i}", "address": f"tcp://127.0.0.1:{7400 + i}", "arena_size": "1MiB"}
                for i in range(1, 5)
            ],
        }
    )
    assert isinstance(config, ClusterConfig)
    epoch = Epoch(1, ("n1", "n2", "n3"), 2, target=("n1", "n2", "n3", "n4"))
    in_force = ConfigInForce(config)
    assert in_force.adopt(epoch)
    config = in_force.config
    for key, shard in SHARDS:
        assert names(config.replicas_for(key, shard)) == list(epoch.replicas_for(key, shard))
        assert names(config.target_replicas_for(key, shard)) == list(
            epoch.target_replicas_for(key, shard)
        )
    # The next epoch replaces the placement whole: n4 is a member, n1 is gone.
    assert in_force.adopt(Epoch(2, ("n2", "n3", "n4"), 2))
    config = in_force.config
    for key, shard in SHARDS:
        assert "n1" not in names(config.copies_for(key, shard))
        assert config.target_replicas_for(key, shard) == ()
