"""Normalisation statistics and the per-episode signal clean-up the DataModule applies.

Both operate on the DataModule's concatenated frame arrays with an episode table
(``starts``, ``lengths``), fully vectorised.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NORM_KEYS", "OPTIONAL_NORM_KEYS", "STD_FLOOR", "median_within_episodes", "norm_stats"]

NORM_KEYS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")
# Exogenous inputs of counterfactual models (nactuator.data.commands), normalised when the
# frames hold them.
OPTIONAL_NORM_KEYS = ("supply_voltage", "initial_temperature")
# Below this a channel is treated as constant (std := 1), so dividing by std can't blow up
# a channel that never moved in the training split (e.g. an unused gripper).
STD_FLOOR = 1e-6


def median_within_episodes(
    x: np.ndarray, starts: np.ndarray, lengths: np.ndarray, window: int = 5
) -> np.ndarray:
    """Running median over ``window`` frames along time, never reaching across episodes.

    Removes the isolated spikes in servo temperature telemetry (a 95-150 degC sample in a
    35 degC stream; runs of up to ``window // 2`` bad frames) while keeping steps and slow
    drifts. Near an episode's ends the window is clamped to the episode (edge frames
    repeat). ``window`` <= 1 returns a copy.
    """
    if window <= 1 or len(x) == 0:
        return x.copy()
    if window % 2 == 0:
        raise ValueError(f"median window must be odd, got {window}")
    first = np.repeat(starts, lengths)
    last = first + np.repeat(lengths, lengths) - 1
    rows = np.arange(len(x))
    half = window // 2
    shifted = np.stack(
        [x[np.clip(rows + d, first, last)] for d in range(-half, half + 1)], axis=0
    )
    return np.median(shifted, axis=0).astype(x.dtype)


def norm_stats(frames: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, dict[str, list]]:
    """Contract 2 ``norm_stats`` over the given frame rows (the train split's frames).

    ``{key: {"mean": [n], "std": [n]}}`` for q_cmd, q, qd, effort, voltage, temperature and
    error = q_cmd - q, plus those of :data:`OPTIONAL_NORM_KEYS` the frames hold. NaN samples
    are ignored; an all-NaN channel gets mean 0, std 1.
    """
    out: dict[str, dict[str, list]] = {}
    for key in (*NORM_KEYS, *(k for k in OPTIONAL_NORM_KEYS if k in frames)):
        if key == "error":
            x = frames["q_cmd"][rows].astype(np.float64) - frames["q"][rows]
        else:
            x = frames[key][rows].astype(np.float64)
        finite = np.isfinite(x)
        count = finite.sum(axis=0)
        safe = np.where(finite, x, 0.0)
        mean = np.where(count > 0, safe.sum(axis=0) / np.maximum(count, 1), 0.0)
        var = np.where(finite, (x - mean) ** 2, 0.0).sum(axis=0) / np.maximum(count, 1)
        std = np.sqrt(var)
        std = np.where((count > 0) & (std > STD_FLOOR), std, 1.0)
        out[key] = {"mean": mean.tolist(), "std": std.tolist()}
    return out
