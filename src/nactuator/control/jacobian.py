"""dx/du: how chosen points of the arm move when the joint commands ``u`` change.

Two answers, for the same points (:class:`Points`: the end-effector or any point fixed in a
link frame):

* **kinematic** (:func:`kinematic_jacobian`): rigid FK only, ``dx/du = dx/dq`` at the
  measured ``q``. It assumes the joint reaches its command at once and exactly, which a
  position servo does not: it lags the command, and gravity and an unknown payload sag it.
* **actuator-aware** (:class:`ActuatorJacobian`): the trained actuator model and the
  differentiable simulator, rolled ``horizon`` control steps from the current state and the
  model's window of history with the command ``u`` held, differentiated by autograd::

      x(u) = FK(q_{t+h}(u)),   q_{t+h} = sim ∘ model ∘ ... ∘ sim ∘ model (state_t, history, u)

  It returns both the prediction ``x(u)`` (where the points will be, lag included) and
  ``dx/du``. Only a *counterfactual* model (docs/counterfactual.md) can answer for a
  command never executed: a telemetry model would need the effort the servo has not yet
  produced.

Reverse mode gives one row of dx/du per backward pass. The rollout is batched instead:
copy ``b`` of the state drives output row ``b``, so one backward pass through a batch of
``3 × points`` copies gives the whole Jacobian (the copies are independent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nactuator.errors import UserError
from nactuator.rollout import RECORDED_KEYS, closed_loop_rollout

__all__ = ["ActuatorJacobian", "JacobianError", "Points", "kinematic_jacobian"]


class JacobianError(UserError, ValueError):
    """The Jacobian cannot be formed as asked; the message says why."""


@dataclass(frozen=True)
class Points:
    """Points fixed on the arm: ``bodies[i]`` is a body index of the simulator's chain
    kinematics (``kinematics.ee_body`` for the end-effector's body), ``offsets[i]`` the
    point in that body's frame [m]."""

    bodies: tuple[int, ...]
    offsets: tuple[tuple[float, float, float], ...]

    @classmethod
    def end_effector(cls, kinematics) -> Points:
        off = kinematics.ee_offset.detach().cpu().numpy().astype(float)
        return cls((int(kinematics.ee_body),), (tuple(off),))

    @classmethod
    def on_links(cls, kinematics, spec: Sequence[tuple[int, Sequence[float]]]) -> Points:
        """Points on links: ``(joint j, offset)`` is the point ``offset`` in the frame of the
        body joint ``j`` moves."""
        bodies, offsets = [], []
        for joint, offset in spec:
            if not 0 <= int(joint) < kinematics.n:
                raise JacobianError(f"link point on joint {joint}: the arm has joints "
                                    f"0..{kinematics.n - 1}")
            if len(offset) != 3 or not np.isfinite(offset).all():
                raise JacobianError(f"link point offset {list(offset)}: expected 3 finite "
                                    "numbers [m]")
            bodies.append(int(kinematics.joint_child[int(joint)]))
            offsets.append(tuple(float(v) for v in offset))
        return cls(tuple(bodies), tuple(offsets))

    def __len__(self) -> int:
        return len(self.bodies)

    def positions(self, kinematics, q: torch.Tensor) -> torch.Tensor:
        """(B, m, 3) base-frame positions at joint positions ``q`` (B, n); differentiable."""
        f = kinematics.frames(q)
        idx = list(self.bodies)
        off = torch.tensor(self.offsets, dtype=q.dtype, device=q.device)  # (m, 3)
        rot, pos = f["body_rot"][:, idx], f["body_pos"][:, idx]
        return pos + (rot @ off[None, :, :, None])[..., 0]


def kinematic_jacobian(kinematics, points: Points, q: np.ndarray) -> tuple[np.ndarray,
                                                                           np.ndarray]:
    """Rigid-FK baseline at ``q`` (n,): point positions (m, 3) and dx/dq (3m, n).

    Closed form from one FK pass (a loop tick cannot afford 3m backward passes): column j
    is ``a_j × (p − o_j)`` for a revolute joint that carries the point, ``a_j`` for a
    prismatic one, zero otherwise."""
    with torch.no_grad():
        qt = torch.as_tensor(np.asarray(q, dtype=np.float64)[None])
        f = kinematics.frames(qt)
        x = points.positions(kinematics, qt)[0].numpy()
        axes, origins = f["joint_axis"][0].numpy(), f["joint_pos"][0].numpy()
    J = np.zeros((3 * len(points), kinematics.n))
    for i, body in enumerate(points.bodies):
        for j in kinematics._ancestors(body):
            J[3 * i : 3 * i + 3, j] = (np.cross(axes[j], x[i] - origins[j])
                                       if kinematics.kinds[j] == "revolute" else axes[j])
    return x.astype(np.float64), J


class ActuatorJacobian:
    """dx/du through a counterfactual actuator model and the simulator (module docstring).

    ``exogenous``: the inputs known before execution the model may read (``kp``,
    ``supply_voltage``, ``initial_temperature``; (n,) each). :meth:`__call__` takes the
    model's history window as numpy (``history[key]`` (L − 1, n), oldest first, for
    ``q_cmd``, ``q``, ``qd``; fewer rows are padded as at an episode start), the current
    measured state and the command to linearise at.
    """

    def __init__(self, actuator, sim, points: Points, horizon: int = 4,
                 exogenous: Mapping[str, np.ndarray] | None = None) -> None:
        if actuator.mode != "counterfactual":
            raise JacobianError(
                f"the checkpoint reads recorded telemetry ({actuator.inputs}), which does not "
                "exist for a command not yet executed: dx/du needs a counterfactual model "
                "(docs/counterfactual.md; e.g. --model.features '[command, state, error]')")
        if horizon < 1:
            raise JacobianError(f"horizon must be >= 1 control step, got {horizon}")
        self.actuator, self.sim, self.points, self.horizon = actuator, sim, points, int(horizon)
        self.n = sim.n
        self.L = int(actuator.window_length)
        needed = [k for k in ("kp", "supply_voltage", "initial_temperature")
                  if k in actuator.inputs]
        exogenous = dict(exogenous or {})
        absent = [k for k in needed if k not in exogenous]
        if absent:
            raise JacobianError(f"the model reads {absent} (known before execution); pass "
                                "them as exogenous inputs")
        self.exogenous = {k: np.broadcast_to(np.asarray(exogenous[k], np.float64),
                                             (self.n,)).astype(np.float32) for k in needed}
        self.keys = [k for k in RECORDED_KEYS if k in actuator.inputs or k == "q_cmd"]
        actuator.eval()
        for p in actuator.parameters():
            p.requires_grad_(False)

    def _block(self, history: Mapping[str, np.ndarray], q: np.ndarray, qd: np.ndarray,
               commands: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rollout block for B copies: L − 1 history frames, the current frame, then
        ``horizon`` frames holding the command (``commands`` (B, n), with gradient)."""
        before, h, batch = self.L - 1, self.horizon, commands.shape[0]
        have = 0 if history.get("q") is None else min(len(history["q"]), before)
        block: dict[str, torch.Tensor] = {}

        def hist(key: str) -> torch.Tensor:
            out = np.zeros((before, self.n), np.float32)
            if have:
                out[before - have:] = np.asarray(history[key], np.float32)[-have:]
            return torch.from_numpy(out).expand(batch, -1, -1)

        future = commands[:, None, :].expand(-1, h + 1, -1)
        block["q_cmd"] = torch.cat([hist("q_cmd"), future], 1)
        if "q_cmd_next" in self.keys:
            # The command after each frame: history frame i's successor is frame i + 1's.
            cmd = block["q_cmd"]
            block["q_cmd_next"] = torch.cat([cmd[:, 1:], cmd[:, -1:]], 1)
        if "torque_enable" in self.keys:
            block["torque_enable"] = torch.ones_like(block["q_cmd"])
        for key, value in self.exogenous.items():
            block[key] = torch.from_numpy(value).expand(batch, before + h + 1, -1)
        for key, now in (("q", q), ("qd", qd)):
            cur = torch.from_numpy(np.asarray(now, np.float32)).expand(batch, h + 1, -1)
            block[key] = torch.cat([hist(key), cur], 1)
        block["pad"] = torch.zeros(batch, before + h + 1, dtype=torch.bool)
        block["pad"][:, : before - have] = True
        return block

    def __call__(self, history: Mapping[str, np.ndarray], q: np.ndarray, qd: np.ndarray,
                 u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Predicted point positions (m, 3) after ``horizon`` steps under ``u`` held,
        dx/du (3m, n) there, and the predicted joint positions (n,)."""
        rows = 3 * len(self.points)
        base = torch.as_tensor(np.asarray(u, np.float32))
        delta = torch.zeros(rows, self.n, requires_grad=True)
        commands = base[None] + delta
        with torch.enable_grad():
            block = self._block(history, q, qd, commands)
            r = closed_loop_rollout(self.actuator, self.sim.step, block, self.L,
                                    steps=self.horizon)
            q_end = r.q[:, -1]
            x = self.points.positions(self.sim.kinematics, q_end).reshape(rows, rows)
            # Copy b answers for output row b: the diagonal, summed, in one backward pass.
            (grad,) = torch.autograd.grad(torch.diagonal(x).sum(), delta)
        x0 = x[0].detach().numpy().reshape(-1, 3).astype(np.float64)
        return x0, grad.numpy().astype(np.float64), q_end[0].detach().numpy().astype(np.float64)
