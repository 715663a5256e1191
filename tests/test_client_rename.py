"""``rename`` against three real daemons: a metadata step, not a copy; readers of
either name see one tensor whole; names freed by a rename can be used again."""

from __future__ import annotations

import numpy as np
import pytest

from irdma import Client, DaemonUnavailable, TensorExists, TensorNotFound
from irdma.protocol import tensor_key

from .helpers.cluster import Cluster, name_on
from .helpers.whole_reads import WholeReads

TRANSPORTS = ["tcp", "shm"]
N = 300_000  # float32: 19 shards of 64 KiB over the three daemons


def arena_used(c: Client) -> int:
    return sum(c.hello(n)["arena_used"] for n in c.config.nodes)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_rename_moves_no_bytes(cluster: Cluster, transport: str) -> None:
    with Client(cluster.config_path, transport=transport) as c:
        x = np.random.default_rng(1).random(N, dtype=np.float32)
        c.write(f"ren/{transport}/a", x)
        before = c.stat(f"ren/{transport}/a")
        used = arena_used(c)
        info = c.rename(f"ren/{transport}/a", f"ren/{transport}/b")
        # The same tensor under the new name: created when it was, each shard one
        # version on (a copy would be a new tensor, each shard written once).
        assert info.ctime == before.ctime
        assert info.version == before.version + before.num_shards
        assert info.place == tensor_key(f"ren/{transport}/a")
        assert arena_used(c) == used
        assert np.array_equal(c.read(f"ren/{transport}/b"), x)
        with pytest.raises(TensorNotFound):
            c.stat(f"ren/{transport}/a")
        assert [i.name for i in c.list(f"ren/{transport}/")] == [f"ren/{transport}/b"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_reader_holding_the_old_name_is_told_it_is_gone(cluster: Cluster, transport: str) -> None:
    name = f"ren-held/{transport}"
    with (
        Client(cluster.config_path, transport=transport) as reader,
        Client(cluster.config_path, transport=transport) as renamer,
    ):
        x = np.arange(N, dtype=np.float32)
        small = np.arange(10, dtype=np.float32)
        renamer.write(f"{name}/big", x)
        renamer.write(f"{name}/small", small)
        # The reader knows both layouts (and, over shm, where their shards are).
        assert np.array_equal(reader.read(f"{name}/big"), x)
        assert np.array_equal(reader.read(f"{name}/small"), small)
        renamer.rename(f"{name}/big", f"{name}/big2")
        renamer.rename(f"{name}/small", f"{name}/small2")
        for old in ("big", "small"):
            with pytest.raises(TensorNotFound):
                reader.read(f"{name}/{old}")
        assert np.array_equal(reader.read(f"{name}/big2"), x)
        assert np.array_equal(reader.read(f"{name}/small2"), small)


def test_rename_over_an_existing_tensor_needs_replace(client: Client) -> None:
    x, y = np.full(N, 1.0, np.float32), np.full((7, 3), 2.0, np.float64)
    client.write("ren-over/a", x)
    client.write("ren-over/b", y)
    with pytest.raises(TensorExists, match="replace=True"):
        client.rename("ren-over/a", "ren-over/b")
    assert np.array_equal(client.read("ren-over/a"), x)
    assert np.array_equal(client.read("ren-over/b"), y)
    used = arena_used(client)
    info = client.rename("ren-over/a", "ren-over/b", replace=True)
    assert info.shape == (N,) and np.array_equal(client.read("ren-over/b"), x)
    assert [i.name for i in client.list("ren-over/")] == ["ren-over/b"]
    assert arena_used(client) < used  # the replaced tensor's shards are freed


def test_a_name_a_rename_left_takes_a_key_of_its_own(cluster: Cluster, client: Client) -> None:
    x = np.arange(N, dtype=np.float32)
    client.write("ren-again/a", x)
    client.rename("ren-again/a", "ren-again/b")
    # "a"'s own key still places "b": a new "a" is placed by another key.
    y = np.arange(12, dtype=np.int64).reshape(3, 4)
    client.write("ren-again/a", y)
    assert client.stat("ren-again/a").place not in (0, tensor_key("ren-again/a"))
    with Client(cluster.config_path) as other:  # knows nothing cached
        assert np.array_equal(other.read("ren-again/a"), y)
        assert np.array_equal(other.read("ren-again/b"), x)
        # Creating "b" finds the renamed one, wherever it is placed.
        assert other.create("ren-again/b", N, np.float32, exist_ok=True).place == (
            tensor_key("ren-again/a")
        )
        with pytest.raises(TensorExists):
            other.create("ren-again/b", N, np.float32)
        other.create("ren-again/b", 5, np.float32, replace=True)
        assert np.array_equal(other.read("ren-again/b"), np.zeros(5, np.float32))
    names = [i.name for i in client.list("ren-again/")]
    assert names == ["ren-again/a", "ren-again/b"]
    client.delete("ren-again/b")
    assert np.array_equal(client.read("ren-again/a"), y)
    client.delete("ren-again/a")
    assert client.list("ren-again/") == []
    # Both keys free again: an "a" is placed by its own key once more.
    client.write("ren-again/a", x)
    assert client.stat("ren-again/a").place == 0


def test_rename_of_what_does_not_exist_says_so(client: Client) -> None:
    with pytest.raises(TensorNotFound, match="ren-none/a"):
        client.rename("ren-none/a", "ren-none/b")
    client.write("ren-none/c", np.ones(3))
    assert client.rename("ren-none/c", "ren-none/c").name == "ren-none/c"
    with pytest.raises(ValueError):
        client.rename("ren-none/c", "bad//name")
    assert np.array_equal(client.read("ren-none/c"), np.ones(3))


def test_readers_of_a_target_renamed_over_again_and_again_never_see_a_mix(
    cluster: Cluster,
) -> None:
    """Write-then-rename saves of a 19-shard tensor while another client reads the
    target: every read is one save whole (each save is one value throughout)."""
    saves = 30
    with Client(cluster.config_path) as writer:
        writer.write("ren-race/target", np.zeros(N, np.float32))
        with WholeReads(cluster.config_path, "ren-race/target") as reads:
            for k in range(1, saves + 1):
                writer.write("ren-race/tmp", np.full(N, k, np.float32))
                writer.rename("ren-race/tmp", "ren-race/target", replace=True)
    assert not reads.failures, reads.failures[:3]
    # The race happened: reads met several saves.
    assert len(set(reads.seen)) >= 3, sorted(set(reads.seen))


def test_a_lookup_everywhere_finds_renamed_tensors_and_says_when_it_cannot_know(
    fresh_cluster: Cluster,
) -> None:
    c = fresh_cluster
    with Client(c.config_path) as client:
        client.write("look/a", np.arange(N, dtype=np.float32))
        client.rename("look/a", "look/b")
        with Client(c.config_path) as other:
            info = other.stat("look/b", everywhere=True)
            assert info.place == tensor_key("look/a") and info.num_shards == 19
            assert info.version == client.stat("look/b").version  # every holder's shards
            with pytest.raises(TensorNotFound):
                other.stat("look/a", everywhere=True)
        # One copy of each shard: a name whose own place is on a stopped daemon
        # may be there (unavailable); one placed elsewhere is not found.
        down = c.names[0]
        c.stop(down)
        there = name_on(c.config, down, "look/missing-on-")
        elsewhere = name_on(c.config, c.names[1], "look/missing-on-")
        with Client(c.config_path) as other:
            with pytest.raises(DaemonUnavailable):
                other.stat(there, everywhere=True)
            with pytest.raises(TensorNotFound):
                other.stat(elsewhere, everywhere=True)


def test_a_rename_some_daemons_missed_is_finished_by_renaming_again(
    fresh_cluster: Cluster,
) -> None:
    """One copy per shard: a rename while a daemon holding shards is stopped fails
    naming it, and renaming again once it is back finishes the job."""
    c = fresh_cluster
    x = np.arange(N, dtype=np.float32)
    with Client(c.config_path) as client:
        client.write("half/a", x)
        # Down: a daemon holding shards, but where neither name's own key places
        # shard 0 (so the lookups answer and the rename reaches the others).
        homes = {c.config.primary_for(tensor_key(n), 0).name for n in ("half/a", "half/b")}
        down = next(n for n in c.names if n not in homes)
        c.stop(down)
        with pytest.raises(DaemonUnavailable, match=down):
            client.rename("half/a", "half/b")
        c.start(down)
        client.rename("half/a", "half/b")
        assert np.array_equal(client.read("half/b"), x)
        with pytest.raises(TensorNotFound):
            client.stat("half/a")
        assert [i.name for i in client.list("half/")] == ["half/b"]
