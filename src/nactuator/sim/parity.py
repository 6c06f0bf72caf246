"""MuJoCo reference runs for the parity check (the only place ``sim`` uses MuJoCo).

The same MJCF and the same platform joint dynamics as the Newton builder, stepped at the
same substep ``dt`` under the same zero-order-hold torques (``qfrc_applied``). Featherstone
is semi-implicit Euler with EXPLICIT damping while MuJoCo's Euler treats damping implicitly,
so the two differ by first-order integration error; the yardstick for "small" is MuJoCo's
own Euler-vs-RK4 gap on the same trajectory (physics.md §7).
"""

from __future__ import annotations

import numpy as np

from nactuator.constants import GRAVITY
from nactuator.platforms import Platform

__all__ = ["mujoco_control_step", "mujoco_model", "mujoco_replay"]


_INTEGRATORS = ("euler", "euler_explicit_damping", "rk4")


def mujoco_model(platform: Platform, integrator: str = "euler"):
    """Compile the platform's MJCF with the platform's armature, damping and limits.

    ``integrator``: ``euler`` (MuJoCo's default semi-implicit Euler, damping implicit),
    ``euler_explicit_damping`` (the same with ``eulerdamp`` disabled: damping explicit, which
    is exactly Featherstone's scheme) or ``rk4``."""
    import mujoco

    spec = mujoco.MjSpec.from_file(str(platform.robot_model_path()))
    spec.compiler.degree = False  # our ranges are radians (MjSpec defaults to degrees)
    names = [j.name for j in spec.joints]
    if names != platform.channel_names:
        raise ValueError(f"{platform.robot_model_path()}: MuJoCo joints {names} do not match the "
                         f"channels {platform.channel_names}")
    for joint, ch in zip(spec.joints, platform.channels, strict=True):
        joint.armature = ch.armature
        joint.damping = [ch.damping, 0.0, 0.0]
        joint.frictionloss = 0.0
        joint.range = [ch.limit_lower, ch.limit_upper]
        joint.limited = mujoco.mjtLimited.mjLIMITED_TRUE
    spec.option.timestep = platform.substep_dt
    spec.option.gravity = [0.0, 0.0, -GRAVITY]
    if integrator not in _INTEGRATORS:
        raise ValueError(f"integrator must be one of {_INTEGRATORS}, got {integrator!r}")
    if integrator == "rk4":
        spec.option.integrator = mujoco.mjtIntegrator.mjINT_RK4
    else:
        spec.option.integrator = mujoco.mjtIntegrator.mjINT_EULER
    if integrator == "euler_explicit_damping":
        spec.option.disableflags |= mujoco.mjtDisableBit.mjDSBL_EULERDAMP
    return spec.compile()


def mujoco_replay(platform: Platform, q0: np.ndarray, qd0: np.ndarray, taus: np.ndarray,
                   integrator: str = "euler") -> np.ndarray:
    """One arm: q0, qd0 (n,), taus (T, n) held per control step -> q after each step (T, n)."""
    import mujoco

    model = mujoco_model(platform, integrator)
    data = mujoco.MjData(model)
    data.qpos[:] = q0
    data.qvel[:] = qd0
    out = np.empty((taus.shape[0], platform.n))
    for t, tau in enumerate(taus):
        data.qfrc_applied[:] = tau
        for _ in range(platform.substeps):
            mujoco.mj_step(model, data)
        out[t] = data.qpos
    return out


def mujoco_control_step(platform: Platform, q: np.ndarray, qd: np.ndarray, tau: np.ndarray,
                        integrator: str = "euler_explicit_damping") -> tuple[np.ndarray,
                                                                              np.ndarray]:
    """One arm, one control step in float64: (q1, qd1) after ``platform.substeps`` substeps
    under the torque ``tau`` (n,) from (q, qd)."""
    import mujoco

    model = mujoco_model(platform, integrator)
    data = mujoco.MjData(model)
    data.qpos[:] = q
    data.qvel[:] = qd
    data.qfrc_applied[:] = tau
    for _ in range(platform.substeps):
        mujoco.mj_step(model, data)
    return data.qpos.copy(), data.qvel.copy()
