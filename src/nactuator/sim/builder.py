"""Build the Newton model of a platform: B replicas of its MJCF arm, all at the origin.

The platform YAML is the source of truth for joint armature, damping and limits; the MJCF
supplies only kinematics and inertials. Everything the differentiable Featherstone step
depends on is set explicitly here (physics.md §4): pure torque drive (``target_ke =
target_kd = 0``), explicit limit penalty gains, ``requires_grad=True`` and gravity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import newton
import numpy as np

from nactuator.constants import GRAVITY
from nactuator.errors import UserError
from nactuator.platforms import Platform
from nactuator.sim.warp_runtime import init_warp

__all__ = [
    "ENGINES",
    "SimSettings",
    "SimSetupError",
    "body_index",
    "build_arm",
    "build_newton_model",
    "joint_arrays",
    "sim_settings",
]

# Defaults for the `sim:` section of a platform YAML. Limit penalty: NAD's Newton port uses
# ke = 250, kd = 10 because Newton's default (1e4, 10) is ~40x stiffer than MuJoCo's soft
# limits and "poisons early-training gradients" (physics.md §4 item 3).
_DEFAULTS = {"limit_ke": 250.0, "limit_kd": 10.0, "angular_damping": 0.0}
# `sim.engine` pins the simulator engine; absent = the chain engine for serial chains.
ENGINES = ("chain", "newton")


class SimSetupError(UserError, ValueError):
    """The platform's simulator settings are unusable (unstable, or model mismatch)."""


@dataclass(frozen=True)
class SimSettings:
    limit_ke: float  # joint-limit penalty stiffness [N*m/rad or N/m]
    limit_kd: float  # joint-limit penalty damping [N*m*s/rad or N*s/m]
    angular_damping: float  # Featherstone's body angular damping; 0 = no MuJoCo counterpart
    engine: str | None = None  # "chain" | "newton" pinned by the YAML; None = automatic


def sim_settings(platform: Platform) -> SimSettings:
    """Read the platform's ``sim:`` section, filling in the documented defaults."""
    raw = dict(platform.sim)
    known = [*_DEFAULTS, "engine"]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise SimSetupError(
            f"{platform.source or platform.name}: unknown key(s) {unknown} in section 'sim'; "
            f"expected some of {sorted(known)}"
        )
    engine = raw.pop("engine", None)
    if engine is not None and engine not in ENGINES:
        raise SimSetupError(
            f"{platform.source or platform.name}: sim.engine must be one of {list(ENGINES)}, "
            f"got {engine!r}"
        )
    values = {}
    for key, default in _DEFAULTS.items():
        v = raw.get(key, default)
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise SimSetupError(
                f"{platform.source or platform.name}: sim.{key} must be a finite number >= 0, "
                f"got {v!r}"
            )
        values[key] = float(v)
    return SimSettings(**values, engine=engine)


def _leaf(label: str) -> str:
    # Newton labels MJCF entities by their full path ("omx/worldbody/link1/link2/joint1").
    return label.rsplit("/", 1)[-1]


def build_arm(platform: Platform) -> newton.ModelBuilder:
    """One arm from the platform's MJCF, with the platform's joint dynamics applied."""
    path = platform.robot_model_path()
    if not path.exists():
        raise SimSetupError(f"{platform.source}: robot_model {platform.robot_model!r} -> {path} "
                            "does not exist")
    settings = sim_settings(platform)
    arm = newton.ModelBuilder(up_axis=newton.Axis.Z, gravity=(0.0, 0.0, -GRAVITY))
    # floating=None keeps the MJCF's own root joints (floating=False would weld the first
    # hinge, physics.md §2); collapse_fixed_joints merges welded bodies (base, lumped
    # fingers, hand) into their parents so Featherstone only sees the actuated chain.
    arm.add_mjcf(str(path), collapse_fixed_joints=True, parse_mujoco_options=False)

    joint_names = [_leaf(k) for k in arm.joint_label]
    if joint_names != platform.channel_names:
        raise SimSetupError(
            f"{path}: joints {joint_names} do not match the channels of {platform.source} "
            f"{platform.channel_names} (same names, same order expected)"
        )
    expected = {"revolute": newton.JointType.REVOLUTE, "prismatic": newton.JointType.PRISMATIC}
    for ch, jtype in zip(platform.channels, arm.joint_type, strict=True):
        if jtype != expected[ch.kind]:
            raise SimSetupError(f"{path}: joint {ch.name!r} is {jtype!r}, channel kind is "
                                f"{ch.kind!r} in {platform.source}")
    if arm.joint_dof_count != platform.n:
        raise SimSetupError(f"{path}: {arm.joint_dof_count} DoF, expected {platform.n}")

    for dof, ch in enumerate(platform.channels):
        arm.joint_armature[dof] = ch.armature
        arm.joint_damping[dof] = ch.damping
        arm.joint_limit_lower[dof] = ch.limit_lower
        arm.joint_limit_upper[dof] = ch.limit_upper
        arm.joint_limit_ke[dof] = settings.limit_ke
        arm.joint_limit_kd[dof] = settings.limit_kd
        # Pure torque drive: the network's torque is the only actuator.
        arm.joint_target_ke[dof] = 0.0
        arm.joint_target_kd[dof] = 0.0
        arm.joint_friction[dof] = 0.0

    body_names = [_leaf(k) for k in arm.body_label]
    if platform.end_effector.body not in body_names:
        raise SimSetupError(
            f"{platform.source}: end_effector.body {platform.end_effector.body!r} is not a "
            f"moving body of {path}; expected one of {body_names}"
        )
    return arm


def build_newton_model(platform: Platform, batch: int, device: str) -> newton.Model:
    """``batch`` copies of the arm, every one at the origin (no contacts; physics.md §11)."""
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    init_warp(device)  # before Warp's first use: no "no CUDA driver" notice on a CPU run
    arm = build_arm(platform)
    scene = newton.ModelBuilder(up_axis=newton.Axis.Z, gravity=(0.0, 0.0, -GRAVITY))
    for _ in range(batch):
        scene.add_builder(arm)
    return scene.finalize(device=device, requires_grad=True)


def body_name(model: newton.Model, index: int) -> str:
    """The MJCF name of the first replica's body ``index``."""
    return _leaf(model.body_label[index])


def body_index(model: newton.Model, name: str) -> int:
    """Index of the first replica's body whose MJCF name is ``name``."""
    names = [_leaf(k) for k in model.body_label]
    return names.index(name)


def joint_arrays(model: newton.Model, n_joints: int) -> dict[str, np.ndarray]:
    """The first replica's joint frames and body inertials, as numpy arrays."""
    nb = n_joints  # collapse_fixed_joints leaves exactly one moving body per joint
    return {
        "joint_type": model.joint_type.numpy()[:n_joints],
        "joint_parent": model.joint_parent.numpy()[:n_joints],
        "joint_child": model.joint_child.numpy()[:n_joints],
        "joint_X_p": model.joint_X_p.numpy()[:n_joints],
        "joint_X_c": model.joint_X_c.numpy()[:n_joints],
        "joint_axis": model.joint_axis.numpy()[:n_joints],
        "body_mass": model.body_mass.numpy()[:nb],
        "body_com": model.body_com.numpy()[:nb],
        "body_inertia": model.body_inertia.numpy()[:nb],
    }
