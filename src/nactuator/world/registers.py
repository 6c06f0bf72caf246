"""Telemetry registers: quantise the servo's internal state exactly as the real control table.

Each register map turns the firmware's view (encoder counts, its velocity estimate, motor
current, PWM output, bus voltage, winding temperature) into the integer register values a bus
would return, and those back into SI (Contract 1 units). The encodings and unit scales are
:mod:`nactuator.servo_units` (the buses decode with the same), ``../shared/docs/servos.md`` §2/§5:

- ``xm430``: position 4096/rev (raw 2048 = 0 rad), velocity int32 x 0.229 rpm, current int16 x
  2.69 mA, PWM int16 (885 = 100 %), input voltage 0.1 V, temperature 1 degC.
- ``xl330``: as ``xm430`` but current in 1 mA units.
- ``sts3215``: position 4096/rev, velocity in steps/s from the count difference over a
  20 ms window (so always a multiple of 50 steps/s), load in 0.1 % of max torque taken from the
  PWM output (magnitudes in multiples of 4 with a dead band below 20, as the NAD SO-101 logs
  show), sign-magnitude with the sign in bit 10, **positive while the motor drives toward
  lower positions** (the NAD SO-101 files: load vs goal - position correlates at -0.96..-1.00
  on every joint; a squeezing jaw reads +200); current magnitude x 6.5 mA; 0.1 V; 1 degC.
- ``franka``: libfranka doubles, no quantisation; the effort is the commanded torque.
"""

from __future__ import annotations

import numpy as np

from nactuator.servo_units import (
    STS_A_PER_UNIT,
    STS_LOAD_FULL,
    STS_LOAD_SIGN_BIT,
    STS_SIGN_BIT,
    VOLT_PER_UNIT,
    XL330_A_PER_UNIT,
    XM430_A_PER_UNIT,
    XM430_PWM_FULL,
    XM430_RAD_S_PER_UNIT,
    encode_sign_magnitude,
)

__all__ = ["quantize"]

_CURRENT_UNIT = {"xm430": XM430_A_PER_UNIT, "xl330": XL330_A_PER_UNIT,
                 "sts3215": STS_A_PER_UNIT}


def quantize(
    regmap: str,
    state: dict[str, np.ndarray],
    motors: dict[str, np.ndarray],
    sensors: dict,
    noise: dict[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Registers (int64 arrays) and SI telemetry from the servo state (all (n_envs, n)).

    ``state`` keys: ``counts`` (encoder), ``count_rate`` (counts/s over the velocity window,
    STS) , ``omega`` (filtered output speed, rad/s), ``current`` (A), ``pwm`` (PWM counts),
    ``duty``, ``tau_cmd`` (N*m), ``theta`` (rad, exact), ``voltage`` (V), ``temperature``.
    ``noise``: standard-normal ``voltage``/``current``/``torque`` and uniform ``glitch``/
    ``glitch_level`` draws of the same shape.
    SI keys: q_servo (output rad), qd_servo, current, pwm (duty), load, voltage,
    temperature, torque.
    """
    shape = state["counts"].shape
    volts = state["voltage"] + sensors["voltage_noise"] * noise["voltage"]
    volt_reg = np.round(volts / VOLT_PER_UNIT)
    temperature = state["temperature"].copy()
    glitch = noise["glitch"] < sensors["temperature_glitch_prob"]
    if glitch.any():
        lo, hi = sensors["temperature_glitch"]
        temperature = np.where(glitch, lo + (hi - lo) * noise["glitch_level"], temperature)
    temp_reg = np.round(temperature)
    nan = np.full(shape, np.nan)

    if regmap == "franka":
        torque = state["tau_cmd"] + sensors["torque_noise"] * noise["torque"]
        regs = {"present_voltage": volt_reg.astype(np.int64),
                "present_temperature": temp_reg.astype(np.int64)}
        si = {"q_servo": state["theta"].copy(), "qd_servo": state["omega"].copy(),
              "current": nan, "pwm": nan, "load": nan, "torque": torque,
              "voltage": volt_reg * VOLT_PER_UNIT, "temperature": temp_reg}
        return regs, si

    cpr = motors["counts_per_rev"]
    zero = motors["zero_count"]
    counts = state["counts"]
    q_servo = (counts - zero) * (2 * np.pi / cpr)
    noisy_current = state["current"] + sensors["current_noise"] * noise["current"]
    unit = _CURRENT_UNIT[regmap]
    if regmap == "sts3215":
        vel_reg = np.round(state["count_rate"]).astype(np.int64)
        qd_servo = vel_reg * (2 * np.pi / cpr)
        m = sensors["load_multiple"]
        # Opposite sign to the PWM duty (real STS3215 Present_Load, see the module docstring).
        load = np.round(-state["duty"] * float(STS_LOAD_FULL) / m) * m
        load = np.where(np.abs(load) < sensors["load_deadband"], 0.0, load)
        load = np.clip(load, -STS_LOAD_FULL, STS_LOAD_FULL).astype(np.int64)
        cur_reg = np.round(np.abs(noisy_current) / unit).astype(np.int64)
        regs = {
            "present_position": encode_sign_magnitude(counts, STS_SIGN_BIT),
            "present_velocity": encode_sign_magnitude(vel_reg, STS_SIGN_BIT),
            "present_load": encode_sign_magnitude(load, STS_LOAD_SIGN_BIT),
            "present_voltage": volt_reg.astype(np.int64),
            "present_temperature": temp_reg.astype(np.int64),
            "present_current": cur_reg,
        }
        si = {"q_servo": q_servo, "qd_servo": qd_servo, "current": cur_reg * unit,
              "pwm": nan, "load": load / float(STS_LOAD_FULL), "torque": nan,
              "voltage": volt_reg * VOLT_PER_UNIT, "temperature": temp_reg}
        return regs, si

    # DYNAMIXEL X series (xm430, xl330)
    vel_reg = np.round(state["omega"] / XM430_RAD_S_PER_UNIT).astype(np.int64)
    cur_reg = np.round(noisy_current / unit).astype(np.int64)
    pwm_reg = state["pwm"].astype(np.int64)
    regs = {
        "present_pwm": pwm_reg,
        "present_current": cur_reg,
        "present_velocity": vel_reg,
        "present_position": counts.astype(np.int64),
        "present_input_voltage": volt_reg.astype(np.int64),
        "present_temperature": temp_reg.astype(np.int64),
    }
    si = {"q_servo": q_servo, "qd_servo": vel_reg * XM430_RAD_S_PER_UNIT,
          "current": cur_reg * unit,
          "pwm": pwm_reg / float(XM430_PWM_FULL), "load": nan, "torque": nan,
          "voltage": volt_reg * VOLT_PER_UNIT, "temperature": temp_reg}
    return regs, si
