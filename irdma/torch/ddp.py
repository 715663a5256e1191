"""A DDP communication hook: DistributedDataParallel's gradient buckets summed by irdma.

    dist.init_process_group("gloo")          # for everything but the gradients
    model = DistributedDataParallel(model)
    state = irdma.torch.HookState(compression=irdma.torch.FP16)
    model.register_comm_hook(state, irdma.torch.allreduce_hook)
    ...train...
    state.close()

DDP calls the hook once per bucket as soon as the bucket's gradients are
ready (in bucket order, on every rank) and goes on with the backward pass;
the hook hands the bucket to the reducer and returns a future that completes
with the bucket averaged over the ranks, as DDP's own allreduce does.

On a GPU model the future is CUDA-aware: the sum lands in the bucket on the
reducer's side stream, and DDP's stream waits for that with an event.
"""

# No ``from __future__ import annotations``: DDP's register_comm_hook compares
# the hook's annotations with dist.GradBucket and Future[Tensor] as objects.

from collections.abc import Callable
from concurrent.futures import Future

import torch
import torch.distributed as dist

from irdma.client import Client
from irdma.devices import copies_for
from irdma.training.modes import DEFAULT_WORKER_TIMEOUT, worker_identity

from .compression import NONE, Compression
from .reducer import Reducer, Traffic, default_name

BucketCompression = Compression | Callable[[dist.GradBucket], Compression]


class HookState:
    """What ``allreduce_hook`` needs: the reducer of this job, and the compression.

    ``compression``: a ``Compression`` for every bucket, or a function of
    the bucket (``bucket.buffer().numel()``, ``bucket.parameters()``). Rank
    and world size are those of ``process_group`` (default: the default
    group) when torch.distributed is initialised, else the launcher's.
    ``client``, ``name`` and ``timeout`` are as for ``DistributedOptimizer``.
    """

    def __init__(
        self,
        *,
        compression: BucketCompression = NONE,
        client: Client | None = None,
        name: str | None = None,
        process_group: dist.ProcessGroup | None = None,
        timeout: float = DEFAULT_WORKER_TIMEOUT,
    ) -> None:
        if dist.is_available() and dist.is_initialized():
            rank, size = dist.get_rank(process_group), dist.get_world_size(process_group)
        else:
            ident = worker_identity()
            rank, size = ident.rank, ident.world_size
        self.compression = compression
        self._owns_client = client is None
        self.client = Client() if client is None else client
        try:
            self.reducer = Reducer(
                self.client, name or default_name(), rank=rank, world_size=size, timeout=timeout
            )
        except BaseException:
            if self._owns_client:
                self.client.close()
            raise

    def compression_for(self, bucket: dist.GradBucket) -> Compression:
        c = self.compression
        if isinstance(c, Compression):
            return c
        got = c(bucket)
        if not isinstance(got, Compression):
            raise TypeError(f"compression for bucket {bucket.index()} must be a Compression")
        return got

    @property
    def traffic(self) -> Traffic:
        """Bytes this rank has sent and received for its buckets so far."""
        return self.reducer.traffic

    def close(self, *, wait_for_peers: bool = True) -> None:
        """After the last backward pass: with ``wait_for_peers`` wait for every rank and
        remove the job's tensors. Closes an owned client."""
        try:
            self.reducer.close(wait_for_peers=wait_for_peers)
        finally:
            if self._owns_client:
                self.client.close()


def allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket averaged over all ranks through the daemons."""
    buffer = bucket.buffer()
    # The key is the bucket's index; the reducer adds its size, so DDP's
    # rebuilt buckets (after the first iteration) get tensors of their own.
    done = state.reducer.reduce(
        f"bucket/{bucket.index()}", [buffer], state.compression_for(bucket), average=True
    )
    on_gpu = buffer.device.type == "cuda"
    # A CUDA-aware future: set_result records an event on the setting stream that
    # DDP's stream waits for, so no one waits on the host.
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(
        devices=[buffer.device] if on_gpu else None
    )
    copies = copies_for(buffer)

    def finish(reduced: Future[list[torch.Tensor]]) -> None:
        # On the reducer's thread; DDP leaves the bucket alone until fut completes.
        try:
            (total,) = reduced.result()
            with copies.side(down=True):
                buffer.copy_(total)
        except Exception as exc:
            # torch annotates set_exception's argument as the result type.
            fut.set_exception(exc)  # type: ignore[arg-type]
            return
        with copies.side(down=True):
            fut.set_result(buffer)

    done.add_done_callback(finish)
    return fut
