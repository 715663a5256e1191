"""Tests for irdma_psd.snapshot: write, verify and restore a daemon's shards."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import trio
from irdma_psd import snapshot
from irdma_psd.snapshot import (
    SNAPSHOT_FILE,
    SnapshotError,
    SnapshotInfo,
    load_snapshot,
    read_snapshot_header,
    write_snapshot,
)
from irdma_psd.store import Store

from irdma.protocol import Op, TensorMeta, tensor_key
from irdma.training.modes import Mode

from .helpers.payloads import rand_bytes
from .helpers.stores import even, everything, open_store, shard_bytes

# -- helpers -----------------------------------------------------------------


@pytest.fixture
def stores() -> Iterator[Callable[..., Store]]:
    """Make stores over fresh arenas; every arena is closed afterwards."""
    with contextlib.ExitStack() as stack:

        def make(owns: Callable[[int, int], bool] = everything, capacity: int = 1 << 20) -> Store:
            return stack.enter_context(open_store(capacity, owns))

        yield make


def write(store: Store, key: int, index: int, offset: int, data: bytes) -> int:
    u = store.begin_update(Op.WRITE, key, index, offset, len(data))
    u.buffer[:] = np.frombuffer(data, dtype=np.uint8)
    return store.commit(u)


def accumulate(store: Store, key: int, index: int, delta: np.ndarray) -> int:
    raw = np.ascontiguousarray(delta).reshape(-1).view(np.uint8)
    u = store.begin_update(Op.ACCUMULATE, key, index, 0, raw.nbytes)
    u.buffer[:] = raw
    return store.commit(u)


def all_bytes(store: Store) -> dict[tuple[str, int], bytes]:
    return {
        (t.meta.name, i): shard_bytes(store, k, i)
        for k, t in store.tensors.items()
        for i in t.shards
    }


def shard_state(store: Store) -> dict[tuple[str, int], tuple[int, float]]:
    return {
        (t.meta.name, i): (s.version, s.mtime)
        for t in store.tensors.values()
        for i, s in t.shards.items()
    }


def pins(store: Store) -> list[int]:
    return [s.block.pins for t in store.tensors.values() for s in t.shards.values()]


def populate(store: Store, metas: list[TensorMeta], seed: int = 0) -> None:
    """Create ``metas`` and give their shards random bytes and 0, 1 or 2 updates each."""
    for n, meta in enumerate(metas):
        store.create(meta)
        for index, shard in store.tensors[meta.key].shards.items():
            for k in range((n + index) % 3):
                write(store, meta.key, index, 0, rand_bytes(shard.nbytes, seed + 7 * n + k))


def sample_metas() -> list[TensorMeta]:
    return [
        TensorMeta("a/f32", "float32", (37, 53), 1024),  # 7844 bytes: 8 shards
        TensorMeta("a/f64", "float64", (10,), 4096),
        TensorMeta("b/i8", "int8", (5000,), 1000),  # 5 shards
        TensorMeta("b/u16", "uint16", (3, 4, 5), 4096),
        TensorMeta("c/bool", "bool", (17,), 4096),
        TensorMeta("c/c64", "complex64", (7,), 16),  # 4 shards, the last 8 bytes
        TensorMeta("c/i64", "int64", (9000,), 8192),  # 72000 bytes: 9 shards
        TensorMeta("z/empty", "float32", (0,), 4096),
        TensorMeta("z/empty3", "int64", (3, 0, 2), 4096),
        TensorMeta("z/scalar", "float64", (), 4096),
        TensorMeta("m/sync", "float32", (100,), 256, Mode.sync(2).to_options()),
        TensorMeta("m/ssp", "float32", (64,), 4096, Mode.ssp(3, 1).to_options()),
        TensorMeta(
            "m/set",
            "float64",
            (8,),
            4096,
            {**Mode.sync(2, apply="set", on_timeout="evict").to_options(), "note": "x"},
        ),
    ]


def corrupt_files(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob(SNAPSHOT_FILE + ".corrupt-*"))


# -- round trip ----------------------------------------------------------------


async def test_deleted_tensors_are_remembered_across_a_restart(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    """A daemon restarted from its snapshot still knows which tensors were deleted
    (tombstones): a replica that missed a delete drops its copy on its word, and one
    that did not is never told to drop a copy (docs/semantics.md, Rejoin)."""
    store = stores()
    metas = sample_metas()
    populate(store, metas)
    gone, kept = metas[0], metas[1]
    store.delete(gone.key)
    store.drop_shard(kept.key, 0)  # no longer kept here: not a delete
    assert store.deleted == (gone.key,)
    await write_snapshot(store, tmp_path)
    back = stores()
    load_snapshot(back, tmp_path)
    assert back.deleted == (gone.key,)
    assert back.was_deleted(gone.key) and not back.was_deleted(kept.key)
    back.create(gone)  # created again: no longer deleted
    assert back.deleted == ()


async def test_round_trip(stores: Callable[..., Store], tmp_path: Path) -> None:
    src = stores()
    metas = sample_metas()
    populate(src, metas)
    f32 = metas[0]
    accumulate(src, f32.key, 2, np.ones(256, dtype=np.float32))  # in place: version + 1
    used = src.arena.used
    data_dir = tmp_path / "deep" / "data"

    info = await write_snapshot(src, data_dir)

    path = data_dir / SNAPSHOT_FILE
    assert info.path == path
    assert info.tensors == len(metas)
    assert info.shards == sum(m.num_shards for m in metas)
    assert info.nbytes == sum(m.nbytes for m in metas)
    assert info.seq == 1
    assert abs(info.created - os.path.getmtime(path)) < 60
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in data_dir.iterdir()) == [SNAPSHOT_FILE]  # no temp file left
    assert all(p == 0 for p in pins(src))
    assert src.arena.used == used

    header = read_snapshot_header(path)
    assert header["seq"] == 1
    assert [t["meta"]["name"] for t in header["tensors"]] == sorted(m.name for m in metas)

    dst = stores()
    loaded = load_snapshot(dst, data_dir)
    assert loaded == info
    assert sorted(dst.tensors) == sorted(src.tensors)
    assert all_bytes(dst) == all_bytes(src)
    assert shard_state(dst) == shard_state(src)
    assert max(v for v, _ in shard_state(src).values()) >= 2
    for key, t in src.tensors.items():
        r = dst.tensors[key]
        assert r.meta == t.meta
        assert r.meta.options == t.meta.options
        assert r.ctime == t.ctime
        assert r.version == t.version
        if t.coord is None:
            assert r.coord is None
        else:
            assert r.coord is not None
            assert r.coord.mode == t.coord.mode
    assert dst.tensors[metas[10].key].coord.mode == Mode.sync(2)
    assert dst.arena.used == used
    assert path.exists()  # loading keeps the snapshot


async def test_a_renamed_tensor_comes_back_under_its_name_and_key(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    src = stores()
    a = TensorMeta("r/a", "float32", (3000,), 4096)  # 3 shards
    populate(src, [a])
    renamed = src.rename(a.key, "r/a", "r/b")
    # "r/a" again, at the salted key a create meeting the renamed tensor takes.
    again = TensorMeta("r/a", "int8", (10,), 4096, place=tensor_key("r/a", 1))
    src.create(again)
    await write_snapshot(src, tmp_path)
    dst = stores()
    load_snapshot(dst, tmp_path)
    assert (
        dst.catalogue.named("r/b").meta == renamed.meta
        and dst.catalogue.named("r/b").meta.key == a.key
    )
    assert dst.catalogue.named("r/a").meta == again
    assert all_bytes(dst) == all_bytes(src) and shard_state(dst) == shard_state(src)


async def test_the_txn_window_survives_a_restart(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    """An update acknowledged before a restart, retried after it (same txn), is
    recognised and not applied again."""
    src = stores()
    f32 = sample_metas()[0]
    src.create(f32)
    versions = {}
    for txn in (11, 12, 13):
        u = src.begin_update(Op.ACCUMULATE, f32.key, 2, 0, 1024)
        u.buffer[:] = np.ones(256, dtype=np.float32).view(np.uint8)
        u.txn = txn
        versions[txn] = src.commit(u)
    await write_snapshot(src, tmp_path)
    header = read_snapshot_header(tmp_path / SNAPSHOT_FILE)
    entry = next(s for s in tensor_entry(header, f32.name)["shards"] if s["index"] == 2)
    assert entry["txns"] == [[t, v] for t, v in versions.items()]  # oldest first

    dst = stores()
    load_snapshot(dst, tmp_path)
    before = shard_bytes(dst, f32.key, 2)
    retry = dst.begin_update(Op.ACCUMULATE, f32.key, 2, 0, 1024)
    retry.buffer[:] = np.ones(256, dtype=np.float32).view(np.uint8)
    retry.txn = 12
    assert dst.applied(retry) == versions[12]
    dst.abort(retry)
    assert shard_bytes(dst, f32.key, 2) == before
    assert list(dst.tensors[f32.key].shards[2].recent.items()) == list(versions.items())


async def test_a_snapshot_without_txns_loads_with_an_empty_window(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    """Files written before the window was kept have no "txns": they still load."""
    src = stores()
    populate(src, sample_metas())
    await write_snapshot(src, tmp_path)
    path = tmp_path / SNAPSHOT_FILE

    def drop_txns(h: dict) -> None:
        for t in h["tensors"]:
            for shard in t["shards"]:
                del shard["txns"]

    path.write_bytes(edit_header(drop_txns)(path.read_bytes()))
    dst = stores()
    assert load_snapshot(dst, tmp_path) is not None
    assert all_bytes(dst) == all_bytes(src)
    assert all(not s.recent for t in dst.tensors.values() for s in t.shards.values())


async def test_empty_store_round_trip(stores: Callable[..., Store], tmp_path: Path) -> None:
    info = await write_snapshot(stores(), tmp_path)
    assert (info.tensors, info.shards, info.nbytes, info.seq) == (0, 0, 0, 1)
    dst = stores()
    assert load_snapshot(dst, tmp_path) == info
    assert dst.tensors == {}


def test_no_snapshot(stores: Callable[..., Store], tmp_path: Path) -> None:
    store = stores()
    assert load_snapshot(store, tmp_path / "missing") is None
    assert load_snapshot(store, tmp_path) is None
    assert store.tensors == {}


# -- consistency while the daemon serves ----------------------------------------


async def test_update_after_cut_keeps_cut_bytes(
    stores: Callable[..., Store], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = stores()
    a = TensorMeta("a", "float32", (2048,), 4096)  # 2 shards
    gone = TensorMeta("gone", "uint8", (5000,), 8192)
    populate(store, [a, gone])
    write(store, a.key, 0, 0, rand_bytes(4096, 1))
    write(store, a.key, 1, 0, rand_bytes(4096, 2))
    write(store, gone.key, 0, 0, rand_bytes(5000, 3))
    cut_bytes = all_bytes(store)
    cut_state = shard_state(store)
    used = store.arena.used
    old_block = store.tensors[a.key].shards[0].block

    # Hold the writer thread until the updates below have happened after the cut.
    started, go = threading.Event(), threading.Event()
    real = snapshot._write_file
    released: list[tuple[int, int]] = []

    def held(data_dir, tensors, created, release, deleted):
        started.set()
        assert go.wait(30)

        def spy(slot: int) -> None:
            release(slot)  # unpins on the trio thread, and returns once that is done
            released.append((slot, old_block.pins))

        return real(data_dir, tensors, created, spy, deleted)

    monkeypatch.setattr(snapshot, "_write_file", held)
    infos: list[SnapshotInfo] = []

    async def take() -> None:
        infos.append(await write_snapshot(store, tmp_path))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(take)
            await trio.to_thread.run_sync(started.wait, 30)
            assert old_block.pins == 1
            # A partial write (copy-on-write: the pinned block stays as it was) ...
            write(store, a.key, 0, 100, b"\xee" * 200)
            assert store.tensors[a.key].shards[0].block is not old_block
            # ... an accumulate, a delete and a create, all after the cut.
            accumulate(store, a.key, 1, np.full(1024, 3.0, dtype=np.float32))
            store.delete(gone.key)
            store.create(TensorMeta("late", "int32", (10,), 4096))
            after = all_bytes(store)
            go.set()

    (info,) = infos
    assert info.tensors == 2
    # Each block was unpinned as soon as its bytes were written, not only at the end.
    assert released == [(0, 0), (1, 0), (2, 0)]
    assert all(p == 0 for p in pins(store))
    assert old_block.pins == 0
    # The old blocks (shard 0's, both of the deleted tensor's) went back to the arena.
    assert store.arena.used == used - 8192 + 4096
    assert all_bytes(store) == after
    assert shard_bytes(store, a.key, 0)[100:300] == b"\xee" * 200

    dst = stores()
    load_snapshot(dst, tmp_path)
    assert all_bytes(dst) == cut_bytes
    assert shard_state(dst) == cut_state
    assert "late" not in {t.meta.name for t in dst.tensors.values()}


async def test_cancelled_snapshot_leaves_previous(
    stores: Callable[..., Store], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = stores()
    meta = TensorMeta("t", "uint8", (10000,), 4096)
    store.create(meta)
    write(store, meta.key, 0, 0, rand_bytes(4096, 1))
    first = await write_snapshot(store, tmp_path)
    before = (tmp_path / SNAPSHOT_FILE).read_bytes()
    write(store, meta.key, 1, 0, rand_bytes(4096, 2))

    started, go = threading.Event(), threading.Event()
    real = snapshot._write_file

    def held(*args):
        started.set()
        assert go.wait(30)
        return real(*args)  # sees the cancellation at its first chunk

    monkeypatch.setattr(snapshot, "_write_file", held)
    with trio.fail_after(60):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write_snapshot, store, tmp_path)
                await trio.to_thread.run_sync(started.wait, 30)
                scope.cancel()
                go.set()
        assert scope.cancelled_caught
    assert all(p == 0 for p in pins(store))
    assert sorted(p.name for p in tmp_path.iterdir()) == [SNAPSHOT_FILE]
    assert (tmp_path / SNAPSHOT_FILE).read_bytes() == before
    assert read_snapshot_header(tmp_path / SNAPSHOT_FILE)["seq"] == first.seq


async def test_concurrent_snapshots_take_turns(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    store = stores()
    populate(store, sample_metas())
    infos: list[SnapshotInfo] = []

    async def take() -> None:
        infos.append(await write_snapshot(store, tmp_path))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(take)
    assert sorted(i.seq for i in infos) == [1, 2, 3]
    assert all(p == 0 for p in pins(store))
    dst = stores()
    assert load_snapshot(dst, tmp_path).seq == 3
    assert all_bytes(dst) == all_bytes(store)


# -- seq -------------------------------------------------------------------------


async def test_seq_increments(stores: Callable[..., Store], tmp_path: Path) -> None:
    store = stores()
    meta = TensorMeta("t", "float32", (10,), 4096)
    store.create(meta)
    seqs = []
    for i in range(3):
        write(store, meta.key, 0, 0, rand_bytes(40, i))
        seqs.append((await write_snapshot(store, tmp_path)).seq)
    assert seqs == [1, 2, 3]
    assert load_snapshot(stores(), tmp_path).seq == 3

    # A snapshot moved aside as corrupt still counts: seq never goes back.
    path = tmp_path / SNAPSHOT_FILE
    raw = bytearray(path.read_bytes())
    raw[snapshot.PREAMBLE.size] ^= 0xFF  # shard data
    path.write_bytes(raw)
    with pytest.raises(SnapshotError):
        load_snapshot(stores(), tmp_path)
    assert not path.exists()
    assert (await write_snapshot(store, tmp_path)).seq == 4
    assert (await write_snapshot(store, tmp_path)).seq == 5


# -- corrupt files -------------------------------------------------------------------


def split(raw: bytes) -> tuple[bytes, dict, bytes]:
    """(preamble and data, decoded header, trailer) of a snapshot file's bytes."""
    hoffset, hlen, _, _, _ = snapshot.TRAILER.unpack(raw[-snapshot.TRAILER.size :])
    return raw[:hoffset], json.loads(raw[hoffset : hoffset + hlen]), raw[-snapshot.TRAILER.size :]


