"""What moves the emulated servos: a pluggable arm model stepped in real time.

An arm model owns the physics; the emulator only copies its state into the servos'
control tables (via :mod:`nactuator.servo_units`) and its goals/torque flags out of them.

- :class:`WorldArm` runs the synthetic world's hidden ground-truth servo law and physics
  (``nactuator.world``) — the default for a follower, what recordings are made against.
- :class:`ScriptedLeader` is a leader arm with torque off, moved by a scripted "human":
  a smooth sum of sines inside each joint's limits.
- :class:`ReferenceArm` is a small first-order servo (no world), for protocol tests and
  for platforms the world does not describe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from nactuator.platforms import Platform


@dataclass
class ArmState:
    """Per-motor telemetry in SI (Contract 1 units), in the platform's channel order."""

    q: np.ndarray
    qd: np.ndarray
    current: np.ndarray  # A (motor current)
    load: np.ndarray  # signed fraction of max torque
    pwm: np.ndarray  # duty in [-1, 1]
    voltage: np.ndarray  # V at each servo
    temperature: np.ndarray  # degC
    extra: dict = field(default_factory=dict)


class ArmModel(Protocol):
    dt: float  # the step the model wants, in seconds

    def set_goal(self, q_goal: np.ndarray) -> None: ...
    def set_torque_enabled(self, enabled: np.ndarray) -> None: ...
    def step(self, dt: float) -> None: ...
    def state(self) -> ArmState: ...


def _limits(platform: Platform) -> tuple[np.ndarray, np.ndarray]:
    lo = np.array([c.limit_lower for c in platform.channels])
    hi = np.array([c.limit_upper for c in platform.channels])
    return lo, hi


class ReferenceArm:
    """First-order position servo: velocity ∝ tracking error, capped; effort ∝ error.

    Deterministic and cheap; not a physical model of the arm. Effort saturates at 1 (full
    torque) for errors beyond ``full_effort_error`` rad.
    """

    def __init__(self, platform: Platform, supply_voltage: float = 12.0, tau: float = 0.05,
                 max_speed: float = 4.0, full_effort_error: float = 0.3,
                 current_at_full: float = 3.2, ambient: float = 30.0) -> None:
        self.n = platform.n
        self.dt = 0.001
        self.lo, self.hi = _limits(platform)
        self.q = np.clip(np.zeros(self.n), self.lo, self.hi)
        self.qd = np.zeros(self.n)
        self.goal = self.q.copy()
        self.enabled = np.zeros(self.n, dtype=bool)
        self.tau, self.max_speed = tau, max_speed
        self.full_effort_error = full_effort_error
        self.current_at_full = current_at_full
        self.supply = supply_voltage
        self.ambient = ambient
        self.temperature = np.full(self.n, ambient)
        self.effort = np.zeros(self.n)

    def set_goal(self, q_goal: np.ndarray) -> None:
        self.goal = np.clip(np.asarray(q_goal, dtype=float), self.lo, self.hi)

    def set_torque_enabled(self, enabled: np.ndarray) -> None:
        self.enabled = np.asarray(enabled, dtype=bool)

    def step(self, dt: float) -> None:
        err = np.where(self.enabled, self.goal - self.q, 0.0)
        self.qd = np.clip(err / self.tau, -self.max_speed, self.max_speed)
        self.q = np.clip(self.q + self.qd * dt, self.lo, self.hi)
        self.effort = np.clip(err / self.full_effort_error, -1.0, 1.0)
        # Joule heating against Newton cooling; ~1 degC/s at full effort.
        self.temperature += dt * (1.0 * self.effort**2 - 0.01 * (self.temperature - self.ambient))

    def state(self) -> ArmState:
        return ArmState(
            q=self.q.copy(), qd=self.qd.copy(), current=self.effort * self.current_at_full,
            load=self.effort.copy(), pwm=self.effort.copy(),
            voltage=np.full(self.n, self.supply), temperature=self.temperature.copy(),
        )


class ScriptedLeader:
    """A leader arm (torque off) moved by a scripted human: per joint a sum of three sines
    with random phases and periods of 2-9 s, spanning ``amplitude`` of the joint range
    around its centre. Smooth (C-infinity), bounded, reproducible from ``seed``."""

    def __init__(self, platform: Platform, seed: int = 0, amplitude: float = 0.6,
                 supply_voltage: float = 12.0, ambient: float = 30.0) -> None:
        rng = np.random.default_rng(seed)
        self.n = platform.n
        self.dt = 0.005
        lo, hi = _limits(platform)
        # Keep away from the stops: 2.0 rad of span is plenty for a human demo.
        half = np.minimum((hi - lo) / 2, 1.0)
        self.center = (lo + hi) / 2
        self.freq = 1.0 / rng.uniform(2.0, 9.0, size=(3, self.n))
        self.phase = rng.uniform(0, 2 * np.pi, size=(3, self.n))
        self.weight = np.array([0.6, 0.3, 0.1])[:, None]
        self.amp = amplitude * half
        self.t = 0.0
        self.supply, self.ambient = supply_voltage, ambient

    def set_goal(self, q_goal: np.ndarray) -> None:
        pass  # torque is off: goals do not move a leader

    def set_torque_enabled(self, enabled: np.ndarray) -> None:
        pass  # a human holds the leader; the scripted motion continues either way

    def step(self, dt: float) -> None:
        self.t += dt

    def _motion(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        w = 2 * np.pi * self.freq
        s = np.sin(w * t + self.phase)
        c = np.cos(w * t + self.phase) * w
        return (self.center + self.amp * (self.weight * s).sum(0),
                self.amp * (self.weight * c).sum(0))

    def state(self) -> ArmState:
        q, qd = self._motion(self.t)
        zero = np.zeros(self.n)
        return ArmState(q=q, qd=qd, current=zero, load=zero, pwm=zero,
                        voltage=np.full(self.n, self.supply),
                        temperature=np.full(self.n, self.ambient))
