"""Tensors on a device (CUDA) and torch tensors where the client takes arrays.

The client moves host memory. ``Transfers`` (one per client) turns what a
user hands it into that:

- a numpy array (or anything numpy reads) is passed on as it is;
- a torch tensor on the CPU, C-contiguous, is viewed as a numpy array of
  the same dtype (bfloat16 and float8 through ``irdma.dtypes``): no copy;
- anything else (a CUDA tensor, a non-contiguous CPU tensor, an object with
  ``__cuda_array_interface__`` or DLPack, read through torch) is copied into
  host memory the client owns: a room of the client's shared region when it
  has one (same-host daemons copy a write straight from there), else a host
  buffer (pinned, where CUDA is present). On CUDA the shared region is
  registered with the driver as pinned memory, so the device-to-host copy
  lands there by DMA and the push leaves from it with no further copy.

A read into such a tensor (``out=``) reads into host memory the same way and
then copies the bytes to the device (``land``): on CUDA on a side stream
that the caller's current stream then waits for, without the host waiting.

The copies go through a ``Copies`` of the tensor's device: ``CudaCopies``
queues them on a stream and hands back an event; ``CpuCopies`` copies at
once and hands back ``DONE``. Everything above it is the same code for both,
which is what the tests run on a machine without a GPU.

torch is imported only when a tensor arrives: irdma without torch works as before.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .transport.shared import SharedMemoryFull, SharedRegion

if TYPE_CHECKING:
    import torch


class Ready(Protocol):
    """Work queued on a device (an event): ``synchronize`` waits for it on the host."""

    def synchronize(self) -> None: ...

    def query(self) -> bool: ...


class _Done:
    """Work that is done already (a CPU copy)."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


DONE: Ready = _Done()


def _torch() -> Any:
    """torch if this process has imported it (a tensor can only come from a loaded torch)."""
    return sys.modules.get("torch")


def is_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor."""
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def is_device_array(obj: Any) -> bool:
    """Whether ``obj`` needs ``Transfers``: a torch tensor, or an array offering
    ``__cuda_array_interface__``, or DLPack and nothing numpy reads (an object numpy
    converts itself, a JAX CPU array say, is left to numpy as before)."""
    if isinstance(obj, np.ndarray | bytes | bytearray | memoryview):
        return False
    return (
        is_tensor(obj)
        or hasattr(obj, "__cuda_array_interface__")
        or (
            hasattr(obj, "__dlpack__")
            and not hasattr(obj, "__array_interface__")
            and not hasattr(obj, "__array__")
        )
    )


def as_tensor(obj: Any) -> torch.Tensor:
    """``obj`` as a torch tensor sharing its memory."""
    if is_tensor(obj):
        return obj
    try:
        import torch
    except ImportError:
        raise TypeError(
            f"a {type(obj).__name__} (a device array) needs torch to be moved: "
            "install the 'torch' extra, or pass a numpy array"
        ) from None
    if hasattr(obj, "__cuda_array_interface__"):
        return torch.as_tensor(obj)  # on the device the interface's pointer is on
    return torch.from_dlpack(obj)


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a torch dtype is stored as (bfloat16 and float8 via ml_dtypes)."""
    from .torch.arrays import numpy_dtype as of

    return of(dtype)


def cpu_view(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous CPU tensor as a numpy array over the same memory."""
    from .torch.arrays import to_numpy

    return to_numpy(t)


# -- copies on a device ---------------------------------------------------------------


class CpuCopies:
    """Copies between CPU tensors: done when the call returns."""

    def mark(self) -> Ready:
        return DONE

    @contextlib.contextmanager
    def side(self, after: Ready = DONE, *, down: bool = False) -> Iterator[None]:
        yield

    def to_host(self, src: torch.Tensor, dst: torch.Tensor) -> Ready:
        dst.copy_(src)
        return DONE

    def to_device(self, src: torch.Tensor, dst: torch.Tensor) -> Ready:
        dst.copy_(src)
        return DONE

    def wait_here(self, ready: Ready, tensors: list[torch.Tensor] | tuple = ()) -> None:
        return None


class CudaCopies:
    """Copies to and from one CUDA device on side streams of this object's, ordered
    against the caller's current stream with events (the host never waits here).

    Two side streams: ``up`` (work before a copy to the host: encoding, the
    copy) and ``down`` (a copy to the device and what decodes it), so a pull
    landing never queues behind a push still waiting for its gradients, and
    the two directions use both copy engines.
    """

    def __init__(self, device: torch.device) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.up = torch.cuda.Stream(device)
        self.down = torch.cuda.Stream(device)

    def _current(self) -> Any:
        return self.torch.cuda.current_stream(self.device)

    def mark(self) -> Ready:
        """An event after the work queued so far on the current stream (gradients done)."""
        ev = self.torch.cuda.Event()
        ev.record(self._current())
        return ev

    @contextlib.contextmanager
    def side(self, after: Ready = DONE, *, down: bool = False) -> Iterator[None]:
        """Run the block's device work on a side stream (``down``: the one landing
        copies to the device), after ``after``."""
        s = self.down if down else self.up
        if after is not DONE:
            s.wait_event(after)  # type: ignore[arg-type]
        with self.torch.cuda.stream(s):
            yield

    def to_host(self, src: torch.Tensor, dst: torch.Tensor) -> Ready:
        s = self.up
        if self._current() != s:
            s.wait_stream(self._current())
        with self.torch.cuda.stream(s):
            dst.copy_(src, non_blocking=True)
        src.record_stream(s)  # its memory is not reused before the copy has read it
        ev = self.torch.cuda.Event()
        ev.record(s)
        return ev

    def to_device(self, src: torch.Tensor, dst: torch.Tensor) -> Ready:
        s, cur = self.down, self._current()
        if cur != s:
            s.wait_stream(cur)  # dst may still be read by earlier work there
        with self.torch.cuda.stream(s):
            dst.copy_(src, non_blocking=True)
        ev = self.torch.cuda.Event()
        ev.record(s)
        if cur != s:
            cur.wait_event(ev)
        return ev

    def wait_here(self, ready: Ready, tensors: list[torch.Tensor] | tuple = ()) -> None:
        """The current stream waits for ``ready``; ``tensors`` (made on the side stream)
        are kept from reuse until the current stream is done with them."""
        cur = self._current()
        if ready is not DONE:
            cur.wait_event(ready)
        for t in tensors:
            t.record_stream(cur)


_CPU = CpuCopies()
_cuda: dict[Any, CudaCopies] = {}
_cuda_lock = threading.Lock()


def copies_for(t: torch.Tensor) -> CpuCopies | CudaCopies:
    """The copies of ``t``'s device (one pair of side streams per CUDA device, per process)."""
    if t.device.type == "cpu":
        return _CPU
    if t.device.type != "cuda":
        raise ValueError(f"tensors on {t.device.type} are not supported (cpu and cuda are)")
    with _cuda_lock:
        c = _cuda.get(t.device)
        if c is None:
            c = _cuda[t.device] = CudaCopies(t.device)
        return c


