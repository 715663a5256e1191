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
from .registry import current_epoch


class ConfigInForce:
    """The config in force in this process, replaced whole by ``adopt``."""

    def __init__(self, config: ClusterConfig) -> None:
        self._config = config

    @property
    def config(self) -> ClusterConfig:
        return self._config

    @property
    def needs_epoch(self) -> bool:
        """A config naming only etcd: the daemons come from the epoch stored there.
        (With ``[[nodes]]`` too, a daemon's refusal brings the epoch in force.)"""
        c = self._config
        return c.etcd is not None and c.epoch is None and not c.nodes

    async def adopt_stored_epoch(self, timeout: float) -> None:
        """Adopt the epoch stored in etcd where the config names no daemons
        (``needs_epoch``); EtcdError if etcd does not answer within ``timeout``."""
        if self._config.etcd is not None and self.needs_epoch:
            self.adopt(await current_epoch(self._config.etcd, timeout))

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
