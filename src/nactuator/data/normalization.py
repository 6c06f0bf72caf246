"""Normalisation statistics over the DataModule's concatenated frame arrays (the input
filters, :mod:`nactuator.input_filters`, have run on them already), fully vectorised.
"""

from __future__ import annotations

import numpy as np

from nactuator.data.schema import REQUIRED_KEYS
from nactuator.input_filters import POOLED_KEYS

__all__ = ["NORM_KEYS", "OPTIONAL_NORM_KEYS", "STD_FLOOR", "norm_stats", "state_step_stats"]

NORM_KEYS = (*REQUIRED_KEYS, "error")  # the recorded channels and the error q_cmd - q
# Exogenous inputs of counterfactual models (nactuator.data.commands) and the input
# filters' pooled statistics, normalised when the frames hold them.
OPTIONAL_NORM_KEYS = ("supply_voltage", "initial_temperature", *POOLED_KEYS)
# Below this a channel is treated as constant (std := 1), so dividing by std can't blow up
# a channel that never moved in the training split (e.g. an unused gripper).
STD_FLOOR = 1e-6


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


def state_step_stats(frames: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, list]:
    """Per-channel std of one control step's change of the state, ``{"dq": [n], "dqd":
    [n]}``: of ``q[r + 1] - q[r]`` and ``qd[r + 1] - qd[r]`` over ``rows`` (rows whose next
    row is the next frame of the same episode). The scale a next-state model predicts its
    per-step change in (``model.dynamics: next_state``). NaN ignored; floor as above."""
    out: dict[str, list] = {}
    for key, name in (("q", "dq"), ("qd", "dqd")):
        x = frames[key][rows + 1].astype(np.float64) - frames[key][rows]
        finite = np.isfinite(x)
        count = finite.sum(axis=0)
        safe = np.where(finite, x, 0.0)
        mean = safe.sum(axis=0) / np.maximum(count, 1)
        var = np.where(finite, (x - mean) ** 2, 0.0).sum(axis=0) / np.maximum(count, 1)
        std = np.sqrt(var)
        out[name] = np.where((count > 0) & (std > STD_FLOOR), std, 1.0).tolist()
    return out
