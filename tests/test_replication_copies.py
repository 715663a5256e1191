"""Whose copies a replica takes: forwarded updates and shard copies from the wrong daemon.

A primary that was paused or cut off can come back with updates it queued
before; by then another replica may have taken its shards over. Such
leftovers must be refused (NOT_OWNER) and change nothing. Driven with raw
frames against three real daemons with two copies of every shard.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from irdma.protocol import (
    HEADER_SIZE,
    NO_WORKER,
    Flag,
    Header,
    Op,
    Status,
    encode_json,
    tensor_key,
    unpack_header,
)

from .helpers.cluster import Cluster, make_cluster
from .helpers.wire import recv_exactly

TENSOR = "copies/w"
VALUE = np.arange(4096, dtype=np.float32)  # 16 KiB: one shard


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = make_cluster(tmp_path_factory.mktemp("copies"), 3, replicas=2)
    try:
        with c.client() as client:
            client.write(TENSOR, VALUE)
        yield c
    finally:
        c.close()


def roles(c: Cluster) -> tuple[str, str, str]:
    """Primary and backup of shard 0, and the daemon that holds no copy."""
    primary, backup = (n.name for n in c.config.replicas_for(tensor_key(TENSOR), 0))
    other = next(n for n in c.names if n not in (primary, backup))
    return primary, backup, other


def index(c: Cluster, name: str) -> int:
    return c.names.index(name)


def exchange(c: Cluster, node: str, header: Header, payload: bytes = b"") -> tuple[Header, bytes]:
    a = c.config.node(node).address
    with socket.create_connection((a.host, a.port), timeout=5) as s:
        s.sendall(header.pack() + payload)
        head = recv_exactly(s, HEADER_SIZE)
        reply = unpack_header(head)
        return reply, recv_exactly(s, reply.length)


def copy_on(c: Cluster, node: str) -> tuple[int, bytes]:
    """(version, bytes) of shard 0 as stored on ``node``."""
    header = Header(op=Op.READ, key=tensor_key(TENSOR), shard=0, size=VALUE.nbytes)
    reply, data = exchange(c, node, header)
    assert reply.status == Status.OK, data
    return reply.version, data


def replica_write(c: Cluster, to: str, sender: int, version: int) -> tuple[Header, bytes]:
    junk = np.full_like(VALUE, -1.0).tobytes()
    header = Header(
        op=Op.WRITE,
        key=tensor_key(TENSOR),
        shard=0,
        size=len(junk),
        length=len(junk),
        version=version,
        flags=Flag.REPLICA,
        worker=sender,
    )
    return exchange(c, to, header, junk)


def assert_untouched(c: Cluster, before: dict[str, tuple[int, bytes]]) -> None:
    primary, backup, _ = roles(c)
    for node in (primary, backup):
        assert copy_on(c, node) == before[node], f"the copy on {node} changed"
    assert before[primary][1] == VALUE.tobytes()


def snapshot_copies(c: Cluster) -> dict[str, tuple[int, bytes]]:
    primary, backup, _ = roles(c)
    return {n: copy_on(c, n) for n in (primary, backup)}


def test_a_primary_refuses_updates_forwarded_by_its_backup(replicated: Cluster) -> None:
    c = replicated
    primary, backup, _ = roles(c)
    before = snapshot_copies(c)
    reply, msg = replica_write(c, primary, index(c, backup), before[primary][0] + 1)
    assert reply.status == Status.NOT_OWNER, msg
    assert backup.encode() in msg and b"not" in msg
    assert_untouched(c, before)


def test_a_primary_refuses_a_whole_shard_from_its_backup(replicated: Cluster) -> None:
    c = replicated
    primary, backup, _ = roles(c)
    before = snapshot_copies(c)
    with c.client() as client:
        meta = client.stat(TENSOR).meta
    body = encode_json({"meta": meta.to_dict(), "version": 99, "txns": []})
    junk = np.zeros_like(VALUE).tobytes()
    header = Header(
        op=Op.SYNC,
        key=meta.key,
        shard=0,
        offset=len(body),
        size=len(junk),
        length=len(body) + len(junk),
        version=before[primary][0] + 50,
        worker=index(c, backup),
    )
    reply, msg = exchange(c, primary, header, body + junk)
    assert reply.status == Status.NOT_OWNER, msg
    assert_untouched(c, before)


def test_a_backup_refuses_copies_from_a_daemon_that_is_no_replica(replicated: Cluster) -> None:
    c = replicated
    _, backup, other = roles(c)
    before = snapshot_copies(c)
    reply, msg = replica_write(c, backup, index(c, other), before[backup][0] + 1)
    assert reply.status == Status.NOT_OWNER, msg
    assert b"not a replica" in msg
    reply, msg = replica_write(c, backup, 77, before[backup][0] + 1)
    assert reply.status == Status.BAD_ARGUMENT and b"unknown daemon" in msg
    assert_untouched(c, before)


def test_a_backup_takes_its_primary_forwards_only_in_order(replicated: Cluster) -> None:
    # The sender check lets the real primary through; the version rule then
    # refuses an update that does not sit on the backup's copy.
    c = replicated
    primary, backup, _ = roles(c)
    before = snapshot_copies(c)
    reply, msg = replica_write(c, backup, index(c, primary), before[backup][0] + 5)
    assert reply.status == Status.BEHIND, msg
    assert_untouched(c, before)


def test_a_backup_refuses_the_primary_it_saw_go_down(tmp_path: Path) -> None:
    # The stale-primary case itself: the primary was stopped, so the backup
    # took over; what the old primary still had queued must not land.
    c = make_cluster(tmp_path, 3, replicas=2)
    try:
        with c.client() as client:
            client.write(TENSOR, VALUE)
        primary, backup, _ = roles(c)
        c.kill(primary)
        with c.client() as client:
            client.accumulate(TENSOR, np.ones_like(VALUE))  # the backup serves it now
        version, data = copy_on(c, backup)
        assert np.array_equal(np.frombuffer(data, np.float32), VALUE + 1)
        reply, msg = replica_write(c, backup, index(c, primary), version + 1)
        assert reply.status == Status.NOT_OWNER, msg
        assert copy_on(c, backup) == (version, data)
    finally:
        c.close()


def test_a_retry_a_backup_already_had_reaches_every_copy_before_its_answer(
    tmp_path: Path,
) -> None:
    """The primary forwarded an update to one backup and died before the other had it;
    the client's retry (same txn) reaches the first backup once it has taken over. It
    was applied there already, so it is not applied again, but it is answered only
    once the other copy has it too: that copy could otherwise take over later without
    an update the client saw acknowledged."""
    c = make_cluster(tmp_path, 3, replicas=3)
    try:
        with c.client() as client:
            client.write(TENSOR, VALUE)
        key = tensor_key(TENSOR)
        primary, backup, third = (n.name for n in c.config.replicas_for(key, 0))
        version, _ = copy_on(c, backup)
        ones = np.ones_like(VALUE).tobytes()
        txn = 0x5EED

        def accumulate(flags: int = 0, worker: int = NO_WORKER, at: int = 0) -> Header:
            return Header(op=Op.ACCUMULATE, key=key, shard=0, size=len(ones), length=len(ones),
                          version=at, flags=flags, worker=worker, txn=txn)  # fmt: skip

        # What the primary forwarded before it died: to the backup only.
        forwarded = accumulate(Flag.REPLICA, index(c, primary), version + 1)
        reply, text = exchange(c, backup, forwarded, ones)
        assert reply.status == Status.OK, text
        c.kill(primary)
        deadline = time.monotonic() + 30
        while True:  # NOT_OWNER until the backup sees the primary down
            reply, text = exchange(c, backup, accumulate(), ones)
            if reply.status == Status.OK or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert reply.status == Status.OK, text
        assert reply.version == version + 1  # applied once
        expected = (VALUE + 1).tobytes()
        assert copy_on(c, backup) == (version + 1, expected)
        assert copy_on(c, third) == (version + 1, expected)
    finally:
        c.close()
