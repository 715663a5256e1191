"""The tensors one daemon holds and the rules that change them (``store.Store``
composes the parts; its module docstring names each one's role)."""

from ..errors import StoreError
from .outbox import Commit, held_commit
from .records import PendingUpdate, Shard, Tensor
from .store import Store

__all__ = ["Commit", "PendingUpdate", "Shard", "Store", "StoreError", "Tensor", "held_commit"]
