"""Model version numbers kept in etcd (``irdma.cluster.version_numbers``), with a real
etcd server: claims etcd decides when the writers reach different copies of a
manifest's name, and a record of the newest commit that outlives the daemons."""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio

from irdma import Client, VersionsWentBack
from irdma.client.manifests import manifest_name, manifests_dir
from irdma.cluster.etcd import Etcd, EtcdError, blocking_post
from irdma.cluster.version_numbers import ModelNumbers, NumbersError, VersionNumbers

from .helpers.cluster import Cluster, make_cluster
from .helpers.etcd import EtcdServer, etcd_server
from .test_cli import irdma

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_server(tmp_path_factory.mktemp("etcd") / "data") as s:
        yield s


def fresh_prefix() -> str:
    return f"/irdma/test-{uuid.uuid4().hex[:8]}"


def start_leased(server: EtcdServer, directory: Path, nodes: int, timeout: float) -> Cluster:
    """Daemons keeping two copies, membership in etcd under a fresh prefix; leases
    (10 s) outlive the tests' pauses, so no pause changes the members."""
    body = f'endpoints = ["{server.endpoint}"]\nprefix = "{fresh_prefix()}"\nlease_ttl = 10'
    return make_cluster(directory, nodes, replicas=2, timeout=timeout, etcd=body)


def numbers_of(cluster: Cluster) -> VersionNumbers:
    settings = cluster.config.etcd
    assert settings is not None
    return VersionNumbers.of(settings, timeout=5.0)


def weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.random(1000, dtype=np.float32), "b": np.full(3, seed, np.int64)}


def test_concurrent_claims_each_get_their_own_number(server: EtcdServer) -> None:
    numbers = VersionNumbers(Etcd([server.endpoint]), fresh_prefix())

    async def main() -> list[int]:
        got: list[int] = []

        async def claim() -> None:
            got.append(await numbers.claim("m", 0))

        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(claim)
        return got

    got = trio.run(main)
    assert sorted(got) == list(range(1, 21))
    # A claim is above what the daemons show, and above every earlier claim.
    assert trio.run(numbers.claim, "m", 57) == 58
    assert trio.run(numbers.claim, "m", 3) == 59


def test_the_committed_record_only_goes_up_and_models_are_listed(server: EtcdServer) -> None:
    numbers = VersionNumbers(Etcd([server.endpoint]), fresh_prefix())

    async def main() -> list[ModelNumbers]:
        assert await numbers.committed("a/committed") == 0
        await numbers.record_commit("a/committed", 5)
        await numbers.record_commit("a/committed", 3)  # a slow writer's older commit
        assert await numbers.committed("a/committed") == 5
        await numbers.claim("a", 0)
        await numbers.claim("a", 0)
        return await numbers.models()

    # Model names with their own "/" parts, even one ending as a key's last part does.
    assert trio.run(main) == [ModelNumbers("a", 2, 0), ModelNumbers("a/committed", 0, 5)]


def test_a_key_holding_no_number_is_named(server: EtcdServer) -> None:
    numbers = VersionNumbers(Etcd([server.endpoint]), fresh_prefix())
    trio.run(numbers.etcd.put, numbers.key("m", "claimed"), b"seven")
    with pytest.raises(NumbersError, match=r"holds 'seven', not a version number"):
        trio.run(numbers.claim, "m", 0)


def test_etcd_decides_a_claim_when_the_writers_reach_different_copies(
    server: EtcdServer, tmp_path: Path
) -> None:
    """Two daemons, each holding a copy of every manifest. Writer B claims while the
    first is paused (its claim reaches only the second); writer A claims while the
    second is paused (A reaches only the first, which never heard of B's claim). The
    daemons alone would give both the same number; etcd gives A the next."""
    cluster = start_leased(server, tmp_path, nodes=2, timeout=1.0)
    first, second = cluster.names
    try:
        a, b = cluster.client(), cluster.client()
        model_a, model_b = a.model("split/policy"), b.model("split/policy")
        assert model_a.commit(weights(1)) == 1
        cluster.signal(first, signal.SIGSTOP)
        draft_b = model_b.draft()
        cluster.signal(second, signal.SIGSTOP)
        cluster.signal(first, signal.SIGCONT)
        # The race: what A's daemons show has no claim of B's number.
        shown = {i.name for i in a.list(manifests_dir("split/policy"))}
        assert manifest_name("split/policy", draft_b.version) not in shown
        assert max(shown) == manifest_name("split/policy", draft_b.version - 1)
        draft_a = model_a.draft()
        cluster.signal(second, signal.SIGCONT)
        assert (draft_b.version, draft_a.version) == (2, 3)
        draft_b.write_many(weights(2))
        draft_a.write_many(weights(3))
        assert draft_b.commit() == 2 and draft_a.commit() == 3
        assert model_b.versions() == [1, 2, 3]
        assert model_b.read(2).arrays["b"][0] == 2 and model_b.read().arrays["b"][0] == 3
        assert trio.run(numbers_of(cluster).models) == [ModelNumbers("split/policy", 3, 3)]
    finally:
        cluster.close()


