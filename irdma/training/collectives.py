"""Collectives for independent Python processes, built on the daemons (no MPI).

``Group(client)`` joins the processes of one job: each knows its rank and the
world size (from torchrun's or mpirun's environment, or given). Every member
calls the same collectives in the same order:

- ``barrier()``: returns once every member has entered it.
- ``broadcast(array, root)``: the root's array, on every member.
- ``gather(array, root)``: on the root, ``np.stack`` of every member's array
  in rank order (None elsewhere).
- ``allreduce(array, op="sum"|"mean")``: the elementwise sum (or mean) of all
  members' arrays, on every member.

Each takes ``out=``, an array the result is written into and returned (as
mpi4py's receive buffers and torch.distributed's in-place tensors): a loop
that reuses it saves allocating, and first touching, a new array per call.
Arrays may be torch tensors, on the CPU or a GPU (``irdma.devices``); the
result is a numpy array, or lands in ``out`` when that is a tensor.

allreduce is a sync-mode tensor (see ``irdma.training.modes``) whose steps replace
it with the sum of the step's contributions, added in rank order, so the
result equals ``np.sum(np.stack(arrays), axis=0)`` bit for bit (and
``np.mean`` for float arrays). The barrier is a one-element sync tensor;
broadcast and gather move the data through ordinary tensors, in two slots
used in turn so a fast member never overwrites what a slow one still reads.

The group's tensors live under ``.collectives/<name>``. A group name must
be new for each job (the default comes from the launcher's job id);
``close()`` removes the tensors at the end.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..client import Client
from ..devices import is_device_array
from ..errors import DtypeMismatch, ShapeMismatch, StepMismatch, TensorNotFound
from ..protocol import validate_name
from .modes import DEFAULT_WORKER_TIMEOUT, Mode, worker_identity

PREFIX = ".collectives"
# Job ids of the launchers we know, to name a group when no name is given.
JOB_VARIABLES = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMI_JOBID")
_ONE = np.ones(1, dtype=np.int64)


def default_group_name(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    for var in JOB_VARIABLES:
        if env.get(var):
            return f"job-{env[var]}"
    return "default"


class Group:
    """The members of one job, doing collectives through ``client``'s daemons.

    ``timeout``: how long a member waits for a silent one before the
    collective fails with WorkerLost.
    """

    def __init__(
        self,
        client: Client,
        name: str | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        timeout: float = DEFAULT_WORKER_TIMEOUT,
    ) -> None:
        ident = worker_identity(rank, world_size)
        self.client = client
        self.rank = ident.rank
        self.size = ident.world_size
        self.name = name or default_group_name()
        self.prefix = validate_name(f"{PREFIX}/{self.name}")
        self.timeout = timeout
        self._steps: dict[str, int] = {}  # sync tensor -> this member's next step
        self._calls = 0  # broadcasts and gathers so far (they use slots in turn)

    def __repr__(self) -> str:
        return f"Group({self.name!r}, rank={self.rank}, size={self.size})"

    # -- the sync-mode step every member takes together ---------------------------

    def _step(
        self, name: str, contribution: np.ndarray, apply: str, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Push ``contribution`` as this member's next step of sync tensor ``name``;
        return the tensor (in ``out`` if given) once every member has pushed."""
        step = self._steps.get(name)
        if step is None:
            mode = Mode.sync(self.size, apply=apply, worker_timeout=self.timeout)
            self.client.create(
                name, contribution.shape, contribution.dtype, mode=mode, exist_ok=True
            )
            step = 0
        try:
            self.client.accumulate(name, contribution, worker=self.rank, step=step)
        except StepMismatch as exc:
            raise StepMismatch(
                f"{exc} (group {self.name!r}: is a previous job's group of this name still "
                "there? give this job a new group name, or close() the old group)",
                exc.status,
            ) from exc
        got = self.client.read(name, out, worker=self.rank, step=step + 1)
        self._steps[name] = step + 1
        return got

    def barrier(self) -> None:
        """Return once every member has called barrier (this many times)."""
        self._step(f"{self.prefix}/barrier", _ONE, "add")

    # -- collectives ----------------------------------------------------------------

    def allreduce(
        self, array: Any, op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        """The elementwise sum (or mean) of every member's array, on every member
        (in ``out`` if given: the array's shape, and the result's dtype)."""
        if op not in ("sum", "mean"):
            raise ValueError(f"allreduce op must be 'sum' or 'mean', not {op!r}")
        if is_device_array(out):  # a tensor: the result lands there (irdma.devices)
            return self.client.transfers.put(out, self.allreduce(array, op))
        arr = self._as_c_array(array)
        if arr.dtype.kind == "b":
            raise TypeError("allreduce of bool arrays is not supported; use uint8")
        # numpy's accumulator types, so results equal np.sum / np.mean over the
        # stacked arrays: small ints sum as the platform int; a mean of ints is
        # taken in float64 and one of float16 in float32.
        if op == "sum":
            acc = np.add.reduce(np.zeros((1, 1), arr.dtype), axis=0).dtype
        elif arr.dtype.kind in "iu":
            acc = np.dtype(np.float64)
        elif arr.dtype == np.float16:
            acc = np.dtype(np.float32)
        else:
            acc = arr.dtype
        contribution = arr.astype(acc, copy=False)
        shape = "x".join(map(str, arr.shape)) or "scalar"
        name = f"{self.prefix}/allreduce/{acc.name}-{shape}"
        # np.mean of float16 returns float16 (computed in float32).
        half_mean = op == "mean" and arr.dtype == np.float16
        result_dtype = np.dtype(np.float16) if half_mean else acc
        if out is not None:
            _check_out(out, arr.shape, result_dtype)
        if op == "sum":
            return self._step(name, contribution, "set", out)
        total = self._step(name, contribution, "set")
        # np.mean's arithmetic: the sum, then one division.
        mean = (total / self.size).astype(result_dtype, copy=False)
        if out is None:
            return mean
        out[...] = mean
        return out

    def broadcast(
        self, array: Any = None, root: int = 0, *, out: np.ndarray | None = None
    ) -> np.ndarray:
        """The root's array on every member (others may pass None); elsewhere
        than the root, read into ``out`` if given (the root's shape and dtype)."""
        self._check_root(root)
        if is_device_array(out):
            return self.client.transfers.put(out, self.broadcast(array, root))
        slot = f"{self.prefix}/broadcast/{self._next_slot()}"
        if self.rank == root:
            arr = self._as_c_array(array)
            self._put(slot, arr)
            self.barrier()
            if out is None:
                return arr
            _check_out(out, arr.shape, arr.dtype)
            np.copyto(out, arr)
            return out
        self.barrier()
        return self.client.read(slot, out)

    def gather(
        self, array: Any, root: int = 0, *, out: np.ndarray | None = None
    ) -> np.ndarray | None:
        """On the root, every member's array stacked in rank order (in ``out`` if
        given: shape ``(size, *array.shape)``); None elsewhere."""
        self._check_root(root)
        if is_device_array(out):
            got = self.gather(array, root)
            return None if got is None else self.client.transfers.put(out, got)
        arr = self._as_c_array(array)
        slot = f"{self.prefix}/gather/{self._next_slot()}"
        if self.rank == root:
            if out is None:
                out = np.empty((self.size, *arr.shape), dtype=arr.dtype)
            else:
                _check_out(out, (self.size, *arr.shape), arr.dtype)
        else:  # the root's own part never leaves it
            self._put(f"{slot}/{self.rank}", arr)
        self.barrier()
        if self.rank != root:
            return None
        assert out is not None  # the root's, made or checked above
        out[root] = arr
        # Each part straight into its row (a view, 0-d parts too): one-sided
        # where it can be, the requests to different daemons in flight
        # together. A part redefined since this slot's last use is found by its
        # layout (or by not fitting its row) and asked for again.
        others = [r for r in range(self.size) if r != root]
        self.client.read_into({f"{slot}/{r}": out[r : r + 1].reshape(arr.shape) for r in others})
        return out

    def close(self) -> None:
        """Wait for every member, then remove the group's tensors (rank 0 does it).

        Rank 0 passes this last barrier only once every member has pushed to
        it, and then deletes. A member still reading the barrier may find it
        gone; that means the same (everyone arrived), so it is not an error.
        """
        try:
            self.barrier()
        except TensorNotFound:
            if self.rank == 0:
                raise
            return
        if self.rank == 0:
            for info in self.client.list(self.prefix + "/"):
                with contextlib.suppress(TensorNotFound):
                    self.client.delete(info.name)

    # -- helpers ------------------------------------------------------------------

    def _put(self, slot: str, arr: np.ndarray) -> None:
        """Write a slot tensor, redefining it only when its dtype or shape changes
        (a redefinition asks every daemon holding it first: one more round trip)."""
        try:
            self.client.write(slot, arr)
        except (DtypeMismatch, ShapeMismatch):
            self.client.write(slot, arr, replace=True)

    def _as_c_array(self, array: Any) -> np.ndarray:
        """``array`` as a C-ordered numpy array; a tensor (on a GPU too) through the
        client's host memory (``irdma.devices``)."""
        return _as_c_array(self.client.transfers.source(array))

    def _check_root(self, root: int) -> None:
        if not 0 <= root < self.size:
            raise ValueError(f"root {root} is outside 0..{self.size - 1}")

    def _next_slot(self) -> int:
        # Slot k % 2: when a member reuses a slot two calls later it has passed
        # the barrier of the call in between, which every member entered only
        # after it finished reading this slot.
        slot = self._calls % 2
        self._calls += 1
        return slot


def _check_out(out: np.ndarray, shape: tuple[int, ...], dtype: Any) -> None:
    """``out`` must take a collective's result as it is: no casting, no reshaping."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
    if out.shape != tuple(shape) or out.dtype != np.dtype(dtype):
        raise ValueError(
            f"out has shape {out.shape} and dtype {out.dtype}; this collective's result "
            f"has shape {tuple(shape)} and dtype {np.dtype(dtype)}"
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous array")


def _as_c_array(array: Any) -> np.ndarray:
    # Not np.ascontiguousarray: it makes a 0-d array 1-d, and the result of a
    # collective of scalars is a scalar, as numpy's own reductions give.
    return np.asarray(array, order="C")
