"""The chain engine: every substep of one control step in ONE Warp kernel, one thread per arm.

Newton's ``SolverFeatherstone`` is general (trees, free joints, contacts) and pays for it with
~15 kernel launches per substep and dense ``6n x 6n`` mass-matrix products. Every platform
we ship is a serial chain of revolute/prismatic joints, so here one thread steps one arm
through all of a control step's substeps with the articulated-body algorithm (ABA):

- pass 1, base -> tip: joint frames, motion subspaces ``S``, body twists ``v``,
  velocity-product accelerations ``c = v x S qd``, spatial inertias ``I`` and bias forces
  ``p = v x* I v - f_gravity``;
- pass 2, tip -> base: articulated inertias; ``D = S.I^A S + armature`` per joint;
- pass 3, base -> tip: joint accelerations ``qdd``;

then semi-implicit Euler, exactly as Newton integrates revolute/prismatic joints:
``qd += qdd dt; q += qd dt``. Efforts are ``joint_f`` + Newton's joint-limit penalty
(``limit_ke (bound - q) - limit_kd qd`` outside the limits) - ``damping qd``. Everything
is expressed in world coordinates about the world origin (Featherstone's "spatial"
frame, as Newton does), so inertias add without frame changes. Spatial vectors are
(linear, angular), Newton's convention.

Adjoint correctness (Warp differentiates the kernel). Warp cannot differentiate a variable
that is overwritten inside a *dynamic* loop, so every loop here has a compile-time count
(``wp.static``) and is unrolled: each loop-carried value (``q``, ``qd``, the articulated
inertia flowing to the parent) becomes a fresh SSA value per iteration. Per-joint results
that a later pass reads are kept in small fixed-size matrices (one row per joint) that are
created inside ``chain_qdd`` -- so afresh for every substep -- and each row is written
exactly once before it is read: under that rule Warp's in-place component store has the
right adjoint. The kernel is generated per robot geometry (``n``, joint kinds, frames and
inertials are compile-time constants); joint dynamics (armature, damping, limits, gains)
are launch arguments, so changing them does not recompile. tests/test_sim_chain.py checks
the trajectories and gradients against Newton and float64 MuJoCo, tests/test_sim_grad.py the
gradients against finite differences (open loop, closed loop, inside the joint limits).
"""

# No `from __future__ import annotations`: Warp reads kernel annotations as live types.

from dataclasses import dataclass

import numpy as np
import torch
import warp as wp

from nactuator.constants import GRAVITY
from nactuator.platforms import Platform
from nactuator.sim.builder import SimSettings, SimSetupError
from nactuator.sim.kinematics import _quat_xyzw_to_matrix

__all__ = ["ChainEngine", "ChainGeometry", "NotASerialChain", "chain_geometry"]

_REVOLUTE, _PRISMATIC = 1, 0  # newton.JointType values
_GRAVITY = (0.0, 0.0, -GRAVITY)

# Warp's default CPU flags add much higher inlining thresholds; on this large unrolled kernel
# they compiled no faster and ran slower (docs/simulator.md "Compile time").
MODULE_OPTIONS: dict = {"cpu_compiler_flags": "-march=native"}

vec6 = wp.types.vector(length=6, dtype=wp.float32)
mat66 = wp.types.matrix(shape=(6, 6), dtype=wp.float32)


class NotASerialChain(ValueError):
    """The model is not a serial chain of revolute/prismatic joints (use engine='newton')."""


@dataclass(frozen=True)
class ChainGeometry:
    """Everything about one arm that the kernel bakes in as constants (tuples, hashable).

    Per joint j (parent = body j - 1, child = body j): ``revolute`` flag, joint frame in the
    parent ``rot_p``/``pos_p``, the inverse of the joint frame in the child
    ``rot_c_inv``/``pos_c_inv``, unit ``axis`` in the joint frame, and the child body's
    ``mass``, ``com`` (body frame) and ``inertia`` about the COM (body frame)."""

    revolute: tuple[bool, ...]
    rot_p: tuple[tuple[float, ...], ...]  # row-major 3x3
    pos_p: tuple[tuple[float, float, float], ...]
    rot_c_inv: tuple[tuple[float, ...], ...]
    pos_c_inv: tuple[tuple[float, float, float], ...]
    axis: tuple[tuple[float, float, float], ...]
    mass: tuple[float, ...]
    com: tuple[tuple[float, float, float], ...]
    inertia: tuple[tuple[float, ...], ...]

    @property
    def n(self) -> int:
        return len(self.revolute)


