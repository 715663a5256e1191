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

allreduce is a sync-mode tensor (see ``irdma.modes``) whose steps replace
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

from .client import Client
from .errors import DtypeMismatch, ShapeMismatch, StepMismatch, TensorNotFound
from .modes import DEFAULT_WORKER_TIMEOUT, Mode, worker_identity
from .protocol import validate_name

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

    def _step(self, name: str, contribution: np.ndarray, apply: str) -> np.ndarray:
        """Push ``contribution`` as this member's next step of sync tensor ``name``;
        return the tensor once every member has pushed."""
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
        out = self.client.read(name, worker=self.rank, step=step + 1)
        self._steps[name] = step + 1
        return out

    def barrier(self) -> None:
        """Return once every member has called barrier (this many times)."""
        self._step(f"{self.prefix}/barrier", _ONE, "add")

    # -- collectives ----------------------------------------------------------------

    def allreduce(self, array: Any, op: str = "sum") -> np.ndarray:
        """The elementwise sum (or mean) of every member's array, on every member."""
        if op not in ("sum", "mean"):
            raise ValueError(f"allreduce op must be 'sum' or 'mean', not {op!r}")
        arr = np.ascontiguousarray(array)
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
        total = self._step(name, contribution, "set")
        if op == "sum":
            return total
        mean = total / self.size  # np.mean's arithmetic: the sum, then one division
        return mean.astype(np.float16) if arr.dtype == np.float16 else mean

    def broadcast(self, array: Any = None, root: int = 0) -> np.ndarray:
        """The root's array on every member (others may pass None)."""
        self._check_root(root)
        slot = f"{self.prefix}/broadcast/{self._next_slot()}"
        if self.rank == root:
            arr = np.ascontiguousarray(array)
            self._put(slot, arr)
            self.barrier()
            return arr
        self.barrier()
        return self.client.read(slot)

    def gather(self, array: Any, root: int = 0) -> np.ndarray | None:
        """On the root, every member's array stacked in rank order; None elsewhere."""
        self._check_root(root)
        arr = np.ascontiguousarray(array)
        slot = f"{self.prefix}/gather/{self._next_slot()}"
        self._put(f"{slot}/{self.rank}", arr)
        self.barrier()
        if self.rank != root:
            return None
        names = [f"{slot}/{r}" for r in range(self.size)]
        # Members may have redefined their slot tensors since this slot's last use.
        parts = self.client.read_many(names, refresh=True)
        return np.stack([parts[n] for n in names])

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
