"""Model versions against real daemons (``irdma.client.versions``): many tensors
committed at once, numbers that only go up, versions kept and pruned, several
writers of one version, readers' slices, digests checked."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from irdma import (
    AsyncClient,
    Client,
    DigestMismatch,
    TensorExists,
    VersionGone,
    VersionNotFound,
)
from irdma.client.manifests import manifest_name, stored_name

from .helpers.cluster import Cluster, make_cluster

TRANSPORTS = ["tcp", "shm"]


def state(seed: int, n: int = 3) -> dict[str, np.ndarray]:
    """A small state dict: float32, bf16 and int64 tensors, some spanning shards."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for i in range(n):
        out[f"layer{i}.weight"] = rng.random((64, 300), dtype=np.float32)  # 75 KiB: 2 shards
        out[f"layer{i}.bias"] = rng.random(300, dtype=np.float32).astype(ml_dtypes.bfloat16)
    out["step"] = np.array([seed], dtype=np.int64)
    return out


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_commit_is_read_back_whole_and_checked(cluster: Cluster, transport: str) -> None:
    with Client(cluster.config_path, transport=transport) as c:
        model = c.model(f"ver/{transport}/whole")
        sd = state(1)
        assert model.commit(sd) == 1
        snap = model.read()
        assert snap.version == 1
        assert same(snap.arrays, sd)
        assert snap.arrays["layer0.bias"].dtype == ml_dtypes.bfloat16
        assert snap.checked == frozenset(sd)
        assert snap.bytes_read == sum(a.nbytes for a in sd.values())
        # Into the reader's own arrays.
        out = {k: np.zeros_like(v) for k, v in sd.items()}
        again = model.read(1, out=out)
        assert all(again.arrays[k] is out[k] for k in sd)
        assert same(out, sd)


def test_versions_number_up_and_readers_choose_one(client: Client) -> None:
    model = client.model("ver/choose")
    with pytest.raises(VersionNotFound, match="no committed version"):
        model.read()
    states = {model.commit(state(s)): state(s) for s in (10, 11, 12)}
    assert sorted(states) == [1, 2, 3] == model.versions()
    assert model.latest() == 3
    assert same(model.read(2).arrays, states[2])
    assert model.read(at_least=3).version == 3
    with pytest.raises(VersionNotFound, match="below 4"):
        model.read(at_least=4)
    with pytest.raises(VersionNotFound, match="not committed"):
        model.read(7)
    only = model.read(names=["step"])
    assert list(only.arrays) == ["step"] and only.arrays["step"][0] == 12
    with pytest.raises(VersionNotFound, match="nope"):
        model.read(names=["nope"])


def test_only_the_last_keep_are_kept_and_a_pruned_one_says_so(client: Client) -> None:
    model = client.model("ver/keep", keep=2)
    for s in range(4):
        model.commit(state(s, n=1))
    assert model.versions() == [3, 4]
    with pytest.raises(VersionGone, match="pruned"):
        model.read(1)
    # Nothing of a pruned version is left behind.
    assert client.list("ver/keep/@1/") == [] and client.list("ver/keep/@2/") == []


def test_a_pinned_version_outlives_keep_until_released(client: Client) -> None:
    model = client.model("ver/pin", keep=1)
    model.commit(state(0, n=1))
    with model.pin(1) as pin:
        assert pin.version == 1
        model.commit(state(1, n=1))
        model.commit(state(2, n=1))
        assert model.versions() == [1, 3]  # 2 was pruned, 1 is pinned
        assert same(model.read(1).arrays, state(0, n=1))
    model.commit(state(3, n=1))
    assert model.versions() == [4]
    with pytest.raises(VersionGone):
        model.pin(1)


def test_a_changed_tensor_fails_its_digest(client: Client) -> None:
    model = client.model("ver/digest")
    model.commit({"w": np.ones(1000, np.float32)})
    x = np.ones(1000, np.float32)
    x[500] = 2
    client.write(stored_name("ver/digest", 1, "w"), x)  # behind the model's back
    with pytest.raises(DigestMismatch, match="'w' of version 1"):
        model.read()
    assert model.read(check=False).arrays["w"][500] == 2


