"""torch tensors where the client takes arrays (``irdma.devices``), with real daemons.

On a machine without a GPU these run the same code a CUDA tensor takes with
CPU tensors: contiguous ones are viewed without a copy; non-contiguous ones
(and any device's) are staged through host memory the client owns (its
shared region when it has one) and landed back by ``Copies``. The CUDA copies
themselves run only in bench/gpu_check.py.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the 'torch' extra)")

from irdma import Client  # noqa: E402
from irdma.devices import DONE, CpuCopies, Transfers, copies_for, is_device_array  # noqa: E402
from irdma.errors import DtypeMismatch, ShapeMismatch  # noqa: E402
from irdma.torch import (  # noqa: E402
    BF16,
    FP16,
    NONE,
    Compression,
    DistributedOptimizer,
    Reducer,
    pull_state_dict,
    push_state_dict,
)
from irdma.torch.arrays import numpy_dtype, to_numpy  # noqa: E402
from irdma.training.collectives import Group  # noqa: E402

from .helpers.cluster import Cluster  # noqa: E402

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
    transfers = shared_client.async_client.transfers
    region = shared_client.async_client.shared
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
        host = c.async_client.transfers.source(t)
        assert c.async_client.shared.offset_of(host) is None
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


# -- irdma.torch through the same paths ---------------------------------------------------


def two_workers(cluster: Cluster, fn: Callable[[int, Client], object]) -> list[object]:
    """``fn(rank, client)`` for ranks 0 and 1 on threads of their own, each with a client."""
    results: list[object] = [None, None]
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            with Client(cluster.config_path, transport="shm", shared_memory="8MiB") as c:
                results[rank] = fn(rank, c)
        except Exception as exc:  # handed to the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    return results


def grads_of(rank: int) -> list[torch.Tensor]:
    """A float32 matrix, a transposed (strided) one, and a bfloat16 vector."""
    g = torch.Generator().manual_seed(rank)
    return [
        torch.randn(30, 20, generator=g),
        torch.randn(12, 9, generator=g).t(),
        torch.randn(50, generator=g).to(torch.bfloat16),
    ]


@pytest.mark.parametrize("compression", [NONE, FP16, BF16, Compression.topk(1.0)], ids=str)
def test_the_reducer_averages_cpu_tensors_of_two_workers(
    cluster: Cluster, compression: Compression
) -> None:
    name = uniq("reducer").replace("/", "-")

    def work(rank: int, c: Client) -> list[torch.Tensor]:
        with Reducer(c, name, rank=rank, world_size=2) as r:
            # Each gradient its own key: one bucket is one wire dtype.
            futs = [r.reduce(f"g{i}", [t], compression) for i, t in enumerate(grads_of(rank))]
            return [f.result(30)[0] for f in futs]

    got = two_workers(cluster, work)
    assert all(torch.equal(a, b) for a, b in zip(got[0], got[1], strict=True))  # type: ignore[arg-type]
    for mine, a, b in zip(got[0], grads_of(0), grads_of(1), strict=True):  # type: ignore[arg-type]
        assert mine.dtype == a.dtype and mine.shape == a.shape
        want = (a.float() + b.float()) / 2
        tol = 2e-2 if compression in (FP16, BF16) or a.dtype == torch.bfloat16 else 1e-6
        assert torch.allclose(mine.float(), want, atol=tol, rtol=tol)


def test_a_reduction_of_tensors_on_two_devices_is_refused(cluster: Cluster) -> None:
    with Client(cluster.config_path) as c:
        r = Reducer(c, uniq("devices").replace("/", "-"), rank=0, world_size=1)
        try:
            with pytest.raises(ValueError, match="several devices"):
                r.reduce("mixed", [torch.ones(2), torch.ones(2, device="meta")])
        finally:
            r.close()


def test_distributed_optimizer_with_a_strided_parameter(cluster: Cluster) -> None:
    """Two workers, two buckets (one bfloat16), the sums written into every p.grad."""
    name = uniq("opt").replace("/", "-")

    def work(rank: int, c: Client) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(5, 8).t())  # strided: its gradient is too
        b = torch.nn.Parameter(torch.randn(8, dtype=torch.bfloat16))
        params = [("w", w), ("b", b)]
        opt = DistributedOptimizer(
            torch.optim.SGD([w, b], lr=0.0), params, client=c, name=name, rank=rank, world_size=2
        )
        x = torch.full((3, 5), float(rank + 1))
        (x @ w.t() + b.float()).sum().backward()
        opt.synchronize()
        got = {"w": w.grad.clone(), "b": b.grad.clone()}
        opt.step()
        opt.close()
        return got

    got = two_workers(cluster, work)
    # d/dw of sum(x @ w.t()) is 3*(rank+1) everywhere: the average is 4.5.
    for g in got:
        assert torch.equal(g["w"], torch.full((8, 5), 4.5))  # type: ignore[index]
        assert torch.equal(g["b"], torch.full((8,), 3.0, dtype=torch.bfloat16))  # type: ignore[index]


def test_pull_state_dict_loads_into_the_modules_own_tensors(client: Client) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.BatchNorm1d(256))
    prefix = uniq("state")
    push_state_dict(client, prefix, model)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    where = {k: v.data_ptr() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for v in model.state_dict().values():
            v.zero_()
    pull_state_dict(client, prefix, model)
    for k, v in model.state_dict().items():
        assert torch.equal(v, want[k]), k
        assert v.data_ptr() == where[k], k  # loaded in place


def test_without_torch_a_device_array_is_refused_by_name(cluster: Cluster) -> None:
    """irdma without torch: arrays work as before; a DLPack-only object gets a clear error."""
    script = f"""