def with_header(raw: bytes, header: bytes) -> bytes:
    """The file with its header replaced by ``header`` (all checksums made right again)."""
    body, _, _ = split(raw)
    hcrc = zlib.crc32(header)
    tcrc = zlib.crc32(snapshot.TRAILER_FIELDS.pack(len(body), len(header), hcrc))
    return body + header + snapshot.TRAILER.pack(len(body), len(header), hcrc, tcrc, b"IRDMSEND")


def edit_header(edit: Callable[[dict], None]) -> Callable[[bytes], bytes]:
    def change(raw: bytes) -> bytes:
        _, header, _ = split(raw)
        edit(header)
        return with_header(raw, json.dumps(header).encode())

    return change


def flip(offset: Callable[[bytes], int]) -> Callable[[bytes], bytes]:
    def change(raw: bytes) -> bytes:
        out = bytearray(raw)
        out[offset(raw)] ^= 0x10
        return bytes(out)

    return change


def shard_offset(raw: bytes, name: str, index: int) -> int:
    _, header, _ = split(raw)
    (t,) = [t for t in header["tensors"] if t["meta"]["name"] == name]
    (s,) = [s for s in t["shards"] if s["index"] == index]
    return s["offset"] + s["nbytes"] // 2


def header_offset(raw: bytes) -> int:
    body, _, _ = split(raw)
    return len(body) + 5


