"""Training modes: how a tensor's accumulates from many workers are applied.

A mode is chosen when a tensor is created and stored in its metadata
options (``{"mode": "sync", "workers": 4, ...}``), so every daemon holding a
shard applies the same rules and ``irdma stat`` shows them:

- ``async``: every accumulate applies at once (Hogwild-style).
- ``sync`` (BSP): worker w's accumulate for step t is held until all live
  workers have pushed step t; then the contributions are summed in worker
  order (deterministic) and applied as one update, and the step advances.
  A read for step t waits until step t has been reached.
- ``ssp`` (bounded staleness, ``slack`` s): accumulates apply at once; a
  worker reading for step c waits until every live worker has pushed step
  c - s - 1, i.e. the slowest worker is at clock c - s or later.
- ``hybrid`` (ShmCaffe-H): workers form ``groups`` contiguous groups; inside
  a group the rules of ``sync`` hold, across groups updates are asynchronous.

``apply="set"`` makes a sync step replace the tensor with the step's sum
instead of adding to it (allreduce is built on that).

A worker that falls silent for ``worker_timeout`` seconds while others wait
for it is, per ``on_timeout``, either reported to the waiters as lost
(``error``) or evicted so the rest go on without it (``evict``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MODES = ("async", "sync", "ssp", "hybrid")
ON_TIMEOUT = ("error", "evict")
APPLY = ("add", "set")
MAX_WORKERS = 1 << 16
DEFAULT_WORKER_TIMEOUT = 60.0
# Option keys a mode owns inside TensorMeta.options.
_KEYS = ("mode", "workers", "slack", "groups", "worker_timeout", "on_timeout", "apply")


def _finite(x: float) -> bool:
    """math.isfinite, but False (not OverflowError) for an int too large for a float."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


