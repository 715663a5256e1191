"""irdma.cluster.registry against a real etcd: members with leases, epochs by compare-and-swap."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from irdma.cluster.epochs import Epoch
from irdma.cluster.etcd import Etcd, EtcdError
from irdma.cluster.registry import MemberRecord, Registry

from .helpers.etcd import EtcdServer, etcd_server

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_server(tmp_path_factory.mktemp("etcd") / "data") as s:
        yield s


def registry(server: EtcdServer, cluster: str) -> Registry:
    return Registry(Etcd([server.endpoint], timeout=3.0), f"/irdma/{cluster}")


def record(name: str) -> MemberRecord:
    return MemberRecord(name, f"tcp://198.18.0.{name[-1]}:7400", 1 << 30)


async def test_members_register_once_per_name_and_leave(server: EtcdServer) -> None:
    reg = registry(server, "members")
    lease = await reg.register(record("n1"), ttl=30)
    await reg.register(record("n2"), ttl=30)
    members, _ = await reg.members()
    assert members == {"n1": record("n1"), "n2": record("n2")}
    with pytest.raises(EtcdError, match="member 'n1' is already registered"):
        await reg.register(record("n1"), ttl=30)
    await reg.leave(lease)
    assert set((await reg.members())[0]) == {"n2"}
    assert (await registry(server, "other").members())[0] == {}  # prefixes are apart


async def test_a_renewed_lease_outlives_its_ttl_and_a_revoked_one_is_noticed(
    server: EtcdServer,
) -> None:
    reg = registry(server, "renew")
    lease = await reg.register(record("n1"), ttl=2)
    lost: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reg.keep_alive, lease, lost.append)
        await trio.sleep(5)  # two and a half TTLs
        assert "n1" in (await reg.members())[0] and lost == []
        await reg.etcd.revoke(lease.id)  # e.g. an operator removed it
        with trio.fail_after(5):
            while not lost:
                await trio.sleep(0.05)
    assert "expired" in lost[0]
    assert (await reg.members())[0] == {}


async def test_a_daemon_cut_off_from_etcd_gives_its_lease_up(tmp_path: Path) -> None:
    """No renewal granted before the deadline (counted from the last renewal sent,
    so never after etcd's own expiry): the daemon takes its lease as lost."""
    with etcd_server(tmp_path / "data") as own:
        reg = Registry(Etcd([own.endpoint], timeout=0.5), "/irdma/cut")
        lease = await reg.register(record("n1"), ttl=2)
        lost: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reg.keep_alive, lease, lost.append)
            await trio.sleep(1)
            assert lost == []
            own.stop()
            with trio.fail_after(10):
                while not lost:
                    await trio.sleep(0.05)
        assert lost == [f"lease {lease.id:x} not renewed within its 2 s"]


async def test_only_one_of_two_proposals_from_the_same_epoch_wins(server: EtcdServer) -> None:
    reg = registry(server, "epochs")
    assert await reg.epoch() == (None, 0)
    first = Epoch(1, ("n1", "n2", "n3"), 2)
    assert await reg.propose(first, 0)
    assert not await reg.propose(Epoch(1, ("n9",), 2), 0)  # created already
    current, rev = await reg.epoch()
    assert current == first
    join, drain = first.next(["n1", "n2", "n3", "n4"]), first.next(["n1", "n2"])
    results = []

    async def propose(epoch: Epoch) -> None:
        results.append((epoch, await reg.propose(epoch, rev)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(propose, join)
        nursery.start_soon(propose, drain)
    assert sorted(ok for _, ok in results) == [False, True]
    winner = next(e for e, ok in results if ok)
    assert (await reg.epoch())[0] == winner


def test_member_records_round_trip_and_bad_ones_are_named() -> None:
    r = MemberRecord("n1", "shm://127.0.0.1:7401", 1 << 20, "127.0.0.1:9401")
    assert MemberRecord.from_json(r.to_json()) == r
    for bad in (b"[", b'{"name": "n1"}', b'{"name": 1, "address": "x", "arena_size": 1}'):
        with pytest.raises(ValueError, match="not a member record"):
            MemberRecord.from_json(bad)