def test_several_writers_commit_one_version_together(client: Client) -> None:
    model = client.model("ver/parts")
    first = model.draft()
    first.write("a", np.full(100, 1.0, np.float32))
    second = model.join(first.version)
    second.write("b", np.full(100, 2.0, np.float32))
    third = model.join(first.version)
    third.write("c", np.full(100, 3.0, np.float32))
    second.finish()
    # One writer has not finished: the commit waits, then gives up; nothing is visible.
    with pytest.raises(TimeoutError, match="2 of 3 writers"):
        first.commit(parts=3, patience=0.2)
    with pytest.raises(VersionNotFound):
        model.read()
    third.finish()
    assert first.commit(parts=3) == 1
    snap = model.read()
    assert {k: float(v[0]) for k, v in snap.arrays.items()} == {"a": 1, "b": 2, "c": 3}
    assert client.list("ver/parts/@parts/") == []


def test_two_writers_of_one_tensor_in_a_version_are_refused(client: Client) -> None:
    model = client.model("ver/clash")
    first = model.draft()
    first.write("a", np.zeros(4, np.float32))
    other = model.join(first.version)
    other.write("a", np.ones(4, np.float32))
    other.finish()
    with pytest.raises(ValueError, match="'a' written by two writers"):
        first.commit(parts=2)


def test_writers_racing_for_numbers_each_get_their_own(cluster: Cluster) -> None:
    """Four writers commit at once, each from its own client: every commit gets a
    distinct number, and every one is kept and read back as its writer wrote it."""
    results: dict[int, int] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def writer(seed: int) -> None:
        try:
            with Client(cluster.config_path) as c:
                model = c.model("ver/race", keep=16)
                start.wait()
                for k in range(3):
                    results[model.commit({"x": np.full(10, seed * 10 + k, np.int64)})] = (
                        seed * 10 + k
                    )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(results) == list(range(1, 13))
    with Client(cluster.config_path) as c:
        model = c.model("ver/race", keep=16)
        for v, value in results.items():
            assert int(model.read(v).arrays["x"][0]) == value


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_read_holding_a_version_meets_newer_commits_and_stays_whole(
    cluster: Cluster, transport: str
) -> None:
    """The interleaving made to happen: a reader has chosen version 1 (its
    manifest read) when two more versions are committed over every tensor;
    its read still returns version 1 whole."""

    async def main() -> None:
        async with AsyncClient(cluster.config_path, transport=transport) as c:
            model = c.model(f"ver/{transport}/held", keep=3)
            await model.commit({f"t{i}": np.full(5000, 1.0, np.float32) for i in range(8)})
            chosen = await model.pick()
            await model.commit({f"t{i}": np.full(5000, 2.0, np.float32) for i in range(8)})
            await model.commit({f"t{i}": np.full(5000, 3.0, np.float32) for i in range(8)})
            assert await model.latest() == 3
            snap = await model.read(chosen.version)
            assert {float(a[0]) for a in snap.arrays.values()} == {1.0}
            assert all((a == 1.0).all() for a in snap.arrays.values())

    trio.run(main)


