"""Validation of what a writer is given: an episode's labels and frames against the schema,
and an existing dataset against the platform and rate appended to it. Pure functions: no
file is touched (:mod:`nactuator.data.writer` calls them before anything is written).
"""

from __future__ import annotations

import json

import numpy as np

from nactuator.data.committed import recorded_fps
from nactuator.data.schema import FEATURES, REQUIRED_KEYS, SPLITS, DataFormatError, feature_width
from nactuator.platforms import Platform

__all__ = ["check_compatible", "check_labels", "validate_frames"]


def check_labels(task: str, split: str, episode_meta: dict | None, where: str) -> dict:
    """The episode's task and split, and its metadata as plain JSON (a copy)."""
    if not isinstance(task, str) or not task.strip():
        raise DataFormatError(f"{where}: task must be a non-empty string, got {task!r}")
    if split not in SPLITS:
        raise DataFormatError(f"{where}: split must be one of {SPLITS}, got {split!r}")
    meta = dict(episode_meta or {})
    try:
        json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise DataFormatError(f"{where}: episode_meta must be plain JSON data: {e}") from e
    return meta


def check_compatible(info: dict, platform: Platform, fps: float, where: str) -> None:
    """Data of ``platform`` at ``fps`` may be appended to the dataset ``info`` describes."""
    theirs = info.get("nactuator", {}).get("platform")
    if theirs != platform.name:
        raise DataFormatError(
            f"{where}: dataset platform is {theirs!r}, "
            f"cannot append {platform.name!r} data"
        )
    theirs_fps = recorded_fps(info, where)
    if abs(theirs_fps - fps) > 1e-6 * fps:
        raise DataFormatError(
            f"{where}: fps mismatch when appending: dataset has {theirs_fps:g}, "
            f"writer got {fps:g}"
        )
    names = info["features"]["observation.state"]["names"]
    if names != platform.channel_names:
        raise DataFormatError(
            f"{where}: channel names {names} differ from platform {platform.name!r} "
            f"channels {platform.channel_names}"
        )


def validate_frames(frames: dict[str, np.ndarray], platform: Platform, fps: float,
                    where: str) -> dict[str, np.ndarray]:
    """One episode's frames checked against the schema (keys, shapes, NaN only where a
    read was missed or a channel is unrecorded) -> float32 (T, w) per feature, defaults
    filled in, and ``timestamp`` (given, or ``frame / fps``)."""
    if not isinstance(frames, dict):
        raise DataFormatError(f"{where}: frames must be a dict of arrays, got {type(frames)}")
    allowed = set(FEATURES) | {"timestamp"}
    unknown = sorted(set(frames) - allowed)
    if unknown:
        raise DataFormatError(
            f"{where}: unknown frame keys {unknown}; expected canonical keys {sorted(allowed)}"
        )
    missing = [k for k in REQUIRED_KEYS if k not in frames]
    if missing:
        raise DataFormatError(f"{where}: missing required frame keys {missing}")
    n = platform.n
    length = None
    unrecorded = set(platform.data.get("unrecorded", []))
    # A motor whose telemetry was not read this cycle may have NaN channels there.
    missed = None
    if "telemetry_valid" in frames:
        valid = np.asarray(frames["telemetry_valid"], dtype=np.float64)
        if valid.ndim == 2 and valid.shape[1] == n:
            missed = valid == 0
    clean: dict[str, np.ndarray] = {}
    for key, spec in FEATURES.items():
        w = feature_width(spec, n)
        if key not in frames:
            continue
        arr = np.asarray(frames[key], dtype=np.float64)
        expect = "(T,)" if spec.width == "1" else f"(T, {w})"
        if spec.width == "1" and arr.ndim == 2 and arr.shape[1] == 1:
            arr = arr[:, 0]
        if (spec.width == "1" and arr.ndim != 1) or (
            spec.width != "1" and (arr.ndim != 2 or arr.shape[1] != w)
        ):
            raise DataFormatError(f"{where}: '{key}' has shape {arr.shape}, expected {expect}")
        if length is None:
            length = arr.shape[0]
        if arr.shape[0] != length:
            raise DataFormatError(
                f"{where}: '{key}' has {arr.shape[0]} frames, other keys have {length}"
            )
        if np.isinf(arr).any():
            raise DataFormatError(f"{where}: '{key}' contains inf")
        if spec.required and key not in unrecorded:
            bad = np.isnan(arr)
            if missed is not None and missed.shape == bad.shape:
                bad &= ~missed
            if bad.any():
                t, j = np.argwhere(bad)[0]
                raise DataFormatError(
                    f"{where}: NaN in required channel '{key}' "
                    f"(channel {platform.channel_names[j]!r}, frame {t})"
                )
        if key in ("telemetry_valid", "torque_enable") and not np.isin(arr, (0.0, 1.0)).all():
            raise DataFormatError(f"{where}: '{key}' must hold only 0 or 1")
        if key == "condition" and ((arr < 0) | (arr > 1)).any():
            raise DataFormatError(f"{where}: 'condition' must be in [0, 1] or NaN")
        clean[key] = arr.reshape(length, w).astype(np.float32)
    if not length:
        raise DataFormatError(f"{where}: empty episode (0 frames)")
    for key, spec in FEATURES.items():
        if key not in clean:
            shape = (length, feature_width(spec, n))
            clean[key] = np.full(shape, spec.default, dtype=np.float32)
    if "timestamp" in frames:
        ts = np.asarray(frames["timestamp"], dtype=np.float64).reshape(-1)
        if ts.shape[0] != length:
            raise DataFormatError(
                f"{where}: 'timestamp' has {ts.shape[0]} frames, other keys have {length}"
            )
        if not np.isfinite(ts).all() or (np.diff(ts) < 0).any():
            raise DataFormatError(f"{where}: 'timestamp' must be finite and non-decreasing")
    else:
        ts = np.arange(length, dtype=np.float64) / fps
    clean["timestamp"] = ts.astype(np.float32)
    return clean