def chain_geometry(arrays: dict[str, np.ndarray], where: str) -> ChainGeometry:
    """Read the first replica's joint frames and inertials (``builder.joint_arrays``) and
    check that they form a serial chain; ``where`` names the model in error messages."""
    types = [int(t) for t in arrays["joint_type"]]
    parents = [int(p) for p in arrays["joint_parent"]]
    children = [int(c) for c in arrays["joint_child"]]
    n = len(types)
    for j in range(n):
        if types[j] not in (_REVOLUTE, _PRISMATIC):
            raise NotASerialChain(
                f"{where}: joint {j} has Newton joint type {types[j]}; the chain engine steps "
                "only revolute and prismatic joints. Use engine='newton'"
            )
        if children[j] != j or parents[j] != j - 1:
            raise NotASerialChain(
                f"{where}: joint {j} connects body {parents[j]} -> {children[j]}, expected "
                f"{j - 1} -> {j}: the model is not a serial chain (a tree or an out-of-order "
                "MJCF). Use engine='newton'"
            )

    def rows(m: np.ndarray) -> tuple[float, ...]:
        return tuple(float(v) for v in np.asarray(m, dtype=np.float64).reshape(-1))

    def vec(v) -> tuple[float, float, float]:
        return tuple(float(x) for x in np.asarray(v, dtype=np.float64).reshape(3))

    rot_p, pos_p, rot_c_inv, pos_c_inv = [], [], [], []
    for xp, xc in zip(arrays["joint_X_p"], arrays["joint_X_c"], strict=True):
        rot_p.append(rows(_quat_xyzw_to_matrix(xp[3:7])))
        pos_p.append(vec(xp[:3]))
        rc = _quat_xyzw_to_matrix(xc[3:7])
        rot_c_inv.append(rows(rc.T))
        pos_c_inv.append(vec(-rc.T @ np.asarray(xc[:3], dtype=np.float64)))
    return ChainGeometry(
        revolute=tuple(t == _REVOLUTE for t in types),
        rot_p=tuple(rot_p),
        pos_p=tuple(pos_p),
        rot_c_inv=tuple(rot_c_inv),
        pos_c_inv=tuple(pos_c_inv),
        axis=tuple(vec(a) for a in arrays["joint_axis"][:n]),
        mass=tuple(float(m) for m in arrays["body_mass"][:n]),
        com=tuple(vec(c) for c in arrays["body_com"][:n]),
        inertia=tuple(rows(i) for i in arrays["body_inertia"][:n]),
    )


# -- spatial algebra, (linear, angular) ------------------------------------------------------

@wp.func
def _top(a: vec6) -> wp.vec3:
    return wp.vec3(a[0], a[1], a[2])


@wp.func
def _bottom(a: vec6) -> wp.vec3:
    return wp.vec3(a[3], a[4], a[5])


@wp.func
def _spatial(lin: wp.vec3, ang: wp.vec3) -> vec6:
    return vec6(lin[0], lin[1], lin[2], ang[0], ang[1], ang[2])


@wp.func
def _motion_cross(a: vec6, b: vec6) -> vec6:
    """a x b for motion vectors (the derivative of b moving with twist a)."""
    va, wa = _top(a), _bottom(a)
    vb, wb = _top(b), _bottom(b)
    return _spatial(wp.cross(wa, vb) + wp.cross(va, wb), wp.cross(wa, wb))


@wp.func
def _force_cross(a: vec6, f: vec6) -> vec6:
    """a x* f for a force f (its rate of change in a frame moving with twist a)."""
    va, wa = _top(a), _bottom(a)
    fl, fa = _top(f), _bottom(f)
    return _spatial(wp.cross(wa, fl), wp.cross(wa, fa) + wp.cross(va, fl))


@wp.func
def _spatial_inertia(m: float, c: wp.vec3, inertia_com: wp.mat33) -> mat66:
    """Spatial inertia about the world origin of a body of mass m with its COM at c and
    rotational inertia ``inertia_com`` about the COM (both world-aligned)."""
    mx, my, mz = m * c[0], m * c[1], m * c[2]
    j = inertia_com + m * (wp.dot(c, c) * wp.identity(n=3, dtype=float) - wp.outer(c, c))
    return mat66(
        m, 0.0, 0.0, 0.0, mz, -my,
        0.0, m, 0.0, -mz, 0.0, mx,
        0.0, 0.0, m, my, -mx, 0.0,
        0.0, -mz, my, j[0, 0], j[0, 1], j[0, 2],
        mz, 0.0, -mx, j[1, 0], j[1, 1], j[1, 2],
        -my, mx, 0.0, j[2, 0], j[2, 1], j[2, 2],
    )


