"""What the daemon refuses: a status for the client and why.

``Refusal`` is any refusal the daemon answers with (a frame it cannot take, a
request it must not serve now, a peer it does not follow); ``StoreError`` is
one the store's rules make (``psd/store/``, and the training-mode rules of
``psd/coordination.py``). A handler answers either the same way, so it catches
``Refusal``.
"""

from __future__ import annotations

from irdma.protocol import Status


class Refusal(Exception):
    """A request the daemon refuses; ``status`` goes back to the client, and with
    ``stamp`` the answer's stamp field (a STALE_STAMP names the later write)."""

    def __init__(self, status: Status, message: str, *, stamp: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.stamp = stamp


class StoreError(Refusal):
    """A request the store's rules refuse (no such tensor, a range outside it,
    no room, a stale layout, ...)."""
