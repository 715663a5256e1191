"""The client's retry policy (irdma/client/retry.py): what is tried again, until when.
Pure: the loops run under trio's autojump clock, no daemons."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from irdma.client.retry import (
    AGREE_PAUSE,
    EPOCH_PAUSE,
    FAILOVER_PAUSE_MAX,
    STALE_RETRIES,
    agree_pause,
    failover_pause,
    patience,
    redefined,
    rerouted,
    with_fresh_meta,
)
from irdma.errors import StaleEpoch, StaleLayout, TensorNotFound
from irdma.protocol import TensorMeta

CLOCK = SimpleNamespace(now=trio.current_time, sleep=trio.sleep)


def meta(shape: tuple[int, ...] = (8,), place: int = 0) -> TensorMeta:
    return TensorMeta("r/t", "float32", shape, 4096, place=place)


def run(fn, *args):  # type: ignore[no-untyped-def]
    return trio.run(fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_epoch_change_is_rerouted_until_it_succeeds() -> None:
    calls: list[float] = []

    async def op() -> str:
        calls.append(trio.current_time())
        if len(calls) < 3:
            raise StaleEpoch("behind")
        return "done"

    async def main() -> str:
        return await rerouted(CLOCK, 10.0, op)

    assert run(main) == "done"
    assert [round(b - a, 6) for a, b in itertools.pairwise(calls)] == [EPOCH_PAUSE] * 2


def test_an_epoch_change_that_never_settles_raises_after_the_patience() -> None:
    async def op() -> None:
        raise StaleEpoch("behind")

    async def main() -> float:
        start = trio.current_time()
        with pytest.raises(StaleEpoch):
            await rerouted(CLOCK, 1.0, op)
        return trio.current_time() - start

    assert 1.0 <= run(main) < 1.0 + 2 * EPOCH_PAUSE


def test_a_stale_layout_is_read_again_with_fresh_metadata() -> None:
    old, new = meta((8,)), meta((16,))
    seen: list[TensorMeta] = []

    async def op(m: TensorMeta) -> int:
        seen.append(m)
        if m is old:
            raise StaleLayout("redefined")
        return m.shape[0]

    async def refresh() -> TensorMeta:
        return new

    async def main() -> int:
        return await with_fresh_meta(CLOCK, 5.0, old, refresh, op)

    assert run(main) == 16
    assert seen == [old, new]


def test_the_same_layout_again_is_tried_a_few_times_then_raised() -> None:
    same = meta()
    tries = 0

    async def op(m: TensorMeta) -> None:
        nonlocal tries
        tries += 1
        raise TensorNotFound("renamed away")

    async def refresh() -> TensorMeta:
        return same

    async def main() -> None:
        with pytest.raises(TensorNotFound):
            await with_fresh_meta(CLOCK, 5.0, same, refresh, op)

    run(main)
    assert tries == STALE_RETRIES + 1


def test_failover_pauses_grow_with_each_round_up_to_a_bound() -> None:
    pauses = [failover_pause(r) for r in range(1, 10)]
    assert pauses == sorted(pauses)
    assert pauses[0] > 0 and pauses[-1] == FAILOVER_PAUSE_MAX


def test_patience_is_the_timeout_and_two_failure_detections() -> None:
    assert patience(2.0, 0.5) == 3.0


def test_a_write_refused_as_stale_runs_once_more_on_the_tensor_defined_again() -> None:
    old, new = meta((8,)), meta((16,))
    seen: list[TensorMeta] = []
    redefinitions = 0

    async def redefine() -> TensorMeta:
        nonlocal redefinitions
        redefinitions += 1
        return new

    async def write(m: TensorMeta) -> int:
        seen.append(m)
        if m is old:
            raise StaleLayout("redefined by another client")
        return m.shape[0]

    async def always_stale(m: TensorMeta) -> None:
        seen.append(m)
        raise TensorNotFound("deleted again")

    async def main() -> None:
        assert await redefined(old, redefine, write) == 16
        assert (seen, redefinitions) == ([old, new], 1)
        seen.clear()
        with pytest.raises(TensorNotFound):
            await redefined(old, redefine, always_stale)
        assert (seen, redefinitions) == ([old, new], 2)  # once more only
        seen.clear()
        assert await redefined(new, redefine, write) == 16  # not stale: as it is
        assert (seen, redefinitions) == ([new], 2)

    run(main)


def test_a_read_waiting_for_one_write_pauses_longer_each_round() -> None:
    assert [agree_pause(r) for r in (1, 2, 3)] == [AGREE_PAUSE, 2 * AGREE_PAUSE, 3 * AGREE_PAUSE]