@wp.func
def _joint_torque(f: float, q: float, qd: float, lower: float, upper: float, limit_ke: float,
                  limit_kd: float, damping: float) -> float:
    """Applied torque + Newton's penalty joint limit (a spring-damper only outside the
    limits) + viscous damping -- Newton's ``joint_force`` with zero PD targets."""
    below = limit_ke * (lower - q) - limit_kd * qd
    above = limit_ke * (upper - q) - limit_kd * qd
    limit = wp.where(q < lower, below, wp.where(q > upper, above, 0.0))
    return f + limit - damping * qd


def _skew(a) -> np.ndarray:
    x, y, z = a
    return np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])


def build_chain_kernel(geometry: ChainGeometry, substeps: int) -> wp.Kernel:
    """The kernel for one arm geometry and substep count.

    ``step(q, qd, f, armature, damping, lower, upper, limit_ke, limit_kd, dt, q_out, qd_out)``
    with one (n,)-vector per arm in each array; launch with ``dim = B``."""
    n = geometry.n
    vec_n = wp.types.vector(length=n, dtype=wp.float32)
    mat_n6 = wp.types.matrix(shape=(n, 6), dtype=wp.float32)  # one spatial vector per joint
    mat_6n6 = wp.types.matrix(shape=(6 * n, 6), dtype=wp.float32)  # one 6x6 per joint

    def mat33(values) -> wp.mat33:
        return wp.mat33(*[float(v) for v in np.asarray(values).reshape(-1)])

    revolute = list(geometry.revolute)
    rot_p = [mat33(r) for r in geometry.rot_p]
    pos_p = [wp.vec3(*p) for p in geometry.pos_p]
    rot_c_inv = [mat33(r) for r in geometry.rot_c_inv]
    pos_c_inv = [wp.vec3(*p) for p in geometry.pos_c_inv]
    axis = [wp.vec3(*a) for a in geometry.axis]
    # Rodrigues about a fixed unit axis a: R(q) = cos q E + sin q [a]x + (1 - cos q) a a^T
    axis_skew = [mat33(_skew(a)) for a in geometry.axis]
    axis_outer = [mat33(np.outer(a, a)) for a in geometry.axis]
    mass = list(geometry.mass)
    com = [wp.vec3(*c) for c in geometry.com]
    inertia = [mat33(i) for i in geometry.inertia]
    gravity = wp.vec3(*_GRAVITY)

    @wp.func
    def chain_qdd(q: vec_n, qd: vec_n, f: vec_n, armature: vec_n, damping: vec_n,
                  lower: vec_n, upper: vec_n, limit_ke: float, limit_kd: float) -> vec_n:
        """Joint accelerations of one arm (the articulated-body algorithm)."""
        # Per-joint results read by a later pass, one row per joint, each written once.
        s_rows = mat_n6()  # motion subspace S_j
        c_rows = mat_n6()  # velocity-product acceleration c_j = v_j x S_j qd_j
        p_rows = mat_n6()  # bias force p_j = v_j x* I_j v_j - gravity force
        i_rows = mat_6n6()  # spatial inertia I_j in rows 6j..6j+5
        tau = vec_n()  # joint torque incl. limit penalty and damping

        # pass 1, base -> tip
        rot = wp.identity(n=3, dtype=float)  # parent body pose in the world
        pos = wp.vec3()
        v = vec6()  # parent body twist
        for j in range(wp.static(n)):
            rot_j = rot @ wp.static(rot_p[j])  # joint frame in the world
            pos_j = pos + rot @ wp.static(pos_p[j])
            a = rot_j @ wp.static(axis[j])
            if wp.static(revolute[j]):
                s = _spatial(wp.cross(pos_j, a), a)
                cq = wp.cos(q[j])
                turn = (cq * wp.identity(n=3, dtype=float)
                        + wp.sin(q[j]) * wp.static(axis_skew[j])
                        + (1.0 - cq) * wp.static(axis_outer[j]))
                rot_m = rot_j @ turn
                pos_m = pos_j
            else:
                s = _spatial(a, wp.vec3())
                rot_m = rot_j
                pos_m = pos_j + a * q[j]
            rot = rot_m @ wp.static(rot_c_inv[j])  # child body pose in the world
            pos = pos_m + rot_m @ wp.static(pos_c_inv[j])

            v_joint = s * qd[j]
            v = v + v_joint
            m = wp.static(mass[j])
            c = pos + rot @ wp.static(com[j])
            body_inertia = _spatial_inertia(
                m, c, rot @ wp.static(inertia[j]) @ wp.transpose(rot))
            weight = m * wp.static(gravity)
            s_rows[j] = s
            c_rows[j] = _motion_cross(v, v_joint)
            p_rows[j] = (_force_cross(v, body_inertia @ v)
                         - _spatial(weight, wp.cross(c, weight)))
            for r in range(6):
                i_rows[wp.static(6 * j) + r] = body_inertia[r]
            tau[j] = _joint_torque(f[j], q[j], qd[j], lower[j], upper[j], limit_ke,
                                   limit_kd, damping[j])

        # pass 2, tip -> base: articulated inertia and bias force handed to the parent
        u_rows = mat_n6()  # U_j = I^A_j S_j
        d = vec_n()  # D_j = S_j . U_j + armature_j
        u = vec_n()  # u_j = tau_j - S_j . p^A_j
        child_inertia = mat66()
        child_bias = vec6()
        for k in range(wp.static(n)):
            j = wp.static(n - 1 - k)
            art_inertia = child_inertia + wp.matrix_from_rows(
                i_rows[wp.static(6 * j)], i_rows[wp.static(6 * j + 1)],
                i_rows[wp.static(6 * j + 2)], i_rows[wp.static(6 * j + 3)],
                i_rows[wp.static(6 * j + 4)], i_rows[wp.static(6 * j + 5)])
            art_bias = p_rows[j] + child_bias
            s = s_rows[j]
            u_j = art_inertia @ s
            d_j = wp.dot(s, u_j) + armature[j]
            e_j = tau[j] - wp.dot(s, art_bias)
            u_rows[j] = u_j
            d[j] = d_j
            u[j] = e_j
            child_inertia = art_inertia - wp.outer(u_j, u_j) / d_j
            child_bias = art_bias + child_inertia @ c_rows[j] + u_j * (e_j / d_j)

        # pass 3, base -> tip: accelerations (gravity is in the bias forces, so the
        # base does not accelerate)
        qdd = vec_n()
        acc = vec6()
        for j in range(wp.static(n)):
            acc = acc + c_rows[j]
            qdd_j = (u[j] - wp.dot(u_rows[j], acc)) / d[j]
            acc = acc + s_rows[j] * qdd_j
            qdd[j] = qdd_j
        return qdd

    @wp.kernel(module="unique", module_options=dict(MODULE_OPTIONS))
    def chain_step(q_in: wp.array(dtype=vec_n), qd_in: wp.array(dtype=vec_n),
                   f_in: wp.array(dtype=vec_n), armature: vec_n, damping: vec_n, lower: vec_n,
                   upper: vec_n, limit_ke: float, limit_kd: float, dt: float,
                   q_out: wp.array(dtype=vec_n), qd_out: wp.array(dtype=vec_n)):
        arm = wp.tid()
        q = q_in[arm]
        qd = qd_in[arm]
        f = f_in[arm]
        for _substep in range(wp.static(substeps)):  # unrolled: fresh q, qd per substep
            qdd = chain_qdd(q, qd, f, armature, damping, lower, upper, limit_ke, limit_kd)
            # semi-implicit Euler, as Newton integrates revolute/prismatic joints
            qd = qd + qdd * dt
            q = q + qd * dt
        q_out[arm] = q
        qd_out[arm] = qd

    return chain_step