def test_the_newest_commit_recorded_in_etcd_outlives_the_daemons_memory(
    server: EtcdServer, tmp_path: Path
) -> None:
    """Every daemon restarted without its snapshots: a reader is told the versions went
    back (not shown nothing, or an older one), and the next commit goes on above."""
    cluster = start_leased(server, tmp_path, nodes=3, timeout=5.0)
    try:
        with Client(cluster.config_path) as c:
            model = c.model("lost/policy")
            for s in range(3):
                model.commit(weights(s))
        for node in cluster.config.nodes:
            cluster.stop(node.name)
            shutil.rmtree(node.data_dir)
            node.data_dir.mkdir()
        for name in cluster.names:
            cluster.start(name, wait=False)
        for name in cluster.names:
            cluster.wait_serving(name)
        # irdma status shows it too: etcd's record, and no version on the daemons.
        out = irdma(cluster, "status").stdout.splitlines()
        heading = next(x for x in out if x.startswith("MODEL")).split()
        assert heading == ["MODEL", "LATEST", "ETCD", "OLDEST", "PINNED", "LAG"]
        row = next(x for x in out if x.startswith("lost/policy ")).split()
        assert row == ["lost/policy", "-", "3", "-", "-"]
        with Client(cluster.config_path) as c:
            model = c.model("lost/policy")
            with pytest.raises(VersionsWentBack, match=r"below version 3, etcd recorded"):
                model.latest()
            assert model.commit(weights(9)) == 4
            assert model.latest() == 4 and model.versions() == [4]
    finally:
        cluster.close()


def accepted(listener: socket.socket) -> int:
    """How many connections wait in ``listener``'s backlog (taken, and closed)."""
    listener.setblocking(False)
    n = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


def test_an_etcd_that_does_not_answer_stops_commits_not_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd accepts connections and never answers: a commit fails naming etcd; a
    read goes on with the daemons' view, says so, and the reads after it do not
    wait for etcd again (connections counted)."""
    cluster = make_cluster(tmp_path, 2, replicas=2, timeout=2.0)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    try:
        with Client(cluster.config_path) as c:
            model = c.model("noetcd/policy")
            assert model.commit(weights(1)) == 1
            endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
            etcd = Etcd([endpoint], timeout=0.5, post=blocking_post)
            model.model.numbers = VersionNumbers(etcd, "/irdma/nowhere")
            with pytest.raises(EtcdError, match="no etcd endpoint answered"):
                model.commit(weights(2))
            assert accepted(silent) == 1
            with caplog.at_level(logging.WARNING, logger="irdma.client"):
                assert model.latest() == 1
            assert "etcd's record of versions not read (not asked again" in caplog.text
            assert accepted(silent) == 1
            assert model.latest() == 1 and model.read().arrays["b"][0] == 1
            assert accepted(silent) == 0  # within the quiet time: etcd not asked
    finally:
        silent.close()
        cluster.close()


def test_a_number_claimed_outside_etcd_is_skipped(server: EtcdServer, tmp_path: Path) -> None:
    """A manifest's name claimed on the daemons by a writer not using etcd (a config
    without [etcd]): the etcd writer's create is refused, and it claims the next."""
    cluster = start_leased(server, tmp_path, nodes=2, timeout=5.0)
    try:
        with Client(cluster.config_path) as c:
            model = c.model("mixed/policy")
            assert model.commit(weights(1)) == 1
            numbers = numbers_of(cluster)
            trio.run(numbers.etcd.put, numbers.key("mixed/policy", "claimed"), b"%016d" % 1)
            c.create(manifest_name("mixed/policy", 2), (0,), np.uint8)
            assert model.commit(weights(3)) == 3
            assert trio.run(numbers.models) == [ModelNumbers("mixed/policy", 3, 3)]
    finally:
        cluster.close()
