"""irdma.collectives.Group against real daemons, members as threads of one test."""

from __future__ import annotations

import threading
import uuid

from irdma import Client
from irdma.collectives import Group

from .conftest import Cluster


def test_close_tolerates_rank_0_deleting_before_a_member_reads_the_last_barrier(
    cluster: Cluster,
) -> None:
    """Rank 0 leaves the last barrier once everyone pushed, and deletes the
    group; a member whose barrier read comes later finds the tensor gone,
    which means everyone arrived (seen in deploy/demo.sh with two copies)."""
    name = f"close-{uuid.uuid4().hex[:8]}"
    errors: list[BaseException] = []
    with Client(cluster.config_path) as c0, Client(cluster.config_path) as c1:
        g0 = Group(c0, name, rank=0, world_size=2)
        g1 = Group(c1, name, rank=1, world_size=2)
        slow_read = c1.read
        rank0_closed = threading.Event()

        def late_read(*args, **kwargs):  # member 1 reads only after rank 0 has closed
            assert rank0_closed.wait(30), "rank 0 did not finish close()"
            return slow_read(*args, **kwargs)

        c1.read = late_read  # type: ignore[method-assign]

        def member(g: Group) -> None:
            try:
                g.close()
            except BaseException as exc:
                errors.append(exc)
            finally:
                if g.rank == 0:
                    rank0_closed.set()

        threads = [threading.Thread(target=member, args=(g,)) for g in (g0, g1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a member hung in close()"
        assert errors == []
        assert not c0.list(f".collectives/{name}/")
