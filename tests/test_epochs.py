"""irdma.epochs: placement by epoch and the moves between epochs (pure, no daemons)."""

from __future__ import annotations

import pytest

from irdma.cluster import load_config, rendezvous_order
from irdma.epochs import Epoch, copies_moved, plan_moves
from irdma.local import write_config

SHARDS = [(key, s) for key in range(1, 401) for s in range(10)]  # 4000 shards


def test_an_epoch_places_shards_as_the_static_config_does(tmp_path) -> None:
    """The same rendezvous rule: a cluster moving to etcd keeps every shard where it is."""
    config = load_config(write_config(tmp_path, 4, replicas=2))
    epoch = Epoch(1, tuple(n.name for n in config.nodes), 2)
    for key, shard in SHARDS[:500]:
        ranked = rendezvous_order(config.nodes, key, shard)[:2]
        assert epoch.replicas_for(key, shard) == tuple(n.name for n in ranked)


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_a_fourth_daemon_gets_a_quarter_of_the_copies_and_nothing_else_moves(
    replicas: int,
) -> None:
    three = Epoch(7, ("n1", "n2", "n3"), replicas)
    four = three.next(["n1", "n2", "n3", "n4"])
    assert four.number == 8
    moves = plan_moves(three, four, SHARDS)
    assert all(m.gaining == ("n4",) and len(m.losing) == 1 for m in moves)
    fraction = copies_moved(moves, len(SHARDS), replicas)
    ideal = 1 / 4
    assert abs(fraction - ideal) <= 0.1 * ideal, fraction
    # A copy moves only to the newcomer, and each shard keeps at least one old copy
    # to copy from (R = 1: the old primary, until the switch).
    for m in moves:
        assert m.sources and m.losing[0] in m.sources


def test_draining_a_daemon_moves_exactly_its_copies() -> None:
    four = Epoch(1, ("n1", "n2", "n3", "n4"), 2)
    three = four.next(["n1", "n2", "n4"])
    moves = plan_moves(four, three, SHARDS)
    held = [s for s in SHARDS if four.holds("n3", *s)]
    assert sorted((m.key, m.shard) for m in moves) == sorted(held)
    assert all(m.losing == ("n3",) and len(m.gaining) == 1 for m in moves)
    assert all("n3" not in three.replicas_for(*s) for s in SHARDS)


def test_fewer_members_than_replicas_places_on_all_of_them() -> None:
    assert Epoch(1, ("n1",), 2).replicas_for(5, 0) == ("n1",)


def test_epochs_round_trip_and_bad_records_are_named() -> None:
    e = Epoch(3, ("a", "b"), 2)
    assert Epoch.from_json(e.to_json()) == e
    for bad in (b"{", b'{"epoch": 1}', b'{"epoch": "1", "members": ["a"], "replicas": 1}'):
        with pytest.raises(ValueError, match="not an epoch record"):
            Epoch.from_json(bad)
    with pytest.raises(ValueError, match="named twice"):
        Epoch(1, ("a", "a"), 1)
    with pytest.raises(ValueError, match="start at 1"):
        Epoch(0, ("a",), 1)
