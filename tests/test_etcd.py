"""irdma.cluster.etcd against a real etcd server (tests/helpers/etcd.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from irdma.cluster.etcd import (
    Compare,
    Delete,
    Etcd,
    EtcdError,
    EtcdUnavailable,
    Put,
    prefix_end,
)

from .helpers.etcd import EtcdServer, etcd_server, free_port

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_server(tmp_path_factory.mktemp("etcd") / "data") as s:
        yield s


@pytest.fixture
def etcd(server: EtcdServer) -> Etcd:
    return Etcd([server.endpoint], timeout=5.0)


def test_prefix_end_covers_exactly_the_prefix() -> None:
    assert prefix_end(b"/irdma/") == b"/irdma0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


async def test_put_get_prefix_delete(etcd: Etcd) -> None:
    rev = await etcd.put(b"/t/kv/a", b"1")
    await etcd.put(b"/t/kv/b", b"\x00\xff binary")
    await etcd.put(b"/t/kvx", b"outside the prefix")
    got = await etcd.get(b"/t/kv/a")
    assert got is not None and got.value == b"1" and got.mod_revision == rev
    kvs, at = await etcd.get_prefix(b"/t/kv/")
    assert [(kv.key, kv.value) for kv in kvs] == [
        (b"/t/kv/a", b"1"),
        (b"/t/kv/b", b"\x00\xff binary"),
    ]
    assert at >= rev + 2
    assert await etcd.delete(b"/t/kv/", prefix=True) == 2
    assert await etcd.get(b"/t/kv/a") is None
    assert (await etcd.get(b"/t/kvx")) is not None


async def test_a_transaction_is_a_compare_and_swap(etcd: Etcd) -> None:
    key = b"/t/cas/epoch"
    create = [Compare(key, "CREATE", "EQUAL", 0)]  # the key does not exist
    ok, _ = await etcd.txn(create, [Put(key, b"1")])
    assert ok
    ok, _ = await etcd.txn(create, [Put(key, b"1 again")])
    assert not ok
    first = await etcd.get(key)
    assert first is not None and first.value == b"1"
    # Move on only from the version read: the second of two racers loses.
    same = [Compare(key, "MOD", "EQUAL", first.mod_revision)]
    assert (await etcd.txn(same, [Put(key, b"2")]))[0]
    assert not (await etcd.txn(same, [Put(key, b"2 from a racer")]))[0]
    ok, _ = await etcd.txn([Compare(key, "VALUE", "EQUAL", b"2")], [Delete(key)])
    assert ok and await etcd.get(key) is None


async def test_a_lease_keeps_its_keys_while_renewed_and_drops_them_after(etcd: Etcd) -> None:
    lease = await etcd.grant(2)
    assert lease.ttl == 2
    await etcd.put(b"/t/lease/member", b"n1", lease=lease.id)
    for _ in range(4):  # 3 s renewed: still there
        await trio.sleep(0.75)
        assert await etcd.keep_alive(lease.id) == 2
    got = await etcd.get(b"/t/lease/member")
    assert got is not None and got.lease == lease.id
    with trio.fail_after(10):  # not renewed: gone within its TTL (and etcd's check)
        while await etcd.get(b"/t/lease/member") is not None:
            await trio.sleep(0.2)
    assert await etcd.keep_alive(lease.id) == 0


async def test_revoking_a_lease_deletes_its_keys_at_once(etcd: Etcd) -> None:
    lease = await etcd.grant(60)
    await etcd.put(b"/t/revoke/member", b"n2", lease=lease.id)
    await etcd.revoke(lease.id)
    assert await etcd.get(b"/t/revoke/member") is None


async def test_a_watch_sees_every_change_under_its_prefix_in_order(etcd: Etcd) -> None:
    _, rev = await etcd.get_prefix(b"/t/watch/")
    seen = []
    async with etcd.watch(b"/t/watch/", rev + 1) as changes:
        await etcd.put(b"/t/watch/a", b"1")
        await etcd.put(b"/t/other", b"not watched")
        await etcd.put(b"/t/watch/a", b"2")
        await etcd.delete(b"/t/watch/a")
        with trio.fail_after(10):
            async for events in changes:
                seen += [(e.kind, e.kv.key, e.kv.value) for e in events]
                if len(seen) == 3:
                    break
    assert seen == [
        ("put", b"/t/watch/a", b"1"),
        ("put", b"/t/watch/a", b"2"),
        ("delete", b"/t/watch/a", b""),
    ]


async def test_a_watch_replays_history_from_its_start_revision(etcd: Etcd) -> None:
    first = await etcd.put(b"/t/replay/a", b"1")
    await etcd.put(b"/t/replay/b", b"2")
    async with etcd.watch(b"/t/replay/", first) as changes:
        seen = []
        with trio.fail_after(10):
            async for events in changes:
                seen += [e.kv.key for e in events]
                if len(seen) == 2:
                    break
    assert seen == [b"/t/replay/a", b"/t/replay/b"]


async def test_a_watch_from_compacted_history_says_so(etcd: Etcd) -> None:
    old = await etcd.put(b"/t/compact/a", b"1")
    now = await etcd.put(b"/t/compact/a", b"2")
    await etcd.call("/v3/kv/compaction", {"revision": str(now), "physical": True})
    with pytest.raises(EtcdError, match="compacted"):
        async with etcd.watch(b"/t/compact/", old) as changes:
            with trio.fail_after(10):
                async for _ in changes:
                    pass


async def test_a_dead_endpoint_is_skipped_and_none_answering_is_named(
    server: EtcdServer,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    etcd = Etcd([dead, server.endpoint], timeout=2.0)
    await etcd.put(b"/t/failover", b"ok")
    assert (await etcd.get(b"/t/failover")).value == b"ok"
    with pytest.raises(EtcdUnavailable, match=r"no etcd endpoint answered /v3/kv/range: 127"):
        await Etcd([dead], timeout=2.0).get(b"/t/failover")


async def test_a_stopped_server_ends_a_watch_with_unavailable(tmp_path: Path) -> None:
    with etcd_server(tmp_path / "data") as own:
        etcd = Etcd([own.endpoint], timeout=2.0)
        _, rev = await etcd.get_prefix(b"/t/")
        with pytest.raises(EtcdUnavailable):
            async with etcd.watch(b"/t/", rev + 1) as changes:
                own.stop()
                with trio.fail_after(10):
                    async for _ in changes:
                        pass


def test_endpoints_must_be_http_urls() -> None:
    with pytest.raises(ValueError, match="expected http://host:port"):
        Etcd(["https://secure:2379"])
    with pytest.raises(ValueError, match="at least one endpoint"):
        Etcd([])
    assert Etcd(["10.0.0.1:2379"]).endpoints == [("10.0.0.1", 2379)]
