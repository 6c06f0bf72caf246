"""The one fixed-rate loop clock (recorder, live loop) and sub-millisecond waits.

:class:`FixedRate` lays slots every ``1/fps`` s on one clock (``time.perf_counter``) from
:meth:`FixedRate.start`; after each cycle :meth:`FixedRate.wait` sleeps until the next
slot. A cycle that ends late runs the next one at once if that slot is at most one period
past; slots it overran by more are lost: skipped, counted in ``lost``, and the loop
re-anchors on the current slot of the same grid. It never bursts through missed slots to
catch up (each slot runs at most one cycle) and never stretches: slot k always starts at
``t0 + k / fps`` or not at all, so a loop of N slots lasts N periods whatever the load.
"""

from __future__ import annotations

import time
from collections.abc import Callable

SPIN_S = 3e-4  # time.sleep overshoots by ~0.1 ms on Linux; spin the last 0.3 ms


def sleep_until(deadline: float) -> None:
    """Return at ``deadline`` (a ``time.perf_counter()`` value), not much later."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left - SPIN_S if left > SPIN_S else 0)


class FixedRate:
    """Slots at ``fps`` on ``clock``; ``sleep_until(t)`` waits for a clock value (both
    replaceable, e.g. by a fake clock in tests).

        pace = FixedRate(50.0).start()
        while pace.slot < n_slots:
            late_s = pace.clock() - pace.scheduled  # how late this slot's cycle starts
            ...                                     # one cycle
            pace.wait(n_slots)                      # -> slots lost (also in pace.lost)
    """

    def __init__(self, fps: float, clock: Callable[[], float] = time.perf_counter,
                 sleep_until: Callable[[float], None] = sleep_until) -> None:
        if not fps > 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.period = 1.0 / fps
        self.clock = clock
        self._sleep_until = sleep_until
        self.t0 = 0.0
        self.slot = 0  # the slot the current cycle belongs to
        self.lost = 0  # slots skipped since start()

    def start(self) -> FixedRate:
        """Slot 0 is now."""
        self.t0 = self.clock()
        self.slot = self.lost = 0
        return self

    @property
    def scheduled(self) -> float:
        """When the current slot was due (a ``clock`` value)."""
        return self.t0 + self.slot * self.period

    def wait(self, end: int | None = None) -> int:
        """Move to the next slot and sleep until it is due; returns how many slots were
        lost on the way (never more than remain before slot ``end``, if given)."""
        self.slot += 1
        late = self.clock() - self.scheduled
        if late <= 0:
            self._sleep_until(self.scheduled)
            return 0
        lost = int(late // self.period) if late > self.period else 0
        if end is not None:
            lost = max(0, min(lost, end - self.slot))
        self.slot += lost
        self.lost += lost
        return lost
