"""The planner (irdma/client/planner.py): pieces, wire slices, stamps, txns and replica
choice, decided before anything is sent. Pure: no daemons (placement is pure)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from irdma.cli.local import write_config
from irdma.client.planner import (
    Spread,
    batch_wire,
    slices,
    update_txn,
    whole_write_stamp,
    wire_for,
)
from irdma.client.routing import Router
from irdma.client.session import Session
from irdma.client.stamps import StampClock
from irdma.cluster import load_config
from irdma.errors import DtypeMismatch
from irdma.narrowing import wire_code
from irdma.protocol import Op, TensorMeta

SHARD = 4096


def meta(name: str = "p/w", n: int = 10_000, dtype: str = "float32") -> TensorMeta:
    return TensorMeta(name, dtype, (n,), SHARD)


def router_for(tmp_path: Path, nodes: int, replicas: int) -> Router:
    path = write_config(tmp_path, nodes, replicas=replicas, ports=list(range(7101, 7101 + nodes)))
    config = load_config(path)
    # A session never opened: the router only reads its clock here.
    session = Session(config, timeout=1.0, transport="tcp", shared=None)
    return Router(session.in_force, config.timeout, session)


def test_slices_cover_the_range_shard_by_shard() -> None:
    m = meta()  # 40000 bytes: 10 shards, the last one short
    cut = slices(m, 100, m.nbytes - 100)
    assert [s.shard for s in cut] == list(range(10))
    assert cut[0].piece.shard_offset == 100 and cut[0].start == 0
    assert sum(s.length for s in cut) == m.nbytes - 100
    # Each slice's bytes follow the one before in the buffer.
    assert all(b.start == a.start + a.length for a, b in itertools.pairwise(cut))


def test_wire_slices_count_wire_bytes_while_pieces_count_the_tensors() -> None:
    m = meta()
    code = wire_code("float16")
    cut = slices(m, 0, m.nbytes // 2, code)  # the buffer holds float16 values
    assert sum(s.piece.length for s in cut) == m.nbytes
    assert [s.length for s in cut] == [s.piece.length // 2 for s in cut]
    assert [s.start for s in cut] == [s.piece.buf_offset // 2 for s in cut]


def test_the_wire_dtype_is_decided_per_tensor() -> None:
    f16 = wire_code("float16")
    assert wire_for(meta(), 0) == 0
    assert wire_for(meta(), f16) == f16
    assert wire_for(meta(dtype="float16"), f16) == 0  # already that dtype: nothing to narrow
    with pytest.raises(DtypeMismatch, match="p/i"):
        wire_for(meta("p/i", dtype="int32"), f16)


def test_a_batch_with_a_wire_dtype_names_the_tensor_that_is_not_wider() -> None:
    f16 = wire_code("float16")
    assert batch_wire([meta("p/a"), meta("p/b")], f16) == f16
    with pytest.raises(DtypeMismatch, match="'p/h' is float16 already"):
        batch_wire([meta("p/a"), meta("p/h", dtype="float16")], f16)


def test_only_a_whole_write_over_several_shards_is_stamped() -> None:
    m = meta()
    clock = StampClock()
    whole = slices(m, 0, m.nbytes)
    stamps = {whole_write_stamp(Op.WRITE, m, whole, clock) for _ in range(8)}
    assert len(stamps) == 8 and not stamps & {0, 1}  # fresh, never "none" or UNSTAMPED
    assert whole_write_stamp(Op.WRITE, m, slices(m, 4, m.nbytes - 4), clock) == 0
    assert whole_write_stamp(Op.ACCUMULATE, m, whole, clock) == 0
    one = meta(n=100)
    assert whole_write_stamp(Op.WRITE, one, slices(one, 0, one.nbytes), clock) == 0


def test_updates_carry_a_txn_only_where_daemons_replicate() -> None:
    assert update_txn(False) == 0
    txns = {update_txn(True) for _ in range(8)}
    assert len(txns) == 8 and 0 not in txns


async def test_reads_of_a_call_spread_over_the_replicas_by_bytes(tmp_path: Path) -> None:
    router = router_for(tmp_path, 4, 2)
    spread = Spread(router, to_primary=False)
    # Two tensors of one call share the load: together they spread evenly.
    for m in (meta("p/a", 32 * SHARD // 4), meta("p/b", 32 * SHARD // 4)):
        for s in slices(m, 0, m.nbytes):
            order = spread.order(m.key, s.piece)
            assert set(order) == set(router.in_force.config.replicas_for(m.key, s.shard))
    assert sum(spread.load.values()) == 64 * SHARD
    assert max(spread.load.values()) <= (64 // 4 + 1) * SHARD, spread.load


async def test_updates_start_where_the_router_says_the_primary_is(tmp_path: Path) -> None:
    router = router_for(tmp_path, 3, 2)
    m = meta()
    piece = slices(m, 0, m.nbytes)[0].piece
    replicas = router.in_force.config.replicas_for(m.key, piece.shard)
    spread = Spread(router, to_primary=True)
    assert spread.order(m.key, piece)[0] == replicas[0]
    router.primary_hint[replicas[0].name] = replicas[1]  # the backup took over
    assert spread.order(m.key, piece)[0] == replicas[1]
    assert spread.load == {}  # updates are not spread


def test_slices_refuse_a_range_outside_the_tensor() -> None:
    m = meta()
    with pytest.raises(ValueError, match="outside"):
        slices(m, 8, m.nbytes)
