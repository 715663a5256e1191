"""irdma.cluster.epochs: placement by epoch and the moves between epochs (pure, no daemons)."""

from __future__ import annotations

import pytest

from irdma.cli.local import write_config
from irdma.cluster import load_config, rendezvous_order
from irdma.cluster.epochs import ClusterView, Epoch, copies_moved, next_epoch, plan_moves

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


# -- what comes next (the steward's rule) -----------------------------------------------

ADDR = {f"n{i}": f"tcp://10.0.0.{i}:7401" for i in range(1, 6)}


def three() -> Epoch:
    names = ("n1", "n2", "n3")
    return Epoch(4, names, 2, None, tuple((n, ADDR[n]) for n in names))


def view(registered, **kwargs) -> ClusterView:
    return ClusterView({n: ADDR[n] for n in registered}, **kwargs)


def test_nothing_changes_while_the_members_are_the_registered_daemons() -> None:
    assert next_epoch(three(), view(["n1", "n2", "n3"]), 30) is None
    # A member down for less than replace_after keeps its place (and its shards).
    assert next_epoch(three(), view(["n1", "n2"], absent={"n3": 29.0}), 30) is None


def test_a_registered_daemon_joins_by_a_move_then_a_switch() -> None:
    moving = next_epoch(three(), view(["n1", "n2", "n3", "n4"]), 30)
    assert moving is not None
    assert (moving.number, moving.members, moving.target) == (
        5,
        ("n1", "n2", "n3"),
        ("n1", "n2", "n3", "n4"),
    )
    assert moving.address_of("n4") == ADDR["n4"]
    # Not before every daemon of the target copied for this very epoch.
    partly = view(["n1", "n2", "n3", "n4"], gained={"n1": 5, "n2": 5, "n3": 5, "n4": 4})
    assert next_epoch(moving, partly, 30) is None
    done = view(["n1", "n2", "n3", "n4"], gained=dict.fromkeys(["n1", "n2", "n3", "n4"], 5))
    switched = next_epoch(moving, done, 30)
    assert switched is not None
    assert (switched.number, switched.members, switched.target) == (
        6,
        ("n1", "n2", "n3", "n4"),
        None,
    )


def test_a_drained_or_lost_member_is_moved_off() -> None:
    drained = next_epoch(three(), view(["n1", "n2", "n3"], drained=frozenset({"n2"})), 30)
    assert drained is not None and drained.target == ("n1", "n3")
    lost = next_epoch(three(), view(["n1", "n2"], absent={"n3": 30.0}), 30)
    assert lost is not None and lost.target == ("n1", "n2")
    # The switch leaves the drained daemon's address out of the record.
    gained = dict.fromkeys(["n1", "n3"], drained.number)
    switched = next_epoch(drained, view(["n1", "n2", "n3"], drained=frozenset({"n2"}),
                                        gained=gained), 30)  # fmt: skip
    assert switched is not None and switched.members == ("n1", "n3")
    assert switched.address_of("n2") is None


def test_a_move_is_revised_or_dropped_when_what_is_wanted_changes() -> None:
    moving = next_epoch(three(), view(["n1", "n2", "n3", "n4"]), 30)
    assert moving is not None
    # n5 registers meanwhile: one move to both.
    revised = next_epoch(moving, view(["n1", "n2", "n3", "n4", "n5"]), 30)
    assert revised is not None and revised.target == ("n1", "n2", "n3", "n4", "n5")
    # The joiner died before the switch: back to the members, no target.
    dropped = next_epoch(moving, view(["n1", "n2", "n3"], absent={"n4": 31.0}), 30)
    assert dropped is not None and dropped.target is None
    assert dropped.members == ("n1", "n2", "n3") and dropped.number == moving.number + 1


def test_the_last_members_stay_when_every_one_is_gone() -> None:
    gone = {"n1": 99.0, "n2": 99.0, "n3": 99.0}
    assert next_epoch(three(), view([], absent=gone), 30) is None


def test_a_move_round_trips_through_its_record() -> None:
    moving = next_epoch(three(), view(["n1", "n2", "n3", "n4"]), 30)
    assert moving is not None and Epoch.from_json(moving.to_json()) == moving
