"""State dicts on the daemons, and SGD held by the daemons (``irdma.torch`` re-exports these).

- ``push_state_dict(client, prefix, module)`` stores every tensor of a
  module's ``state_dict`` as ``<prefix>/<key>``;
  ``pull_state_dict(client, prefix, module)`` loads them back in place,
  straight into the module's tensors wherever they are (a GPU's included:
  through the client's pinned host memory, ``irdma.devices``).
- ``ParameterServerOptimizer(module, worker, lr)``: call ``step()`` after
  ``loss.backward()``; it pushes the gradients as this worker's step and
  pulls the parameters for the next one (waiting as the model's training
  mode says), then copies them into the module.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from irdma.client import Client
from irdma.sizes import INLINE_MAX
from irdma.training.worker import Worker

from .arrays import from_numpy
from .arrays import to_numpy as _to_numpy


def push_state_dict(client: Client, prefix: str, module: Any, **write_kw: Any) -> list[str]:
    """Store a module's (or a state dict's) tensors under ``prefix``; return their names."""
    state = module.state_dict() if hasattr(module, "state_dict") else module
    names = []
    for k, v in state.items():
        client.write(f"{prefix}/{k}", v, replace=True, **write_kw)  # a CUDA tensor too
        names.append(f"{prefix}/{k}")
    return names


def pull_state_dict(client: Client, prefix: str, module: torch.nn.Module) -> None:
    """Load ``<prefix>/<key>`` into every entry of the module's state dict, in place:
    large tensors are read straight into the module's own (on the CPU or a GPU),
    small ones together in one batch per daemon and then copied."""
    state = module.state_dict()
    large = {f"{prefix}/{k}": v for k, v in state.items() if v.nbytes >= INLINE_MAX}
    small = {f"{prefix}/{k}": v for k, v in state.items() if v.nbytes < INLINE_MAX}
    with torch.no_grad():
        client.read_into(large)
        got = client.read_many(small) if small else {}
        for name, v in small.items():
            v.copy_(from_numpy(got[name]).reshape(v.shape))


class ParameterServerOptimizer:
    """SGD through the daemons: gradients out, parameters in, once per step.

    ``worker.init`` must have run with this module's parameters (``init``
    below does that), so tensor keys are the module's parameter names.
    """

    def __init__(self, module: torch.nn.Module, worker: Worker, lr: float) -> None:
        self.module = module
        self.worker = worker
        self.lr = lr
        self.step_count = 0
        self._params = dict(module.named_parameters())

    def init(self) -> None:
        """Rank 0 stores the module's parameters; every worker then pulls step 0."""
        self.worker.init({k: _to_numpy(p) for k, p in self._params.items()})
        self._load(self.worker.pull(0))

    def zero_grad(self) -> None:
        self.module.zero_grad(set_to_none=False)

    def step(self) -> None:
        grads = {
            k: _to_numpy(p.grad) if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
            for k, p in self._params.items()
        }
        self.worker.push(grads, self.step_count, self.lr)
        self.step_count += 1
        self._load(self.worker.pull(self.step_count))

    def _load(self, params: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for k, p in self._params.items():
                p.copy_(from_numpy(params[k]))
