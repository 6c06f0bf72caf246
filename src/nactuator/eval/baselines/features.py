"""The 20 hand-made window features of the condition baselines (SPEC §6: 64-step windows,
50 % overlap), computed per (window, motor) from that motor's recorded signals.

SPEC names only "20 hand-made window features"; ours describe how hard the motor works
(effort), how well it tracks (error = q_cmd - q), how it moves (q, qd) and how its effort
relates to the motion -- what a restriction such as an elastic band on the joint changes:

 1-6   effort u: mean, std, min, max, RMS, mean |u|      (mean |u| is the threshold feature)
 7-10  tracking error e: mean, std, max |e|, RMS
11-13  velocity qd: mean |qd|, std, max |qd|
14-15  position q: mean, range (max - min)
16-18  correlation of u with e, with qd, with q          (0 where either is constant)
19     slope of u on q (least squares; a spring's stiffness shows here)
20     mean |du| per frame (effort roughness)
"""

from __future__ import annotations

import numpy as np

from nactuator.data import Episode

__all__ = ["FEATURE_NAMES", "window_features", "window_labels", "window_starts"]

FEATURE_NAMES = (
    "effort_mean", "effort_std", "effort_min", "effort_max", "effort_rms", "effort_mean_abs",
    "error_mean", "error_std", "error_max_abs", "error_rms",
    "velocity_mean_abs", "velocity_std", "velocity_max_abs",
    "position_mean", "position_range",
    "corr_effort_error", "corr_effort_velocity", "corr_effort_position",
    "slope_effort_position", "effort_roughness",
)
MEAN_ABS_EFFORT = FEATURE_NAMES.index("effort_mean_abs")


def window_starts(length: int, window: int, stride: int) -> np.ndarray:
    """First frame of every whole window of an episode (none if it is shorter than one)."""
    if length < window:
        return np.zeros(0, dtype=int)
    return np.arange(0, length - window + 1, stride)


def _corr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise Pearson correlation of (W, L) arrays; 0 where a row is constant."""
    a = a - a.mean(axis=1, keepdims=True)
    b = b - b.mean(axis=1, keepdims=True)
    den = np.sqrt((a * a).sum(axis=1) * (b * b).sum(axis=1))
    num = (a * b).sum(axis=1)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 1e-12)


def _slope(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    xc = x - x.mean(axis=1, keepdims=True)
    den = (xc * xc).sum(axis=1)
    num = (xc * (y - y.mean(axis=1, keepdims=True))).sum(axis=1)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 1e-12)


def _windows(x: np.ndarray, starts: np.ndarray, window: int) -> np.ndarray:
    return np.stack([x[s:s + window] for s in starts]) if len(starts) else np.zeros((0, window))


def window_features(ep: Episode, channel: int, starts: np.ndarray, window: int) -> np.ndarray:
    """(W, 20) features of motor ``channel`` in the windows starting at ``starts``."""
    get = lambda key: np.nan_to_num(np.asarray(ep.frames[key], np.float64)[:, channel])  # noqa: E731
    u = _windows(get("effort"), starts, window)
    q = _windows(get("q"), starts, window)
    e = _windows(get("q_cmd"), starts, window) - q
    qd = _windows(get("qd"), starts, window)
    rms = lambda x: np.sqrt((x * x).mean(axis=1))  # noqa: E731
    feats = [
        u.mean(1), u.std(1), u.min(1), u.max(1), rms(u), np.abs(u).mean(1),
        e.mean(1), e.std(1), np.abs(e).max(1), rms(e),
        np.abs(qd).mean(1), qd.std(1), np.abs(qd).max(1),
        q.mean(1), q.max(1) - q.min(1),
        _corr(u, e), _corr(u, qd), _corr(u, q),
        _slope(u, q), np.abs(np.diff(u, axis=1)).mean(1),
    ]
    out = np.stack(feats, axis=1) if len(starts) else np.zeros((0, len(FEATURE_NAMES)))
    return out


def window_labels(ep: Episode, channel: int, starts: np.ndarray, window: int) -> np.ndarray:
    """(W,) 1.0 degraded / 0.0 nominal by the majority of the window's frames (label < 0.5 is
    degraded); NaN if any frame of the window is unlabelled for this motor."""
    c = ep.frames.get("condition")
    if c is None:
        return np.full(len(starts), np.nan)
    lab = _windows(np.asarray(c, np.float64)[:, channel], starts, window)
    known = np.isfinite(lab).all(axis=1)
    degraded = (np.where(np.isfinite(lab), lab, 1.0) < 0.5).mean(axis=1) > 0.5
    return np.where(known, degraded.astype(np.float64), np.nan)