WRITER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from irdma import Client

    c = Client(sys.argv[1])
    model = c.model("ver/died")
    draft = model.draft()
    for i in range(20):
        draft.write(f"t{i}", np.full(1000, 2.0, np.float32))
        if i == 9:
            print("half", draft.version, flush=True)
    time.sleep(60)
    """
)


def test_a_writer_killed_mid_commit_leaves_the_previous_version_whole(
    cluster: Cluster, tmp_path: Path
) -> None:
    with Client(cluster.config_path) as c:
        model = c.model("ver/died")
        model.commit({f"t{i}": np.full(1000, 1.0, np.float32) for i in range(20)})
        script = tmp_path / "writer.py"
        script.write_text(WRITER)
        proc = subprocess.Popen(
            [sys.executable, str(script), str(cluster.config_path)], stdout=subprocess.PIPE
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().decode().split()
            assert line[:2] == ["half", "2"]
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        # Version 2 was claimed, half written, never committed.
        assert c.stat(manifest_name("ver/died", 2)).nbytes == 0
        assert c.list("ver/died/@2/")
        snap = model.read()
        assert snap.version == 1 and all((a == 1.0).all() for a in snap.arrays.values())
        with pytest.raises(VersionNotFound, match="not committed"):
            model.read(2)
        # The next commit takes a number above the dead one's: numbers never go back.
        assert model.commit({"t0": np.zeros(3, np.float32)}) == 3
        assert model.versions() == [1, 3]


def test_readers_never_see_two_versions_in_one_read(cluster: Cluster) -> None:
    """A writer commits versions of 60 tensors as fast as it can while readers over
    tcp and shm read the latest: each read is one version whole, and the
    readers saw many versions (the race happened)."""
    stop = threading.Event()
    seen: dict[str, Counter[int]] = {t: Counter() for t in TRANSPORTS}
    errors: list[BaseException] = []
    names = [f"block{i}.w" for i in range(60)]

    def writer() -> None:
        try:
            with Client(cluster.config_path) as c:
                model = c.model("ver/race-read", keep=3)
                for v in range(1, 26):
                    model.commit({n: np.full(2000, v, np.float32) for n in names})
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    def reader(transport: str) -> None:
        try:
            with Client(cluster.config_path, transport=transport) as c:
                model = c.model("ver/race-read", keep=3)
                while not stop.is_set():
                    try:
                        snap = model.read()
                    except VersionNotFound:
                        continue  # nothing committed yet
                    values = {float(a[0]) for a in snap.arrays.values()}
                    assert values == {float(snap.version)}, (snap.version, sorted(values))
                    assert all((a == snap.version).all() for a in snap.arrays.values())
                    assert set(snap.arrays) == set(names)
                    seen[transport][snap.version] += 1
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=reader, args=(t,)) for t in TRANSPORTS
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors, errors
    for transport in TRANSPORTS:
        assert len(seen[transport]) >= 3, (transport, seen[transport])


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_readers_slices_are_bit_exact_and_move_only_their_bytes(
    client: Client, data: st.DataObject
) -> None:
    rows = data.draw(st.integers(1, 70))
    cols = data.draw(st.integers(1, 300))
    dtype = data.draw(st.sampled_from([np.float32, ml_dtypes.bfloat16, np.int8]))
    x = (np.arange(rows * cols) % 251).astype(dtype).reshape(rows, cols)
    r0 = data.draw(st.integers(0, rows))
    r1 = data.draw(st.integers(r0, rows))
    c0 = data.draw(st.integers(0, cols))
    c1 = data.draw(st.integers(c0, cols))
    model = client.model("ver/slices", keep=1)
    v = model.commit({"w": x})
    index = (slice(r0, r1), slice(c0, c1))
    snap = model.read(v, slices={"w": index})
    want = x[index]
    assert snap.arrays["w"].tobytes() == want.tobytes() and snap.arrays["w"].shape == want.shape
    assert snap.bytes_read == want.nbytes
    assert snap.checked == frozenset()
    # Into an array of the slice's shape; a wrong one is refused by name.
    out = np.empty(want.shape, want.dtype)
    model.read(v, slices={"w": index}, out={"w": out})
    assert out.tobytes() == want.tobytes()
    if want.size:
        with pytest.raises(ValueError, match="out for 'w'"):
            model.read(v, slices={"w": index}, out={"w": np.empty(want.size + 1, want.dtype)})


def test_versions_go_on_across_a_failover_and_a_whole_cluster_restart(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, replicas=2, timeout=2.0)
    try:
        with Client(cluster.config_path) as c:
            model = c.model("ver/durable")
            for s in range(3):
                model.commit(state(s, n=1))
            # Kill the primary of the newest manifest: its backup answers.
            key = c.stat(manifest_name("ver/durable", 3)).meta.key
            primary = c.config.primary_for(key, 0).name
            cluster.kill(primary)
            assert model.latest() == 3
            assert same(model.read().arrays, state(2, n=1))
            assert model.commit(state(3, n=1)) == 4
            cluster.start(primary)
        # Every daemon stopped (each writes its snapshot), then started again.
        for name in cluster.names:
            cluster.stop(name)
        for name in cluster.names:
            cluster.start(name, wait=False)
        for name in cluster.names:
            cluster.wait_serving(name)
        with Client(cluster.config_path) as c:
            model = c.model("ver/durable")
            assert model.versions() == [1, 2, 3, 4]
            assert same(model.read().arrays, state(3, n=1))
            assert model.commit(state(4, n=1)) == 5
    finally:
        cluster.close()


def test_a_claim_lost_to_another_writer_is_retried_at_the_next_number(client: Client) -> None:
    model = client.model("ver/claimed")
    # Another writer holds the next number's claim already.
    client.create(manifest_name("ver/claimed", 1), (0,), np.uint8)
    assert model.commit({"x": np.zeros(2, np.float32)}) == 2
    with pytest.raises(TensorExists):
        client.create(manifest_name("ver/claimed", 2), (0,), np.uint8)


def changed_copy(x: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """``x`` with about ``fraction`` of its elements changed (as an RL step's bf16
    weights: most bit-identical)."""
    rng = np.random.default_rng(seed)
    y = x.copy()
    flat = y.reshape(-1)
    picks = rng.random(flat.size) < fraction
    flat[picks] = (flat[picks].astype(np.float32) + 1).astype(x.dtype)
    return y


def test_versions_of_one_tensor_share_their_daemons(cluster: Cluster) -> None:
    from irdma.protocol import tensor_key

    config = cluster.config
    for shard in range(8):
        homes = {config.replicas_for(tensor_key(f"p/@{v}/w"), shard) for v in (1, 2, 77, 70000)}
        assert len(homes) == 1
    # Another tensor's versions are placed on their own.
    spread = {config.replicas_for(tensor_key(f"p/@1/w{i}"), 0) for i in range(30)}
    assert len(spread) > 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_pull_moves_only_what_changed_and_ends_bit_exact(
    cluster: Cluster, transport: str
) -> None:
    with Client(cluster.config_path, transport=transport) as c:
        model = c.model(f"ver/{transport}/pull", keep=8)
        rng = np.random.default_rng(5)
        w = rng.random((200, 300), dtype=np.float32).astype(ml_dtypes.bfloat16)  # 4 shards
        b = rng.random(5000, dtype=np.float32)
        model.commit({"w": w, "b": b})
        have = model.read()
        w2 = changed_copy(w, 0.01, 1)
        changed = int((w2.view(np.uint16) != w.view(np.uint16)).sum())
        model.commit({"w": w2, "b": b})
        held = have.arrays["w"]
        snap = model.pull(have)
        assert snap.version == 2 and snap.arrays["w"] is held
        assert snap.arrays["w"].tobytes() == w2.tobytes()
        assert snap.checked == {"w", "b"}
        # Only the changed elements and their indices moved; "b" did not change.
        assert changed * 2 <= snap.bytes_read <= changed * (2 + 4) + 4 * 16
        # Three versions behind: the changes of all three, once each.
        states = [w2]
        for seed in (2, 3, 4):
            states.append(changed_copy(states[-1], 0.01, seed))
            model.commit({"w": states[-1], "b": b})
        union = int((states[-1].view(np.uint16) != w2.view(np.uint16)).sum())
        snap = model.pull(snap)
        assert snap.version == 5 and snap.arrays["w"].tobytes() == states[-1].tobytes()
        assert union * 2 <= snap.bytes_read <= union * 6 + 4 * 16
        # Nothing new: nothing moves.
        assert model.pull(snap).bytes_read == 0


def test_a_pull_from_a_pruned_version_reads_whole(client: Client) -> None:
    model = client.model("ver/pull-pruned", keep=1)
    x = np.arange(40000, dtype=np.float32)
    model.commit({"x": x})
    have = model.read()
    for k in (1, 2):
        model.commit({"x": x + k})
    snap = model.pull(have)
    assert snap.version == 3 and (snap.arrays["x"] == x + 2).all()
    assert snap.bytes_read == x.nbytes


def test_a_pull_into_an_array_changed_by_its_reader_fails_its_digest(client: Client) -> None:
    model = client.model("ver/pull-changed")
    x = np.zeros(1000, np.float32)
    model.commit({"x": x})
    have = model.read()
    y = x.copy()
    y[3] = 1
    model.commit({"x": y})
    have.arrays["x"][700] = 5  # the reader's own change
    with pytest.raises(DigestMismatch, match="changed since it was read"):
        model.pull(have)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_sliced_pulls_are_bit_exact_and_move_the_changes_in_the_slice(
    client: Client, data: st.DataObject
) -> None:
    from irdma.protocol.deltas import HEAD

    rows = data.draw(st.integers(1, 90))
    cols = data.draw(st.integers(1, 400))
    dtype = data.draw(st.sampled_from([np.float32, ml_dtypes.bfloat16, np.int8, np.float64]))
    fraction = data.draw(st.sampled_from([0.0, 0.005, 0.05, 0.6]))
    x = (np.arange(rows * cols) % 113).astype(dtype).reshape(rows, cols)
    y = changed_copy(x, fraction, data.draw(st.integers(0, 1000)))
    r0 = data.draw(st.integers(0, rows))
    r1 = data.draw(st.integers(r0, rows))
    c0 = data.draw(st.integers(0, cols))
    c1 = data.draw(st.integers(c0, cols))
    index = (slice(r0, r1), slice(c0, c1))
    model = client.model("ver/sliced-pull", keep=2)
    model.commit({"w": x})
    have = model.read(slices={"w": index})
    model.commit({"w": y})
    snap = model.pull(have, slices={"w": index})
    want = y[index]
    assert snap.arrays["w"].tobytes() == want.tobytes()
    item = x.itemsize
    diff = int((x[index].view(f"u{item}") != want.view(f"u{item}")).sum())
    nbytes = want.nbytes
    # At most a run per row of the slice, each cut again where a shard ends.
    pieces = max(1, r1 - r0) + x.nbytes // (64 << 10) + 1
    assert diff * item <= snap.bytes_read
    assert snap.bytes_read <= min(nbytes, diff * (item + 4)) + pieces * HEAD.size


def test_a_part_created_and_not_yet_filled_is_not_taken_for_finished(client: Client) -> None:
    """The moment between another writer's create of its part and its write: the
    committer finds zeros there, and waits for the part instead of failing on it."""
    from irdma.client.manifests import part_name

    model = client.model("ver/part-zeros")
    first = model.draft()
    first.write("a", np.zeros(4, np.float32))
    client.create(part_name("ver/part-zeros", first.version, "other"), (64,), np.uint8)
    with pytest.raises(TimeoutError, match="1 of 2 writers"):
        first.commit(parts=2, patience=0.2)
    other = model.join(first.version)
    other.write("b", np.ones(4, np.float32))
    other.finish()
    assert first.commit(parts=2) == first.version
    assert sorted(model.read().arrays) == ["a", "b"]


def test_a_daemon_killed_mid_commit_leaves_the_version_whole_and_numbers_up(
    tmp_path: Path,
) -> None:
    """Two copies; a writer has written half of version 2's tensors when the primary
    of its manifest is killed with SIGKILL. Until the commit a reader sees version 1
    whole; the commit then goes on through the backups; readers see version 2
    whole, and the latest number any reader saw never went down."""
    cluster = make_cluster(tmp_path, replicas=2, timeout=2.0)
    try:
        with Client(cluster.config_path) as c, Client(cluster.config_path) as r:
            model = c.model("ver/killed")
            names = [f"t{i}" for i in range(20)]
            model.commit({n: np.full(3000, 1.0, np.float32) for n in names})
            reader = r.model("ver/killed")
            seen = [reader.latest()]
            draft = model.draft()
            for n in names[:10]:
                draft.write(n, np.full(3000, 2.0, np.float32))
            key = c.stat(manifest_name("ver/killed", draft.version)).meta.key
            cluster.kill(c.config.primary_for(key, 0).name)
            snap = reader.read()
            seen.append(snap.version)
            assert snap.version == 1 and all((a == 1.0).all() for a in snap.arrays.values())
            for n in names[10:]:
                draft.write(n, np.full(3000, 2.0, np.float32))
            assert draft.commit() == 2
            snap = reader.read()
            seen.append(snap.version)
            assert snap.version == 2 and all((a == 2.0).all() for a in snap.arrays.values())
            assert set(snap.arrays) == set(names)
            seen.append(reader.latest())
            assert seen == sorted(seen), seen
    finally:
        cluster.close()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_writers_commit_their_own_blocks_and_readers_read_theirs_full_and_delta(
    client: Client, data: st.DataObject
) -> None:
    """Random writer and reader layouts: each of 2-3 writers commits its block (rows or
    columns) of one tensor; a reader with its own block reads it whole, then pulls
    the next version: bit-exact, checked where whole, and only changed elements move."""
    rows = data.draw(st.integers(2, 60))
    cols = data.draw(st.integers(2, 300))
    dtype = data.draw(st.sampled_from([np.float32, ml_dtypes.bfloat16, np.int16]))
    by_rows = data.draw(st.booleans())
    extent = rows if by_rows else cols
    # 2 or 3 writers: cut points inside the split dimension.
    inner = st.integers(1, extent - 1)
    cuts = sorted(data.draw(st.lists(inner, min_size=1, max_size=2, unique=True)))
    edges = [0, *cuts, extent]
    blocks = [
        (slice(a, b),) if by_rows else (slice(None), slice(a, b))
        for a, b in itertools.pairwise(edges)
    ]
    x1 = (np.arange(rows * cols) % 97).astype(dtype).reshape(rows, cols)
    x2 = changed_copy(
        x1, data.draw(st.sampled_from([0.0, 0.01, 0.3])), data.draw(st.integers(0, 2**31))
    )
    model = client.model("ver/blocks", keep=2)
    for x in (x1, x2):
        first = model.draft()
        drafts = [first] + [model.join(first.version) for _ in blocks[1:]]
        for d, index in zip(drafts, blocks, strict=True):
            d.write_slice("w", index, x[index], shape=x.shape)
        for d in drafts[1:]:
            d.finish()
        v = first.commit(parts=len(drafts))
        whole = model.read(v)
        assert whole.arrays["w"].tobytes() == x.tobytes() and whole.checked == {"w"}
        if x is x1:
            r0 = data.draw(st.integers(0, rows))
            r1 = data.draw(st.integers(r0, rows))
            c0 = data.draw(st.integers(0, cols))
            c1 = data.draw(st.integers(c0, cols))
            mine = (slice(r0, r1), slice(c0, c1))
            have = model.read(v, slices={"w": mine})
            assert have.arrays["w"].tobytes() == x1[mine].tobytes()
    snap = model.pull(have, slices={"w": mine})
    assert snap.arrays["w"].tobytes() == x2[mine].tobytes()
    item = x1.itemsize
    diff = int((x1[mine].view(f"u{item}") != x2[mine].view(f"u{item}")).sum())
    assert diff * item <= snap.bytes_read <= x2[mine].nbytes + (rows + 8) * 16


def test_a_version_number_past_the_keys_bits_takes_a_key_of_its_own(client: Client) -> None:
    """Version v and v + 65536 of one tensor have the same grouped key: once v is
    deleted its key is reused; while v is kept, the newer one takes a salted key,
    and both read back as written."""
    from irdma.protocol import tensor_key

    client.write("wrap/@1/w", np.ones(10, np.float32))
    client.delete("wrap/@1/w")
    client.write("wrap/@65537/w", np.full(10, 2, np.float32))
    assert client.stat("wrap/@65537/w").meta.key == tensor_key("wrap/@1/w")
    client.write("wrap/@2/w", np.ones(10, np.float32))
    client.write("wrap/@65538/w", np.full(10, 3, np.float32))
    assert client.stat("wrap/@65538/w").meta.key != tensor_key("wrap/@2/w")
    assert (client.read("wrap/@65538/w") == 3).all() and (client.read("wrap/@2/w") == 1).all()
