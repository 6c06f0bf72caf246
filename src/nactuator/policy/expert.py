"""The scripted demonstrator: a human at the leader arm who can feel the payload.

It follows the world's own commanded motion for the task (``world.tasks.plan_episode``:
minimum-jerk waypoints with human timing, placement, posture and tremor variation) and, as
an operator watching the follower does, corrects for the sag a position servo shows under
load:

- a feed-forward that knows the true payload (the expert may read it): the joint torque
  the payload's weight puts on each arm joint (``Jᵀ f``) divided by the servo's position
  stiffness (its P gain in N·m/rad), entering with a human reaction lag once the object is
  held and with an imperfect per-episode gain;
- a slow integral correction of the remaining joint error (the arm's own weight, friction).

The stiffness comes from the world's true firmware and motor constants, as an expert with
a feel for its arm would have it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from nactuator.constants import GRAVITY

from .task_world import Observation, TaskWorld

__all__ = ["ScriptedExpert", "servo_stiffness"]


def servo_stiffness(tw: TaskWorld) -> np.ndarray:
    """(n,) N·m per rad of position error at the joint: P gain -> duty -> current -> torque."""
    m = tw.world.motors
    counts_per_rad = m["counts_per_rev"] / (2 * np.pi)
    duty_per_rad = m["kp"] / m["kp_divisor"] * counts_per_rad / m["pwm_full"]
    volts = float(tw.params.supply["voltage"])
    amps_per_rad = duty_per_rad * volts / m["resistance"]
    return amps_per_rad * m["efficiency"] * m["gear_ratio"] * m["kt_motor"] / m["transmission"]


class ScriptedExpert:
    """Controller for :meth:`TaskWorld.run`: one plan per arm, feed-forward + integral."""

    def __init__(self, tw: TaskWorld, seeds: list[int], seconds: float,
                 cfg: Mapping, rng: np.random.Generator) -> None:
        self.tw = tw
        plans = tw.plans(seeds, seconds)
        frames = max(2, int(round(seconds / tw.platform.control_dt)))
        self.q_plan = np.stack([np.concatenate(
            [p.q_goal, np.repeat(p.q_goal[-1:], max(0, frames - p.frames), axis=0)])[:frames]
            for p in plans], axis=1)  # (T, n_envs, n)
        self.k = servo_stiffness(tw)
        self.ki = float(cfg["integral_gain"])
        self.i_max = float(cfg["integral_limit"])
        self.lag = float(cfg["reaction_s"])
        self.gain = rng.uniform(*cfg["feedforward_gain"], size=tw.n_envs)
        self.integral = np.zeros((tw.n_envs, tw.n))
        self.ff = np.zeros((tw.n_envs, tw.n))

    def __call__(self, obs: Observation) -> np.ndarray:
        tw, dt = self.tw, self.tw.platform.control_dt
        plan = self.q_plan[min(obs.step, len(self.q_plan) - 1)]
        q = obs.telemetry["q"]
        arm = tw.arm
        target = np.zeros_like(self.ff)
        force = np.array([0.0, 0.0, -tw.mass * GRAVITY])
        for e in np.flatnonzero(obs.attached):
            tau = tw.kin.jacobian(q[e]).T @ force  # payload torque on each joint
            target[e, arm] = -self.gain[e] * tau[arm] / self.k[arm]
        alpha = dt / (self.lag + dt)
        self.ff += alpha * (target - self.ff)
        err = plan[:, arm] - q[:, arm]
        self.integral[:, arm] = np.clip(self.integral[:, arm] + self.ki * dt * err,
                                        -self.i_max, self.i_max)
        cmd = plan + self.ff + self.integral
        cmd[:, tw.grip] = plan[:, tw.grip]
        return cmd
