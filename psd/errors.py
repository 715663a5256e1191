"""The refusal every part of the daemon raises: a status for the client and why."""

from __future__ import annotations

from irdma.protocol import Status


class StoreError(Exception):
    """A request the daemon refuses; ``status`` goes back to the client."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
