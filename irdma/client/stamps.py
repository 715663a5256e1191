"""Whole-tensor write stamps: ids that are unique and ordered.

A stamp names one whole-tensor write on every shard it reaches, and orders it
against the other whole writes of the tensor: each shard keeps the later of
two (a daemon refuses a whole write older than the one it holds,
``STALE_STAMP``, naming that one), and the writer stamps the write again
above it and writes every shard again. So whole writes converge on one write
on every shard, whatever order each shard's primary received them in.

A stamp is a hybrid logical clock: ``TICK_BITS`` of 1/``TICKS_PER_SECOND``-s
ticks since the Unix epoch (good until 2106) above ``RANDOM_BITS`` random
bits. The tick is the client's (each client's data path owns a ``StampClock``;
no state is shared across a process), monotonic: above the last it stamped
with and above any stamp it was told of (``after``), and the wall clock's when
that is ahead. Writes of one client therefore never refuse each other, writes of
different clients are ordered by their clocks as far as those agree, and a
write refused because another machine's clock was ahead goes after that write
(a causally later write is never silently lost: its refusal makes it win).

The random bits are drawn per stamp from the operating system (``secrets``),
never from the process-wide ``random``, which training scripts seed alike on
every rank. They make two stamps of one tick from two clients differ (and a
forked child's from its parent's): two distinct writes share a stamp only if
they fall in the same tick and draw the same bits (1 in 2**22), and even then
a daemon refuses the second one it receives (an equal stamp is not later), so
their writers stamp again. Drawn per stamp rather than once per process, they
cannot repeat that collision on the writes stamped again.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

TICKS_PER_SECOND = 1024
RANDOM_BITS = 22
TICK_BITS = 64 - RANDOM_BITS
LAST_TICK = (1 << TICK_BITS) - 1


class StampClock:
    """The stamps of one client: each above the one before it and any it was told of."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self._tick = 0
        self._lock = threading.Lock()  # cheap, and safe should two threads share a client

    def next(self, after: int = 0) -> int:
        """A fresh stamp, later than every stamp this clock made and than ``after``."""
        with self._lock:
            tick = max(int(self._wall() * TICKS_PER_SECOND), self._tick + 1, tick_of(after) + 1)
            if tick > LAST_TICK:
                raise ValueError(
                    f"no whole-tensor write stamp can come after {after:#x}: the stamp "
                    "clock is at its end (a stamp from a clock set far in the future)"
                )
            self._tick = tick
        return tick << RANDOM_BITS | secrets.randbits(RANDOM_BITS)


def tick_of(stamp: int) -> int:
    """The clock part of ``stamp``."""
    return stamp >> RANDOM_BITS
