"""torch tensors where the client takes arrays (``irdma.devices``), with real daemons.

On a machine without a GPU these run the same code a CUDA tensor takes with
CPU tensors: contiguous ones are viewed without a copy; non-contiguous ones
(and any device's) are staged through host memory the client owns (its
shared region when it has one) and landed back by ``Copies``. The CUDA copies
themselves run only in bench/gpu_check.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the 'torch' extra)")

from irdma import Client  # noqa: E402
from irdma.devices import DONE, CpuCopies, Transfers, copies_for, is_device_array  # noqa: E402
from irdma.errors import DtypeMismatch, ShapeMismatch  # noqa: E402
from irdma.torch.arrays import numpy_dtype, to_numpy  # noqa: E402

from .conftest import Cluster  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.uint8]
if hasattr(torch, "float8_e4m3fn"):
    DTYPES.append(torch.float8_e4m3fn)


def uniq(prefix: str) -> str:
    return f"devices/{prefix}/{uuid.uuid4().hex[:8]}"


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 4).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return to_numpy(a).tobytes() == to_numpy(b).tobytes()


@pytest.fixture
def shared_client(cluster: Cluster) -> Iterator[Client]:
    c = Client(cluster.config_path, transport="shm", shared_memory="16MiB")
    try:
        yield c
    finally:
        c.close()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensors_are_written_and_read_back_bit_for_bit(client: Client, dtype: torch.dtype) -> None:
    name = uniq("dtypes")
    t = sample(dtype, (300, 70))  # spans shards of 64 KiB on every daemon
    client.write(name, t)
    info = client.stat(name)
    assert (info.dtype, info.shape) == (numpy_dtype(dtype).name, (300, 70))
    out = torch.empty_like(t)
    got = client.read(name, out=out)
    assert got is out
    assert same_bytes(out, t)
    # read without out still hands back numpy, the tensor's numpy twin
    assert client.read(name).tobytes() == to_numpy(t).tobytes()


def test_a_read_into_a_tensor_of_another_dtype_or_shape_is_refused(client: Client) -> None:
    name = uniq("refused")
    client.write(name, torch.arange(12, dtype=torch.float32))
    before = torch.full((12,), 7.0, dtype=torch.float64)
    with pytest.raises(DtypeMismatch):
        client.read(name, out=before)
    with pytest.raises(ShapeMismatch):
        client.read(name, out=torch.empty(3, 4))
    assert torch.equal(before, torch.full((12,), 7.0, dtype=torch.float64))
    assert np.array_equal(client.read(name), np.arange(12, dtype=np.float32))


def test_non_contiguous_tensors_are_staged_and_landed(client: Client) -> None:
    name = uniq("strided")
    base = sample(torch.float32, (64, 48), seed=1)
    client.write(name, base.t())  # a transposed view: staged, stored in C order
    assert np.array_equal(client.read(name), base.t().contiguous().numpy())
    holder = torch.zeros(48, 64 * 2)
    out = holder[:, ::2]  # every other column: not contiguous
    assert client.read(name, out=out) is out
    assert torch.equal(out, base.t())
    assert torch.count_nonzero(holder[:, 1::2]) == 0  # nothing outside the view was touched


def test_staged_bytes_go_through_the_clients_shared_region(shared_client: Client) -> None:
    transfers = shared_client._client.transfers
    region = shared_client._client.shared
    t = sample(torch.bfloat16, (128, 32), seed=2).t()
    host = transfers.source(t)
    assert region.offset_of(host) is not None
    assert host.tobytes() == to_numpy(t.contiguous()).tobytes()
    name = uniq("shared")
    shared_client.write(name, t)
    out = torch.empty(128, 32, dtype=torch.bfloat16).t()  # a strided out of the same shape
    shared_client.read(name, out=out)
    assert torch.equal(out, t)


def test_a_full_shared_region_falls_back_to_host_memory(cluster: Cluster) -> None:
    with Client(cluster.config_path, transport="shm", shared_memory="64KiB") as c:
        t = sample(torch.float32, (256, 256), seed=3).t()  # 256 KiB: no room for it
        host = c._client.transfers.source(t)
        assert c._client.shared.offset_of(host) is None
        name = uniq("full")
        c.write(name, t)
        assert np.array_equal(c.read(name), t.contiguous().numpy())


def test_accumulate_takes_tensors_and_narrows_them_on_the_wire(client: Client) -> None:
    name = uniq("acc")
    start = sample(torch.float32, (40, 40), seed=4)
    delta = sample(torch.float32, (40, 40), seed=5)
    client.write(name, start)
    client.accumulate(name, delta.t(), alpha=0.5)  # staged: a transposed view
    expect = start + 0.5 * delta.t()
    assert torch.allclose(client.read(name, out=torch.empty(40, 40)), expect)
    client.accumulate(name, delta, wire="bfloat16")
    rounded = delta.to(torch.bfloat16).to(torch.float32)
    assert torch.allclose(client.read(name, out=torch.empty(40, 40)), expect + rounded)
    # a bfloat16 tensor is a delta already on the wire's dtype
    client.accumulate(name, -delta.to(torch.bfloat16), wire="bfloat16")
    assert torch.allclose(client.read(name, out=torch.empty(40, 40)), expect, atol=1e-5)


def test_batched_calls_and_read_into_take_tensors(client: Client) -> None:
    p = uniq("batch")
    tensors = {f"{p}/{i}": sample(dt, (17, 3), seed=i) for i, dt in enumerate(DTYPES)}
    client.write_many(tensors)
    outs = {n: torch.empty_like(t) for n, t in tensors.items()}
    client.read_into(outs)
    for n, t in tensors.items():
        assert same_bytes(outs[n], t), n
    floats = {n: t for n, t in tensors.items() if t.dtype in (torch.float32, torch.float64)}
    client.accumulate_many({n: torch.ones_like(t) for n, t in floats.items()}, alpha=2.0)
    strided = {n: torch.empty(3, 17, dtype=t.dtype).t() for n, t in floats.items()}
    client.read_into(strided)
    for n, t in floats.items():
        assert torch.equal(strided[n], t + 2), n


class DLPackOnly:
    """A producer that offers its memory only through DLPack (as JAX or CuPy arrays do)."""

    def __init__(self, t: torch.Tensor) -> None:
        self._t = t

    def __dlpack__(self, **kwargs: object) -> object:
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._t.__dlpack_device__()


def test_dlpack_arrays_are_accepted(client: Client) -> None:
    t = sample(torch.float32, (5, 9), seed=6)
    src = DLPackOnly(t)
    assert is_device_array(src)
    name = uniq("dlpack")
    client.write(name, src)
    out = DLPackOnly(torch.zeros(5, 9))
    assert client.read(name, out=out) is out
    assert torch.equal(out._t, t)


def test_arrays_and_bytes_are_not_taken_for_tensors() -> None:
    for obj in (np.zeros(3), b"abc", bytearray(3), memoryview(b"x"), [1, 2], None):
        assert not is_device_array(obj)
    transfers = Transfers(None)
    a = np.zeros(3)
    assert transfers.source(a) is a
    assert transfers.sink(a) == (a, None)


def test_cpu_copies_are_done_at_once() -> None:
    t = torch.arange(6.0)
    copies = copies_for(t)
    assert isinstance(copies, CpuCopies)
    dst = torch.empty(6)
    assert copies.to_host(t, dst) is DONE and torch.equal(dst, t)
    with pytest.raises(ValueError, match="meta"):
        copies_for(torch.empty(2, device="meta"))