@dataclass(frozen=True, slots=True)
class Mode:
    """A tensor's training mode; validated on construction (ValueError names the problem)."""

    kind: str = "async"
    workers: int = 1
    slack: int = 0
    groups: int = 1
    worker_timeout: float = DEFAULT_WORKER_TIMEOUT
    on_timeout: str = "error"
    apply: str = "add"

    def __post_init__(self) -> None:
        if self.kind not in MODES:
            raise ValueError(f"unknown training mode {self.kind!r}; use one of {', '.join(MODES)}")
        for name in ("workers", "slack", "groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, not {value!r}")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be between 1 and {MAX_WORKERS}, not {self.workers}")
        if self.slack < 0:
            raise ValueError(f"slack must be >= 0, not {self.slack}")
        if not 1 <= self.groups <= self.workers:
            raise ValueError(
                f"groups must be between 1 and the number of workers ({self.workers}), "
                f"not {self.groups}"
            )
        if self.kind != "hybrid" and self.groups != 1:
            raise ValueError(f"groups only apply to hybrid mode, not {self.kind}")
        if self.kind != "ssp" and self.slack != 0:
            raise ValueError(f"slack only applies to ssp mode, not {self.kind}")
        if self.apply not in APPLY:
            raise ValueError(f"apply must be one of {', '.join(APPLY)}, not {self.apply!r}")
        if self.apply == "set" and self.kind != "sync":
            raise ValueError("apply='set' needs sync mode (a step's sum replaces the tensor)")
        timeout = self.worker_timeout
        if (
            not isinstance(timeout, int | float)
            or isinstance(timeout, bool)
            or not _finite(timeout)
            or timeout <= 0
        ):
            raise ValueError(f"worker_timeout must be a positive number of seconds: {timeout!r}")
        if self.on_timeout not in ON_TIMEOUT:
            raise ValueError(
                f"on_timeout must be one of {', '.join(ON_TIMEOUT)}, not {self.on_timeout!r}"
            )

    # -- constructors ---------------------------------------------------------

    @classmethod
    def sync(cls, workers: int, **kw: Any) -> Mode:
        return cls("sync", workers, **kw)

    @classmethod
    def ssp(cls, workers: int, slack: int, **kw: Any) -> Mode:
        return cls("ssp", workers, slack=slack, **kw)

    @classmethod
    def hybrid(cls, workers: int, groups: int, **kw: Any) -> Mode:
        return cls("hybrid", workers, groups=groups, **kw)

    # -- rules shared by the daemon and its clients ---------------------------

    @property
    def steps_in_lockstep(self) -> bool:
        """Whether accumulates are held until a whole group has pushed (sync, hybrid)."""
        return self.kind in ("sync", "hybrid")

    def group_of(self, worker: int) -> int:
        """The group of a worker: contiguous blocks of ranks (0 for sync)."""
        return worker * self.groups // self.workers

    def members(self, group: int) -> range:
        """The workers of ``group``, the inverse of ``group_of``."""
        start = -(-group * self.workers // self.groups)
        stop = -(-(group + 1) * self.workers // self.groups)
        return range(start, stop)

    def contributors(self, worker: int) -> int:
        """How many workers' deltas one update of ``worker``'s step sums."""
        if self.kind == "sync":
            return self.workers
        if self.kind == "hybrid":
            return len(self.members(self.group_of(worker)))
        return 1

    # -- storage in TensorMeta.options ---------------------------------------

    def to_options(self) -> dict[str, Any]:
        if self.kind == "async":
            return {"mode": "async"}
        out: dict[str, Any] = {
            "mode": self.kind,
            "workers": self.workers,
            "worker_timeout": self.worker_timeout,
            "on_timeout": self.on_timeout,
        }
        if self.kind == "ssp":
            out["slack"] = self.slack
        if self.kind == "hybrid":
            out["groups"] = self.groups
        if self.apply != "add":
            out["apply"] = self.apply
        return out

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Mode:
        """The mode stored in tensor options (async when none is stated)."""
        if "mode" not in options:
            return ASYNC
        kw = {k: options[k] for k in _KEYS if k in options}
        kind = kw.pop("mode")
        if not isinstance(kind, str):
            raise ValueError(f"mode must be a string, not {kind!r}")
        return cls(kind, **kw)

    def describe(self) -> str:
        """One line for ``irdma stat``."""
        if self.kind == "async":
            return "async"
        parts = [f"{self.kind}", f"workers={self.workers}"]
        if self.kind == "ssp":
            parts.append(f"slack={self.slack}")
        if self.kind == "hybrid":
            parts.append(f"groups={self.groups}")
        if self.apply != "add":
            parts.append(f"apply={self.apply}")
        parts.append(f"worker_timeout={self.worker_timeout:g}s on_timeout={self.on_timeout}")
        return " ".join(parts)


ASYNC = Mode()


def describe_options(options: Mapping[str, Any]) -> str:
    """The mode line ``irdma stat`` and the mount's xattr show for tensor options."""
    try:
        return Mode.from_options(options).describe()
    except ValueError as exc:  # written by a newer irdma, say
        return f"unknown ({exc})"


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Who a worker process is: its rank among ``world_size`` workers."""

    rank: int
    world_size: int

    def __post_init__(self) -> None:
        if not 1 <= self.world_size <= MAX_WORKERS:
            raise ValueError(f"world size must be between 1 and {MAX_WORKERS}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside 0..{self.world_size - 1}")


# (rank variable, size variable) of the launchers we recognise, in order.
LAUNCHER_VARIABLES = (
    ("RANK", "WORLD_SIZE"),  # torchrun, torch.distributed.launch
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),  # Open MPI's mpirun
    ("PMI_RANK", "PMI_SIZE"),  # MPICH, Intel MPI
    ("SLURM_PROCID", "SLURM_NTASKS"),  # srun
)


def worker_identity(
    rank: int | None = None,
    world_size: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> WorkerIdentity:
    """The worker's identity: explicit arguments, else the launcher's environment.

    Raises ValueError naming the variables it looked for when neither is there.
    """
    if rank is not None and world_size is not None:
        return WorkerIdentity(rank, world_size)
    env = os.environ if environ is None else environ
    for rank_var, size_var in LAUNCHER_VARIABLES:
        if rank_var in env and size_var in env:
            try:
                found = int(env[rank_var]), int(env[size_var])
            except ValueError:
                raise ValueError(
                    f"{rank_var}={env[rank_var]!r} / {size_var}={env[size_var]!r} are not integers"
                ) from None
            return WorkerIdentity(
                found[0] if rank is None else rank,
                found[1] if world_size is None else world_size,
            )
    names = ", ".join(f"{r}/{s}" for r, s in LAUNCHER_VARIABLES)
    raise ValueError(f"no worker rank given and none of {names} is set; pass rank and world_size")
