"""Family 3: ID-Friction, ID-Linear plus per-joint Coulomb + viscous + Stribeck friction and
a backlash dead zone, all fitted on the free motion of the train split.

Model of the torque the joint receives from its servo, per joint::

    tau_motor = Kt * dz(u) + b - (Fc s(qd) + Fv qd + Fs exp(-(qd / vs)^2) s(qd))
    dz(u)     = sign(u) * max(|u| - delta, 0)          (backlash: small efforts move no link)
    s(x)      = tanh(x / smooth_velocity)               (a sign that does not chatter at rest)

and ``tau_ext = tau_ID - LP(tau_motor)`` with the causal low-pass ``LP`` every inverse
dynamics term goes through (``signals``). Kt and b are refitted together with the friction:
with an effort signal such as the STS3215's load (a PWM duty) the back-EMF acts like a large
viscous term, and without it in the model the linear calibration cannot even find Kt.

Fit, per joint, on the free-motion frames of the train split. As in the linear calibration
(``calibration``) the effort is the dependent variable, since friction left unmodelled,
quantisation and dither live on the effort side. For ``|u| > delta`` the model inverts to

    LP(dz(u)) = (tau_ID - b + LP(friction(qd))) / Kt

which, for each (vs, delta) on the grids of ``conf/eval/baselines.yaml`` (delta as quantiles
of |u| in free motion), is linear in (1/Kt, -b/Kt, Fc/Kt, Fv/Kt, Fs/Kt). Bounded least
squares keeps the friction coefficients on the side of Kt (``Fc, Fv, Fs >= 0``), the sign
of Kt being that of the partial correlation of effort and tau_ID given the friction terms;
the grid point with the smallest torque residual wins. Where that partial correlation is
below ``calibration.min_correlation`` Kt is not identifiable from free motion, and the joint
keeps the linear calibration's Kt and fits only b and friction in torque units:
``Kt * LP(dz(u)) - tau_ID = -b + LP(friction(qd))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import lsq_linear

from nactuator.eval.baselines.calibration import MIN_FREE_FRAMES, TorqueCalibration
from nactuator.eval.baselines.signals import EpisodeSignals
from nactuator.eval.episodes import EvalDataError

__all__ = ["FrictionModel", "IDFriction", "deadzone", "fit_friction"]

PARAMS = ("kt", "bias", "coulomb", "viscous", "stribeck", "stribeck_velocity", "deadzone")


def deadzone(u: np.ndarray, delta: np.ndarray | float) -> np.ndarray:
    return np.sign(u) * np.maximum(np.abs(u) - delta, 0.0)


@dataclass
class FrictionModel:
    """Per-joint parameters, each (n,)."""

    kt: np.ndarray
    bias: np.ndarray
    coulomb: np.ndarray
    viscous: np.ndarray
    stribeck: np.ndarray
    stribeck_velocity: np.ndarray
    deadzone: np.ndarray
    smooth_velocity: float
    rms: np.ndarray  # residual RMS on the fit frames
    frames: int
    identified: list[bool]  # per joint: Kt fitted with the friction (else the linear one's)

    def friction(self, qd: np.ndarray) -> np.ndarray:
        s = np.tanh(qd / self.smooth_velocity)
        return (self.coulomb * s + self.viscous * qd
                + self.stribeck * np.exp(-(qd / self.stribeck_velocity) ** 2) * s)

    def motor_torque(self, u: np.ndarray, qd: np.ndarray) -> np.ndarray:
        """Torque reaching the joint (T, n) from effort u and velocity qd (unfiltered)."""
        return self.kt * deadzone(u, self.deadzone) + self.bias - self.friction(qd)

    def info(self, channels: Sequence[str]) -> dict:
        joints = {}
        for j, c in enumerate(channels):
            joints[c] = {p: float(getattr(self, p)[j]) for p in PARAMS}
            joints[c]["rms"] = float(self.rms[j])
            joints[c]["kt_fit"] = "with friction" if self.identified[j] else "linear calibration"
        return {"frames": self.frames, "smooth_velocity": self.smooth_velocity,
                "joints": joints}


def _filtered_free(train: Sequence[EpisodeSignals], make) -> np.ndarray:
    """``make(sig)`` (T, n) per episode, low-passed with the episode's filter, free frames."""
    return np.concatenate([sig.lowpass(make(sig))[sig.free] for sig in train])


def _bounded_lsq(a: np.ndarray, y: np.ndarray, lower: list[float],
                 upper: list[float]) -> tuple[np.ndarray, float]:
    """Bounded least squares on columns scaled to comparable size; (coef, rms). An all-zero
    column gets coefficient 0."""
    peak = np.abs(a).max(axis=0)
    scale = np.where(peak > 1e-12, peak, 1.0)
    res = lsq_linear(a / scale, y, bounds=(lower, upper), method="bvls")
    coef = np.where(peak > 1e-12, res.x / scale, 0.0)
    return coef, float(np.sqrt(np.mean((a @ coef - y) ** 2)))


def _partial_correlation(y: np.ndarray, x: np.ndarray, given: np.ndarray) -> float:
    """Correlation of y and x once both are regressed on the columns of ``given``."""
    ry = y - given @ np.linalg.lstsq(given, y, rcond=None)[0]
    rx = x - given @ np.linalg.lstsq(given, x, rcond=None)[0]
    den = np.sqrt(np.mean(ry * ry) * np.mean(rx * rx))
    return float(np.mean(ry * rx) / den) if den > 0 else 0.0