# -- host memory the client owns --------------------------------------------------------


_registered: weakref.WeakSet[SharedRegion] = weakref.WeakSet()
_registered_lock = threading.Lock()


def _pin_region(region: SharedRegion) -> None:
    """Register the shared region with CUDA as pinned memory (once per region)."""
    import torch

    with _registered_lock:
        if region in _registered:
            return
        cudart = torch.cuda.cudart()
        err = cudart.cudaHostRegister(region.address, region.size, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of the shared region failed: {err}")
        _registered.add(region)
        # Before the mapping goes (the region's own finalizer runs after this one).
        weakref.finalize(region, cudart.cudaHostUnregister, region.address)


class Transfers:
    """A client's moves of tensors through host memory it owns (see the module docstring).

    ``shared``: the client's shared region, where staged bytes go first.
    """

    def __init__(self, shared: SharedRegion | None) -> None:
        self.shared = shared
        self._landing: list[tuple[Ready, Any]] = []  # host buffers of copies in flight
        self._lock = threading.Lock()

    def host_empty(self, shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
        """A host tensor for staging: in the shared region if there is room, else
        (pinned where ``pinned``) host memory."""
        import torch

        from .torch.arrays import from_numpy

        if self.shared is not None:
            nbytes = (
                int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
            )
            try:
                room = self.shared.empty(nbytes)
            except SharedMemoryFull:
                pass
            else:
                if pinned:
                    _pin_region(self.shared)
                return from_numpy(room.view(numpy_dtype(dtype)).reshape(shape))
        return torch.empty(shape, dtype=dtype, pin_memory=pinned)

    def source(self, obj: Any) -> Any:
        """What the client sends for ``obj``: ``obj`` itself unless it is a tensor (see
        the module docstring). A device's bytes are on the host when this returns."""
        if not is_device_array(obj):
            return obj
        host, ready = self.stage(as_tensor(obj))
        ready.synchronize()
        return host

    def stage(self, t: torch.Tensor) -> tuple[np.ndarray, Ready]:
        """``t``'s bytes as a host array, and the copy to wait for before reading it
        (queued on the current stream's side stream; DONE for a CPU tensor)."""
        t = t.detach()
        if t.device.type == "cpu" and t.is_contiguous():
            return cpu_view(t), DONE
        copies = copies_for(t)
        host = self.host_empty(tuple(t.shape), t.dtype, pinned=t.device.type == "cuda")
        return cpu_view(host), copies.to_host(t, host)

    def sink(self, out: Any) -> tuple[Any, Callable[[], Any] | None]:
        """Where the client reads for ``out``, and what lands it there afterwards
        (None: it reads into ``out``'s own memory)."""
        if not is_device_array(out):
            return out, None
        t = as_tensor(out)
        if t.device.type == "cpu" and t.is_contiguous():
            return cpu_view(t), None
        copies = copies_for(t)
        host = self.host_empty(tuple(t.shape), t.dtype, pinned=t.device.type == "cuda")

        def land() -> Any:
            ready = copies.to_device(host, t)
            self._keep(ready, host)
            return out

        return cpu_view(host), land

    def put(self, out: Any, array: np.ndarray) -> Any:
        """Copy a host ``array`` into tensor ``out`` (same shape and dtype); return ``out``."""
        host, land = self.sink(out)
        if host.shape != array.shape or host.dtype != array.dtype:
            raise ValueError(
                f"out has shape {tuple(host.shape)} and dtype {host.dtype}; the result "
                f"has shape {array.shape} and dtype {array.dtype}"
            )
        np.copyto(host, array)
        return out if land is None else land()

    def _keep(self, ready: Ready, host: Any) -> None:
        """Hold ``host`` until the copy from it is done (it may be queued on a stream)."""
        if ready is DONE:
            return
        with self._lock:
            self._landing = [(r, h) for r, h in self._landing if not r.query()]
            self._landing.append((ready, host))
