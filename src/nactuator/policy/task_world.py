"""Manipulation tasks with success criteria, run in the hidden world (``nactuator.world``).

The world already carries a payload as a force at the end-effector point and stops the
closing jaw at ``workspace.grasp_jaw`` while an object sits between the jaws. This module
adds the object's state on top: where it is, whether the gripper holds it, and the task's
verdict. ``n_envs`` arms run in lock-step, each with its own object; a *controller* (the
scripted expert or a policy) is called once per control period with the observation and
returns the goal positions to write, exactly as a teleoperation recorder does (read the
registers, then write the next goal).

Tasks (conf/policy/<platform>.yaml ``tasks``):

- ``lift_hold``: the object is in the closed gripper at rest; lift it to the fixed target
  ``workspace.lift`` and hold it. Success: over the last ``hold_seconds`` the end effector's
  mean position is within ``tolerance_m`` of the target and the object is still held.
- ``pick_place``: the object rests at ``workspace.pick``; grasp it (the jaw closes on it
  while the end effector is within ``capture_m``), carry it to ``workspace.place`` and
  release it there. Success: it was released within ``tolerance_m`` (horizontal) of the
  place point and at most ``release_height_m`` above it, and nothing else happened to it.

Either task fails on any firmware protection trip (``world.protection``: torque off or
output limited on any motor) and on any arm joint reaching within ``limit_margin`` rad of
its limit. The payload mass is the world's, never part of an observation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from nactuator.constants import GRAVITY
from nactuator.platforms import Platform
from nactuator.world import World, WorldParams
from nactuator.world.protection import make_protection
from nactuator.world.tasks import EpisodePlan, Kinematics, plan_episode

__all__ = ["TASKS", "EpisodeLog", "Observation", "TaskWorld"]

TASKS = ("lift_hold", "pick_place")


@dataclass
class Observation:
    """What a controller sees at one control step (n_envs rows)."""

    step: int
    t: float
    telemetry: dict[str, np.ndarray]  # world.telemetry(): q, qd, effort, ... (n_envs, n)
    force_true: np.ndarray  # (n_envs, 3) the payload's force on the end effector [N]
    attached: np.ndarray  # (n_envs,) bool; only the expert may read it
    ee: np.ndarray  # (n_envs, 3) end-effector point [m]; only the expert may read it


@dataclass
class EpisodeLog:
    """Per-frame arrays (T, n_envs, ...) and per-arm verdicts (n_envs,)."""

    frames: dict[str, np.ndarray]
    success: np.ndarray
    tripped: np.ndarray
    limit_hit: np.ndarray
    peak_current: np.ndarray  # (n_envs,) max |A| over every motor
    final_error_m: np.ndarray
    other_ok: np.ndarray  # (n_envs,) every criterion but the distance held
    meta: dict = field(default_factory=dict)


class TaskWorld:
    """``n_envs`` arms doing one task with one payload, each with its own object."""

    def __init__(self, platform: Platform, params: WorldParams, task: str, payload_kg: float,
                 cfg: Mapping, seeds: list[int]) -> None:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
        # The task's own human variation (conf/policy ``variation``) over the world's: a
        # task has one fixed target, which an operator hits more closely than NAD's free runs.
        params = replace(params, variation={**params.variation, **cfg.get("variation", {})})
        self.platform, self.params, self.task, self.cfg = platform, params, task, cfg
        self.mass = float(payload_kg)
        self.n_envs, self.n = len(seeds), platform.n
        self.world = World(platform, params, seed=list(seeds), n_envs=self.n_envs)
        prot = cfg["protection"]
        self.world.set_protection(make_protection(prot["kind"], self.n_envs, self.n,
                                                  prot["registers"]))
        ws = params.workspace
        self.jaw = float(ws["grasp_jaw"])
        self.target = np.asarray(ws["lift" if task == "lift_hold" else "place"], float)
        self.pick = np.asarray(ws["pick"], float)
        self.lower = np.array([c.limit_lower for c in platform.channels])
        self.upper = np.array([c.limit_upper for c in platform.channels])
        self.arm = np.array(platform.arm_indices)
        self.grip = platform.gripper_indices[0]
        self.kin = Kinematics(platform)

    # -- object ---------------------------------------------------------------------------

    def _reset_object(self) -> None:
        held = self.task == "lift_hold"
        self.attached = np.full(self.n_envs, held)
        self.released = np.zeros(self.n_envs, dtype=bool)
        self.dropped = np.zeros(self.n_envs, dtype=bool)
        self.obj = np.tile(self.pick, (self.n_envs, 1))
        self.release_at = np.full((self.n_envs, 3), np.nan)

    def _update_object(self, q: np.ndarray, ee: np.ndarray) -> None:
        t = self.cfg["tasks"][self.task]
        jaw = q[:, self.grip]
        closed_on = jaw <= self.jaw + t["release_margin"]
        near = np.linalg.norm(ee - self.obj, axis=1) <= t["capture_m"]
        free = ~self.attached & ~self.released & ~self.dropped
        grab = free & near & closed_on
        opened = self.attached & ~closed_on
        self.attached = (self.attached | grab) & ~opened
        if self.task == "lift_hold":
            self.dropped |= opened  # any opening of the jaw in the air drops it
        else:
            high = ee[:, 2] > self.target[2] + t["release_height_m"]
            self.released |= opened & ~high
            self.dropped |= opened & high
            self.release_at = np.where(opened[:, None], ee, self.release_at)
        self.obj = np.where(self.attached[:, None], ee, self.obj)
        # The jaw stops on the object only when the object is between the jaws.
        between = self.attached | (free & near)
        self.world.set_grasp(np.where(between, self.jaw, np.nan))
        force = np.zeros((self.n_envs, 3))
        force[:, 2] = np.where(self.attached, -self.mass * GRAVITY, 0.0)
        self.world.set_external_force(force)
        self.force = force

    # -- episode --------------------------------------------------------------------------

    def plans(self, seeds: list[int], seconds: float) -> list[EpisodePlan]:
        """The world's commanded motion for this task, one human repetition per arm (seed)."""
        kind = {"lift_hold": "lift_hold", "pick_place": "pick_place"}[self.task]
        name = next(k for k, v in self.params.tasks.items()
                    if v["kind"] == kind and v.get("payload_g", 0) > 0 and not v.get("degrade"))
        return [plan_episode(self.platform, self.params, self.kin, name, 0, s, seconds)
                for s in seeds]

    def start_pose(self, seeds: list[int]) -> np.ndarray:
        """The plan's first frame: rest posture with human offsets, gripper on the object
        (lift) or open (pick)."""
        q0 = np.stack([p.q_goal[0] for p in self.plans(seeds, 2.0)])
        if self.task == "lift_hold":
            q0[:, self.grip] = self.jaw
        return q0

    def run(self, controller: Callable[[Observation], np.ndarray], seconds: float,
            q0: np.ndarray, after_step: Callable[[Observation, np.ndarray], None] | None = None,
            ) -> EpisodeLog:
        w = self.world
        w.reset(q0)
        self._reset_object()
        self._update_object(q0, w.ee_position())
        w.step(float(self.params.physics["settle_seconds"]))
        # Trips and peaks count from the first controlled frame: the settle (the arm
        # catching its own weight at the start pose) is the world's, not the controller's.
        w.protection.reset()
        frames = max(2, int(round(seconds / self.platform.control_dt)))
        log: dict[str, list[np.ndarray]] = {k: [] for k in (
            "q_cmd", "q", "qd", "effort", "voltage", "temperature", "current",
            "current_true", "force", "ee", "attached", "torque_enable")}
        limit_hit = np.zeros(self.n_envs, dtype=bool)
        margin = float(self.cfg["tasks"][self.task]["limit_margin"])
        for k in range(frames):
            tel = w.telemetry()
            ee = w.ee_position()
            self._update_object(tel["q"], ee)
            obs = Observation(k, k * self.platform.control_dt, tel, self.force.copy(),
                              self.attached.copy(), ee)
            q_cmd = np.clip(np.asarray(controller(obs), dtype=np.float64), self.lower,
                            self.upper)
            w.set_goal(q_cmd)
            q = tel["q"][:, self.arm]
            limit_hit |= ((q <= self.lower[self.arm] + margin)
                          | (q >= self.upper[self.arm] - margin)).any(axis=1)
            for key in ("q", "qd", "effort", "voltage", "temperature", "current"):
                log[key].append(tel[key])  # telemetry (NaN where the servo has no register)
            log["current_true"].append(tel["current_true"])  # hidden: for the verdict only
            log["q_cmd"].append(w.goal())
            log["force"].append(self.force.copy())
            log["ee"].append(ee)
            log["attached"].append(self.attached.copy())
            log["torque_enable"].append(w.servo.torque_enabled.astype(float))
            if after_step is not None:
                after_step(obs, w.goal())
            w.step(self.platform.control_dt)
        arrays = {k: np.stack(v) for k, v in log.items()}
        return self._verdict(arrays, limit_hit)

    def _verdict(self, frames: dict[str, np.ndarray], limit_hit: np.ndarray) -> EpisodeLog:
        t = self.cfg["tasks"][self.task]
        prot = self.world.protection
        tripped = prot.tripped.any(axis=1)
        peak = prot.peak_current.max(axis=1)
        if self.task == "lift_hold":
            hold = max(1, int(round(t["hold_seconds"] / self.platform.control_dt)))
            mean_ee = frames["ee"][-hold:].mean(axis=0)
            error = np.linalg.norm(mean_ee - self.target, axis=1)
            other = frames["attached"][-hold:].all(axis=0)
        else:
            error = np.linalg.norm(self.release_at[:, :2] - self.target[:2], axis=1)
            error = np.where(self.released, error, np.inf)
            other = self.released & ~self.dropped
        other &= ~tripped & ~limit_hit
        ok = other & (error <= t["tolerance_m"])
        return EpisodeLog(frames, ok, tripped, limit_hit, peak, error, other,
                          meta={"task": self.task, "payload_kg": self.mass,
                                "errors": prot.errors.copy()})
