"""The units of an exported model's inputs and outputs, for its metadata.

SI as everywhere inside nactuator (docs/architecture.md, Contract 1), per motor in the
platform's channel order: a revolute joint's position is in rad, a prismatic one's (the
OMX gripper finger) in m. ``effort`` is the platform's servo telemetry signal, whose unit
depends on the servo (``Platform.effort_signal``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nactuator.input_filters import POOLED_KEYS
from nactuator.platforms import Platform

__all__ = ["EFFORT_UNITS", "export_units"]

EFFORT_UNITS = {
    "current": "A (Present Current)",
    "load": "fraction of max torque, signed (STS3215 Present_Load register / 1000)",
    "torque": "N·m (measured joint torque)",
    "pwm": "duty in [-1, 1] (Present PWM)",
}
POSITION = {"revolute": "rad", "prismatic": "m"}
VELOCITY = {"revolute": "rad/s", "prismatic": "m/s"}
TORQUE = {"revolute": "N·m", "prismatic": "N"}


def _pooled_unit(key: str, kind: str, effort_signal: str) -> str:
    """The input filters' pooled statistics (``pool``): moving averages over the bundle's
    ``input_filters.pool.frames`` of effort u and command c (nactuator.input_filters)."""
    u, c = EFFORT_UNITS[effort_signal], POSITION[kind]
    units = {"pool_effort_mean": u, "pool_effort_std": u, "pool_effort_abs": u,
             "pool_command_std": c, "pool_effort_command_corr": "1 (correlation of u and c)",
             "pool_effort_command_slope": f"({u}) per {c}",
             "pool_command_speed": f"{c} per frame (mean |Δc|)",
             "pool_effort_drive": f"{u} (mean u · sign(Δc))",
             "pool_effort_roughness": f"{u} per frame (mean |Δu|)"}
    return f"pooled statistic: {units[key]}"


def _channel_unit(key: str, kind: str, effort_signal: str) -> str:
    if key in POOLED_KEYS:
        return _pooled_unit(key, kind, effort_signal)
    if key in ("q_cmd", "q", "q_cmd_next"):
        return POSITION[kind]
    if key == "qd":
        return VELOCITY[kind]
    if key == "effort":
        return EFFORT_UNITS[effort_signal]
    if key in ("voltage", "supply_voltage"):
        return "V"
    if key in ("temperature", "initial_temperature"):
        return "°C"
    if key == "torque_enable":
        return "1 torque on, 0 off"
    if key == "kp":
        return "Position P gain register (raw servo units)"
    raise ValueError(f"no unit is known for window channel {key!r}")


def export_units(platform: Platform, inputs: Sequence[str]) -> dict[str, Any]:
    """``{"inputs": {key: [unit per motor]}, "pad": ..., "outputs": {name: unit or [per
    motor]}, "channels": [names]}`` for an actuator reading ``inputs`` on ``platform``."""
    kinds = [c.kind for c in platform.channels]
    return {
        "channels": platform.channel_names,
        "inputs": {key: [_channel_unit(key, kind, platform.effort_signal) for kind in kinds]
                   for key in inputs},
        "pad": "bool, True on a zero-padded frame before the stream's first frame",
        "outputs": {
            "tau": [TORQUE[kind] for kind in kinds],
            "force": "N, end-effector force of the environment on the robot, base frame "
                     "(x, y, z)",
            "gate": "probability of contact, in [0, 1]",
            "condition": ["probability the motor is in nominal condition, in [0, 1]"]
                         * len(kinds),
        },
    }