_KERNELS: dict[tuple[ChainGeometry, int], wp.Kernel] = {}


def chain_kernel(geometry: ChainGeometry, substeps: int) -> wp.Kernel:
    """One kernel per (geometry, substeps) per process; Warp caches the compiled code."""
    key = (geometry, substeps)
    if key not in _KERNELS:
        _KERNELS[key] = build_chain_kernel(geometry, substeps)
    return _KERNELS[key]


class _Launches:
    """Persistent arrays for one batch size and the two recorded launches that use them:
    the step and its adjoint. Replaying a recorded launch skips Warp's per-call argument
    packing (~0.1-0.4 ms per call on CPU), which dominates at small batch sizes."""

    def __init__(self, kernel: wp.Kernel, vec_n: type, params: list, batch: int,
                 device: str) -> None:
        n = vec_n._length_
        # q, qd, f, q1, qd1 (values) and their adjoints, each one (5, B, n) torch tensor
        # whose rows the Warp arrays view (no copies): loading, zeroing and reading several
        # rows is one torch op instead of one per row.
        self.value_rows = torch.zeros(5, batch, n, dtype=torch.float32, device=device)
        self.adjoint_rows = torch.zeros(5, batch, n, dtype=torch.float32, device=device)
        self.values = [wp.from_torch(row, dtype=vec_n) for row in self.value_rows]
        self.adjoints = [wp.from_torch(row, dtype=vec_n) for row in self.adjoint_rows]
        self.value_views = list(self.value_rows.unbind(0))
        self.adjoint_views = list(self.adjoint_rows.unbind(0))
        inputs, outputs = [*self.values[:3], *params], self.values[3:]
        self.step = wp.launch(kernel, dim=batch, inputs=inputs, outputs=outputs, device=device,
                              record_cmd=True)
        self.adjoint = wp.launch(kernel, dim=batch, inputs=inputs, outputs=outputs,
                                 adj_inputs=[*self.adjoints[:3], *([None] * len(params))],
                                 adj_outputs=self.adjoints[3:], adjoint=True, device=device,
                                 record_cmd=True)

    def load_inputs(self, tau: torch.Tensor, q: torch.Tensor, qd: torch.Tensor) -> None:
        torch.stack((q, qd, tau), out=self.value_rows[:3])


