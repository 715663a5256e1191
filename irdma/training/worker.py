"""A training worker's view of a model held by the daemons.

    worker = Worker(client, "runs/lenet", Mode.sync(4))   # rank from RANK/WORLD_SIZE
    worker.init(initial_params)          # rank 0 stores them; everyone waits for it
    params = worker.pull(0)
    for step in range(steps):
        grads = compute(params, batch)
        worker.push(grads, step, lr=0.1)  # this worker's gradient for the step
        params = worker.pull(step + 1)    # waits as the mode says

The mode (``irdma.training.modes``) is set for every tensor of the model when rank 0
creates it. ``push`` scales the gradient by ``-lr`` divided by the number of
workers whose gradients are summed into one update (all of them in sync
mode, the worker's group in hybrid mode, one otherwise), so a sync step is
one SGD step on the mean gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..client import Client
from .collectives import Group
from .modes import Mode, worker_identity


class Worker:
    """One worker of a model called ``model`` (tensors ``<model>/<name>``)."""

    def __init__(
        self,
        client: Client,
        model: str,
        mode: Mode,
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        ident = worker_identity(rank, world_size)
        if mode.kind != "async" and mode.workers != ident.world_size:
            raise ValueError(
                f"mode {mode.describe()} is for {mode.workers} workers, but the world size "
                f"is {ident.world_size}"
            )
        self.client = client
        self.model = model.strip("/")
        self.mode = mode
        self.rank = ident.rank
        self.world_size = ident.world_size
        self.group = Group(
            client,
            f"{self.model}/init",
            rank=self.rank,
            world_size=self.world_size,
            timeout=mode.worker_timeout,
        )
        self.tensors: dict[str, str] = {}  # parameter key -> tensor name, set by init
        self.contributors = mode.contributors(self.rank)

    def tensor(self, key: str) -> str:
        return f"{self.model}/{key}"

    def init(self, params: Mapping[str, Any]) -> None:
        """Rank 0 stores the initial parameters (in the model's mode); all wait for it."""
        self.tensors = {k: self.tensor(k) for k in params}
        if self.rank == 0:
            for key, value in params.items():
                self.client.write(self.tensor(key), np.asarray(value), mode=self.mode, replace=True)
        self.group.barrier()

    def pull(self, step: int) -> dict[str, np.ndarray]:
        """The parameters this worker trains step ``step`` on (waits as the mode says)."""
        got = self.client.read_many(self.tensors.values(), worker=self.rank, step=step)
        return {k: got[n] for k, n in self.tensors.items()}

    def push(self, grads: Mapping[str, Any], step: int, lr: float) -> None:
        """This worker's gradients for ``step``: parameters move by ``-lr`` times their mean."""
        deltas = {self.tensor(k): np.asarray(g) for k, g in grads.items()}
        alpha = -lr / self.contributors
        self.client.accumulate_many(deltas, alpha, worker=self.rank, step=step)

    def close(self) -> None:
        """Wait for every worker to finish (the model's tensors stay)."""
        self.group.close()
