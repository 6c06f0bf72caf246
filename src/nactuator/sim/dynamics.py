"""Rigid-body inverse dynamics of a platform arm in torch: RNEA, mass matrix, Coriolis.

The equation of motion the simulator integrates is

    M(q) qdd + C(q, qd) qd + g(q) = tau + J_v(q)^T f_ext

with M including the platform's joint armature (no joint damping, no limits: those are
passive/constraint forces, not part of the rigid-body model). This module evaluates its
pieces for batches of states, built on the same joint frames and body inertials as the
simulator's forward kinematics (:class:`~nactuator.sim.kinematics.ChainKinematics`):

- :meth:`ArmDynamics.inverse_dynamics` -- the recursive Newton-Euler algorithm (RNEA) in the
  world frame: velocities and accelerations propagate from the base out, then each joint
  takes the axis component of the inertial wrench of the bodies it moves;
- :meth:`ArmDynamics.mass_matrix` -- ``sum_b m_b Jv_b^T Jv_b + Jw_b^T I_b Jw_b + armature``;
- :meth:`ArmDynamics.coriolis_matrix` -- the Christoffel-symbol C (so ``Mdot - 2C`` is
  skew-symmetric, which the momentum observer relies on);
- :meth:`ArmDynamics.coriolis_transpose_qd` -- ``C^T qd = Mdot qd - C qd`` in one
  forward-mode pass, the term the momentum observer needs;
- :func:`momentum_residual` / :func:`observer_torque` -- the generalised momentum observer
  (De Luca & Mattone, ICRA 2005): an external joint-torque estimate without the acceleration
  (the classical GMO baseline and the contact experiment's observer residuals).

Everything is float64 by default, batched over the first axis and differentiable. The
parity with MuJoCo's ``mj_inverse``/``mj_fullM`` is tested in tests/test_sim_dynamics_id.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from nactuator.platforms import Platform, load_platform
from nactuator.sim.kinematics import ChainKinematics

__all__ = ["ArmDynamics", "momentum_residual", "observer_terms", "observer_torque"]


def _cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.linalg.cross(a, b, dim=-1)


def _matvec(m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (m @ v[..., None])[..., 0]


class ArmDynamics(torch.nn.Module):
    """Inverse dynamics, mass matrix and Coriolis terms of one arm, batched over states.

    ``ArmDynamics.for_platform("so101")`` builds it from the same Newton model the
    simulator uses; ``ArmDynamics(kinematics)`` wraps an existing ``ChainKinematics``.
    ``armature`` (n,) overrides the platform's joint armature (the reflected rotor inertia
    on the diagonal of M) when given.
    """

    def __init__(self, kinematics: ChainKinematics,
                 armature: torch.Tensor | list[float] | None = None) -> None:
        super().__init__()
        self.kin = kinematics
        self.n = kinematics.n
        arm = kinematics.armature if armature is None else torch.as_tensor(armature)
        arm = arm.to(torch.float64).reshape(-1)
        if arm.numel() != self.n:
            raise ValueError(f"armature needs {self.n} values (one per joint), got {arm.numel()}")
        self.register_buffer("armature", arm.clone())
        self.revolute = [k == "revolute" for k in kinematics.kinds]
        # Bodies moved by each joint (its subtree) and the joints above each body.
        self.subtree = [kinematics._subtree(j) for j in range(self.n)]
        self.ancestors = [kinematics._ancestors(b) for b in range(self.n)]

    @classmethod
    def for_platform(cls, platform: Platform | str,
                     armature: list[float] | None = None) -> ArmDynamics:
        """The dynamics of ``platform``'s arm (MJCF inertials + platform armature)."""
        from nactuator.sim.builder import body_index, build_newton_model, joint_arrays

        if isinstance(platform, str):
            platform = load_platform(platform)
        reference = build_newton_model(platform, 1, "cpu")
        kin = ChainKinematics(
            joint_arrays(reference, platform.n),
            kinds=[c.kind for c in platform.channels],
            armature=[c.armature for c in platform.channels],
            ee_body=body_index(reference, platform.end_effector.body),
            ee_offset=platform.end_effector.offset,
        )
        return cls(kin, armature)

    # -- helpers ------------------------------------------------------------------------
    def _check(self, name: str, x: torch.Tensor, batch: int | None = None) -> None:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor, got "
                            f"{type(x).__name__ if not isinstance(x, torch.Tensor) else x.dtype}")
        if x.ndim != 2 or x.shape[1] != self.n or (batch is not None and x.shape[0] != batch):
            want = f"({batch if batch is not None else 'B'}, {self.n})"
            raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")

    def _bodies(self, q: torch.Tensor) -> dict[str, torch.Tensor]:
        """World COM positions, world inertia tensors and joint frames at ``q``."""
        f = self.kin.frames(q)
        dt, dev = q.dtype, q.device
        com = self.kin.body_com.to(dev, dt)
        inertia = self.kin.body_inertia.to(dev, dt)
        # Stored in float32 upstream: symmetrise so omega x I omega and the Christoffel C
        # (both derived for a symmetric I) agree to float64 precision.
        inertia = 0.5 * (inertia + inertia.transpose(-1, -2))
        rot = f["body_rot"]
        c = f["body_pos"] + (rot @ com[None, :, :, None])[..., 0]
        i_world = rot @ inertia[None] @ rot.transpose(-1, -2)
        return {"com": c, "inertia": i_world, "origin": f["joint_pos"], "axis": f["joint_axis"],
                "mass": self.kin.body_mass.to(dev, dt)}

    # -- the equation of motion ---------------------------------------------------------
    def inverse_dynamics(self, q: torch.Tensor, qd: torch.Tensor, qdd: torch.Tensor,
                         gravity: bool = True) -> torch.Tensor:
        """Joint torques (B, n) that produce ``qdd`` at (q, qd): M qdd + C qd [+ g]."""
        self._check("q", q)
        batch = q.shape[0]
        self._check("qd", qd, batch)
        self._check("qdd", qdd, batch)
        qd, qdd = qd.to(q.dtype), qdd.to(q.dtype)
        s = self._bodies(q)
        zero = torch.zeros(batch, 3, dtype=q.dtype, device=q.device)
        g = self.kin.gravity.to(q.device, q.dtype) if gravity else zero[0]
        w: list[torch.Tensor] = [zero] * self.n  # angular velocity of each body
        al: list[torch.Tensor] = [zero] * self.n  # angular acceleration
        v: list[torch.Tensor] = [zero] * self.n  # COM velocity
        a: list[torch.Tensor] = [zero] * self.n  # COM acceleration
        for j in range(self.n):  # MJCF order is topological: parents first
            parent, b = self.kin.joint_parent[j], self.kin.joint_child[j]
            o, axis = s["origin"][:, j], s["axis"][:, j]
            if parent < 0:
                w_p, al_p, v_o, a_o = zero, zero, zero, zero
            else:
                w_p, al_p = w[parent], al[parent]
                rp = o - s["com"][:, parent]
                v_o = v[parent] + _cross(w_p, rp)
                a_o = a[parent] + _cross(al_p, rp) + _cross(w_p, _cross(w_p, rp))
            r = s["com"][:, b] - o
            rate, acc = qd[:, j:j + 1], qdd[:, j:j + 1]
            if self.revolute[j]:
                w[b] = w_p + axis * rate
                al[b] = al_p + axis * acc + _cross(w_p, axis * rate)
                v[b] = v_o + _cross(w[b], r)
                a[b] = a_o + _cross(al[b], r) + _cross(w[b], _cross(w[b], r))
            else:
                w[b], al[b] = w_p, al_p
                v[b] = v_o + _cross(w_p, r) + axis * rate
                a[b] = (a_o + _cross(al_p, r) + _cross(w_p, _cross(w_p, r))
                        + 2.0 * _cross(w_p, axis * rate) + axis * acc)
        # Inertial wrench of every body (about its COM), gravity as a base acceleration.
        force = [s["mass"][b] * (a[b] - g) for b in range(self.n)]
        moment = [_matvec(s["inertia"][:, b], al[b])
                  + _cross(w[b], _matvec(s["inertia"][:, b], w[b])) for b in range(self.n)]
        tau = []
        for j in range(self.n):
            o, axis = s["origin"][:, j], s["axis"][:, j]
            total = torch.zeros(batch, 3, dtype=q.dtype, device=q.device)
            for b in self.subtree[j]:
                if self.revolute[j]:
                    total = total + moment[b] + _cross(s["com"][:, b] - o, force[b])
                else:
                    total = total + force[b]
            tau.append((total * axis).sum(-1))
        return torch.stack(tau, -1) + self.armature.to(q.device, q.dtype) * qdd

    def gravity_torque(self, q: torch.Tensor) -> torch.Tensor:
        """g(q): the torques that hold the arm still at ``q``, (B, n)."""
        zero = torch.zeros_like(q)
        return self.inverse_dynamics(q, zero, zero)

    def bias(self, q: torch.Tensor, qd: torch.Tensor, gravity: bool = True) -> torch.Tensor:
        """C(q, qd) qd [+ g(q)], (B, n): the torques at zero acceleration."""
        return self.inverse_dynamics(q, qd, torch.zeros_like(q), gravity=gravity)

    def jacobians(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """COM linear and angular Jacobians of every body, each (B, n_bodies, 3, n)."""
        self._check("q", q)
        s = self._bodies(q)
        batch = q.shape[0]
        jv = torch.zeros(batch, self.n, 3, self.n, dtype=q.dtype, device=q.device)
        jw = torch.zeros_like(jv)
        for b in range(self.n):
            for j in self.ancestors[b]:
                axis = s["axis"][:, j]
                if self.revolute[j]:
                    jv[:, b, :, j] = _cross(axis, s["com"][:, b] - s["origin"][:, j])
                    jw[:, b, :, j] = axis
                else:
                    jv[:, b, :, j] = axis
        return jv, jw, s

    def mass_matrix(self, q: torch.Tensor) -> torch.Tensor:
        """Joint-space inertia M(q) including armature, (B, n, n), symmetric positive."""
        jv, jw, s = self.jacobians(q)
        m = s["mass"][None, :, None, None]
        lin = (m * jv.transpose(-1, -2) @ jv).sum(1)
        ang = (jw.transpose(-1, -2) @ s["inertia"] @ jw).sum(1)
        return lin + ang + torch.diag(self.armature.to(q.device, q.dtype))

    def momentum(self, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
        """Generalised momentum p = M(q) qd, (B, n)."""
        return _matvec(self.mass_matrix(q), qd.to(q.dtype))

    def mass_matrix_rate(self, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
        """Mdot = dM/dt along the motion, (B, n, n): one forward-mode derivative of M."""
        _, mdot = torch.func.jvp(self.mass_matrix, (q,), (qd.to(q.dtype),))
        return mdot

    def coriolis_transpose_qd(self, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
        """C(q, qd)^T qd = Mdot qd - C qd, (B, n) (the momentum observer's term)."""
        qd = qd.to(q.dtype)
        return _matvec(self.mass_matrix_rate(q, qd), qd) - self.bias(q, qd, gravity=False)

    def coriolis_matrix(self, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
        """Christoffel-symbol Coriolis matrix C(q, qd), (B, n, n):
        C_ij = sum_k 1/2 (dM_ij/dq_k + dM_ik/dq_j - dM_jk/dq_i) qd_k."""
        self._check("q", q)
        self._check("qd", qd, q.shape[0])
        qd = qd.to(q.dtype)
        eye = torch.eye(self.n, dtype=q.dtype, device=q.device)
        # dM[..., k] = dM/dq_k, (B, n, n, n)
        dm = torch.stack([torch.func.jvp(self.mass_matrix, (q,), (eye[k].expand_as(q),))[1]
                          for k in range(self.n)], -1)
        term1 = torch.einsum("bijk,bk->bij", dm, qd)  # Mdot
        term2 = torch.einsum("bikj,bk->bij", dm, qd)  # dM_ik/dq_j qd_k
        term3 = torch.einsum("bjki,bk->bij", dm, qd)  # dM_jk/dq_i qd_k
        return 0.5 * (term1 + term2 - term3)

    def ee_jacobian(self, q: torch.Tensor) -> torch.Tensor:
        """Linear Jacobian of the platform's end-effector point, (B, 3, n)."""
        return self.kin.ee_jacobian(q)


def ee_force_from_joint_torques(dyn: ArmDynamics, q: np.ndarray, tau_ext: np.ndarray,
                                joints: Sequence[int], damping: float = 0.0) -> np.ndarray:
    """(T, 3) the end-effector force [N, base frame, environment on the arm] that explains
    the external joint torques ``tau_ext`` (T, n) on ``joints`` at each frame's pose ``q``
    (T, n): ``J_v(q)^T f = tau_ext`` solved per frame by least squares, with ``J_v`` the
    linear Jacobian of the end-effector point on those joints (a gripper's jaw moves no
    end-effector point: leave it out and its torque, the grip, never enters).

    ``damping`` = 0: ``f = pinv(J_v^T) tau``, exact where the pose is not singular and
    bounded where it is. ``damping`` = lambda > 0 [m]: ``(J_v J_v^T + lambda^2 I)^-1 J_v tau``,
    which biases |f| low only near singularities (the classical baselines'
    ``pinv_damping``). A non-finite row of ``tau_ext`` gives a NaN row."""
    joints = list(joints)
    with torch.no_grad():
        jac = dyn.ee_jacobian(torch.from_numpy(np.asarray(q, np.float64))).numpy()
    j = jac[:, :, joints]  # (T, 3, k)
    tau = np.asarray(tau_ext, np.float64)[:, joints]
    if damping > 0:
        gram = j @ j.transpose(0, 2, 1) + damping ** 2 * np.eye(3)
        return np.linalg.solve(gram, j @ tau[:, :, None])[..., 0]
    return np.einsum("tik,tk->ti", np.linalg.pinv(j.transpose(0, 2, 1)), tau)


def momentum_residual(p: np.ndarray, beta: np.ndarray, tau_motor: np.ndarray,
                      step_dt: np.ndarray, gain: float) -> np.ndarray:
    """The generalised momentum observer over a recording: r (T, n) from momentum
    ``p = M(q) qd``, ``beta = g - C^T qd`` and the motor torque (all (T, n)), and the frame
    steps ``step_dt`` (T,) (``step_dt[k]``: time from frame k-1 to k).

    With ``Mdot = C + C^T`` the arm obeys ``pdot = tau_motor + C^T qd - g + tau_ext``, which
    needs no acceleration; the residual

        r(t) = K ( p(t) - p(0) - integral_0^t (tau_motor + C^T qd - g + r) ds )

    follows ``rdot = K (tau_ext - r)``: a first-order low-pass of the external torque with
    time constant ``1 / K`` (``gain`` K [1/s]).

    Discrete form, r(0) = 0: the measured part of the integrand (``tau_motor - beta``, known
    at both ends of a step) by the trapezoid rule, the residual's own feedback by forward
    Euler. Causal (row k uses frames <= k); stable for ``K dt < 2``. (Forward Euler on the
    measured part too lags it by one frame, which on a 1 Hz, 0.8 rad SO-101 motion leaves a
    residual as large as the whole C^T qd term.)"""
    step_dt = np.asarray(step_dt, np.float64)
    if np.any(gain * step_dt[1:] >= 2.0):
        raise ValueError(f"momentum observer gain {gain} 1/s is unstable at frame steps up to "
                         f"{step_dt[1:].max():.4f} s (needs gain * dt < 2)")
    r = np.zeros_like(p, dtype=np.float64)
    integral = np.zeros(p.shape[1])
    known = tau_motor - beta
    for k in range(1, len(p)):
        integral += (0.5 * (known[k - 1] + known[k]) + r[k - 1]) * step_dt[k]
        r[k] = gain * (p[k] - p[0] - integral)
    return r


def observer_terms(dyn: ArmDynamics, q: np.ndarray, qd: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The observer's state terms at each frame (T, n) each: momentum ``M(q) qd`` and
    ``beta = g(q) - C(q, qd)^T qd``, on the nominal arm, float64."""
    q_t = torch.from_numpy(np.asarray(q, np.float64))
    qd_t = torch.from_numpy(np.asarray(qd, np.float64))
    with torch.no_grad():
        p = dyn.momentum(q_t, qd_t).numpy()
        beta = (dyn.gravity_torque(q_t) - dyn.coriolis_transpose_qd(q_t, qd_t)).numpy()
    return p, beta


def observer_torque(dyn: ArmDynamics, q: np.ndarray, qd: np.ndarray, tau_motor: np.ndarray,
                    step_dt: np.ndarray, gain: float) -> np.ndarray:
    """(T, n) the momentum observer's external joint-torque estimate over a recording at
    joint states ``q``, ``qd`` with motor torque ``tau_motor`` (all (T, n))."""
    p, beta = observer_terms(dyn, q, qd)
    return momentum_residual(p, beta, np.asarray(tau_motor, np.float64), step_dt, gain)
