"""What every classical baseline reads from an episode: state, effort, qdd, tau_ID, free motion.

All baselines work on the *recorded* state (the paper's "true state at each step"), frame by
frame, using only the current and past frames (causal), so they run live as well:

- ``q``, ``qd``, ``u`` (the platform's effort signal: XM430 current in A, STS3215 signed
  load fraction, ...), NaN gaps (telemetry not read) held at the last valid value;
- ``qdd`` from the recorded velocity by a **causal** filter: a Butterworth low-pass ``LP``
  (``acceleration.order``, ``acceleration.cutoff_hz``, started at steady state on the first
  frame) followed by a backward difference over the nominal frame period;
- ``tau_id = M(q) qdd + LP(C(q, qd) qd + g(q))`` from our own platform model
  (:class:`nactuator.sim.dynamics.ArmDynamics`: the MJCF inertials plus the armature of
  ``conf/eval/baselines.yaml``), the effort a sensorless arm needs with no external load,
  and ``u_f = LP(u)``.

Why the same low-pass on every term: ``qdd`` from a causal filter lags the true
acceleration by the filter's group delay (about 0.06 s at 4 Hz, order 2). Subtracting an
unfiltered motor torque from a lagged inertial torque turns that lag into a large error
(on the servo worlds it even flips the sign of the correlation between effort and
``tau_id`` on lightly loaded joints). Filtering both sides alike -- the standard "filtered
dynamics" of sensorless force estimation -- makes every estimate a consistently low-passed
external torque, delayed but unbiased, like the momentum observer's.

- ``free``: frames that may calibrate a current-to-torque map or a friction model (no
  contact or payload labelled, no motor labelled degraded, torque on, telemetry valid), for
  at least one filter settling
  time (``1 / cutoff_hz``) so no filtered value still remembers a payload or contact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import signal as sps

from nactuator.data import Episode
from nactuator.eval.episodes import EvalDataError, force_labels

__all__ = ["EpisodeSignals", "LowPass", "causal_acceleration", "episode_signals",
           "free_motion_mask", "nominal_dt"]


@dataclass
class EpisodeSignals:
    """One episode's inputs to the baselines, (T, n) float64 unless noted."""

    q: np.ndarray
    qd: np.ndarray
    qdd: np.ndarray  # d/dt LP(qd)
    u: np.ndarray  # the platform's effort signal
    u_f: np.ndarray  # LP(u)
    tau_id: np.ndarray  # M(q) qdd + LP(C qd + g) [N*m or N]
    free: np.ndarray  # (T,) bool
    step_dt: np.ndarray  # (T,) seconds from frame k-1 to k (step_dt[0] = the nominal dt)
    dt: float  # nominal frame period
    lowpass: LowPass

    @property
    def length(self) -> int:
        return self.q.shape[0]


@dataclass(frozen=True)
class LowPass:
    """Causal Butterworth low-pass along the time axis, started at steady state."""

    b: np.ndarray
    a: np.ndarray

    @classmethod
    def design(cls, dt: float, cutoff_hz: float, order: int) -> LowPass:
        nyquist = 0.5 / dt
        if not 0 < cutoff_hz < nyquist:
            raise EvalDataError(f"acceleration.cutoff_hz = {cutoff_hz} must lie in (0, "
                                f"{nyquist:.1f}) Hz, the Nyquist frequency of the "
                                f"{dt * 1000:.1f} ms frames")
        b, a = sps.butter(order, cutoff_hz, fs=1.0 / dt)
        return cls(b, a)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Filter (T, ...) along axis 0."""
        x = np.asarray(x, np.float64)
        zi = sps.lfilter_zi(self.b, self.a).reshape(-1, *([1] * (x.ndim - 1)))
        return sps.lfilter(self.b, self.a, x, axis=0, zi=zi * x[:1])[0]


def nominal_dt(ep: Episode, control_dt: float) -> float:
    """Median timestamp step of the episode, or the platform's control period without one."""
    ts = ep.frames.get("timestamp")
    if ts is not None and len(ts) > 1:
        steps = np.diff(np.asarray(ts, dtype=np.float64))
        steps = steps[np.isfinite(steps) & (steps > 0)]
        if steps.size:
            return float(np.median(steps))
    return float(control_dt)


