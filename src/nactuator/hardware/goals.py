"""Goal positions of a telemetry bus: one sync write of every servo's target per cycle
(clipped to the joint limits, the bus watchdog fed first) and the read-back of the goals
the servos hold.
"""

from __future__ import annotations

import time

import numpy as np

from nactuator.hardware.port import COMM_SUCCESS, BusError
from nactuator.hardware.watchdog import BusWatchdog


class Goals(BusWatchdog):
    """``write_goal()`` / ``read_goal()``; a goal write arms and feeds the bus watchdog."""

    lo: np.ndarray  # joint limits goals are clipped to
    hi: np.ndarray
    units: list  # per channel: register units <-> SI (set by the protocol subclasses)
    lerobot: object  # the LeRobot bus the sync write goes through

    GOAL_RETRIES = 5

    def write_goal(self, q: np.ndarray) -> None:
        """Command joint targets (SI, channel order, clipped to the joint limits) with one
        sync write through LeRobot, no reply; servos known to be absent are skipped."""
        q = np.clip(np.asarray(q, dtype=float), self.lo, self.hi)
        raw = {n: self.units[k].raw_position(q[k]) for k, n in enumerate(self.names)
               if np.isfinite(q[k]) and self.ids[k] not in self._absent}
        if raw:
            if self.watchdog_s:
                self._keep_watchdog()
            self.lerobot.sync_write("Goal_Position", raw, normalize=False)
            self._last_request = time.monotonic()

    def read_goal(self) -> np.ndarray:
        """The goal position each servo currently holds (SI), read servo by servo with up
        to ``GOAL_RETRIES`` tries each (a read has no side effect; one corrupt reply in a
        group read would fail them all)."""
        q = np.empty(len(self.ids))
        for k, (name, sid) in enumerate(zip(self.names, self.ids, strict=True)):
            for _ in range(self.GOAL_RETRIES):
                self._drain()
                raw = self._read_goal_raw(sid)
                if raw is not None:
                    break
            else:
                raise BusError(f"could not read Goal_Position of servo {sid} ({name}) on "
                               f"{self.port} in {self.GOAL_RETRIES} tries: check its cable "
                               "and power")
            q[k] = self.units[k].position(raw)
        return q

    def _read_goal_raw(self, sid: int) -> int | None:
        """The servo's Goal_Position register (signed raw counts), or None if no answer."""
        value, comm, _ = self._read_register(sid, "Goal_Position")
        return value if comm == COMM_SUCCESS else None

