"""Floats on the wire narrower than stored: the conversions, and real daemons summing wide."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from irdma import Client
from irdma import narrowing as nw
from irdma.errors import DtypeMismatch
from irdma.protocol import DTYPE_CODES, WIRE_BFLOAT16, tensor_key

from .helpers.cluster import Cluster, make_cluster

FP16 = DTYPE_CODES["float16"]


def torch_bf16_bits(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def test_bfloat16_rounds_as_torch_does() -> None:
    x = np.random.default_rng(0).standard_normal(200_000).astype(np.float32)
    # Ties, the largest finite values (round up to inf), infinities, signed zero, subnormals.
    x[:8] = [1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.4e38, -3.4e38, np.inf, -np.inf, -0.0, 1e-40]
    assert np.array_equal(nw.narrow(x, WIRE_BFLOAT16), torch_bf16_bits(x))


def test_bfloat16_nan_stays_nan() -> None:
    bits = np.array([0x7FC00000, 0xFF800001, 0x7F800001], dtype=np.uint32)
    back = np.empty(3, np.float32)
    nw.widen_into(nw.narrow(bits.view(np.float32), WIRE_BFLOAT16), WIRE_BFLOAT16, back)
    assert np.isnan(back).all()


@pytest.mark.parametrize("stored", [np.float32, np.float64])
@pytest.mark.parametrize("code", [FP16, WIRE_BFLOAT16])
def test_widening_is_exact(stored: type, code: int) -> None:
    x = np.random.default_rng(1).standard_normal(10_000).astype(stored)
    held = nw.narrow(x, code)
    out = np.empty_like(x)
    nw.widen_into(held, code, out)
    if code == FP16:
        expect = x.astype(np.float16).astype(stored)
    else:
        expect = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).to(torch.float64)
        expect = expect.numpy().astype(stored)
    assert np.array_equal(out, expect)


def test_only_narrower_floats_may_stand_for_a_tensor() -> None:
    assert nw.check(np.dtype("<f4"), FP16) == np.dtype("<f2")
    for stored in ("<f2", "<i4", "<c8"):
        with pytest.raises(ValueError, match="narrower float"):
            nw.check(np.dtype(stored), FP16)
    with pytest.raises(ValueError, match="unknown wire dtype"):
        nw.wire_code("int8")


# -- through real daemons ------------------------------------------------------------------


@pytest.fixture(params=["tcp", "shm"])
def any_client(cluster: Cluster, request: pytest.FixtureRequest) -> Client:
    with Client(cluster.config_path, transport=request.param) as c:
        yield c


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_sums_are_kept_wide_on_the_daemon(any_client: Client, wire: str) -> None:
    """Deltas sent narrow are added in float32: 2048 + 1 + 1 + 1 + 1 is 2052, which float16
    (and bfloat16, at 256 + 1 ...) could not hold while summing."""
    c = any_client
    big = 2048.0 if wire == "float16" else 256.0
    # Three shards of 256 KiB, spread over the daemons; over shm their narrowed
    # 128 KiB payloads go through the staging memory (STAGED), not the socket.
    name = f"narrow/sum-{wire}"
    n = 3 * 65536
    c.create(name, (n,), np.float32, exist_ok=True, replace=True, shard_size=256 << 10)
    c.write(name, np.zeros(n, np.float32))
    c.accumulate(name, np.full(n, big, np.float32), wire=wire)
    for _ in range(4):
        c.accumulate(name, np.ones(n, np.float32), wire=wire)
    assert np.array_equal(c.read(name), np.full(n, big + 4, np.float32))
    conns = list(c.async_client.session.conns.values())
    if {k.transport for k in conns} == {"shm"}:
        # Five narrowed pushes of three 128 KiB shard payloads, through staging memory.
        assert sum(k.bulk.staged_bytes for k in conns) >= 5 * 3 * (128 << 10)
    # A narrowed read rounds the answer once, at the end.
    narrowed = c.read(name, wire=wire)
    expect = np.full(n, big + 4, np.float32)
    if wire == "float16":
        expect = expect.astype(np.float16).astype(np.float32)
    else:
        expect = torch.from_numpy(expect).to(torch.bfloat16).float().numpy()
    assert narrowed.dtype == np.float32
    assert np.array_equal(narrowed, expect)


def test_batched_forms_narrow_too(any_client: Client) -> None:
    c = any_client
    rng = np.random.default_rng(2)
    names = [f"narrow/batch{i}" for i in range(5)]
    start = {n: rng.standard_normal(1000 * (i + 1)).astype(np.float32) for i, n in enumerate(names)}
    c.write_many(start)
    deltas = {n: rng.standard_normal(a.size).astype(np.float32) for n, a in start.items()}
    c.accumulate_many(deltas, alpha=0.5, wire="bfloat16")
    got = c.read_many(names)
    for n in names:
        sent = torch.from_numpy(deltas[n]).to(torch.bfloat16).float().numpy()
        assert np.array_equal(got[n], start[n] + np.float32(0.5) * sent)
    narrow = c.read_many(names, wire="float16")
    for n in names:
        assert np.array_equal(narrow[n], got[n].astype(np.float16).astype(np.float32))


def test_a_delta_already_narrowed_is_sent_as_it_is(client: Client) -> None:
    client.write("narrow/pre", np.zeros(100, np.float32))
    bits = torch_bf16_bits(np.full(100, 1.5, np.float32))
    client.accumulate("narrow/pre", bits, wire="bfloat16")
    client.accumulate("narrow/pre", np.full(100, 0.25, np.float16), wire="float16")
    assert np.array_equal(client.read("narrow/pre"), np.full(100, 1.75, np.float32))


def test_a_wire_dtype_that_cannot_stand_for_the_tensor_is_refused(client: Client) -> None:
    client.write("narrow/ints", np.arange(10, dtype=np.int32))
    with pytest.raises(DtypeMismatch, match="narrower float"):
        client.accumulate("narrow/ints", np.ones(10, np.int32), wire="float16")
    with pytest.raises(DtypeMismatch, match="narrower float"):
        client.read("narrow/ints", wire="bfloat16")
    with pytest.raises(DtypeMismatch):
        client.accumulate_many({"narrow/ints": np.ones(10, np.int32)}, wire="float16")
    assert np.array_equal(client.read("narrow/ints"), np.arange(10, dtype=np.int32))


def test_the_float16_tensor_itself_needs_no_wire(client: Client) -> None:
    """wire equal to the tensor's own dtype is the plain path."""
    client.write("narrow/half", np.zeros(10, np.float16))
    client.accumulate("narrow/half", np.ones(10, np.float16), wire="float16")
    assert np.array_equal(client.read("narrow/half", wire="float16"), np.ones(10, np.float16))


def test_backups_get_the_widened_delta(tmp_path: Path) -> None:
    """Two daemons, every shard on both: with the primary gone, the backup's copy
    holds the float32 sum of the narrowed pushes, not a float16 one."""
    c2 = make_cluster(tmp_path, 2, replicas=2, timeout=2.0)
    try:
        with c2.client() as c:
            n = 3 * 16384
            c.write("narrow/replicated", np.full(n, 2048.0, np.float32))
            for _ in range(3):
                c.accumulate("narrow/replicated", np.ones(n, np.float32), wire="float16")
            primary = c.config.replicas_for(tensor_key("narrow/replicated"), 0)[0]
            c2.kill(primary.name)
            assert np.array_equal(c.read("narrow/replicated"), np.full(n, 2051.0, np.float32))
    finally:
        c2.close()
