"""Model versions of a torch module: a trainer publishes, readers follow (weight sync).

- ``publish_state_dict(client, prefix, module)`` commits the module's state
  dict as the next version of model ``prefix`` (every tensor at once, as
  ``irdma.client.versions``), CUDA tensors included; returns the number.
- ``StateFollower(client, prefix, module)`` keeps a module at a version:
  ``sync()`` loads the latest (or a given version, or the newest at least
  v); the first sync reads every tensor, the next ones move only the
  elements that changed since the version it holds, checked against the
  commit's digests. ``slices=`` makes it a tensor-parallel reader: its
  module holds only its block of each named tensor, and only that block
  moves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from irdma.client import Client, Snapshot
from irdma.client.manifests import DEFAULT_KEEP
from irdma.client.versions import BlockingPin
from irdma.errors import VersionNotFound

from .arrays import from_numpy, to_numpy


def publish_state_dict(
    client: Client,
    prefix: str,
    module: Any,
    *,
    keep: int = DEFAULT_KEEP,
    extra: Mapping[str, Any] | None = None,
) -> int:
    """Commit a module's (or a state dict's) tensors as the next version of model
    ``prefix``; return its number. ``keep``: versions the model keeps."""
    state = module.state_dict() if hasattr(module, "state_dict") else module
    arrays = {k: v.detach() for k, v in state.items()}
    return client.model(prefix, keep=keep).commit(arrays, extra=extra)


class StateFollower:
    """Keeps ``module`` at a version of model ``prefix``, moving only what changed."""

    def __init__(
        self,
        client: Client,
        prefix: str,
        module: torch.nn.Module,
        *,
        slices: Mapping[str, Sequence[slice]] | None = None,
        pin: bool = True,
    ) -> None:
        self.model = client.model(prefix)
        self.module = module
        self.slices = dict(slices or {})
        self.held: Snapshot | None = None
        # The version held is pinned (renewed at each sync), so the next sync can
        # move only what changed, and the daemons' metrics show how far behind.
        self.pins = pin
        self._pin: BlockingPin | None = None
        # Bytes the last sync moved from the daemons.
        self.last_bytes = 0

    @property
    def version(self) -> int:
        """The version the module holds (0 before the first sync)."""
        return 0 if self.held is None else self.held.version

    def sync(self, version: int | None = None, *, at_least: int | None = None) -> int:
        """Load ``version`` (the latest by default, at least ``at_least``) into the
        module; return its number."""
        state = self.module.state_dict()
        if self.held is None:
            out = {k: np.empty_like(to_numpy(v)) for k, v in state.items()}
            snap = self.model.read(version, at_least=at_least, out=out, slices=self.slices)
        else:
            snap = self.model.pull(self.held, version, at_least=at_least, slices=self.slices)
        with torch.no_grad():
            for k, v in state.items():
                v.copy_(from_numpy(snap.arrays[k]).reshape(v.shape))
        self.held = snap
        self.last_bytes = snap.bytes_read
        if self.pins:
            self._hold(snap.version)
        return snap.version

    def _hold(self, version: int) -> None:
        """Pin ``version`` in place of the version held before."""
        old = self._pin
        try:
            self._pin = self.model.pin(version)
        except VersionNotFound:
            self._pin = None  # pruned already: the next sync reads whole where it must
        if old is not None:
            old.release()

    def close(self) -> None:
        """Release the pin on the version held."""
        if self._pin is not None:
            self._pin.release()
            self._pin = None
