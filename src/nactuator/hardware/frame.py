"""One cycle of a servo arm's telemetry in SI units: what :meth:`TelemetryBus.read` returns.

Its own module so that what consumes frames (recorder, collector, live loop) and the bus
parts that fill them share the type without importing the whole bus.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class TelemetryFrame:
    """One cycle of telemetry, one value per channel in the platform's order.

    ``valid[i]`` is False when motor i's telemetry could not be read this cycle; its values
    are then NaN (never the previous reading). ``errors`` maps servo id -> the hardware
    error text that servo reported this cycle.
    """

    t: float  # time.monotonic() when the read completed [s]
    q: np.ndarray
    qd: np.ndarray
    effort: np.ndarray
    voltage: np.ndarray
    temperature: np.ndarray
    pwm: np.ndarray
    current: np.ndarray
    valid: np.ndarray
    errors: dict[int, str] = field(default_factory=dict)
    torque: np.ndarray | None = None  # 1 where torque is on (as last set or read back)
    read_s: float = 0.0  # wall time the read took

    @classmethod
    def empty(cls, n: int) -> TelemetryFrame:
        nan = np.full(n, np.nan)
        return cls(time.monotonic(), nan.copy(), nan.copy(), nan.copy(), nan.copy(),
                   nan.copy(), nan.copy(), nan.copy(), np.zeros(n, dtype=bool))