class ChainEngine:
    """One control step of B arms with the chain kernel (same contract as the Newton engine).

    ``forward`` runs the step (no tape). ``backward`` replays the step from its saved
    inputs by launching the kernel's adjoint -- the launch ``wp.Tape.backward`` issues for a
    tape holding this one kernel: Warp's adjoint kernel recomputes the step's forward sweep
    itself, then runs it in reverse. The launches are recorded once per batch size."""

    def __init__(self, platform: Platform, geometry: ChainGeometry, settings: SimSettings,
                 device: str) -> None:
        if settings.angular_damping != 0.0:
            # newton 1.8.0's Featherstone stores this setting but never reads it, so the
            # reference has no behaviour to match; refuse rather than silently ignore it.
            raise SimSetupError(
                f"{platform.source or platform.name}: sim.angular_damping = "
                f"{settings.angular_damping:g} has no effect in newton's Featherstone and the "
                "chain engine does not model it; set it to 0 (or use engine='newton')"
            )
        self.n, self.substeps, self.dt = platform.n, platform.substeps, platform.substep_dt
        self.device = device
        self.kernel = chain_kernel(geometry, platform.substeps)
        self.vec_n = wp.types.vector(length=self.n, dtype=wp.float32)
        per_joint = [[c.armature for c in platform.channels],
                     [c.damping for c in platform.channels],
                     [c.limit_lower for c in platform.channels],
                     [c.limit_upper for c in platform.channels]]
        # The kernel's launch arguments after the arrays (see build_chain_kernel).
        self.params = [*(self.vec_n(*values) for values in per_joint),
                       float(settings.limit_ke), float(settings.limit_kd), float(self.dt)]
        self._launches: dict[int, _Launches] = {}

    def launches(self, batch: int) -> _Launches:
        if batch not in self._launches:
            self._launches[batch] = _Launches(self.kernel, self.vec_n, self.params, batch,
                                              self.device)
        return self._launches[batch]

    def forward(self, tau: torch.Tensor, q: torch.Tensor, qd: torch.Tensor):
        run = self.launches(q.shape[0])
        run.load_inputs(tau, q, qd)
        run.step.launch()
        q1, qd1 = run.value_views[3:]
        return q1.clone(), qd1.clone()

    def backward(self, tau, q, qd, grad_q, grad_qd):
        """Gradients of (tau, q, qd) from those of the step's outputs (q1, qd1)."""
        run = self.launches(q.shape[0])
        run.load_inputs(tau, q, qd)
        run.adjoint_rows[:3].zero_()  # the adjoint accumulates into q, qd, f ...
        # ... and consumes (zeroes) q1, qd1 (autograd materialises unused outputs' zeros)
        torch.stack((grad_q, grad_qd), out=run.adjoint_rows[3:])
        run.adjoint.launch()
        adj_q, adj_qd, adj_f = run.adjoint_rows[:3].clone().unbind(0)
        return adj_f, adj_q, adj_qd
