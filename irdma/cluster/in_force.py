"""The config in force in one process: that of the newest epoch it has adopted.

A ``ClusterConfig`` never changes. A daemon or client that follows epochs
holds one ``ConfigInForce`` and hands it to each part that must see the cluster
move on; adopting a newer epoch replaces the config whole. A part reads
``in_force.config`` where it decides, and keeps that config for the length of one
decision (a request, a forward, a catch-up), so no decision mixes two epochs'
members or placement.
"""

from __future__ import annotations

from .config import ClusterConfig
from .epochs import Epoch


class ConfigInForce:
    """The config in force in this process, replaced whole by ``adopt``."""

    def __init__(self, config: ClusterConfig) -> None:
        self._config = config

    @property
    def config(self) -> ClusterConfig:
        return self._config

    def adopt(self, epoch: Epoch) -> bool:
        """Follow ``epoch`` if it is newer than the one in force (False: nothing changes)."""
        newer = self._config.following(epoch)
        if newer is None:
            return False
        self._config = newer
        return True

    def __repr__(self) -> str:
        epoch = self._config.epoch.number if self._config.epoch else None
        return f"ConfigInForce(epoch={epoch}, nodes={len(self._config.nodes)})"
