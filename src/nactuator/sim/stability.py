"""Reject joint settings that explicit-damping Featherstone cannot integrate (physics.md §10).

Featherstone treats joint damping explicitly, so a joint with damping ``d`` and effective
inertia ``I_eff`` (its own armature plus everything it moves, other joints locked) is stable
only if ``d * dt / I_eff < 2`` at the substep ``dt``. The joint-limit penalty is a spring and
a damper of the same kind, so its gains must pass the same test (``limit_kd * dt / I_eff < 2``
and ``sqrt(limit_ke / I_eff) * dt < 2``). ``I_eff`` depends on the pose; we take its minimum
over q = 0 and a fixed, seeded set of poses inside the joint limits.
"""

from __future__ import annotations

import math

import torch

from nactuator.platforms import Platform
from nactuator.sim.builder import SimSettings, SimSetupError
from nactuator.sim.kinematics import ChainKinematics

__all__ = ["effective_inertia", "check_stability"]

_POSES = 64


def effective_inertia(platform: Platform, kinematics: ChainKinematics) -> torch.Tensor:
    """Smallest joint-space inertia per joint over q = 0 and 64 seeded poses, (n,) float64."""
    gen = torch.Generator().manual_seed(0)
    lo = torch.tensor([c.limit_lower for c in platform.channels], dtype=torch.float64)
    hi = torch.tensor([c.limit_upper for c in platform.channels], dtype=torch.float64)
    poses = lo + (hi - lo) * torch.rand(_POSES, platform.n, generator=gen, dtype=torch.float64)
    poses = torch.cat([torch.zeros(1, platform.n, dtype=torch.float64), poses])
    with torch.no_grad():
        inertia = kinematics.to("cpu").joint_inertia(poses)
    return inertia.min(0).values


def check_stability(platform: Platform, kinematics: ChainKinematics,
                    settings: SimSettings) -> dict[str, float]:
    """Raise :class:`SimSetupError` naming the joint, the value and the fix; else return the
    largest ``d * dt / I_eff`` over joints (for reports)."""
    dt = platform.substep_dt
    where = platform.source or platform.name
    i_eff = effective_inertia(platform, kinematics)
    worst = 0.0
    for ch, inertia in zip(platform.channels, i_eff.tolist(), strict=True):
        link = inertia - ch.armature
        unit = "kg*m^2" if ch.kind == "revolute" else "kg"
        for label, d in (("damping", ch.damping), ("sim.limit_kd", settings.limit_kd)):
            ratio = d * dt / inertia
            worst = max(worst, ratio) if label == "damping" else worst
            if ratio >= 2.0:
                need_arm = d * dt / 2.0 - link
                need_sub = math.floor(d * platform.control_dt / (2.0 * inertia)) + 1
                raise SimSetupError(
                    f"{where}: joint {ch.name!r} is numerically unstable: {label} * dt / I_eff = "
                    f"{d:g} * {dt:.4g} s / {inertia:.3g} {unit} = {ratio:.3g}, must be < 2 "
                    "(Featherstone integrates damping explicitly). Fix: raise armature above "
                    f"{need_arm:.3g} {unit}, or substeps to at least {need_sub}, or lower {label}"
                )
        omega_dt = math.sqrt(settings.limit_ke / inertia) * dt
        if omega_dt >= 2.0:
            raise SimSetupError(
                f"{where}: joint {ch.name!r} limit spring is numerically unstable: "
                f"sqrt(sim.limit_ke / I_eff) * dt = sqrt({settings.limit_ke:g} / {inertia:.3g}) * "
                f"{dt:.4g} = {omega_dt:.3g}, must be < 2. Fix: lower sim.limit_ke below "
                f"{4.0 * inertia / dt**2:.3g}, or raise armature or substeps"
            )
    return {"max_damping_ratio": worst, "min_effective_inertia": float(i_eff.min())}
