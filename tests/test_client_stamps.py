"""Tests for irdma.client.stamps: whole-write stamps are unique and ordered (a
hybrid logical clock over random bits). No daemons."""

from __future__ import annotations

import pytest

from irdma.client.stamps import (
    LAST_TICK,
    RANDOM_BITS,
    TICKS_PER_SECOND,
    StampClock,
    tick_of,
)


class Wall:
    """A wall clock the test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_stamps_follow_the_wall_clock_while_it_is_ahead() -> None:
    wall = Wall(1_700_000_000.0)
    clock = StampClock(wall)
    first = clock.next()
    assert tick_of(first) == int(wall.now * TICKS_PER_SECOND)
    wall.now += 10.0
    assert tick_of(clock.next()) == int(wall.now * TICKS_PER_SECOND)


def test_stamps_increase_when_the_wall_clock_stands_still_or_goes_back() -> None:
    wall = Wall(1_700_000_000.0)
    clock = StampClock(wall)
    stamps = [clock.next() for _ in range(100)]
    wall.now -= 3600.0  # set back an hour
    stamps += [clock.next() for _ in range(100)]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert all(s > 1 for s in stamps)  # 0 and 1 mean "no stamp" and UNSTAMPED


def test_a_stamp_after_one_from_a_clock_ahead_comes_after_it_and_so_do_the_next() -> None:
    """A write refused for a later one is stamped after it (its writer's clock was
    behind), and this process's next writes do not fall behind it again."""
    wall = Wall(1_700_000_000.0)
    clock = StampClock(wall)
    ahead = StampClock(Wall(wall.now + 60.0)).next()
    mine = clock.next()
    assert mine < ahead
    again = clock.next(after=ahead)
    assert again > ahead and tick_of(again) == tick_of(ahead) + 1
    assert clock.next() > again


def test_the_clock_s_end_is_a_clear_error() -> None:
    clock = StampClock(Wall(0.0))
    with pytest.raises(ValueError, match="stamp clock is at its end"):
        clock.next(after=LAST_TICK << RANDOM_BITS)
    assert clock.next(after=(LAST_TICK - 1) << RANDOM_BITS) >> RANDOM_BITS == LAST_TICK


def test_two_processes_stamping_in_one_tick_draw_different_bits() -> None:
    wall = Wall(1_700_000_000.0)
    stamps = {StampClock(wall).next() for _ in range(64)}
    assert len({tick_of(s) for s in stamps}) == 1
    assert len(stamps) > 60  # 4 repeats in 64 draws of 22 bits: under 1 in 10**12


def test_a_client_s_clock_is_monotonic() -> None:
    clock = StampClock()
    stamps = [clock.next() for _ in range(1000)]
    assert stamps == sorted(stamps) and len(set(stamps)) == 1000
