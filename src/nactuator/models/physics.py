"""A physics-structured actuator: the servo's DC motor with learnable parameters.

The network of a :class:`~nactuator.models.NeuralActuator` may sit on top of a small physical
model whose output it corrects (``model_config["physics"]``). For a position-controlled servo
(:class:`DCMotor`, per motor, all in output-shaft SI units)::

    goal  = q_cmd + lead * (q_cmd_next - q_cmd)           # when the goal lands in the step
    d     = firmware duty(goal, q + t_la qd, kp, enable)   # nactuator.models.firmware
    R(T)  = R (1 + a_R (T0 - 25)),  kt(T) = kt (1 + a_kt (T0 - 25))
    i     = (V d - kt qd) / (R(T) + Rs d^2)                # H-bridge + winding + back-EMF,
                                                           #   supply sag V - Rs i d solved
    i     = I_max tanh(i / I_max)                          # the servo's current limit
    tau_m = kt(T) i              (0 while torque is off: the H-bridge is open)
    tau   = tau_m - (Fc + Fs exp(-(qd/vs)^2) + mu |tau_m|) tanh(qd / v0) - b qd

``V`` is the supply voltage before the motion (``supply_voltage``); its sag under load is the
source resistance ``Rs`` times the supply current ``d i``. ``T0`` is the motor temperature
before the motion (``initial_temperature``); ``a_R`` (copper, +0.393 %/K) and ``a_kt`` (NdFeB
magnets, -0.11 %/K) are physical constants, not fitted: on BAM's bench the session warms
the servo from 28 to 39 degC while kp rises, so a fitted coefficient would learn the gain. The
firmware's loop runs at ~1 kHz, far faster than the control step, so the P law sees the angle
move within the step: ``t_la`` (learned, ~dt/2) evaluates it ahead of the step's start. The
friction is BAM's (Coulomb, Stribeck, load-dependent, viscous; Duclusaud et al. 2025),
smoothed by ``tanh(qd / v0)`` so that an explicit control step stays stable. Each parameter
is learned in log space (``lead`` as a logit), starting from the priors given. Everything it
reads exists before execution, and every term has the same meaning at any gain: this is the
part that extrapolates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from nactuator.models.firmware import FirmwareLaw

__all__ = ["DCMotor", "PHYSICS", "build_physics"]

# Priors: a DYNAMIXEL XL330 on its 7.4 V bench (BAM's xl330 m1/m4 fits, rounded).
DC_MOTOR_PRIORS: dict[str, float] = {
    "kt": 0.38,  # N*m/A at the output (= back-EMF constant, V*s/rad)
    "resistance": 3.6,  # ohm, winding + driver
    "source_resistance": 0.3,  # ohm, supply + wiring (the logged supply sags under load)
    "coulomb": 0.01,  # N*m
    "stribeck": 0.005,  # N*m, extra static friction near zero speed
    "stribeck_velocity": 0.2,  # rad/s
    "load_friction": 0.1,  # N*m per N*m of motor torque (gear mesh load)
    "viscous": 0.002,  # N*m*s/rad on top of the simulator's joint damping
    "lead": 0.1,  # fraction of the next command acting within the step
    "lookahead": 0.0025,  # s: when within the step the firmware's P law is evaluated
    "current_limit": 1.75,  # A: the XL330's Current Limit register default (1750 mA)
}
SMOOTHING_VELOCITY = 0.05  # rad/s: friction sign smoothing v0 (explicit-step stability)
T_REF = 25.0  # degC at which kt and R are given
RESISTANCE_TEMP_COEFF = 0.00393  # 1/K, copper
KT_TEMP_COEFF = -0.0011  # 1/K, NdFeB magnets


class DCMotor(nn.Module):
    """Window -> torque (B, n) of a position-controlled servo (see the module docstring)."""

    inputs = ("q_cmd", "q_cmd_next", "q", "qd", "kp", "torque_enable", "supply_voltage",
              "initial_temperature")

    def __init__(self, n_motors: int, firmware: FirmwareLaw,
                 smoothing_velocity: float = SMOOTHING_VELOCITY,
                 temperature: bool = True, **priors: Any) -> None:
        super().__init__()
        if not temperature:  # a bench without a temperature reading: R and kt at 25 degC
            self.inputs = tuple(k for k in self.inputs if k != "initial_temperature")
        self.temperature = bool(temperature)
        unknown = sorted(set(priors) - set(DC_MOTOR_PRIORS))
        if unknown:
            raise ValueError(f"physics dc_motor: unknown parameter(s) {unknown}; expected "
                             f"some of {sorted(DC_MOTOR_PRIORS)}")
        if not smoothing_velocity > 0:
            raise ValueError(f"physics dc_motor: smoothing_velocity must be > 0, got "
                             f"{smoothing_velocity!r}")
        self.firmware = firmware
        self.smoothing_velocity = float(smoothing_velocity)
        self.priors = {**DC_MOTOR_PRIORS, **priors}
        for name, value in self.priors.items():
            prior = torch.as_tensor(value, dtype=torch.float32).flatten()
            if prior.numel() == 1:
                prior = prior.expand(n_motors)
            if prior.numel() != n_motors or not torch.isfinite(prior).all():
                raise ValueError(f"physics dc_motor: {name} must be one number or {n_motors}, "
                                 f"got {value!r}")
            if name == "lead":
                if not ((prior > 0) & (prior < 1)).all():
                    raise ValueError(f"physics dc_motor: lead must lie in (0, 1), got {value!r}")
                raw = torch.log(prior / (1 - prior))
            else:
                if not (prior > 0).all():
                    raise ValueError(f"physics dc_motor: {name} must be > 0, got {value!r}")
                raw = prior.log()
            self.register_parameter(f"raw_{name}", nn.Parameter(raw.clone()))

    def value(self, name: str) -> torch.Tensor:
        """A parameter in physical units (n,)."""
        raw = getattr(self, f"raw_{name}")
        return torch.sigmoid(raw) if name == "lead" else raw.exp()

    def parameters_si(self) -> dict[str, list[float]]:
        """Every parameter in physical units, for reports."""
        return {name: self.value(name).detach().cpu().tolist() for name in self.priors}

    def forward(self, window: Mapping[str, torch.Tensor]) -> torch.Tensor:
        now = {k: window[k][:, -1] for k in self.inputs}
        v = {name: self.value(name) for name in self.priors}
        qd = now["qd"]
        goal = now["q_cmd"] + v["lead"] * (now["q_cmd_next"] - now["q_cmd"])
        duty = self.firmware.duty(goal, now["q"] + v["lookahead"] * qd, now["kp"],
                                  now["torque_enable"])
        kt, resistance = v["kt"], v["resistance"]
        if self.temperature:
            warm = now["initial_temperature"] - T_REF
            kt = kt * (1.0 + KT_TEMP_COEFF * warm)
            resistance = resistance * (1.0 + RESISTANCE_TEMP_COEFF * warm)
        current = (now["supply_voltage"] * duty - kt * qd) / (
            resistance + v["source_resistance"] * duty * duty)
        current = v["current_limit"] * torch.tanh(current / v["current_limit"])
        on = (now["torque_enable"] > 0.5).to(current.dtype)
        tau_motor = kt * current * on
        stribeck = v["stribeck"] * torch.exp(-(qd / v["stribeck_velocity"]) ** 2)
        dry = v["coulomb"] + stribeck + v["load_friction"] * tau_motor.abs()
        friction = dry * torch.tanh(qd / self.smoothing_velocity) + v["viscous"] * qd
        return tau_motor - friction


PHYSICS = {"dc_motor": DCMotor}


def build_physics(config: Mapping[str, Any], n_motors: int,
                  firmware: FirmwareLaw | None) -> nn.Module:
    """``config`` = ``{"kind": "dc_motor", **priors}`` -> the physics module."""
    if not isinstance(config, Mapping) or config.get("kind") not in PHYSICS:
        raise ValueError(f"model_config 'physics' must be a mapping with kind in "
                         f"{sorted(PHYSICS)}, got {config!r}")
    if firmware is None:
        raise ValueError("physics dc_motor needs the servo firmware law (model_config "
                         "'firmware', from the platform's hardware.firmware)")
    args = {k: v for k, v in config.items() if k != "kind"}
    return PHYSICS[config["kind"]](n_motors, firmware, **args)