def tensor_entry(header: dict, name: str) -> dict:
    (t,) = [t for t in header["tensors"] if t["meta"]["name"] == name]
    return t


def set_version(version: int) -> Callable[[bytes], bytes]:
    def change(raw: bytes) -> bytes:
        return raw[:8] + version.to_bytes(4, "little") + raw[12:]

    return change


CORRUPTIONS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "empty": (lambda raw: b"", "the file is empty"),
    "truncated-3": (lambda raw: raw[:3], "truncated"),
    "truncated-20": (lambda raw: raw[:20], "truncated"),
    "truncated-data": (lambda raw: raw[: len(raw) // 3], "truncated"),
    "truncated-1": (lambda raw: raw[:-1], "truncated"),
    "extended": (lambda raw: raw + b"\0", "truncated"),
    "wrong-magic": (lambda raw: b"PK\x03\x04" + raw[4:], "wrong magic"),
    "unknown-version": (set_version(2), "unknown format version 2"),
    "flip-data": (
        flip(lambda raw: shard_offset(raw, "m/w", 3)),
        "shard 3 of 'm/w': checksum mismatch",
    ),
    "flip-header": (flip(header_offset), "header checksum mismatch"),
    "flip-trailer": (flip(lambda raw: len(raw) - 30), "trailer checksum mismatch"),
    "json-nonsense": (lambda raw: with_header(raw, b"{nonsense"), "header is not valid JSON"),
    "json-list": (lambda raw: with_header(raw, b"[1, 2]"), "header is not a JSON object"),
    "bad-dtype": (
        edit_header(lambda h: tensor_entry(h, "m/w")["meta"].update(dtype="float128")),
        "unsupported dtype 'float128'",
    ),
    "bad-mode": (
        edit_header(lambda h: tensor_entry(h, "m/w")["meta"]["options"].update(workers=0)),
        "workers must be between",
    ),
    "bad-nbytes": (
        edit_header(lambda h: tensor_entry(h, "m/w")["shards"][1].update(nbytes=5)),
        "shard 1 of 'm/w' has 5 bytes, its layout says 4096",
    ),
    "bad-seq": (edit_header(lambda h: h.update(seq="one")), "'seq' must be an integer"),
    "bad-txns": (
        edit_header(lambda h: tensor_entry(h, "m/w")["shards"][1].update(txns=[[0, 1]])),
        "shard 1 of 'm/w': bad txn entry [0, 1]",
    ),
    "txns-not-a-list": (
        edit_header(lambda h: tensor_entry(h, "m/w")["shards"][1].update(txns={"1": 2})),
        "'txns' must be a list",
    ),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
async def test_corrupt_snapshot_is_kept_aside(
    case: str, stores: Callable[..., Store], tmp_path: Path
) -> None:
    change, problem = CORRUPTIONS[case]
    src = stores()
    populate(
        src,
        [
            TensorMeta("m/w", "float32", (5000,), 4096, Mode.sync(2).to_options()),
            TensorMeta("m/b", "int16", (30,), 4096),
        ],
    )
    await write_snapshot(src, tmp_path)
    path = tmp_path / SNAPSHOT_FILE
    bad = change(path.read_bytes())
    path.write_bytes(bad)

    dst = stores()
    keep = TensorMeta("keep/me", "uint8", (100,), 4096)
    dst.create(keep)
    write(dst, keep.key, 0, 0, rand_bytes(100, 9))
    before = (all_bytes(dst), shard_state(dst), dst.arena.used)

    with pytest.raises(SnapshotError) as ei:
        load_snapshot(dst, tmp_path)

    (kept,) = corrupt_files(tmp_path)
    assert kept.name == f"{SNAPSHOT_FILE}.corrupt-{int(kept.name.rsplit('-', 1)[1])}"
    assert kept.read_bytes() == bad
    assert not path.exists()
    message = str(ei.value)
    assert str(kept) in message
    assert problem in message
    assert (all_bytes(dst), shard_state(dst), dst.arena.used) == before
    assert sorted(t.meta.name for t in dst.tensors.values()) == ["keep/me"]
    # Now there is no snapshot to load.
    assert load_snapshot(dst, tmp_path) is None
    # A helper for tools sees the same problem without moving anything.
    if case != "flip-data":
        with pytest.raises(SnapshotError, match="snapshot"):
            read_snapshot_header(kept)
        assert kept.exists()


async def test_second_corruption_keeps_both(stores: Callable[..., Store], tmp_path: Path) -> None:
    path = tmp_path / SNAPSHOT_FILE
    for _ in range(2):
        path.write_bytes(b"nonsense")
        with pytest.raises(SnapshotError, match="wrong magic"):
            load_snapshot(stores(), tmp_path)
    assert len(corrupt_files(tmp_path)) == 2


# -- write errors -------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs to fill up; always unmounted. Skips where mounting is impossible."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(mnt)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        why = r.stderr.strip() or f"exit status {r.returncode}"
        ok = r.returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        why, ok = str(exc), False
    if not ok:
        reason = f"cannot mount a tmpfs to fill up ({' '.join(cmd)}): {why}"
        print(reason)
        pytest.skip(reason)
    try:
        yield mnt
    finally:
        r = subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


async def test_full_disk_keeps_previous_snapshot(
    stores: Callable[..., Store], small_fs: Path
) -> None:
    data_dir = small_fs / "data"
    store = stores()
    a = TensorMeta("a", "uint8", (40000,), 8192)
    store.create(a)
    write(store, a.key, 0, 0, rand_bytes(8192, 1))
    first = await write_snapshot(store, data_dir)
    previous = (data_dir / SNAPSHOT_FILE).read_bytes()
    first_bytes = all_bytes(store)

    # Fill the file system but for two pages: the next snapshot fails part way.
    free = os.statvfs(small_fs)
    filler = small_fs / "filler"
    filler.write_bytes(bytes(free.f_bavail * free.f_frsize - 8192))
    b = TensorMeta("b", "float64", (20000,), 65536)  # 160000 bytes
    store.create(b)
    write(store, b.key, 1, 0, rand_bytes(65536, 2))

    with pytest.raises(SnapshotError) as ei:
        await write_snapshot(store, data_dir)
    message = str(ei.value)
    assert str(data_dir / SNAPSHOT_FILE) in message
    assert os.strerror(28) in message  # ENOSPC: No space left on device
    assert sorted(p.name for p in data_dir.iterdir()) == [SNAPSHOT_FILE]  # temp file gone
    assert (data_dir / SNAPSHOT_FILE).read_bytes() == previous
    assert all(p == 0 for p in pins(store))

    dst = stores()
    assert load_snapshot(dst, data_dir) == first
    assert all_bytes(dst) == first_bytes

    filler.unlink()
    info = await write_snapshot(store, data_dir)
    assert info.seq == 2
    assert info.tensors == 2


async def test_unwritable_data_dir(stores: Callable[..., Store], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(SnapshotError) as ei:
        await write_snapshot(stores(), tmp_path / "file" / "data")
    assert str(tmp_path / "file" / "data") in str(ei.value)
    assert os.strerror(20) in str(ei.value)  # ENOTDIR: Not a directory


# -- placement and capacity -----------------------------------------------------


async def test_shards_not_owned_are_skipped(stores: Callable[..., Store], tmp_path: Path) -> None:
    meta = TensorMeta("t", "int32", (5000,), 4096)  # 5 shards
    src = stores(everything)
    populate(src, [meta], seed=1)
    for i in range(5):
        write(src, meta.key, i, 0, rand_bytes(src.tensors[meta.key].shards[i].nbytes, 10 + i))
    await write_snapshot(src, tmp_path / "all")

    half = stores(even)
    info = load_snapshot(half, tmp_path / "all")
    assert info.shards == 5
    assert sorted(half.tensors[meta.key].shards) == [0, 2, 4]
    for i in (0, 2, 4):
        assert shard_bytes(half, meta.key, i) == shard_bytes(src, meta.key, i)
        assert half.tensors[meta.key].shards[i].version == src.tensors[meta.key].shards[i].version

    # The other way: shards missing from the snapshot stay zero at version 0.
    await write_snapshot(half, tmp_path / "even")
    full = stores(everything)
    load_snapshot(full, tmp_path / "even")
    shards = full.tensors[meta.key].shards
    for i in range(5):
        if i % 2 == 0:
            assert shard_bytes(full, meta.key, i) == shard_bytes(src, meta.key, i)
            assert shards[i].version == src.tensors[meta.key].shards[i].version
        else:
            assert shard_bytes(full, meta.key, i) == bytes(shards[i].nbytes)
            assert shards[i].version == 0


async def test_arena_too_small(stores: Callable[..., Store], tmp_path: Path) -> None:
    src = stores(capacity=1 << 20)
    metas = [TensorMeta(f"big/{i}", "float32", (50000,), 65536) for i in range(3)]
    populate(src, metas)
    await write_snapshot(src, tmp_path)
    path = tmp_path / SNAPSHOT_FILE
    raw = path.read_bytes()

    dst = stores(capacity=256 << 10)
    keep = TensorMeta("keep/me", "uint8", (100,), 4096)
    dst.create(keep)
    write(dst, keep.key, 0, 0, rand_bytes(100, 9))
    before = (all_bytes(dst), shard_state(dst), dst.arena.used)

    with pytest.raises(SnapshotError) as ei:
        load_snapshot(dst, tmp_path)
    message = str(ei.value)
    assert "arena is too small" in message
    assert "'big/1'" in message  # big/0 fits, big/1 does not
    assert "200704 bytes" in message  # big/1's shards, rounded to pages
    assert str(path) in message
    assert path.read_bytes() == raw  # kept where it was, as it was
    assert corrupt_files(tmp_path) == []
    assert (all_bytes(dst), shard_state(dst), dst.arena.used) == before
    assert sorted(t.meta.name for t in dst.tensors.values()) == ["keep/me"]

    # The same file restores into an arena large enough.
    big = stores(capacity=1 << 20)
    load_snapshot(big, tmp_path)
    assert all_bytes(big) == all_bytes(src)


async def test_existing_tensor_with_other_layout(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    src = stores()
    populate(src, [TensorMeta("t", "float32", (100,), 4096), TensorMeta("u", "int8", (9,), 4096)])
    await write_snapshot(src, tmp_path)
    dst = stores()
    dst.create(TensorMeta("u", "int8", (10,), 4096))
    before = (all_bytes(dst), dst.arena.used)
    with pytest.raises(SnapshotError, match="shape"):
        load_snapshot(dst, tmp_path)
    assert (all_bytes(dst), dst.arena.used) == before
    assert corrupt_files(tmp_path) == []


def test_read_snapshot_header_missing(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="cannot read snapshot"):
        read_snapshot_header(tmp_path / SNAPSHOT_FILE)


def test_no_tmpfs_left_mounted(tmp_path: Path) -> None:
    """The fixture above unmounts; no tmpfs of this test run may stay mounted. (This
    run's own base directory: another pytest on the host may have mounts of its own.)"""
    with open("/proc/mounts") as f:
        mounted = [(fields[1], fields[2]) for fields in (line.split() for line in f)]
    base = f"{tmp_path.parent}/"
    assert [m for m, kind in mounted if m.startswith(base) and kind == "tmpfs"] == []


async def test_small_chunks(
    stores: Callable[..., Store], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shards much larger than a chunk stream through in pieces (as GB shards do)."""
    monkeypatch.setattr(snapshot, "CHUNK", 1000)
    monkeypatch.setattr(snapshot, "VERIFY_BUFFER", 777)
    src = stores()
    populate(src, sample_metas())
    info = await write_snapshot(src, tmp_path)
    dst = stores()
    assert load_snapshot(dst, tmp_path) == info
    assert all_bytes(dst) == all_bytes(src)
    assert shard_state(dst) == shard_state(src)

    path = tmp_path / SNAPSHOT_FILE
    raw = bytearray(path.read_bytes())
    raw[shard_offset(bytes(raw), "c/i64", 4) + 3000] ^= 1
    path.write_bytes(raw)
    with pytest.raises(SnapshotError, match="shard 4 of 'c/i64': checksum mismatch"):
        load_snapshot(stores(), tmp_path)
