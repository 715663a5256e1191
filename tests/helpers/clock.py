"""A clock the test moves: it stands still until ``now`` is set."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Clock:
    """Called as ``time.monotonic`` is; answers ``now``."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now