import sys
sys.modules["torch"] = None  # as if torch were not installed
import numpy as np
from irdma import Client

class DLPackOnly:
    def __dlpack__(self, **kw): raise AssertionError("not reached")
    def __dlpack_device__(self): return (1, 0)

with Client({str(cluster.config_path)!r}) as c:
    c.write("devices/notorch", np.arange(5.0))
    assert c.read("devices/notorch").tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    try:
        c.write("devices/notorch", DLPackOnly())
    except TypeError as exc:
        print(exc)
"""
    got = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "DLPackOnly (a device array) needs torch" in got.stdout, got.stdout + got.stderr


def test_collectives_take_tensors_and_land_results_in_them(cluster: Cluster) -> None:
    name = uniq("group").replace("/", "-")

    def work(rank: int, c: Client) -> dict[str, object]:
        g = Group(c, name, rank=rank, world_size=2)
        mine = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1)
        summed = g.allreduce(mine)
        out = torch.zeros(4, 3 * 2)[:, ::2].t()  # a strided (3, 4) view
        meaned = g.allreduce(mine.t().contiguous().t(), "mean", out=out)
        bf = g.broadcast(
            torch.full((5,), 1.5 + rank, dtype=torch.bfloat16) if rank == 1 else None, 1
        )
        into = torch.empty(2, 3, dtype=torch.int64)
        gathered = g.gather(torch.full((3,), rank, dtype=torch.int64), 0, out=into)
        g.close()
        return {"sum": summed, "mean": meaned, "out": out, "bf": bf, "gathered": gathered}

    got = two_workers(cluster, work)
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    for rank, r in enumerate(got):
        assert isinstance(r, dict)
        assert np.array_equal(r["sum"], base * 3)
        assert r["mean"] is r["out"] and torch.equal(r["out"], torch.from_numpy(base * 1.5))
        assert to_numpy(torch.full((5,), 2.5, dtype=torch.bfloat16)).tobytes() == r["bf"].tobytes()
        if rank == 0:
            assert torch.equal(r["gathered"], torch.tensor([[0, 0, 0], [1, 1, 1]]))
        else:
            assert r["gathered"] is None


class DLPackAndArray(DLPackOnly):
    """DLPack and ``__array__`` (as a JAX CPU array): numpy converts it, as before."""

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        return self._t.numpy()


def test_an_array_numpy_converts_itself_is_left_to_numpy(client: Client) -> None:
    t = sample(torch.float32, (4, 4), seed=7)
    obj = DLPackAndArray(t)
    assert not is_device_array(obj)
    assert Transfers(None).source(obj) is obj
    name = uniq("array")
    client.write(name, obj)
    assert np.array_equal(client.read(name), t.numpy())
