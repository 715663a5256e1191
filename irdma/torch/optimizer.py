"""``DistributedOptimizer``: any torch.optim optimizer, gradients summed through irdma.

    opt = DistributedOptimizer(torch.optim.Adam(model.parameters()), model.named_parameters())
    opt.broadcast_parameters()            # every worker starts from rank 0's weights
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # each gradient is pushed as soon as it is ready
        opt.step()                        # waits for the sums, then steps locally
    opt.close()

As in Horovod and BytePS the optimizer's state (momenta, Adam's moments)
stays on the worker; only gradients travel. Gradients are grouped into
buckets as DDP does (in reverse parameter order, about the order the
backward pass produces them, up to ``bucket_bytes`` each): a hook on every
parameter notes when autograd has finished its gradient, and the moment a
bucket's last one is done the bucket goes to the reducer's push thread, so
the sums travel while the backward pass goes on. ``step()`` (or
``synchronize()``) waits for them, writes them into ``p.grad`` and steps
the wrapped optimizer. Gradients under a gathered compression (top-k)
are sent together in ``synchronize()``, in parameter order.

On a GPU the hook only records an event on the backward pass's stream; the
copy to the host, the push, the pull and the copy back run on the reducer's
threads and a side stream (``irdma.torch.reducer``), so the training
thread waits only in ``step()``, for sums that are mostly there already.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from irdma.client import Client
from irdma.devices import DONE, copies_for
from irdma.training.modes import DEFAULT_WORKER_TIMEOUT, worker_identity

from .compression import NONE, Compression, dense_sum_dtype
from .reducer import Reducer, Traffic, default_name

CompressionChoice = (
    Compression | Mapping[str, Compression] | Callable[[str, torch.Tensor], Compression]
)
OPS = ("average", "sum")
# DDP's default bucket size: a few large sums per step, the first ones while
# the backward pass still runs.
BUCKET_BYTES = 25 << 20


@dataclass(eq=False)
class _Bucket:
    """Parameters whose gradients are summed as one tensor, in one push and one read."""

    index: int
    compression: Compression
    members: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    nbytes: int = 0


def staging_bytes(params: list[tuple[str, torch.Tensor]]) -> int:
    """Shared memory for an owned client: room for two steps of every GPU parameter's
    gradient (pinned once, so device-to-host copies land there by DMA); none on the CPU."""
    on_gpu = sum(p.numel() * p.element_size() for _, p in params if p.device.type == "cuda")
    return 2 * on_gpu


def _grad(p: torch.Tensor) -> torch.Tensor:
    """``p.grad`` of a parameter whose gradient is summed: never None there
    (a worker whose backward passes left none sends zeros)."""
    assert p.grad is not None
    return p.grad


def compression_for(choice: CompressionChoice, name: str, param: torch.Tensor) -> Compression:
    """The compression of one parameter: one for all, a table by name (NONE if absent), or a
    function of the name and the parameter."""
    if isinstance(choice, Compression):
        return choice
    if isinstance(choice, Mapping):
        return choice.get(name, NONE)
    got = choice(name, param)
    if not isinstance(got, Compression):
        raise TypeError(f"compression for {name!r} must be a Compression, not {got!r}")
    return got


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer``; gradients are reduced over the job's workers before it steps.

    ``named_parameters``: (name, parameter) pairs covering every parameter
    the optimizer holds (``model.named_parameters()``); names key the tensors
    on the daemons, so every worker must use the same. ``op``: ``average``
    (as DDP) or ``sum``. ``compression``: a ``Compression`` for all, a table
    by parameter name, or a function ``(name, param) -> Compression``.
    ``backward_passes_per_step``: backward passes accumulated locally before
    a gradient is sent. ``bucket_bytes``: gradients are summed in buckets of
    about this size (0: each on its own). ``client``: default ``Client()`` (``$IRDMA_CONFIG``),
    closed by ``close()``. ``name``: the job's name on the daemons (default:
    the launcher's job id and a per-process count). Rank and world size come
    from the launcher (torchrun, mpirun, srun) unless given. ``timeout``:
    seconds a worker waits for a silent one before failing with WorkerLost.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]],
        *,
        compression: CompressionChoice = NONE,
        op: str = "average",
        backward_passes_per_step: int = 1,
        bucket_bytes: int = BUCKET_BYTES,
        client: Client | None = None,
        name: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        timeout: float = DEFAULT_WORKER_TIMEOUT,
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"expected a torch.optim.Optimizer, not {type(optimizer).__name__}")
        if op not in OPS:
            raise ValueError(f"op must be one of {', '.join(OPS)}, not {op!r}")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1: {backward_passes_per_step!r}")
        if bucket_bytes < 0:
            raise ValueError(f"bucket_bytes must be >= 0, not {bucket_bytes}")
        self._names: dict[int, str] = {}
        for pname, p in named_parameters:
            if pname in self._names.values() and self._names.get(id(p)) != pname:
                raise ValueError(f"two parameters are named {pname!r}")
            self._names.setdefault(id(p), pname)
        self._params = self._named(p for g in optimizer.param_groups for p in g["params"])
        self._ready = False
        # The base class is built on a placeholder, then shares the wrapped
        # optimizer's param_groups, state and defaults: LR schedulers and
        # checkpoints see (and change) the real ones, and isinstance holds.
        super().__init__([torch.empty(0)], dict(optimizer.defaults))
        self.optimizer = optimizer
        self.defaults = optimizer.defaults
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state

        self._average = op == "average"
        self._passes = backward_passes_per_step
        self._choice = compression
        self._bucket_bytes = bucket_bytes
        self._compression: dict[str, Compression] = {}
        self._buckets: list[_Bucket] = []
        self._bucket_of: dict[str, _Bucket] = {}
        # This step so far: backward passes per parameter, gradients done per
        # bucket, and the buckets handed to the reducer.
        self._counts: dict[str, int] = {}
        self._done: dict[int, int] = {}
        self._pending: dict[int, Future[list[torch.Tensor]]] = {}
        # Autograd may run hooks on a thread per device: the counts change under a lock.
        self._lock = threading.Lock()
        self._hooks: list[Any] = []
        self._synchronized = False  # synchronize() ran since the last step()
        ident = worker_identity(rank, world_size)
        self._owns_client = client is None
        if client is None:
            client = Client(shared_memory=staging_bytes(self._params) or None)
        self.client = client
        try:
            self.reducer = Reducer(
                self.client,
                name or default_name(),
                rank=ident.rank,
                world_size=ident.world_size,
                timeout=timeout,
            )
            self._watch(self._params)
        except BaseException:
            self._close_client()
            raise
        self._ready = True

    # -- parameters and their hooks ---------------------------------------------------

    def _named(self, params: Iterable[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        out = []
        for p in params:
            pname = self._names.get(id(p))
            if pname is None:
                raise ValueError(
                    f"a parameter of shape {tuple(p.shape)} is not in named_parameters; "
                    "pass model.named_parameters() of the model the optimizer trains"
                )
            out.append((pname, p))
        return out

    def _watch(self, params: list[tuple[str, torch.Tensor]]) -> None:
        """Note each parameter's compression; bucket and hook those the daemon sums."""
        open_buckets: dict[tuple[Compression, Any], _Bucket] = {}
        for pname, p in reversed(params):  # about the order gradients come in
            c = compression_for(self._choice, pname, p)
            self._compression[pname] = c
            if not (p.requires_grad and c.summed_on_daemon):
                continue
            # One bucket is one tensor on the wire: one compression, one dtype.
            kind = (c, dense_sum_dtype(c, p.dtype))
            bucket = open_buckets.get(kind)
            if bucket is None:
                bucket = _Bucket(len(self._buckets), c)
                self._buckets.append(bucket)
                open_buckets[kind] = bucket
            bucket.members.append((pname, p))
            bucket.nbytes += p.numel() * p.element_size()
            if bucket.nbytes >= self._bucket_bytes:
                del open_buckets[kind]
            self._bucket_of[pname] = bucket
            hook = partial(self._ready_grad, pname)
            self._hooks.append(p.register_post_accumulate_grad_hook(hook))

    def _ready_grad(self, pname: str, p: torch.Tensor) -> None:
        """Autograd finished ``p.grad`` for this backward pass; on the last pass, a bucket
        whose gradients are all done is sent."""
        bucket = self._bucket_of[pname]
        with self._lock:
            count = self._counts.get(pname, 0) + 1
            self._counts[pname] = count
            if count < self._passes:
                return
            if count > self._passes or bucket.index in self._pending:
                raise RuntimeError(
                    f"the gradient of {pname!r} was computed {count} times before step(); "
                    "call step() after each backward pass, or set backward_passes_per_step"
                )
            done = self._done.get(bucket.index, 0) + 1
            self._done[bucket.index] = done
            if done == len(bucket.members):
                self._send(bucket)

    def _send(self, bucket: _Bucket) -> None:
        grads = []
        for _, p in bucket.members:
            if p.grad is None:  # not reached by this worker's backward passes
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        self._pending[bucket.index] = self.reducer.reduce(
            f"bucket/{bucket.index}", grads, bucket.compression, average=self._average
        )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if not getattr(self, "_ready", False):  # the placeholder of Optimizer.__init__
            super().add_param_group(param_group)
            return
        before = len(self.optimizer.param_groups)
        self.optimizer.add_param_group(param_group)
        added = self._named(p for g in self.optimizer.param_groups[before:] for p in g["params"])
        self._params += added
        self._watch(added)

    # -- the step ---------------------------------------------------------------------

    def synchronize(self) -> None:
        """Wait for every gradient's sum and write it into ``p.grad``.

        ``step()`` calls it; call it yourself to look at the summed gradients
        first (clipping them, say): ``step()`` then steps without sending again.
        A parameter with no gradient on this worker counts as zeros, so every
        worker sends every gradient every step (as Horovod does).
        """
        if self._synchronized and not self._pending and not self._counts:
            return
        for bucket in self._buckets:  # buckets no backward pass completed
            if bucket.index not in self._pending:
                self._send(bucket)
        gathered: dict[Compression, list[tuple[str, torch.Tensor]]] = {}
        for pname, p in self._params:
            c = self._compression[pname]
            if p.requires_grad and not c.summed_on_daemon:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                gathered.setdefault(c, []).append((pname, p))
        waits = [(self._buckets[i].members, fut) for i, fut in self._pending.items()]
        waits += [
            (
                members,
                self.reducer.reduce(
                    f"grads/{c.describe()}",
                    [_grad(p) for _, p in members],
                    c,
                    average=self._average,
                ),
            )
            for c, members in gathered.items()  # parameter order: the same on every worker
        ]
        self._pending, self._counts, self._done = {}, {}, {}
        error: BaseException | None = None
        with torch.no_grad():
            for members, fut in waits:
                try:
                    for (_, p), total in zip(members, fut.result(), strict=True):
                        # Made on the reducer's side stream: kept until this stream has read it.
                        copies_for(total).wait_here(DONE, [total])
                        _grad(p).copy_(total)
                except Exception as exc:
                    error = error or exc
        if error is not None:
            raise error
        self._synchronized = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Synchronize (unless done since the last backward), then step the wrapped optimizer."""
        if closure is not None:
            raise ValueError(
                "DistributedOptimizer.step takes no closure: a closure's backward "
                "pass would not be summed across workers"
            )
        self.synchronize()
        self._synchronized = False
        return self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)
        # load_state_dict replaces the lists: share the new ones.
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state

    # -- the rest -----------------------------------------------------------------------

    def broadcast_parameters(self, root: int = 0, module: torch.nn.Module | None = None) -> None:
        """Give every worker the root's parameters (and, with ``module``, its buffers too:
        batch-norm statistics). Every worker calls it, before training."""
        tensors = [p for _, p in self._params]
        if module is not None:
            tensors += [b for _, b in module.named_buffers()]
        got = self.reducer.broadcast("parameters", [t.detach() for t in tensors], root).result()
        with torch.no_grad():
            for t, value in zip(tensors, got, strict=True):
                t.copy_(value)

    @property
    def traffic(self) -> Traffic:
        """Bytes this worker has sent and received for its reductions so far."""
        return self.reducer.traffic

    def close(self, *, wait_for_peers: bool = True) -> None:
        """Stop sending; with ``wait_for_peers`` wait for every worker and remove the job's
        tensors from the daemons. Close an owned client."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        try:
            self.reducer.close(wait_for_peers=wait_for_peers)
        finally:
            self._close_client()

    def _close_client(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> DistributedOptimizer:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        # After an error the peers may never arrive: do not wait for them.
        with contextlib.suppress(Exception) if exc_type else contextlib.nullcontext():
            self.close(wait_for_peers=exc_type is None)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r}, {self.reducer!r})"
