"""Family 1: the per-joint current-to-torque calibration ``tau_motor = Kt * u + b``.

Fitted by least squares on the free-motion frames of the train split, against the inverse
dynamics of the platform model (``tau_id``): with nothing touching the arm the motor must
supply ``tau_id`` plus friction. ``u`` is the platform's effort signal (XM430 current in A,
STS3215 signed load fraction), so ``Kt`` is in N*m/A, N*m per unit load, or N/A on a
prismatic finger; a negative ``Kt`` means the effort register counts the other way round
from the joint. The fit pairs ``tau_id`` with ``u_f``, the effort through the same causal
low-pass (``signals``), so both sides carry the same delay.

Which way the regression runs matters. Friction, quantisation and servo dither are not in
``tau_id`` but are in the effort, so the effort is the noisy, dependent variable::

    u = (tau_id - b) / Kt + noise        ->  least squares of u on [tau_id, 1]

(the regression of ``tau_id`` on ``u`` would shrink Kt towards zero by the noise fraction of
``u``'s variance -- on the synthetic worlds by 2-10x). A joint whose free-motion effort
correlates with ``tau_id`` by less than ``calibration.min_correlation`` has no identifiable
Kt in these frames (a yaw joint with no gravity load, an arm that hardly moves); inverting a
near-zero slope would blow its effort noise up, so it falls back to the ordinary regression
of ``tau_id`` on ``u`` (``mode: "torque-on-effort"``), whose motor torque stays near the
free-motion mean of ``tau_id``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nactuator.eval.baselines.signals import EpisodeSignals
from nactuator.eval.episodes import EvalDataError

__all__ = ["EFFORT_ON_TORQUE", "MIN_FREE_FRAMES", "TORQUE_ON_EFFORT", "TorqueCalibration",
           "free_motion_frames"]

MIN_FREE_FRAMES = 20  # fewer free-motion frames cannot pin down a slope and an offset
EFFORT_ON_TORQUE = "effort-on-torque"
TORQUE_ON_EFFORT = "torque-on-effort"


def free_motion_frames(signals: Sequence[EpisodeSignals]) -> dict[str, np.ndarray]:
    """Concatenated free-motion frames of ``signals``: q, qd, qdd, u, u_f, tau_id (F, n)."""
    frames = int(sum(s.free.sum() for s in signals))
    if frames < MIN_FREE_FRAMES:
        raise EvalDataError(f"the train split has {frames} free-motion frame(s) (no contact or "
                            f"payload labelled, torque on); the current-to-torque calibration "
                            f"needs at least {MIN_FREE_FRAMES}")
    return {k: np.concatenate([getattr(s, k)[s.free] for s in signals])
            for k in ("q", "qd", "qdd", "u", "u_f", "tau_id")}


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    sa, sb = a.std(), b.std()
    return float(np.mean((a - a.mean()) * (b - b.mean())) / (sa * sb)) if sa > 0 and sb > 0 \
        else 0.0


@dataclass
class TorqueCalibration:
    """``tau_motor = kt * u + bias`` per joint, with the fit's quality."""

    kt: np.ndarray  # (n,)
    bias: np.ndarray  # (n,)
    rms: np.ndarray  # (n,) RMS of tau_id - tau_motor on the fit frames [N*m or N]
    correlation: np.ndarray  # (n,) Pearson r of u_f and tau_id on the fit frames
    modes: list[str]  # per joint: EFFORT_ON_TORQUE or TORQUE_ON_EFFORT
    frames: int

    @classmethod
    def fit(cls, signals: Sequence[EpisodeSignals],
            min_correlation: float = 0.3) -> TorqueCalibration:
        data = free_motion_frames(signals)
        u, tau = data["u_f"], data["tau_id"]
        n = u.shape[1]
        kt, bias, rms, corr = (np.zeros(n) for _ in range(4))
        modes = []
        ones = np.ones(len(u))
        for j in range(n):
            corr[j] = _correlation(u[:, j], tau[:, j])
            if abs(corr[j]) >= min_correlation:
                (slope, offset), *_ = np.linalg.lstsq(np.stack([tau[:, j], ones], 1), u[:, j],
                                                      rcond=None)
                kt[j], bias[j] = 1.0 / slope, -offset / slope
                modes.append(EFFORT_ON_TORQUE)
            else:
                (kt[j], bias[j]), *_ = np.linalg.lstsq(np.stack([u[:, j], ones], 1), tau[:, j],
                                                       rcond=None)
                modes.append(TORQUE_ON_EFFORT)
            rms[j] = np.sqrt(np.mean((tau[:, j] - kt[j] * u[:, j] - bias[j]) ** 2))
        return cls(kt=kt, bias=bias, rms=rms, correlation=corr, modes=modes,
                   frames=int(len(u)))

    def torque(self, u: np.ndarray) -> np.ndarray:
        """Motor torque (T, n) from the effort signal (T, n) (raw or low-passed alike)."""
        return u * self.kt + self.bias

    def info(self, channels: Sequence[str]) -> dict:
        return {"frames": self.frames,
                "joints": {c: {"kt": float(self.kt[j]), "bias": float(self.bias[j]),
                               "rms": float(self.rms[j]),
                               "correlation": float(self.correlation[j]),
                               "mode": self.modes[j]}
                           for j, c in enumerate(channels)}}
