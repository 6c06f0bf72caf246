"""Servo firmware protections: what a real servo does when a controller tears at the arm.

Both are vectorised over the world's ``(n_envs, n)`` motors and latch, as the firmware
does: once tripped a motor stays tripped until the world is reset (a real servo needs a
reboot or a torque re-enable). Register names and units are the vendors' (servos.md §5 for
the STS3215, the XM430 e-manual for DYNAMIXEL; the addresses are in
``nactuator.hardware.control_table``):

- **Feetech STS3215** (``FeetechProtection``):
  ``Protection_Current`` (≈ 6.5 mA per unit) held for ``Over_Current_Protection_Time``
  (10 ms units) switches the torque off and sets the over-current bit (8) of the status
  byte. ``Overload_Torque`` (% of full output) held for ``Protection_Time`` (10 ms units)
  sets the overload bit (32) and limits the output to ``Protective_Torque`` %.
- **DYNAMIXEL XM430** (``DynamixelProtection``): the current is clipped at ``Current_Limit``
  by the motor model already; running at that limit for ``overload_time`` seconds sets
  Hardware Error Status bit 5 (overload) and the firmware switches the torque off.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import numpy as np

from .params import WorldError

__all__ = ["DynamixelProtection", "FeetechProtection", "Protection", "make_protection",
           "STS_OVERCURRENT_BIT", "STS_OVERLOAD_BIT", "XM_OVERLOAD_BIT"]

STS_CURRENT_UNIT = 0.0065  # A per Protection_Current count (servos.md §5)
STS_TIME_UNIT = 0.01  # s per Protection_Time / Over_Current_Protection_Time count
STS_OVERCURRENT_BIT = 8  # status byte bit values (servos.md §4 "ERR bits")
STS_OVERLOAD_BIT = 32
XM_CURRENT_UNIT = 0.00269  # A per Current_Limit count (XM430)
XM_OVERLOAD_BIT = 1 << 5  # Hardware Error Status bit 5


class Protection(ABC):
    """Common state: per-motor timers over threshold and the latched error bits."""

    def __init__(self, n_envs: int, n: int) -> None:
        self.n_envs, self.n = n_envs, n
        self.reset()

    def reset(self) -> None:
        shape = (self.n_envs, self.n)
        self.errors = np.zeros(shape, dtype=np.int64)  # latched status bits per motor
        self.peak_current = np.zeros(shape)  # |A| seen since reset
        self._over_current_s = np.zeros(shape)
        self._overload_s = np.zeros(shape)

    @property
    def tripped(self) -> np.ndarray:
        """(n_envs, n) bool: any protection fired on that motor."""
        return self.errors != 0

    def limit_pwm(self, pwm: np.ndarray, pwm_full: np.ndarray) -> np.ndarray:
        """The firmware's output after protections (before the H-bridge)."""
        return pwm

    @abstractmethod
    def update(self, current: np.ndarray, duty: np.ndarray, torque_enabled: np.ndarray,
               dt: float) -> np.ndarray:
        """Advance the timers one physics step; returns the torque-enable mask to apply."""


class FeetechProtection(Protection):
    def __init__(self, n_envs: int, n: int, registers: Mapping[str, float]) -> None:
        need = ("Protection_Current", "Over_Current_Protection_Time", "Overload_Torque",
                "Protection_Time", "Protective_Torque")
        missing = [k for k in need if k not in registers]
        if missing:
            raise WorldError(f"feetech protection: missing registers {missing}")
        self.current_limit = float(registers["Protection_Current"]) * STS_CURRENT_UNIT
        self.current_time = float(registers["Over_Current_Protection_Time"]) * STS_TIME_UNIT
        self.overload = float(registers["Overload_Torque"]) / 100.0
        self.overload_time = float(registers["Protection_Time"]) * STS_TIME_UNIT
        self.protective = float(registers["Protective_Torque"]) / 100.0
        super().__init__(n_envs, n)

    def limit_pwm(self, pwm: np.ndarray, pwm_full: np.ndarray) -> np.ndarray:
        cap = np.round(self.protective * pwm_full).astype(np.int64)
        overloaded = (self.errors & STS_OVERLOAD_BIT) != 0
        return np.where(overloaded, np.clip(pwm, -cap, cap), pwm)

    def update(self, current: np.ndarray, duty: np.ndarray, torque_enabled: np.ndarray,
               dt: float) -> np.ndarray:
        """Advance the timers one physics step; returns the torque-enable mask to apply."""
        self.peak_current = np.maximum(self.peak_current, np.abs(current))
        over = np.abs(current) > self.current_limit
        self._over_current_s = np.where(over, self._over_current_s + dt, 0.0)
        loaded = np.abs(duty) > self.overload
        self._overload_s = np.where(loaded, self._overload_s + dt, 0.0)
        self.errors |= np.where(self._over_current_s >= self.current_time - 1e-9,
                                STS_OVERCURRENT_BIT, 0)
        self.errors |= np.where(self._overload_s >= self.overload_time - 1e-9, STS_OVERLOAD_BIT, 0)
        return torque_enabled & ((self.errors & STS_OVERCURRENT_BIT) == 0)


class DynamixelProtection(Protection):
    def __init__(self, n_envs: int, n: int, registers: Mapping[str, float]) -> None:
        if "Current_Limit" not in registers or "overload_time" not in registers:
            raise WorldError("dynamixel protection: needs Current_Limit and overload_time")
        self.current_limit = float(registers["Current_Limit"]) * XM_CURRENT_UNIT
        self.overload_time = float(registers["overload_time"])
        super().__init__(n_envs, n)

    def update(self, current: np.ndarray, duty: np.ndarray, torque_enabled: np.ndarray,
               dt: float) -> np.ndarray:
        self.peak_current = np.maximum(self.peak_current, np.abs(current))
        # At the limit (within 2 %: the motor model clips there), the firmware counts.
        at_limit = np.abs(current) >= 0.98 * self.current_limit
        self._overload_s = np.where(at_limit, self._overload_s + dt, 0.0)
        self.errors |= np.where(self._overload_s >= self.overload_time - 1e-9, XM_OVERLOAD_BIT, 0)
        return torque_enabled & (self.errors == 0)


def make_protection(kind: str, n_envs: int, n: int,
                    registers: Mapping[str, float]) -> Protection:
    """``kind``: ``feetech`` | ``dynamixel`` (the platform's bus)."""
    if kind == "feetech":
        return FeetechProtection(n_envs, n, registers)
    if kind == "dynamixel":
        return DynamixelProtection(n_envs, n, registers)
    raise WorldError(f"unknown protection kind {kind!r}; expected feetech | dynamixel")
