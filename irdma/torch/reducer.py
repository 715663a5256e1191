"""One worker's gradient reductions through the daemons, off the training thread.

A ``Reducer`` belongs to one job (a ``Group``: rank, world size, a name
every worker shares) and reduces tensors by key. ``reduce(key, tensors)``
returns at once with a future; two threads do the work, so the backward
pass goes on while gradients travel:

- the push thread encodes each gradient (``irdma.torch.compression``) and
  sends it as this worker's step of a ``sync`` tensor with ``apply="set"``:
  the daemon holds the contributions until every worker has pushed the step,
  then stores their rank-ordered sum. Whatever is queued goes in one batch
  (one frame per daemon). It never waits for other workers.
- the pull thread reads each sum for the next step (the daemon answers once
  every worker has pushed) and decodes it; reads queued together go in one
  batch. Compressions the daemon cannot add (top-k pairs) are
  exchanged here too, behind the group's barriers, so they run in the order
  they were submitted: every worker must submit those in the same order.

Tensors on a GPU take the same path: ``reduce`` only records an event on
the caller's stream (the gradients are done there); the push thread encodes
on the GPU on a side stream after that event and stages the encoded bytes
into the client's pinned host memory (``irdma.devices``), one copy per
batch queued before it waits; the pull thread copies each sum to the GPU
and decodes it there. The training thread never waits for the device.

Every key is a tensor of its own with its own step count, so keys may be
submitted in any order across workers (each exactly once per step); only the
gathered compressions need the same order everywhere (DDP calls its hook in
bucket order; DistributedOptimizer submits them in parameter order).

The tensors live under the group's prefix, so ``close()`` (the group's
close) removes them. A name left by an earlier job is found at the first
push and reported with ``StepMismatch``, as ``Group`` does.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections import defaultdict, deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from irdma.client import Client
from irdma.devices import DONE, CpuCopies, CudaCopies, Ready, copies_for
from irdma.errors import StepMismatch
from irdma.protocol import validate_name
from irdma.training.collectives import Group, default_group_name
from irdma.training.modes import DEFAULT_WORKER_TIMEOUT, Mode

from .arrays import from_numpy, to_numpy
from .compression import (
    NONE,
    Compression,
    TopK,
    decode_dense,
    dense_sum_dtype,
    encode_dense,
    pack_pairs,
    sum_pairs,
    unpack_pairs,
    wire_nbytes,
)

_made = itertools.count()


def default_name() -> str:
    """A job name: the launcher's job id and a count of the reducers this process made.

    Workers that make their optimizers and hook states in the same order
    agree on it. (A ``-``, not a ``/``: a Group named after the bare job id
    removes everything under its own prefix when it closes.)
    """
    return f"{default_group_name()}-torch{next(_made)}"


@dataclass
class Traffic:
    """Payload bytes this worker sent to and received from the daemons for its reductions."""

    sent: int = 0
    received: int = 0

    def total(self) -> int:
        return self.sent + self.received


@dataclass(eq=False)
class _Job:
    kind: str  # "reduce" or "broadcast"
    key: str
    name: str  # the tensor (or tensors' prefix) on the daemons
    tensors: list[torch.Tensor]
    compression: Compression
    average: bool
    future: Future[list[torch.Tensor]] = field(default_factory=Future)
    step: int = 0
    root: int = 0
    wire: np.ndarray | None = None
    # The tensors' device copies, and the point on the caller's stream they are done at.
    copies: CpuCopies | CudaCopies | None = None
    ready: Ready = DONE


class Reducer:
    """Sums (or averages) tensors across the workers of one job; see the module docstring.

    ``name`` is the job's group name (new for each job); ``timeout`` is how
    long a worker waits for a silent one before its reductions fail with
    WorkerLost.
    """

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        timeout: float = DEFAULT_WORKER_TIMEOUT,
    ) -> None:
        self.client = client
        self.group = Group(client, name, rank=rank, world_size=world_size, timeout=timeout)
        self.rank = self.group.rank
        self.size = self.group.size
        self.prefix = f"{self.group.prefix}/torch"
        self._mode = Mode.sync(self.size, apply="set", worker_timeout=timeout)
        self.traffic = Traffic()
        self._lock = threading.Lock()
        self._steps: dict[str, int] = {}  # tensor name -> the next step this worker submits
        self._created: set[str] = set()
        self._topk = TopK()
        self._push_q: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._pull_q: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._pusher = threading.Thread(target=self._push_loop, name="irdma-push", daemon=True)
        self._puller = threading.Thread(target=self._pull_loop, name="irdma-pull", daemon=True)
        self._pusher.start()
        self._puller.start()

    def __repr__(self) -> str:
        return f"Reducer({self.group.name!r}, rank={self.rank}, size={self.size})"

    # -- submitting ------------------------------------------------------------------

    def reduce(
        self,
        key: str,
        tensors: Sequence[torch.Tensor],
        compression: Compression = NONE,
        *,
        average: bool = True,
    ) -> Future[list[torch.Tensor]]:
        """The sum (or mean) over all workers of each of ``tensors``, as new tensors.

        Every worker calls this once per step for each key, with tensors of
        the same shapes. The tensors must not change until the future is done.
        """
        parts = list(tensors)
        n = sum(t.numel() for t in parts)
        devices = {t.device for t in parts}
        if len(devices) > 1:
            raise ValueError(
                f"tensors of {key!r} are on several devices: {sorted(map(str, devices))}"
            )
        if compression.summed_on_daemon:
            wires = {dense_sum_dtype(compression, t.dtype) for t in parts}
            if len(wires) > 1:
                raise ValueError(f"tensors of {key!r} go on the wire as {sorted(map(str, wires))}")
            held = wires.pop() if wires else "empty"
            what = f"sum/{key}/{compression.describe()}-{held}-{n}"
        else:
            # The element count names the tensors, so a rebuilt DDP bucket gets new ones.
            what = f"{compression.describe()}/{key}/{n}"
        job = _Job(
            "reduce", key, validate_name(f"{self.prefix}/{what}"), parts, compression, average
        )
        if n == 0:  # nothing to send; every worker knows it
            job.future.set_result([t.detach().clone() for t in parts])
            return job.future
        job.copies = copies_for(parts[0])
        job.ready = job.copies.mark()  # no wait: an event on the caller's stream
        self._submit(job, self._push_q if compression.summed_on_daemon else self._pull_q)
        return job.future

    def broadcast(self, key: str, tensors: Sequence[torch.Tensor], root: int = 0) -> Future[list]:
        """The root's tensors on every worker (in the order of the other submitted work)."""
        if not 0 <= root < self.size:
            raise ValueError(f"root {root} is outside 0..{self.size - 1}")
        name = validate_name(f"{self.prefix}/broadcast/{key}")
        job = _Job("broadcast", key, name, list(tensors), NONE, False, root=root)
        self._submit(job, self._pull_q)
        return job.future

    def _submit(self, job: _Job, q: queue.SimpleQueue[_Job | None]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            job.step = self._steps.get(job.name, 0)
            self._steps[job.name] = job.step + 1
            q.put(job)  # under the lock: a key's steps are queued in order

    # -- the push thread ---------------------------------------------------------------

    def _push_loop(self) -> None:
        while True:
            job = self._push_q.get()
            if job is None:
                break
            batch, stop = [job], False
            while True:  # whatever else is queued goes in the same batch
                try:
                    nxt = self._push_q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            for sent in self._push(batch):
                self._pull_q.put(sent)
            if stop:
                break
        self._pull_q.put(None)

    def _push(self, batch: list[_Job]) -> list[_Job]:
        """Send the batch's contributions; return the jobs sent (failed ones have their error)."""
        # One call per step and wire dtype (a batch frame has one of each).
        by_step: dict[tuple[int, str | None], list[_Job]] = defaultdict(list)
        staged: list[tuple[_Job, Ready]] = []
        for job in batch:  # every job's encoding and copy queued before any is waited for
            try:
                assert job.copies is not None
                with job.copies.side(job.ready):
                    parts = [
                        encode_dense(job.compression, t.reshape(-1), self.size, job.average)
                        for t in job.tensors
                    ]
                    flat = parts[0] if len(parts) == 1 else torch.cat(parts)
                    job.wire, copied = self.client.transfers.stage(flat)
                staged.append((job, copied))
            except Exception as exc:
                job.future.set_exception(exc)
        for job, copied in staged:
            try:
                copied.synchronize()  # on this thread: the training thread goes on
                self._ensure(job)
            except Exception as exc:
                job.future.set_exception(exc)
                continue
            by_step[job.step, job.compression.wire].append(job)
        sent: list[_Job] = []
        for (step, wire), jobs in by_step.items():
            deltas: dict[str, np.ndarray] = {}
            for j in jobs:
                assert j.wire is not None  # encoded above, or it is not in by_step
                deltas[j.name] = j.wire
            try:
                self.client.accumulate_many(deltas, worker=self.rank, step=step, wire=wire)
            except StepMismatch as exc:
                err = self._stale(exc)
                for j in jobs:
                    j.future.set_exception(err)
                continue
            except Exception as exc:
                for j in jobs:
                    j.future.set_exception(exc)
                continue
            self._count(sent=sum(d.nbytes for d in deltas.values()))
            sent += jobs
        return sent

    def _ensure(self, job: _Job) -> None:
        """Create the job's sync tensor the first time; refuse one an earlier job left."""
        if job.name in self._created:
            return
        assert job.wire is not None
        stored = dense_sum_dtype(job.compression, job.tensors[0].dtype)  # wide, as summed
        info = self.client.create(job.name, job.wire.shape, stored, mode=self._mode, exist_ok=True)
        # No step of a new tensor can complete before this worker's first push.
        if job.step == 0 and info.version != 0:
            raise self._stale(StepMismatch(f"{job.name!r} has completed steps already"))
        self._created.add(job.name)

    def _stale(self, exc: StepMismatch) -> StepMismatch:
        return StepMismatch(
            f"{exc} (group {self.group.name!r}: are an earlier job's tensors still there? "
            f"give this job a new name, or remove them: irdma rm -r {self.group.prefix})",
            exc.status,
        )

    # -- the pull thread ----------------------------------------------------------------

    def _pull_loop(self) -> None:
        waiting: deque[_Job | None] = deque()
        while True:
            job = waiting.popleft() if waiting else self._pull_q.get()
            if job is None:
                return
            if job.kind == "reduce" and job.compression.summed_on_daemon:
                batch = [job]
                while True:  # read the sums already waiting together
                    try:
                        nxt = self._pull_q.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None or nxt.kind != "reduce" or not nxt.compression.summed_on_daemon:
                        waiting.append(nxt)
                        break
                    batch.append(nxt)
                self._pull_sums(batch)
                continue
            try:
                if job.kind == "broadcast":
                    job.future.set_result(self._broadcast(job))
                else:
                    job.future.set_result(self._topk_allreduce(job))
            except Exception as exc:
                job.future.set_exception(exc)

    def _pull_sums(self, batch: list[_Job]) -> None:
        by_step: dict[tuple[int, str | None], list[_Job]] = defaultdict(list)
        for job in batch:
            by_step[job.step, job.compression.wire].append(job)
        for (step, wire), jobs in by_step.items():
            try:
                got = self.client.read_many(
                    [j.name for j in jobs], worker=self.rank, step=step + 1, wire=wire
                )
            except Exception as exc:
                for j in jobs:
                    j.future.set_exception(exc)
                continue
            self._count(received=sum(wire_nbytes(j.compression, got[j.name]) for j in jobs))
            for j in jobs:
                try:
                    assert j.copies is not None
                    device = j.tensors[0].device
                    with j.copies.side(down=True):  # to the device, decoded there
                        total = decode_dense(
                            j.compression, got[j.name], self.size, j.average, device
                        )
                        out = self._split(j, total)
                        done = j.copies.mark()
                    done.synchronize()  # here, not on the training thread
                    j.future.set_result(out)
                except Exception as exc:
                    j.future.set_exception(exc)

    @staticmethod
    def _split(job: _Job, flat: torch.Tensor) -> list[torch.Tensor]:
        """A reduced 1-d result cut back into tensors shaped (and typed) as the job's."""
        out = []
        at = 0
        for t in job.tensors:
            n = t.numel()
            out.append(flat[at : at + n].reshape(t.shape).to(t.dtype))
            at += n
        return out

    # -- gathered compressions (workers add) -------------------------------------------------

    def _topk_allreduce(self, job: _Job) -> list[torch.Tensor]:
        """Every worker's top-k pairs gathered; the dense float32 sum taken in rank order."""
        c = job.compression
        assert job.copies is not None
        with job.copies.side(job.ready):  # chosen on the gradients' device
            pairs = [
                self._topk.select(f"{job.name}#{i}", c, t.reshape(-1))
                for i, t in enumerate(job.tensors)
            ]
        counts = [len(idx) for idx, _ in pairs]
        row = pack_pairs(pairs)
        # Two slots in turn: a worker rewrites a slot only after the barrier of the
        # step in between, which every worker enters after reading this one.
        slot = f"{job.name}/{job.step % 2}"
        size, me = self.size, self.rank
        if size > 1:
            self.client.write_many({f"{slot}/{me}": row})
            self._count(sent=row.nbytes)
        self.group.barrier()
        names = [f"{slot}/{r}" for r in range(size) if r != me]
        got = self.client.read_many(names) if names else {}
        self._count(received=sum(a.nbytes for a in got.values()))
        rows = [unpack_pairs(row if r == me else got[f"{slot}/{r}"], counts) for r in range(size)]
        out = []
        with job.copies.side(down=True):
            for i, t in enumerate(job.tensors):
                total = sum_pairs([rows[r][i] for r in range(size)], t.numel(), t.device)
                if job.average:
                    total.div_(size)
                out.append(total.reshape(t.shape).to(t.dtype))
            done = job.copies.mark()
        done.synchronize()
        return out

    def _broadcast(self, job: _Job) -> list[torch.Tensor]:
        names = [f"{job.name}/{i}" for i in range(len(job.tensors))]
        if self.rank == job.root:
            arrays = {n: to_numpy(t) for n, t in zip(names, job.tensors, strict=True)}
            if self.size > 1:
                self.client.write_many(arrays)
                self._count(sent=sum(a.nbytes for a in arrays.values()))
            self.group.barrier()
            out = [t.detach().clone() for t in job.tensors]
        else:
            self.group.barrier()
            # Another broadcast under this key may have had other shapes: refresh.
            got = self.client.read_many(names, refresh=True)
            self._count(received=sum(a.nbytes for a in got.values()))
            out = [from_numpy(got[n]) for n in names]
        self.group.barrier()  # the root writes this key again only after everyone read
        return out

    # -- bookkeeping ---------------------------------------------------------------------

    def _count(self, *, sent: int = 0, received: int = 0) -> None:
        with self._lock:
            self.traffic.sent += sent
            self.traffic.received += received

    def close(self, *, wait_for_peers: bool = True) -> None:
        """Finish the submitted work and stop the threads; then, with ``wait_for_peers``,
        wait for every worker and remove the job's tensors (``Group.close``)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._push_q.put(None)
        self._pusher.join()
        self._puller.join()
        if wait_for_peers:
            self.group.close()

    def __enter__(self) -> Reducer:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        # After an error the peers may never arrive: do not wait for them.
        with contextlib.suppress(Exception) if exc_type else contextlib.nullcontext():
            self.close(wait_for_peers=exc_type is None)
