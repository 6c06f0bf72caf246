"""How right is a dx/du? Both Jacobians against the hidden world's own response.

The world's effective Jacobian at a pose is measured the way a Neural Jacobian Field is
supervised: settle the arm (with its payload) at the pose, step one joint's command by
±δ, hold it ``horizon`` control steps, and difference the world's end-effector positions
(central differences, one world arm per perturbed command, all in lock-step). The
kinematic Jacobian and the actuator model's dx/du at the same settled state are scored by
their relative error ‖J − J_world‖_F / ‖J_world‖_F over the controlled joints.
"""

from __future__ import annotations

import numpy as np

from nactuator.constants import GRAVITY
from nactuator.platforms import Platform

from .jacobian import ActuatorJacobian, Points, kinematic_jacobian

__all__ = ["jacobian_errors", "world_dxdu"]



def _settled_world(platform: Platform, q0: np.ndarray, arms: int, payload_kg: float,
                   world: str | None, seed: int):
    from nactuator.world import World, load_world

    w = World(platform, load_world(platform, world, seed), seed=[seed] * arms, n_envs=arms)
    w.reset(np.broadcast_to(q0, (arms, platform.n)))
    w.set_external_force([0.0, 0.0, -GRAVITY * payload_kg])
    w.step(float(w.params.physics["settle_seconds"]))
    return w


def world_dxdu(platform: Platform, q0: np.ndarray, joints: list[int], horizon: int,
               payload_kg: float = 0.0, delta: float = 0.03, world: str | None = None,
               seed: int = 0, history: int = 8) -> dict[str, np.ndarray]:
    """The world's dx/du (3, len(joints)) over ``horizon`` steps at rest at ``q0``, and the
    settled state (joints, effort, command) and history window (what the model is
    linearised at)."""
    n = platform.n
    arms = 1 + 2 * len(joints)
    w = _settled_world(platform, q0, arms, payload_kg, world, seed)
    hist = {"q_cmd": [], "q": [], "qd": []}
    for _ in range(history):  # the model's window: the arm held at q0
        tel = w.telemetry()
        w.set_goal(np.broadcast_to(q0, (arms, n)))
        hist["q_cmd"].append(np.asarray(q0, float))
        hist["q"].append(tel["q"][0])
        hist["qd"].append(tel["qd"][0])
        w.step(platform.control_dt)
    tel = w.telemetry()
    goals = np.repeat(np.asarray(q0, float)[None], arms, axis=0)
    for k, j in enumerate(joints):
        goals[1 + 2 * k, j] += delta
        goals[2 + 2 * k, j] -= delta
    for _ in range(horizon):
        w.set_goal(goals)
        w.step(platform.control_dt)
        w.telemetry()
    x = w.ee_position()
    J = np.stack([(x[1 + 2 * k] - x[2 + 2 * k]) / (2 * delta) for k in range(len(joints))], 1)
    # effort and q_cmd: what a Jacobian field that sees the load reads at this state.
    return {"J": J, "q": tel["q"][0], "qd": tel["qd"][0], "effort": tel["effort"][0],
            "q_cmd": np.asarray(q0, float), "history": {k: np.array(v) for k, v in hist.items()}}


def jacobian_errors(platform: Platform, sim, poses: np.ndarray, horizon: int,
                    payloads_kg: tuple[float, ...], joints: list[int],
                    aj: ActuatorJacobian | None = None, world: str | None = None,
                    seed: int = 0) -> list[dict]:
    """Relative errors of the kinematic and (if ``aj``) the model's dx/du per pose and
    payload, plus the world's gain relative to rigid FK (‖J_world‖ / ‖J_kin‖)."""
    points = Points.end_effector(sim.kinematics)
    rows = []
    for payload in payloads_kg:
        for i, q0 in enumerate(poses):
            truth = world_dxdu(platform, q0, joints, horizon, payload, world=world, seed=seed)
            Jw = truth["J"]
            Jk = kinematic_jacobian(sim.kinematics, points, truth["q"])[1][:, joints]
            norm = np.linalg.norm(Jw)
            row = {"pose": i, "payload_g": 1000 * payload,
                   "kinematic": float(np.linalg.norm(Jk - Jw) / norm),
                   "world_over_kinematic": float(norm / np.linalg.norm(Jk))}
            if aj is not None:
                _, Ja, _ = aj(truth["history"], truth["q"], truth["qd"], np.asarray(q0, float))
                row["actuator"] = float(np.linalg.norm(Ja[:, joints] - Jw) / norm)
            rows.append(row)
    return rows
