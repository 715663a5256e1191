"""The client's metadata cache: the layout of each tensor it used, by name.

Kept until a daemon says the layout changed or the tensor is gone
(StaleLayout, TensorNotFound), or this client changes the name itself
(create, delete, rename); then it is asked for again.
"""

from __future__ import annotations

from ..protocol import TensorMeta


class MetaCache:
    """Tensor metadata by name, as this client last learned it."""

    def __init__(self) -> None:
        self._by_name: dict[str, TensorMeta] = {}

    def get(self, name: str) -> TensorMeta | None:
        return self._by_name.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def put(self, meta: TensorMeta, name: str | None = None) -> None:
        """Remember ``meta`` under ``name`` (its own name unless given)."""
        self._by_name[meta.name if name is None else name] = meta

    def drop(self, name: str) -> TensorMeta | None:
        """Forget ``name``; what was cached for it, if anything."""
        return self._by_name.pop(name, None)
