"""Model versions over RDMA (run in the soft-RoCE guest): readers of the latest
version never see two versions in one read while a writer commits as fast as it
can, and a pull over the verbs connection moves only what changed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections import Counter

import numpy as np

from irdma import Client, VersionNotFound

from ..helpers.cluster import Cluster

NAMES = [f"block{i}.w" for i in range(60)]
WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from irdma import Client

    names = [f"block{i}.w" for i in range(60)]
    with Client(sys.argv[1], transport="rdma") as c:
        model = c.model("rv/race", keep=3)
        for v in range(1, 13):
            model.commit({n: np.full(1000, v, np.float32) for n in names})
    """
)


def test_rdma_readers_of_the_latest_version_never_see_two(rdma_cluster: Cluster) -> None:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(rdma_cluster.config_path)])
    seen: Counter[int] = Counter()
    try:
        with Client(rdma_cluster.config_path, transport="rdma") as c:
            model = c.model("rv/race", keep=3)
            deadline = time.monotonic() + 300
            while writer.poll() is None and time.monotonic() < deadline:
                try:
                    snap = model.read()
                except VersionNotFound:
                    continue
                values = {float(a[0]) for a in snap.arrays.values()}
                assert values == {float(snap.version)}, (snap.version, sorted(values))
                assert all((a == snap.version).all() for a in snap.arrays.values())
                assert set(snap.arrays) == set(NAMES)
                seen[snap.version] += 1
        assert writer.wait(timeout=60) == 0
    finally:
        writer.kill()
    assert len(seen) >= 3, seen


def test_an_rdma_pull_moves_only_what_changed(rdma_cluster: Cluster) -> None:
    with Client(rdma_cluster.config_path, transport="rdma") as c:
        model = c.model("rv/pull", keep=4)
        x = np.random.default_rng(0).random(300_000, dtype=np.float32)
        model.commit({"x": x})
        have = model.read()
        y = x.copy()
        y[::1000] += 1  # 300 elements
        model.commit({"x": y})
        snap = model.pull(have)
        assert snap.arrays["x"].tobytes() == y.tobytes() and snap.checked == {"x"}
        assert 300 * 4 <= snap.bytes_read <= 300 * 8 + 16 * 8
