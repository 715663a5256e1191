"""A model's versions in a real mount: one read-only directory per committed version,
its bookkeeping and its versions still being written neither listed nor found."""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from irdma import Client

from .helpers.cluster import Cluster


def fails_with(code: int, fn, *args) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OSError) as caught:
        fn(*args)
    assert caught.value.errno == code, caught.value


def test_committed_versions_are_read_only_directories(
    cluster: Cluster, client: Client, mount: Path
) -> None:
    model = client.model("mv")
    w1, w2 = np.arange(5000, dtype=np.float32), np.arange(5000, dtype=np.float32) * 2
    model.commit({"w": w1, "enc/b": np.ones(3, np.int64)})
    model.commit({"w": w2, "enc/b": np.ones(3, np.int64) * 2})
    # A third version claimed and half written by a writer still at it.
    draft = model.draft()
    draft.write("w", np.zeros(5000, np.float32))
    assert sorted(os.listdir(mount / "mv")) == ["@1", "@2"]
    assert sorted(os.listdir(mount / "mv" / "@2")) == ["enc", "w.npy"]
    assert (np.load(mount / "mv" / "@1" / "w.npy") == w1).all()
    assert (np.load(mount / "mv" / "@2" / "w.npy") == w2).all()
    assert (np.load(mount / "mv" / "@2" / "enc" / "b.npy") == 2).all()
    for hidden in ("@3", "@3/w.npy", "@versions", "@pins", "@parts"):
        fails_with(errno.ENOENT, os.stat, mount / "mv" / hidden)
    # Nothing in a version changes.
    v2 = mount / "mv" / "@2"
    fails_with(errno.EROFS, open, v2 / "w.npy", "r+b")
    fails_with(errno.EROFS, open, v2 / "new.npy", "wb")
    fails_with(errno.EROFS, os.unlink, v2 / "w.npy")
    fails_with(errno.EROFS, os.rename, v2 / "w.npy", mount / "mv" / "moved.npy")
    fails_with(errno.EROFS, os.rename, mount / "mv" / "@1", mount / "mv" / "@9")
    fails_with(errno.EROFS, os.mkdir, v2 / "sub")
    fails_with(errno.EROFS, os.truncate, v2 / "w.npy", 0)
    fails_with(errno.EROFS, open, v2 / ".accumulate" / "w.npy", "wb")
    assert (np.load(v2 / "w.npy") == w2).all()
    # Committed, the third version shows up.
    draft.commit()
    assert sorted(os.listdir(mount / "mv")) == ["@1", "@2", "@3"]
    assert (np.load(mount / "mv" / "@3" / "w.npy") == 0).all()


def test_mount_readers_of_the_latest_version_never_see_two(cluster: Cluster, mount: Path) -> None:
    """A writer commits versions of 60 tensors as fast as it can while a reader of
    the mount loads the newest version directory whole: every load is one version,
    and the reader saw several (the race happened)."""
    names = [f"block{i}" for i in range(60)]
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: Counter[int] = Counter()

    def writer() -> None:
        try:
            with Client(cluster.config_path) as c:
                model = c.model("mv-race", keep=6)
                for v in range(1, 26):
                    model.commit({n: np.full(500, v, np.float32) for n in names})
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    def reader() -> None:
        try:
            while not stop.is_set():
                try:
                    versions = [int(d[1:]) for d in os.listdir(mount / "mv-race")]
                except FileNotFoundError:
                    continue  # nothing committed yet
                if not versions:
                    continue
                newest = max(versions)
                folder = mount / "mv-race" / f"@{newest}"
                try:
                    loads = [np.load(folder / f"{n}.npy") for n in names]
                except FileNotFoundError:
                    continue  # pruned while read: six newer versions came meanwhile
                values = {float(a[0]) for a in loads}
                assert values == {float(newest)}, (newest, sorted(values))
                assert all((a == newest).all() for a in loads)
                seen[newest] += 1
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors, errors
    assert len(seen) >= 3, seen


async def test_the_versions_found_committed_are_remembered_within_a_bound(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mount living through many versions remembers at most COMMITTED_KEPT of them
    as committed (one STAT each to find again), and still finds every one."""
    from irdma_fuse import resolve

    from .helpers.fuse_roles import mount_roles

    monkeypatch.setattr(resolve, "COMMITTED_KEPT", 2)
    async with mount_roles(cluster.config_path) as r:
        model = r.backend.c.model("mv-bound", keep=8)
        for k in range(5):
            await model.commit({"w": np.full(4, k, np.float32)})
        for v in range(1, 6):
            found = await r.resolver.resolve(f"mv-bound/@{v}/w.npy")
            assert found.info is not None and found.info.name == f"mv-bound/@{v}/w"
            assert len(r.resolver._committed) <= 2
