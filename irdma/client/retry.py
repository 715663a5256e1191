"""The client's retry policy: when a call is tried again, how long for, how it pauses.

The loops, each with its deadline and pauses here:

- ``rerouted``: an operation over several daemons, run again while daemons
  say the cluster's epoch changed (StaleEpoch), for the ``patience``.
- ``with_fresh_meta``: a data call whose cached layout was stale, run again
  with fresh metadata (StaleLayout, TensorNotFound), within the timeout.
- ``redefined``: a write that defined its tensor, run once more on a tensor
  defined again when the layout it went by was stale.
- failover (``routing.Router.on_replicas``): one shard's request tried on its
  other replicas, for the ``patience``, pausing after each round
  (``failover_pause``).
- agreement (``agreement.agree``, ``settle_at``): a read's pieces read again
  until they come from one whole-tensor write, within the timeout, for
  ``AGREE_TRIES`` rounds without progress, the first ``AGREE_CHASE`` of them
  waiting for a write in progress, pausing ``agree_pause`` (their rules on
  which pieces to read again, and from which write, are ``agreement``'s).
- a whole-tensor write a shard refused for a later one (StaleStamp), stamped
  after it and sent to every shard again, within the timeout, without pause
  (``datapath.DataPath.move``; the order is ``stamps``').

A request itself is bounded by the client timeout (``session.Session.request``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from ..errors import StaleEpoch, StaleLayout, TensorNotFound
from ..protocol import TensorMeta

T = TypeVar("T")

# The pause before an operation that met a daemon behind the epoch runs again
# (the daemon catches up meanwhile).
EPOCH_PAUSE = 0.05
# Times a request refused for a stale layout is tried again when fresh metadata
# says the same (a rename under way), pausing this many seconds times the try.
STALE_RETRIES = 3
STALE_PAUSE = 0.002
# After a whole round of a shard's replicas failed: this many seconds times the
# round, at most FAILOVER_PAUSE_MAX (time for the cluster to fail over).
FAILOVER_PAUSE = 0.1
FAILOVER_PAUSE_MAX = 0.5
# Rounds without progress a read of several shards makes to get them all from
# one whole-tensor write before it gives up (TornRead); rounds it first spends
# waiting for a write in progress to reach the pieces behind; the pause (times
# the round) before it looks at those again.
AGREE_TRIES = 16
AGREE_CHASE = 4
AGREE_PAUSE = 0.0005


def patience(timeout: float, failure_detection: float) -> float:
    """Seconds a shard's request may keep failing over, and an operation be rerouted
    over epochs: the client timeout plus two failure detections (time for the
    cluster to notice a dead primary, or to move to a new epoch)."""
    return timeout + 2 * failure_detection


def failover_pause(rounds: int) -> float:
    """The pause after ``rounds`` whole rounds of a shard's replicas failed."""
    return min(FAILOVER_PAUSE * rounds, FAILOVER_PAUSE_MAX)


def agree_pause(rounds: int) -> float:
    """The pause after ``rounds`` rounds in which a read's pieces waited for a write
    to reach them (or to be had from its copy)."""
    return AGREE_PAUSE * rounds


class Clock(Protocol):
    """What the loops ask of the session: its clock and sleeps (the shell's)."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


async def rerouted(clock: Clock, patience: float, fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn`` (an operation over several daemons) again while daemons say the
    cluster's epoch changed, for ``patience`` seconds."""
    deadline = clock.now() + patience
    while True:
        try:
            return await fn()
        except StaleEpoch:
            if clock.now() >= deadline:
                raise
            await clock.sleep(EPOCH_PAUSE)  # a daemon behind the epoch catches up


async def with_fresh_meta(
    clock: Clock,
    timeout: float,
    meta: TensorMeta,
    refresh: Callable[[], Awaitable[TensorMeta]],
    fn: Callable[[TensorMeta], Awaitable[T]],
) -> T:
    """Run ``fn(meta)``; if the layout was stale, ``refresh`` it and run again.

    Again for as long as each refresh finds another tensor under the name
    (saved over by a rename while this was reading: the next one may be
    read whole), within ``timeout``. And a few times when it finds the same:
    a rename reaches the daemons one by one, so a reader may learn the new
    layout from one a moment before another has it.
    """
    deadline = clock.now() + timeout
    same = 0
    while True:
        try:
            return await fn(meta)
        except (StaleLayout, TensorNotFound):
            fresh = await refresh()
            if (fresh.key, fresh.layout) == (meta.key, meta.layout):
                same += 1
                if same > STALE_RETRIES:
                    raise
                await clock.sleep(STALE_PAUSE * same)
            elif clock.now() > deadline:
                raise
            meta = fresh


async def redefined(
    meta: TensorMeta,
    redefine: Callable[[], Awaitable[TensorMeta]],
    fn: Callable[[TensorMeta], Awaitable[T]],
) -> T:
    """Run ``fn(meta)``, a write that defined its tensor (or found it defined); if the
    layout was stale (the tensor was redefined or deleted meanwhile), ``redefine``
    the tensor and run once more."""
    try:
        return await fn(meta)
    except (StaleLayout, TensorNotFound):
        return await fn(await redefine())
