"""The synthetic world's hidden servo law and MuJoCo arm, as an emulator arm model.

``nactuator.world`` is the same ground truth ``data synth`` records from, so a recording
made through an emulated bus and a synthesized dataset come from one robot. The emulator
steps it in real time, one physics step per tick, and reads its quantised telemetry.
``payload_kg`` (or :meth:`WorldArm.set_payload` between runs) loads the end effector with a
mass the bus's client is not told of, in one of the world's two ways:

- ``grasp=False`` (the default; ``emulate --payload-kg``): tied to the end effector, its
  weight -m g along base z for the whole run, whatever the jaws do, as
  ``data.synth.replay_commands`` and the correction benchmarks apply it;
- ``grasp=True`` (``emulate --grasp``; bench/calibrate_bus.py): an object between the jaws,
  as ``data synth``'s payload tasks hold it (:meth:`World.set_carried`): it stops the closing
  jaw at ``workspace.grasp_jaw`` so the gripper squeezes it (its servo load reads as in a
  synth hold), and its weight hangs while the jaws press it. Open the jaw past it and the arm
  carries nothing (it is set down); close it again and it is picked up.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nactuator.hardware.emulator.arm import ArmState
from nactuator.platforms import Platform


class WorldArm:
    def __init__(self, platform: Platform, seed: int = 0, world: str | Path | None = None,
                 q0: np.ndarray | None = None, payload_kg: float = 0.0,
                 grasp: bool = False) -> None:
        from nactuator.world.world import World, load_world

        params = load_world(platform, world, seed=seed)
        self.world = World(platform, params, seed=seed, n_envs=1)
        self.dt = float(self.world.dt)
        lo = np.array([c.limit_lower for c in platform.channels])
        hi = np.array([c.limit_upper for c in platform.channels])
        self.world.reset(np.clip(np.zeros(platform.n) if q0 is None else q0, lo, hi))
        self.world.set_torque_enabled(False)  # servos power up with torque off
        self.set_payload(payload_kg, grasp)

    def set_payload(self, payload_kg: float, grasp: bool = False) -> None:
        """``payload_kg`` from now on, in place of any before (0: none): tied to the end
        effector, or (``grasp``) an object between the jaws, held while they press it."""
        from nactuator.constants import GRAVITY

        if not (np.isfinite(payload_kg) and payload_kg >= 0):
            raise ValueError(f"payload_kg must be >= 0, got {payload_kg}")
        kg = float(payload_kg)
        self.world.set_carried(kg if grasp else 0.0)
        self.world.set_external_force([0.0, 0.0, 0.0 if grasp else -kg * GRAVITY])

    def set_goal(self, q_goal: np.ndarray) -> None:
        self.world.set_goal(q_goal)

    def set_torque_enabled(self, enabled: np.ndarray) -> None:
        self.world.set_torque_enabled(enabled)

    def step(self, dt: float) -> None:
        self.world.step(dt)

    def state(self) -> ArmState:
        tel = self.world.telemetry()
        return ArmState(
            q=tel["q"][0], qd=tel["qd"][0], current=np.nan_to_num(tel["current"][0]),
            load=tel["effort"][0] if self.world.platform.effort_signal == "load"
            else np.full(self.world.n, np.nan),
            pwm=tel["pwm"][0], voltage=tel["voltage"][0], temperature=tel["temperature"][0],
        )