def fit_friction(train: Sequence[EpisodeSignals], calibration: TorqueCalibration,
                 stribeck_velocities: Sequence[float], deadzone_quantiles: Sequence[float],
                 smooth_velocity: float, min_correlation: float = 0.3) -> FrictionModel:
    frames = int(sum(sig.free.sum() for sig in train))
    if frames < MIN_FREE_FRAMES:
        raise EvalDataError(f"the train split has {frames} free-motion frame(s); the friction "
                            f"fit needs at least {MIN_FREE_FRAMES}")
    tau = np.concatenate([sig.tau_id[sig.free] for sig in train])
    u_free = np.concatenate([sig.u[sig.free] for sig in train])
    u_f = np.concatenate([sig.u_f[sig.free] for sig in train])
    sign = _filtered_free(train, lambda s: np.tanh(s.qd / smooth_velocity))
    vel = _filtered_free(train, lambda s: s.qd)
    ones = np.ones(frames)
    n = tau.shape[1]
    best = {p: np.zeros(n) for p in PARAMS}
    rms = np.full(n, np.inf)
    identified = []
    inf = np.inf
    for j in range(n):
        stribeck = {vs: _filtered_free(train, lambda s, v=vs, j=j: (
            np.exp(-(s.qd[:, j:j + 1] / v) ** 2)
            * np.tanh(s.qd[:, j:j + 1] / smooth_velocity)))[:, 0] for vs in stribeck_velocities}
        # A Stribeck velocity below the data's velocity resolution never shows in the frames
        # (e.g. SO-101 velocities come in 0.077 rad/s steps): its coefficient would be
        # unbounded on a near-zero column, so such vs are left out (Fs = 0 if none is left).
        visible = {vs: stb for vs, stb in stribeck.items()
                   if np.sqrt(np.mean(stb ** 2)) >= 0.01 * np.sqrt(np.mean(sign[:, j] ** 2))}
        stribeck = visible or {stribeck_velocities[0]: np.zeros(frames)}
        deltas = sorted({float(np.quantile(np.abs(u_free[:, j]), q)) for q in deadzone_quantiles})
        r = _partial_correlation(u_f[:, j], tau[:, j],
                                 np.stack([ones, sign[:, j], vel[:, j]], axis=1))
        identified.append(abs(r) >= min_correlation)
        for delta in deltas:
            dz = _filtered_free(train, lambda s, d=delta, j=j: deadzone(s.u[:, j:j + 1], d))[:, 0]
            for vs, stb in stribeck.items():
                if identified[j]:
                    # dz = [tau, 1, s, qd, stb] @ [1/Kt, -b/Kt, Fc/Kt, Fv/Kt, Fs/Kt]
                    a = np.stack([tau[:, j], ones, sign[:, j], vel[:, j], stb], axis=1)
                    lo, hi = ([0, -inf, 0, 0, 0], [inf] * 5) if r > 0 else \
                        ([-inf] * 5, [0, inf, 0, 0, 0])
                    coef, _ = _bounded_lsq(a, dz, lo, hi)
                    if abs(coef[0]) < 1e-9:
                        continue
                    kt = 1.0 / coef[0]
                    params = [kt, -coef[1] * kt, coef[2] * kt, coef[3] * kt, coef[4] * kt]
                else:
                    # Kt from the linear calibration; Kt*dz - tau = [-1, s, qd, stb] @ [b, F..]
                    kt = float(calibration.kt[j])
                    a = np.stack([-ones, sign[:, j], vel[:, j], stb], axis=1)
                    coef, _ = _bounded_lsq(a, kt * dz - tau[:, j], [-inf, 0, 0, 0], [inf] * 4)
                    params = [kt, *coef]
                kt, b, fc, fv, fs = params
                pred = kt * dz + b - fc * sign[:, j] - fv * vel[:, j] - fs * stb
                err = float(np.sqrt(np.mean((tau[:, j] - pred) ** 2)))
                if err < rms[j]:
                    rms[j] = err
                    for p, v in zip(PARAMS, [*params, vs, delta], strict=True):
                        best[p][j] = v
        if not np.isfinite(rms[j]):
            raise EvalDataError(f"joint {j}: no friction model fits its free motion (the effort "
                                f"never varies with tau_ID)")
    return FrictionModel(**best, smooth_velocity=smooth_velocity, rms=rms, frames=frames,
                         identified=identified)


@dataclass
class IDFriction:
    model: FrictionModel
    name: str = "id-friction"

    @classmethod
    def fit(cls, train: Sequence[EpisodeSignals], calibration: TorqueCalibration,
            stribeck_velocities: Sequence[float], deadzone_quantiles: Sequence[float],
            smooth_velocity: float, min_correlation: float = 0.3) -> IDFriction:
        return cls(fit_friction(train, calibration, stribeck_velocities, deadzone_quantiles,
                                smooth_velocity, min_correlation))

    def joint_torques(self, sig: EpisodeSignals) -> np.ndarray:
        """External joint torque estimate (T, n)."""
        return sig.tau_id - sig.lowpass(self.model.motor_torque(sig.u, sig.qd))
