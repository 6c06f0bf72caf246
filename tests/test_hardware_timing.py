"""The one fixed-rate loop (recorder and live loop) on a fake clock: slots on a fixed grid,
a late cycle loses whole slots (counted) and re-anchors on the grid, never bursting."""

from __future__ import annotations

import random

import pytest

from nactuator.hardware.timing import FixedRate


class FakeClock:
    """A clock that only moves when a cycle 'works' or the loop sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep_until(self, t: float) -> None:
        self.sleeps.append(t)
        self.now = max(self.now, t)


def _rate(fps: float = 10.0) -> tuple[FixedRate, FakeClock]:
    clock = FakeClock()
    return FixedRate(fps, clock, clock.sleep_until).start(), clock


def test_on_time_cycles_sleep_to_each_slot_of_the_grid() -> None:
    rate, clock = _rate(10.0)
    for k in range(1, 5):
        clock.now += 0.03  # a 30 ms cycle
        assert rate.wait() == 0
        assert clock.now == pytest.approx(0.1 * k) and rate.scheduled == pytest.approx(0.1 * k)
    assert rate.lost == 0 and rate.slot == 4


def test_a_late_cycle_loses_whole_slots_and_reanchors_on_the_grid_without_bursting() -> None:
    rate, clock = _rate(10.0)
    clock.now = 0.35  # slot 0's cycle overran slots 1 and 2
    assert rate.wait() == 2 and rate.lost == 2
    assert rate.slot == 3 and rate.scheduled == pytest.approx(0.3)  # same grid, due already
    assert clock.sleeps == []  # slot 3 runs at once, late by 50 ms ...
    clock.now += 0.01
    assert rate.wait() == 0
    assert clock.sleeps == [pytest.approx(0.4)]  # ... and slot 4 waits for its time: no burst
    # Late by at most one period: that slot still runs (late), nothing is lost.
    clock.now = 0.5
    assert rate.wait() == 0 and rate.slot == 5 and clock.now == pytest.approx(0.5)
    clock.now = 0.6 + 0.1
    assert rate.wait() == 0 and rate.slot == 6  # exactly one period late
    assert rate.lost == 2


def test_lost_slots_stop_at_the_end_of_the_run() -> None:
    rate, clock = _rate(10.0)
    clock.now = 10.0  # one very long cycle
    assert rate.wait(end=5) == 4 and rate.slot == 5 and rate.lost == 4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_slot_is_one_cycle_or_one_lost_slot_and_the_run_never_stretches(seed) -> None:
    # The recorder's accounting: frames + lost == n_slots, each cycle starts no earlier than
    # its slot and at most one period after it, and the run ends on time.
    gen = random.Random(seed)
    fps, n_slots = 50.0, 400
    rate, clock = _rate(fps)
    period = 1 / fps
    starts: list[tuple[int, float]] = []
    while rate.slot < n_slots:
        starts.append((rate.slot, clock.now))
        clock.now += period * gen.choice([0.2, 0.5, 0.9, 1.5, 3.7])  # cycle time
        rate.wait(n_slots)
    assert len(starts) + rate.lost == n_slots
    assert rate.lost > 0
    slots = [s for s, _ in starts]
    assert slots == sorted(set(slots))  # at most one cycle per slot
    for slot, t in starts:
        assert slot * period - 1e-12 <= t <= (slot + 1) * period + 1e-12
    assert clock.now <= (n_slots + 4) * period  # the longest cycle past the end, no more


def test_fps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="fps must be > 0"):
        FixedRate(0.0)
