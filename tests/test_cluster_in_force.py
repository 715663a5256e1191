"""The config in force (``irdma.cluster.in_force``): a config is never changed, a newer
epoch replaces the one in force whole, and a config kept by a caller stays one epoch's."""

from __future__ import annotations

import dataclasses

import pytest

from irdma.cluster import ClusterConfig, ConfigInForce, parse_config
from irdma.cluster.epochs import Epoch
from irdma.errors import ConfigError


def three_nodes() -> ClusterConfig:
    return parse_config(
        {
            "replicas": 2,
            "nodes": [
                {"name": f"n{i}", "address": f"tcp://127.0.0.1:{7400 + i}", "arena_size": "1MiB"}
                for i in range(1, 4)
            ],
            "etcd": {"endpoints": ["http://127.0.0.1:2379"]},
        }
    )


def placement(config: ClusterConfig) -> list[tuple[str, ...]]:
    return [tuple(n.name for n in config.replicas_for(7, s)) for s in range(64)]


def test_a_config_cannot_be_changed() -> None:
    config = three_nodes()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.replicas = 3  # type: ignore[misc]


def test_adopting_an_epoch_leaves_the_config_a_caller_kept_whole() -> None:
    """A decision that took the config before an epoch changed keeps reading that
    epoch's nodes and placement; the holder's config is the new epoch's."""
    first = three_nodes()
    in_force = ConfigInForce(first)
    kept = in_force.config
    before = placement(kept)
    joined = Epoch(1, ("n2", "n3", "n4"), 2, addresses=(("n4", "tcp://127.0.0.1:7404"),))
    assert in_force.adopt(joined)
    assert in_force.config is not kept
    assert [n.name for n in in_force.config.nodes] == ["n2", "n3", "n4"]
    assert in_force.config.epoch == joined
    # What was kept is untouched: the file's three nodes, no epoch, the same placement.
    assert kept is first and kept.epoch is None
    assert [n.name for n in kept.nodes] == ["n1", "n2", "n3"]
    assert placement(kept) == before
    assert placement(in_force.config) != before
    assert all("n1" not in p for p in placement(in_force.config))


def test_an_epoch_not_newer_changes_nothing() -> None:
    in_force = ConfigInForce(three_nodes())
    assert in_force.adopt(Epoch(4, ("n1", "n2"), 2))
    now = in_force.config
    assert not in_force.adopt(Epoch(4, ("n1", "n2", "n3"), 2))
    assert not in_force.adopt(Epoch(3, ("n3",), 1))
    assert in_force.config is now
    assert now.following(Epoch(2, ("n1",), 1)) is None


def test_a_node_of_the_file_keeps_its_data_dir_across_epochs() -> None:
    """n1 leaves in epoch 1 and comes back in epoch 2: its data_dir and arena are still
    the file's, though the epoch in between did not name it."""
    file_n1 = three_nodes().node("n1")
    in_force = ConfigInForce(three_nodes())
    assert in_force.adopt(Epoch(1, ("n2", "n3"), 2))
    assert in_force.adopt(Epoch(2, ("n1", "n2", "n3"), 2))
    assert in_force.config.node("n1") == file_n1


def test_an_epoch_naming_an_unknown_daemon_without_an_address_is_refused_whole() -> None:
    in_force = ConfigInForce(three_nodes())
    now = in_force.config
    with pytest.raises(ConfigError, match="no address for member 'n9'"):
        in_force.adopt(Epoch(1, ("n1", "n9"), 2))
    assert in_force.config is now


def test_only_a_config_naming_no_daemons_needs_the_stored_epoch() -> None:
    etcd_only = parse_config({"etcd": {"endpoints": ["http://127.0.0.1:2379"]}})
    in_force = ConfigInForce(etcd_only)
    assert in_force.needs_epoch
    assert in_force.adopt(Epoch(1, ("n1",), 1, addresses=(("n1", "tcp://127.0.0.1:7401"),)))
    assert not in_force.needs_epoch  # its daemons are the epoch's now
    assert not ConfigInForce(three_nodes()).needs_epoch  # a daemon's refusal brings it
