"""What the tracking loop reads and commands: the hidden world or a servo bus.

Both give an :class:`Observation` per control step (``read``) and take a command
(``write``). :class:`WorldPlant` is the hidden ground-truth world (:mod:`nactuator.world`)
with an optional payload the controller is not told about, observed through the world's
own point track; :class:`BusPlant` is a servo bus (real or emulated), observed through
rigid FK of the measured joints, paced at the platform rate.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from nactuator.constants import GRAVITY
from nactuator.errors import UserError
from nactuator.platforms import Platform

from .jacobian import Points

__all__ = ["BusPlant", "Observation", "WorldPlant"]



class Observation:
    """One read: joints, time, the servos' effort signal (the platform's: Present_Load on
    the STS3215; what a recording's ``effort`` holds), and the tracked points (m, 3) as the
    controller sees them (``x``) and as the judge does (``x_true``). A bus computes ``x`` by
    FK only when asked (a decision cycle), so the cycles between stay inside their 16 ms
    slot."""

    def __init__(self, q: np.ndarray, qd: np.ndarray, x, x_true, t: float,
                 effort: np.ndarray | None = None) -> None:
        self.q, self.qd, self.t, self.effort = q, qd, t, effort
        self._x, self._x_true = x, x_true

    @property
    def x(self) -> np.ndarray:
        if callable(self._x):
            self._x = self._x()
        return self._x

    @property
    def x_true(self) -> np.ndarray:
        if self._x_true is None:
            return self.x
        if callable(self._x_true):
            self._x_true = self._x_true()
        return self._x_true


class WorldPlant:
    """The hidden world (:class:`nactuator.world.World`), one arm, stepped in simulated time.

    ``payload_kg`` hangs at the end-effector point (``-m g`` along z, the world's payload
    convention); the controller is not told. ``track_noise`` [m]: std of Gaussian noise on
    the observed point track (a camera's), seeded."""

    def __init__(self, platform: Platform, points: Points, kinematics, q0: np.ndarray,
                 payload_kg: float = 0.0, world: str | Path | None = None, seed: int = 0,
                 track_noise: float = 0.0) -> None:
        from nactuator.world import World, load_world

        self.platform, self.points, self.kin = platform, points, kinematics
        self.world = World(platform, load_world(platform, world, seed), seed=seed, n_envs=1)
        self.world.reset(np.asarray(q0, np.float64))
        self.world.set_external_force([0.0, 0.0, -GRAVITY * float(payload_kg)])
        self.world.step(float(self.world.params.physics["settle_seconds"]))
        self.t0 = self.world.time
        self.rng = np.random.default_rng(seed + 101)
        self.track_noise = float(track_noise)
        self.dt = platform.control_dt
        self._tel = self.world.telemetry()
        if self.points.bodies != Points.end_effector(kinematics).bodies:
            self._world_points = None  # link points: judged by FK of the world's true q
        else:
            self._world_points = True

    def _truth(self) -> np.ndarray:
        if self._world_points:
            return self.world.ee_position()[0][None]
        import torch

        q = torch.tensor(self.world.q[:1], dtype=torch.float32)
        return self.points.positions(self.kin, q)[0].numpy().astype(np.float64)

    def read(self) -> Observation:
        tel = self.world.telemetry()
        truth = self._truth()
        seen = truth + self.track_noise * self.rng.standard_normal(truth.shape)
        return Observation(tel["q"][0], tel["qd"][0], seen, truth, self.world.time - self.t0,
                           effort=tel["effort"][0])

    def write(self, u: np.ndarray) -> None:
        self.world.set_goal(u)
        self.world.step(self.dt)

    def goal(self) -> np.ndarray:
        return self.world.goal()[0]

    def close(self) -> None:
        self.world.set_torque_enabled(False)


class BusPlant:
    """A telemetry bus (real or emulated). The observed points are rigid FK of the measured
    joints (no camera); ``truth`` (optional callable -> (m, 3)) reads ground truth, e.g. the
    emulator's hidden world, for scoring only. Writes are paced at the platform rate by
    :class:`nactuator.hardware.timing.FixedRate`."""

    def __init__(self, bus, platform: Platform, points: Points, kinematics,
                 truth=None, paced: bool = True) -> None:
        from nactuator.hardware.timing import FixedRate

        self.bus, self.platform, self.points, self.kin = bus, platform, points, kinematics
        self.truth = truth
        self.dt = platform.control_dt
        self.pace = FixedRate(platform.fps).start() if paced else None
        self.lost_slots = 0
        self.incomplete = 0  # cycles with a servo unread (its last reading held)
        self.max_missed = 5
        self.t0 = time.monotonic()

    def read(self) -> Observation:
        import torch

        frame = self.bus.read()
        q_now, qd_now, eff_now = frame.q.copy(), frame.qd.copy(), frame.effort.copy()
        if frame.valid.all():
            self.missed = 0
        else:
            # A servo not read this cycle keeps its last reading (live's fill rule); a run
            # of them stops the loop rather than steer blind.
            self.missed = getattr(self, "missed", 0) + 1
            if self.missed > self.max_missed or not hasattr(self, "_last"):
                raise UserError(f"track: servo(s) {np.flatnonzero(~frame.valid).tolist()} "
                                f"not read for {self.missed} cycle(s); the loop stops rather "
                                "than steer blind (torque goes off)")
            q_now = np.where(frame.valid, q_now, self._last[0])
            qd_now = np.where(frame.valid, qd_now, self._last[1])
            eff_now = np.where(frame.valid, eff_now, self._last[2])
            self.incomplete += 1
        self._last = (q_now, qd_now, eff_now)

        def fk() -> np.ndarray:
            q = torch.tensor(q_now[None], dtype=torch.float64)
            return self.points.positions(self.kin, q)[0].numpy()

        truth = None if self.truth is None else np.asarray(self.truth(), np.float64)
        return Observation(q_now, qd_now, fk, truth, frame.t - self.t0, effort=eff_now)

    def write(self, u: np.ndarray) -> None:
        self.bus.write_goal(u)
        if self.pace is not None:
            self.lost_slots += self.pace.wait()

    def goal(self) -> np.ndarray:
        return self.bus.read_goal()

    def close(self) -> None:
        pass  # the bus's own close (leaving open_bus) switches torque off
