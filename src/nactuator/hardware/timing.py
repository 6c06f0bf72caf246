"""Sub-millisecond waits for fixed-rate loops (recorder, live loop, emulated wire time)."""

from __future__ import annotations

import time

SPIN_S = 3e-4  # time.sleep overshoots by ~0.1 ms on Linux; spin the last 0.3 ms


def sleep_until(deadline: float) -> None:
    """Return at ``deadline`` (a ``time.perf_counter()`` value), not much later."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left - SPIN_S if left > SPIN_S else 0)