def _held(ep: Episode, key: str) -> np.ndarray:
    """Channel ``key`` with NaN gaps held at the last valid value (0 before the first)."""
    arr = ep.frames.get(key)
    if arr is None or not np.isfinite(arr).any():
        what = "lacks it" if arr is None else "never recorded it (all NaN)"
        raise EvalDataError(f"episode {ep.index} ({ep.task}): the classical baselines need "
                            f"channel '{key}' but the data {what}")
    x = np.asarray(arr, dtype=np.float64).copy()
    for j in range(x.shape[1]):
        col = x[:, j]
        bad = ~np.isfinite(col)
        if bad.any():
            idx = np.where(bad, 0, np.arange(len(col)))
            np.maximum.accumulate(idx, out=idx)
            filled = col[idx]
            filled[~np.isfinite(filled)] = 0.0  # gaps before the first valid sample
            x[:, j] = filled
    return x


def causal_acceleration(qd: np.ndarray, dt: float, lowpass: LowPass) -> np.ndarray:
    """qdd (T, n) from velocity (T, n): causal low-pass, then backward difference."""
    smooth = lowpass(qd)
    qdd = np.zeros_like(smooth)
    qdd[1:] = np.diff(smooth, axis=0) / dt
    return qdd


def free_motion_mask(ep: Episode, max_force_n: float, settle_frames: int = 0) -> np.ndarray:
    """(T,) frames with no labelled contact or payload, no motor labelled degraded, torque on
    and telemetry valid, and so for the ``settle_frames`` frames before too."""
    force = np.nan_to_num(force_labels(ep), nan=0.0)
    free = np.linalg.norm(force, axis=1) <= max_force_n
    mass = ep.frames.get("payload_mass")
    if mass is not None:
        free &= np.nan_to_num(np.asarray(mass, np.float64).reshape(ep.length, -1)[:, 0]) <= 0
    cond = ep.frames.get("condition")
    if cond is not None:  # a motor labelled degraded (e.g. banded) is not moving freely
        free &= ~np.any(np.asarray(cond, np.float64) < 0.5, axis=1)
    for key in ("torque_enable", "telemetry_valid"):
        arr = ep.frames.get(key)
        if arr is not None:
            free &= np.all(np.nan_to_num(np.asarray(arr, np.float64), nan=0.0) > 0.5, axis=1)
    for key in ("q", "qd", "effort"):
        free &= np.all(np.isfinite(np.asarray(ep.frames[key], np.float64)), axis=1)
    if settle_frames > 0:
        # A frame is usable once the last `settle_frames` frames were all free.
        bad = np.concatenate([[0], np.cumsum(~free)])
        k = np.arange(ep.length)
        first = np.maximum(k - settle_frames, 0)
        free = (bad[k + 1] - bad[first]) == 0
    return free


def episode_signals(ep: Episode, dynamics, control_dt: float, cutoff_hz: float, order: int,
                    max_force_n: float) -> EpisodeSignals:
    """State, effort, filtered qdd and tau_ID of one episode (see the module docstring)."""
    q, qd, u = _held(ep, "q"), _held(ep, "qd"), _held(ep, "effort")
    dt = nominal_dt(ep, control_dt)
    lowpass = LowPass.design(dt, cutoff_hz, order)
    qdd = causal_acceleration(qd, dt, lowpass)
    with torch.no_grad():
        qt = torch.from_numpy(q)
        bias = dynamics.bias(qt, torch.from_numpy(qd)).numpy()
        inertial = (dynamics.mass_matrix(qt) @ torch.from_numpy(qdd)[..., None])[..., 0].numpy()
    tau = inertial + lowpass(bias)
    step_dt = np.full(ep.length, dt)
    ts = ep.frames.get("timestamp")
    if ts is not None:
        steps = np.diff(np.asarray(ts, dtype=np.float64))
        ok = np.isfinite(steps) & (steps > 0)
        step_dt[1:] = np.where(ok, steps, dt)
    settle = int(np.ceil(1.0 / (cutoff_hz * dt)))
    return EpisodeSignals(q=q, qd=qd, qdd=qdd, u=u, u_f=lowpass(u), tau_id=tau,
                          free=free_motion_mask(ep, max_force_n, settle), step_dt=step_dt,
                          dt=dt, lowpass=lowpass)
