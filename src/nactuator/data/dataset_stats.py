"""A dataset's ``meta/stats.json``: per-feature min/max/mean/std/count, NaN-aware, as LeRobot
writes it. The writer keeps them as additive partial sums so an append merges the new frames
into the committed statistics without rereading old ones (:func:`add_frames`,
:func:`stats_from_json`, :func:`stats_bytes`); after a crash that left the ``stats.json`` of an
uncommitted append, :func:`committed_stats_bytes` recomputes them from the committed frames.
(The normalisation statistics the DataModule computes over a split are in
:mod:`nactuator.data.normalization`.)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from nactuator.atomic import json_safe
from nactuator.data.committed import json_bytes, read_frames
from nactuator.data.schema import DECLARED_KEYS, FEATURES, declared_keys

__all__ = ["EMPTY_CHANNEL", "add_frames", "committed_stats_bytes", "stats_bytes", "stats_from_json"]

_STAT_NAMES = {key: spec.name for key, spec in FEATURES.items()} | {"timestamp": "timestamp"}


def _partial_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """NaN-aware per-channel count/sum/sum-of-squares/min/max of a (T, w) block."""
    finite = np.isfinite(values)
    zeroed = np.where(finite, values, 0.0).astype(np.float64)
    with np.errstate(invalid="ignore"):
        vmin = np.where(finite, values, np.inf).min(axis=0)
        vmax = np.where(finite, values, -np.inf).max(axis=0)
    return {
        "count": finite.sum(axis=0).astype(np.int64),
        "sum": zeroed.sum(axis=0),
        "sumsq": (zeroed * zeroed).sum(axis=0),
        "min": vmin.astype(np.float64),
        "max": vmax.astype(np.float64),
    }


def _merge_partial(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        "count": a["count"] + b["count"],
        "sum": a["sum"] + b["sum"],
        "sumsq": a["sumsq"] + b["sumsq"],
        "min": np.minimum(a["min"], b["min"]),
        "max": np.maximum(a["max"], b["max"]),
    }


def _stats_of(frames: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Partial statistics of every feature in a block of frames (canonical keys)."""
    return {name: _partial_stats(frames[key].reshape(frames[key].shape[0], -1))
            for key, name in _STAT_NAMES.items() if key in frames}


def add_frames(stats: dict[str, dict[str, np.ndarray]],
               frames: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """``stats`` (partial sums by feature name) with a block of new frames (canonical keys)
    merged in; ``stats`` itself is left as it was."""
    merged = dict(stats)
    for name, part in _stats_of(frames).items():
        merged[name] = _merge_partial(merged[name], part) if name in merged else part
    return merged


# A channel without one finite sample (count 0: never recorded, e.g. the STS3215's PWM) gets
# these numbers instead of null: LeRobot's normalisers turn every stats.json entry into a
# tensor and fail on null. They are the identity normalisation; count 0 says there is no data.
EMPTY_CHANNEL = {"min": 0.0, "max": 1.0, "mean": 0.0, "std": 1.0}


def _stats_to_json(p: dict[str, np.ndarray]) -> dict[str, list]:
    count = p["count"]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = p["sum"] / np.maximum(count, 1)
        var = p["sumsq"] / np.maximum(count, 1) - mean * mean
    values = {"min": p["min"], "max": p["max"], "mean": mean,
              "std": np.sqrt(np.maximum(var, 0.0))}
    return json_safe(
        {**{name: np.where(count > 0, v, EMPTY_CHANNEL[name]).tolist()
            for name, v in values.items()},
         "count": count.tolist()}
    )


def stats_from_json(s: dict) -> dict[str, np.ndarray]:
    """Invert one feature's stats.json entry into additive partial sums (so appends can
    aggregate)."""
    nan = lambda v: np.array([math.nan if x is None else x for x in v], dtype=np.float64)  # noqa: E731
    count = np.array(s["count"], dtype=np.int64)
    mean = np.nan_to_num(nan(s["mean"]))
    std = np.nan_to_num(nan(s["std"]))
    return {
        "count": count,
        "sum": mean * count,
        "sumsq": (std * std + mean * mean) * count,
        "min": np.where(count > 0, nan(s["min"]), np.inf),
        "max": np.where(count > 0, nan(s["max"]), -np.inf),
    }


def stats_bytes(stats: dict[str, dict[str, np.ndarray]]) -> bytes:
    """The stats.json file of partial sums by feature name."""
    return json_bytes({name: _stats_to_json(p) for name, p in stats.items()})


def committed_stats_bytes(root: Path, info: dict, rows: list[dict],
                          frames: dict[str, np.ndarray] | None = None) -> bytes:
    """stats.json of exactly the committed episodes, recomputed from their frames."""
    if not rows:
        return json_bytes({})
    if frames is None:
        frames = read_frames(root, rows, len(info["nactuator"]["channels"]))
    undeclared = set(DECLARED_KEYS) - set(declared_keys(info))
    return stats_bytes(_stats_of({k: v for k, v in frames.items() if k not in undeclared}))
