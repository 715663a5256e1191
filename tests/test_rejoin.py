"""What a daemon that comes back does with the copies it kept (docs/semantics.md, Rejoin):
real daemons with two copies of every shard, stopped (SIGTERM: a snapshot) and started.

- a shard deleted while a daemon was down is dropped when it rejoins (its primary
  remembers the delete), and one its primary lost (restarted empty) is given back to
  it, never dropped;
- after a whole-cluster stop, copies at different versions: the highest wins, and a
  daemon that starts alone waits for the other replica rather than guess.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from irdma import Client
from irdma.errors import TensorNotFound
from irdma.protocol import decode_json, tensor_key
from irdma.protocol.messages import ListTensors, Read

from .helpers.cluster import Cluster, make_cluster
from .helpers.wire import hello
from .test_promises import Raw

N = 4096  # float32: 16 KiB, one shard


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = make_cluster(tmp_path, 3, replicas=2, timeout=2.0)
    try:
        yield c
    finally:
        c.close()


def held(c: Cluster, node: str, prefix: str) -> list[str]:
    """Names of the tensors ``node`` holds shards of (LIST on that daemon alone)."""
    raw = Raw(c, node)
    try:
        body = prefix.encode()
        reply, data = raw.ask(ListTensors().frame(len(body)), body)
    finally:
        raw.close()
    assert reply.status == 0, data
    return [t["meta"]["name"] for t in decode_json(data)]


def replicas(c: Cluster, name: str) -> tuple[str, str, str]:
    primary, backup = (n.name for n in c.config.replicas_for(tensor_key(name), 0))
    other = next(n for n in c.names if n not in (primary, backup))
    return primary, backup, other


def test_a_shard_deleted_while_a_daemon_was_down_is_dropped_when_it_rejoins(
    cluster: Cluster,
) -> None:
    c = cluster
    name = "rejoin/deleted"
    _, backup, _ = replicas(c, name)
    with Client(c.config_path) as client:
        client.write(name, np.ones(N, np.float32))
        client.write("rejoin/kept", np.ones(N, np.float32))
        assert name in held(c, backup, "rejoin/")
        c.stop(backup)  # its snapshot holds the tensor
        client.delete(name)
        c.start(backup)  # back, and caught up (HELLO says ready)
        assert name not in held(c, backup, "rejoin/")
        with pytest.raises(TensorNotFound):
            client.read(name)
    kept_on = {n.name for n in c.config.replicas_for(tensor_key("rejoin/kept"), 0)}
    if backup in kept_on:
        assert "rejoin/kept" in held(c, backup, "rejoin/")  # what was not deleted stays


def test_a_shard_its_primary_lost_is_given_back_not_dropped(cluster: Cluster) -> None:
    """The systemd guest's data loss, second step: a primary that came back empty and
    served (its other copy was away) answered a rejoining replica without the shard,
    and the replica dropped the only copy left, taking the primary's silence for a
    delete. Now only a delete the primary remembers drops a copy; a copy the primary
    lacks is given to it."""
    c = cluster
    name = "rejoin/lost"
    primary, backup, _ = replicas(c, name)
    data = np.arange(N, dtype=np.float32)
    with Client(c.config_path) as client:
        client.write(name, data)
        c.stop(backup)  # its snapshot holds the tensor
        c.kill(primary)  # no snapshot: it comes back empty
        (c.config.node(primary).data_dir / "snapshot.irdma").unlink(missing_ok=True)
        c.start(primary)  # caught up from the daemons it hears: nobody holds the tensor
        assert name not in held(c, primary, "rejoin/")
        c.start(backup)
        assert name in held(c, backup, "rejoin/"), c.log(backup)
        assert name in held(c, primary, "rejoin/"), c.log(backup)
        assert "had lost" in c.log(backup)
        assert np.array_equal(client.read(name), data)


def test_after_a_whole_cluster_stop_the_highest_version_wins(cluster: Cluster) -> None:
    c = cluster
    name = "rejoin/versions"
    primary, backup, other = replicas(c, name)
    with Client(c.config_path) as client:
        client.write(name, np.zeros(N, np.float32))
        c.stop(backup)  # its copy: version 1
        client.accumulate(name, np.ones(N, np.float32))  # the primary's: version 2
    for node in (primary, other):
        c.stop(node)
    # The stale copy's daemon starts first and alone: it must not serve its copy
    # as current while the other replica has not answered.
    c.start(backup, wait=False)
    c.wait_ready(backup)  # listening
    for _ in range(20):
        assert not hello(c.config, backup)["ready"], "served a copy it could not know is current"
        time.sleep(0.1)
    c.start(primary, wait=False)
    c.start(other, wait=False)
    for node in c.names:
        c.wait_serving(node)
    with Client(c.config_path) as client:
        assert np.array_equal(client.read(name), np.ones(N, np.float32))
    for node in (primary, backup):
        raw = Raw(c, node)
        try:
            reply, data = raw.ask(Read(tensor_key(name), 0, 0, N * 4).frame())
        finally:
            raw.close()
        assert np.array_equal(np.frombuffer(data, np.float32), np.ones(N)), node
        assert reply.version == 2, (node, reply.version)
