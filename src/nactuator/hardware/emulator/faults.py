"""Fault injection for the emulated bus: what can go wrong on a real servo chain."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Faults:
    """All rates are per reply packet; all randomness comes from ``seed``.

    corrupt_rate: reply's CRC (DYNAMIXEL) or checksum (Feetech) is wrong.
    drop_rate:    reply is never sent (the client times out).
    latency_ms:   every reply is delayed by this much (on top of bus timing).
    dead_ids:     servos that never answer (see also :meth:`Emulator.set_dead`).
    alert_ids:    servos that latch an overload hardware error (XM430 Hardware Error
                  Status bit 5 + Alert bit; STS3215 status bit 5), which also switches
                  their torque off, as the firmware's shutdown/unloading rule does.
    voltage_sag:  volts the supply drops at full effort (sag = voltage_sag x the largest
                  servo effort fraction); below Min_Voltage_Limit the servos flag an
                  input-voltage error.
    """

    corrupt_rate: float = 0.0
    drop_rate: float = 0.0
    latency_ms: float = 0.0
    dead_ids: set[int] = field(default_factory=set)
    alert_ids: set[int] = field(default_factory=set)
    voltage_sag: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("corrupt_rate", "drop_rate"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"Faults.{name} must be in [0, 1], got {v}")
        if self.latency_ms < 0 or self.voltage_sag < 0:
            raise ValueError("Faults.latency_ms and Faults.voltage_sag must be >= 0")
        self.dead_ids = set(self.dead_ids)
        self.alert_ids = set(self.alert_ids)
        self._rng = np.random.default_rng(self.seed)

    def drop(self) -> bool:
        return self.drop_rate > 0 and self._rng.random() < self.drop_rate

    def corrupt(self) -> bool:
        return self.corrupt_rate > 0 and self._rng.random() < self.corrupt_rate
