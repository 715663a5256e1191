"""Update ids and whole-write stamps (irdma/client/routing.py) differ between clients whatever
the application does to Python's ``random``.

Training scripts seed ``random`` alike on every rank (``random.seed(0)``,
``seed_everything``). Ids drawn from it were then the same on every rank, and a
replicated shard took one rank's update for a retry of another's: applied once,
acknowledged twice, the other lost without an error.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest

from irdma import Client
from irdma.client.routing import new_txn
from irdma.client.stamps import StampClock

from .helpers.cluster import Cluster, make_cluster

# Each rank seeds random as a training script does, then makes N updates.
RANK = textwrap.dedent(
    """
    import random, sys
    import numpy as np
    from irdma import Client

    random.seed(0)
    config, name, op = sys.argv[1:4]
    n, rank = int(sys.argv[4]), int(sys.argv[5])
    with Client(config) as c:
        info = c.stat(name)
        for k in range(n):
            if op == "accumulate":
                c.accumulate(name, np.ones(info.shape, info.dtype))
            else:
                c.write(name, np.full(info.shape, 1000 * rank + k, info.dtype))
        # Shards written twice: reached by a write a shard then refused for a later one.
        print("acknowledged", n, c.async_client.contention.pieces_rewritten, flush=True)
    """
)
SHAPE = (48 << 10,)  # 192 KiB of float32: three 64 KiB shards
UPDATES = 100  # per run, split over the ranks


def test_ids_differ_after_equal_seeds() -> None:
    random.seed(0)
    txns, stamps = [new_txn() for _ in range(4)], [StampClock().next() for _ in range(4)]
    random.seed(0)
    assert not set(txns) & {new_txn() for _ in range(4)}
    assert not set(stamps) & {StampClock().next() for _ in range(4)}
    assert all(s > 1 for s in stamps)  # 0 and 1 mean "no stamp" and UNSTAMPED


def test_ids_differ_in_a_forked_child() -> None:
    """A worker forked from a process that made ids does not repeat them."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one id to the parent, then gone without cleanup
        os.close(read)
        os.write(write, new_txn().to_bytes(8, "little"))
        os._exit(0)
    os.close(write)
    mine = new_txn()
    with os.fdopen(read, "rb") as pipe:
        theirs = int.from_bytes(pipe.read(8), "little")
    os.waitpid(pid, 0)
    assert theirs != mine


@pytest.fixture(scope="module", params=[1, 2], ids=["R=1", "R=2"])
def seeded_cluster(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Cluster]:
    c = make_cluster(tmp_path_factory.mktemp("ids"), replicas=request.param)
    try:
        yield c
    finally:
        c.close()


def run_ranks(cluster: Cluster, name: str, op: str, ranks: int, n: int) -> int:
    """Run the ranks; the shards their whole writes wrote twice, over all ranks."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(cluster.config_path), name, op, str(n), str(r)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(ranks)
    ]
    rewritten = 0
    for p in procs:
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err[-2000:]
        said, count, again = out.split()
        assert (said, count) == ("acknowledged", str(n)), out
        rewritten += int(again)
    return rewritten


@pytest.mark.parametrize("ranks", [2, 4])
def test_seeded_ranks_accumulates_all_count(seeded_cluster: Cluster, ranks: int) -> None:
    name = f"ids/acc{ranks}"
    with Client(seeded_cluster.config_path) as c:
        c.write(name, np.zeros(SHAPE, np.float32))
        # Twice: the second run's ids must not be taken for the first's either.
        for run in (1, 2):
            run_ranks(seeded_cluster, name, "accumulate", ranks, UPDATES // ranks)
            got = c.read(name)
            assert np.array_equal(got, np.full(SHAPE, run * UPDATES, np.float32)), (
                f"run {run}: {np.unique(got)} where every element is {run * UPDATES}"
            )


@pytest.mark.parametrize("ranks", [2, 4])
def test_seeded_ranks_whole_writes_all_apply(seeded_cluster: Cluster, ranks: int) -> None:
    """Each write bumps every shard's version once, and once more each shard it
    reached before another shard refused it for a later write (it is then
    written to every shard again): none is taken for a retry."""
    name = f"ids/write{ranks}"
    with Client(seeded_cluster.config_path) as c:
        c.write(name, np.zeros(SHAPE, np.float32))
        info = c.stat(name)
        before = info.version
        rewritten = run_ranks(seeded_cluster, name, "write", ranks, UPDATES // ranks)
        after = c.stat(name).version
        assert after - before == UPDATES * info.num_shards + rewritten
        last = {1000 * r + UPDATES // ranks - 1 for r in range(ranks)}
        got = np.unique(c.read(name))
        assert len(got) == 1 and got[0] in last, got  # one write's value, whole
