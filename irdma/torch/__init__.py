"""PyTorch on irdma (the ``torch`` extra): drop-in for Horovod/BytePS and DDP habits.

- ``DistributedOptimizer(optimizer, model.named_parameters())`` wraps any
  torch.optim optimizer: gradients are summed (averaged) across the workers
  through the daemons, overlapped with the backward pass, then the wrapped
  optimizer steps locally (its state stays on the worker).
- ``model.register_comm_hook(HookState(), allreduce_hook)`` makes an
  existing DistributedDataParallel job sum its gradient buckets through
  irdma (torch.distributed on Gloo does the rest).
- ``Compression`` (``NONE``, ``FP16``, ``BF16``, ``Compression.topk(r)``):
  what goes on the wire, per tensor or per bucket.
- ``push_state_dict``, ``pull_state_dict``, ``ParameterServerOptimizer``:
  state dicts on the daemons, and plain SGD applied by the daemons.
- ``publish_state_dict``, ``StateFollower``: weight sync through model
  versions (a trainer commits each step; readers move only what changed).

Import it as ``import irdma.torch`` (or ``from irdma.torch import ...``);
``from irdma import torch`` would shadow the real torch in your module.
Rank and world size come from the launcher's environment (torchrun, mpirun,
srun), the daemons from ``$IRDMA_CONFIG`` (``irdma local`` prints it).
"""

from .compression import BF16, FP16, NONE, Compression
from .ddp import HookState, allreduce_hook
from .optimizer import DistributedOptimizer
from .reducer import Reducer, Traffic
from .state import ParameterServerOptimizer, pull_state_dict, push_state_dict
from .versions import StateFollower, publish_state_dict

__all__ = [
    "BF16",
    "FP16",
    "NONE",
    "Compression",
    "DistributedOptimizer",
    "HookState",
    "ParameterServerOptimizer",
    "Reducer",
    "StateFollower",
    "Traffic",
    "allreduce_hook",
    "publish_state_dict",
    "pull_state_dict",
    "push_state_dict",
]
