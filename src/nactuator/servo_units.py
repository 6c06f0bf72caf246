"""Servo register encodings and register units <-> SI, in one place (Contract 1 units;
servos.md §2 and §5).

Everything that turns a servo's register value into SI or back uses this module: the
hidden world's telemetry quantisation (``world/registers.py``), the control tables and the
emulated firmware (``hardware/control_table.py``, ``hardware/emulator/``) and the buses
(``hardware/dynamixel.py``, ``hardware/feetech.py``). It sits below both rooms (stdlib and
numpy only), so the world never imports ``hardware`` and the buses never import ``world``.

Encodings of signed registers:
  XM430 / XL330  two's complement over the register's width
  STS3215        sign-magnitude: one bit is the sign, the bits below it the magnitude
                 (bit 15 for position and velocity, bit 10 for load, bit 11 for the offset)

XM430-W350 (Protocol 2.0):
  position   rad = (raw - 2048) * 2*pi/4096          (ROBOTIS maps raw 2048 to 0 rad)
  gripper    m   = (raw - 2048) * 1.7626621790e-5     (ROBOTIS dynamixel_hardware_interface)
  velocity   rad/s = raw * 0.229 rpm = raw * 0.023981 rad/s  (gripper: times the m/rad ratio)
  current    A   = raw * 2.69e-3                     (the OMX effort signal; XL330: 1e-3)
  PWM        duty = raw / 885
  voltage    V   = raw * 0.1;   temperature  degC = raw
STS3215 (LeRobot/NAD radians):
  position   rad = (raw - mid) * 2*pi/4095, mid = centre of the LeRobot calibration range
             (2048 without one), sign flipped if the calibration's drive_mode is 1
  velocity   rad/s = raw * 2*pi/4096                 (raw in steps/s, 50 steps/s resolution)
  load       fraction = raw / 1000                   (0.1 % of max torque; the SO-101 effort)
  current    A   = raw * 6.5e-3                      (uncertain scale; magnitude only)
  voltage    V   = raw * 0.1;   temperature  degC = raw;   PWM not available (NaN)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

XM430_RAD_PER_PULSE = 2 * math.pi / 4096
XM430_CENTER = 2048
XM430_RAD_S_PER_UNIT = 0.229 * 2 * math.pi / 60  # every DYNAMIXEL X series servo (XL330 too)
OMX_GRIPPER_M_PER_PULSE = 1.7626621790e-5
XM430_A_PER_UNIT = 2.69e-3
XL330_A_PER_UNIT = 1e-3
XM430_PWM_FULL = 885
STS_RAD_PER_STEP = 2 * math.pi / 4095  # NAD / LeRobot DEGREES convention (max_res = 4095)
STS_RAD_S_PER_STEP_S = 2 * math.pi / 4096
STS_CENTER = 2048
STS_LOAD_FULL = 1000
STS_A_PER_UNIT = 6.5e-3
STS_SIGN_BIT = 15  # position, velocity and their goals
STS_LOAD_SIGN_BIT = 10
STS_OFFSET_SIGN_BIT = 11  # Homing_Offset
VOLT_PER_UNIT = 0.1

Raw = TypeVar("Raw", int, np.ndarray)


# --- signed register encodings (an int in, an int out; an array in, an int64 array out) ---
def _integers(x):
    return x if isinstance(x, int) else np.asarray(x, dtype=np.int64)


def decode_sign_magnitude(raw: Raw, sign_bit: int) -> Raw:
    """Bit ``sign_bit`` set means negative; the bits below it are the magnitude."""
    r = _integers(raw)
    magnitude = r & ((1 << sign_bit) - 1)
    return magnitude - 2 * ((r >> sign_bit) & 1) * magnitude


def encode_sign_magnitude(value: Raw, sign_bit: int) -> Raw:
    v = _integers(value)
    magnitude = abs(v)
    limit = (1 << sign_bit) - 1
    worst = magnitude if isinstance(magnitude, int) else int(magnitude.max(initial=0))
    if worst > limit:
        raise ValueError(f"{value if isinstance(v, int) else worst} does not fit "
                         f"sign-magnitude with sign bit {sign_bit} (|value| <= {limit})")
    return magnitude | (v < 0) * (1 << sign_bit)


def decode_twos_complement(raw: int, bits: int) -> int:
    return raw - (1 << bits) if raw & (1 << (bits - 1)) else raw


def encode_twos_complement(value: int, bits: int) -> int:
    return value & ((1 << bits) - 1)


# --- one motor's position / velocity registers <-> its channel's SI coordinate ---------
@dataclass(frozen=True)
class MotorUnits:
    """How one motor's raw position/velocity map to its channel's SI coordinate."""

    pos_scale: float  # SI per raw position count
    center: float  # raw count at SI zero
    vel_scale: float  # SI/s per raw velocity unit
    sign: int = 1  # -1 when the calibration inverts the drive

    def position(self, raw: float) -> float:
        return self.sign * (raw - self.center) * self.pos_scale

    def raw_position(self, si: float) -> int:
        return int(round(self.center + self.sign * si / self.pos_scale))

    def velocity(self, raw: float) -> float:
        return self.sign * raw * self.vel_scale

    def raw_velocity(self, si: float) -> int:
        return int(round(self.sign * si / self.vel_scale))


def xm430_units(prismatic: bool, m_per_pulse: float = OMX_GRIPPER_M_PER_PULSE) -> MotorUnits:
    """``m_per_pulse``: finger travel per encoder count of a prismatic (gripper) channel."""
    if prismatic:
        m_per_rad = m_per_pulse / XM430_RAD_PER_PULSE
        return MotorUnits(m_per_pulse, XM430_CENTER, XM430_RAD_S_PER_UNIT * m_per_rad)
    return MotorUnits(XM430_RAD_PER_PULSE, XM430_CENTER, XM430_RAD_S_PER_UNIT)


def sts3215_units(range_min: int | None = None, range_max: int | None = None,
                  drive_mode: int = 0) -> MotorUnits:
    center = STS_CENTER if range_min is None or range_max is None else (range_min + range_max) / 2
    return MotorUnits(STS_RAD_PER_STEP, center, STS_RAD_S_PER_STEP_S, -1 if drive_mode else 1)


def motor_units(bus: str, prismatic: bool, calibration: dict | None = None,
                m_per_pulse: float = OMX_GRIPPER_M_PER_PULSE) -> MotorUnits:
    """Units for one motor. ``calibration`` is one LeRobot calibration entry (Feetech only)."""
    if bus == "dynamixel":
        return xm430_units(prismatic, m_per_pulse)
    if bus == "feetech":
        if prismatic:
            raise ValueError("a Feetech STS3215 channel must be revolute (rad)")
        cal = calibration or {}
        return sts3215_units(cal.get("range_min"), cal.get("range_max"), cal.get("drive_mode", 0))
    raise ValueError(f"unknown bus {bus!r}: expected 'dynamixel' or 'feetech'")
