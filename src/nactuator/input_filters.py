"""What the model sees of raw telemetry: the input filters, as data and as one causal function.

Training (the DataModule), ``eval``, ``infer`` and ``live`` all pass recorded or streamed
telemetry through :func:`filter_inputs` before it enters a window, configured by a small
*spec* (plain data) that training saves in the actuator bundle, so a checkpoint is always
fed its inputs the way it was trained. The spec::

    {"format": "nactuator-input-filters/1",
     "missing": "hold_last_valid",          # or "zero": the fill rule for missing readings
     "telemetry": ["q", "qd", "effort", "voltage", "temperature"],   # channels it fills
     "median": {"temperature": 11},         # trailing running median, frames per channel
     "pool": {"frames": 64}}                # optional: causal pooled statistics (step 3)

Per motor, in this order:

1. **Missing readings.** A telemetry value is missing where ``telemetry_valid`` is 0 (the
   servo read failed that cycle; the values are NaN then) or where it is NaN.
   ``hold_last_valid`` serves the motor's last valid reading of this episode or stream (NaN
   until it has one); ``zero`` serves 0 (what checkpoints from before this spec were
   trained with). Commands (``q_cmd`` ...) are what was sent and are never filled.
2. **Running median** (glitch removal: single-frame 95-150 degC temperature spikes and
   bursts of up to ``window // 2`` frames), *causal*: the current frame and the
   ``window - 1`` before it, of the filled values; at a stream's start only the frames
   that exist. It is the median of the finite values, the lower middle one for an even
   count, so every output is a sample that was read (NaN when none is).
3. **Pooled statistics** (only with ``pool``; bundles without the key never compute them):
   the 9-frame window sees too little of a motor to tell a restricted joint from a heavier
   load, so each frame also carries per-motor statistics of the filled ``effort`` u and the
   command ``q_cmd`` c over a longer causal horizon (:data:`POOLED_KEYS`, channels of their
   own that the feature group ``pooled`` reads). They are exponential moving averages with
   the centre of mass of a ``frames``-long window (α = 2 / (frames + 1)), normalised by the
   averaged weight so a stream's first frames are the mean of what exists (frame t reads
   frames <= t only): effort mean, std, mean |u|, command std, correlation and slope of u
   on c (a spring's stiffness), command speed mean |Δc|, u · sign(Δc) (resistance to the
   motion: friction) and mean |Δu| (roughness). A frame whose effort is NaN (a motor not
   read yet) adds nothing to the effort moments; the state is O(1) per motor and channel.
   Only effort and commands enter them, never the state q, qd: a rollout replays them from
   the recording as it replays effort, so they cannot leak the recorded trajectory into a
   simulated one.
4. Whatever is still NaN (a channel never recorded, a motor not read yet) reads as 0 in the
   window (:mod:`nactuator.rollout`). Normalisation and the ±10 std clip of the features
   are part of the model (``models.features.FeatureBuilder``), not of this pipeline.

Streaming: :func:`filter_inputs` takes and returns a :class:`FilterState` (the held reading,
the last ``window - 1`` filled values per channel, the pooled moments), so a stream filtered
one frame at a time gives bit-identical results to the whole episode at once: the same code
runs on chunks of 1 or T frames (the moving averages frame by frame in both). This module
imports only numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nactuator.errors import UserError

__all__ = [
    "FILTERS_FORMAT",
    "MISSING_RULES",
    "POOLED_KEYS",
    "POOL_SOURCES",
    "TELEMETRY_KEYS",
    "FilterState",
    "InputFilterError",
    "check_spec",
    "filter_inputs",
    "input_filter_spec",
    "legacy_spec",
    "pooled_keys",
]

FILTERS_FORMAT = "nactuator-input-filters/1"
MISSING_RULES = ("hold_last_valid", "zero")
# The channels a servo read returns (NaN with telemetry_valid = 0 when a read failed).
TELEMETRY_KEYS = ("q", "qd", "effort", "voltage", "temperature")
# The pooled statistics (step 3 above), per motor, in this order, and what they read.
POOLED_KEYS = ("pool_effort_mean", "pool_effort_std", "pool_effort_abs", "pool_command_std",
               "pool_effort_command_corr", "pool_effort_command_slope", "pool_command_speed",
               "pool_effort_drive", "pool_effort_roughness")
POOL_SOURCES = ("q_cmd", "effort")
# The slope of effort on the command divides by the command's variance; a joint that hardly
# moves (std well below a degree) would blow it up, so the variance is floored at this std²
# (rad², or m² for a prismatic channel: 0.02 m would be coarse but no gripper band is trained).
SLOPE_FLOOR = 0.02


class InputFilterError(UserError, ValueError):
    """An input filter spec is malformed; the message names the field and the value."""


def input_filter_spec(temperature_median: int = 11, missing: str = "hold_last_valid",
                      pool_frames: int | None = None) -> dict[str, Any]:
    """The spec of a training run (``NADDataModule(temperature_median=, missing_telemetry=,
    pool_frames=)``); ``pool_frames`` None: no pooled statistics."""
    spec = {"format": FILTERS_FORMAT, "missing": missing, "telemetry": list(TELEMETRY_KEYS),
            "median": {"temperature": int(temperature_median)} if temperature_median > 1
            else {}}
    if pool_frames is not None:
        spec["pool"] = {"frames": pool_frames}
    return check_spec(spec)


def pooled_keys(spec: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The pooled channels ``filter_inputs`` adds under ``spec`` (none without ``pool``)."""
    return POOLED_KEYS if spec is not None and spec.get("pool") is not None else ()


def legacy_spec(training_config: Mapping | None) -> dict[str, Any]:
    """The spec of a checkpoint saved before bundles carried one.

    Such a run was trained on zero-filled telemetry (the DataModule served NaN as 0) with
    temperature through a *centred* running median of ``data.temperature_median`` frames
    (none for a bare bundle without a training config). A centred median reads frames that
    a live robot does not have yet, so these checkpoints get the trailing median of the same
    width (what ``infer`` already fed them) and zero fill: the closest causal input to what
    they saw. ``data.missing_telemetry`` is honoured if the config has it.
    """
    data = (training_config or {}).get("data") or {}
    window = data.get("temperature_median", 1)
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise InputFilterError(f"checkpoint training config data.temperature_median must be "
                               f"a positive integer, got {window!r}")
    return input_filter_spec(window, data.get("missing_telemetry", "zero"))


def check_spec(spec: Any, where: str = "input_filters") -> dict[str, Any]:
    """``spec`` validated (a one-line :class:`InputFilterError` naming the bad field)."""
    if not isinstance(spec, Mapping):
        raise InputFilterError(f"{where} must be a dict, got {type(spec).__name__}")
    if spec.get("format") != FILTERS_FORMAT:
        raise InputFilterError(f"{where}.format is {spec.get('format')!r}, expected "
                               f"{FILTERS_FORMAT!r}")
    if spec.get("missing") not in MISSING_RULES:
        raise InputFilterError(f"{where}.missing must be one of {list(MISSING_RULES)}, got "
                               f"{spec.get('missing')!r}")
    telemetry = spec.get("telemetry")
    if (not isinstance(telemetry, list | tuple)
            or not all(isinstance(k, str) for k in telemetry)):
        raise InputFilterError(f"{where}.telemetry must be a list of channel names, got "
                               f"{telemetry!r}")
    median = spec.get("median")
    if not isinstance(median, Mapping):
        raise InputFilterError(f"{where}.median must be a dict {{channel: frames}}, got "
                               f"{median!r}")
    for key, window in median.items():
        if not isinstance(window, int) or isinstance(window, bool) or window < 1 \
                or window % 2 == 0:
            raise InputFilterError(f"{where}.median.{key} must be a positive odd number of "
                                   f"frames, got {window!r}")
    out = {"format": FILTERS_FORMAT, "missing": spec["missing"], "telemetry": list(telemetry),
           "median": {str(k): int(v) for k, v in median.items()}}
    pool = spec.get("pool")
    if pool is not None:  # absent (every bundle before pooling): no pooled channels
        frames = pool.get("frames") if isinstance(pool, Mapping) else None
        if not isinstance(frames, int) or isinstance(frames, bool) or frames < 2:
            raise InputFilterError(f"{where}.pool must be {{frames: N}} with an integer N >= 2,"
                                   f" got {pool!r}")
        out["pool"] = {"frames": int(frames)}
    return out


@dataclass
class FilterState:
    """What a stream carries from one chunk to the next, per channel: ``held`` (n,) the last
    filled value (the held reading; NaN before the first), ``recent`` (window − 1, n) the
    last filled values the running median reads (NaN before the stream's start); with
    pooling ``pool`` the moving sums, weights and previous u, c (:func:`_pool`)."""

    held: dict[str, np.ndarray] = field(default_factory=dict)
    recent: dict[str, np.ndarray] = field(default_factory=dict)
    pool: dict[str, np.ndarray] | None = None


def _fill(x: np.ndarray, ok: np.ndarray, held: np.ndarray | None, rule: str) -> np.ndarray:
    if rule == "zero":
        return np.where(ok, x, np.float32(0.0))
    # hold_last_valid: row 0 is the held reading; each frame takes the last ok row <= it.
    n = x.shape[1]
    start = np.full((1, n), np.nan, np.float32) if held is None else held[None]
    ext = np.concatenate([start, x])
    ok_ext = np.concatenate([np.isfinite(start), ok])
    rows = np.where(ok_ext, np.arange(len(ext))[:, None], 0)
    last = np.maximum.accumulate(rows, axis=0)
    return ext[last, np.arange(n)][1:]


def _trailing_median(x: np.ndarray, recent: np.ndarray) -> np.ndarray:
    """Per frame of ``x`` (T, n): the median of the finite values among that frame and the
    ``len(recent)`` before it (``recent`` holds those before frame 0)."""
    ext = np.concatenate([recent, x])
    rows = np.arange(len(x))[:, None] + np.arange(len(recent) + 1)
    windows = ext[rows]  # (T, W, n)
    ordered = np.sort(windows, axis=1)  # NaN sorts last
    count = np.isfinite(windows).sum(axis=1)
    pick = np.maximum(count - 1, 0) // 2  # lower middle; 0 (a NaN) when nothing is finite
    out = np.take_along_axis(ordered, pick[:, None], axis=1)[:, 0]
    return np.where(count > 0, out, np.float32(np.nan))


_MOMENTS = 9  # u, u², |u|, c, c², u c, |Δc|, u sign(Δc), |Δu|


def _pool(u: np.ndarray, c: np.ndarray, frames: int,
          state: dict[str, np.ndarray] | None) -> tuple[dict[str, np.ndarray],
                                                         dict[str, np.ndarray]]:
    """The pooled statistics of effort ``u`` and command ``c`` (T, n) continuing ``state``.

    Moving sums ``S ← (1 − α) S + α ok x`` and weights ``W ← (1 − α) W + α ok`` of each
    moment x (ok: the moment's inputs are finite this frame), mean = S / W; float64 inside.
    The recursion runs frame by frame on every chunk, so the result does not depend on how
    a stream is cut into chunks.
    """
    length, n = u.shape
    alpha = 2.0 / (frames + 1.0)
    u = u.astype(np.float64)
    c = c.astype(np.float64)
    if state is None:
        state = {"sum": np.zeros((_MOMENTS, n)), "weight": np.zeros((_MOMENTS, n)),
                 "u": np.full(n, np.nan), "c": np.full(n, np.nan)}
    du = np.diff(np.concatenate([state["u"][None], u]), axis=0)
    dc = np.diff(np.concatenate([state["c"][None], c]), axis=0)
    x = np.stack([u, u * u, np.abs(u), c, c * c, u * c, np.abs(dc), u * np.sign(dc),
                  np.abs(du)], axis=1)  # (T, M, n)
    ok = np.isfinite(x)
    x = np.where(ok, x, 0.0)
    ok = ok.astype(np.float64)
    sums, weights = np.empty_like(x), np.empty_like(x)
    s, w = state["sum"].copy(), state["weight"].copy()
    for t in range(length):
        s = (1.0 - alpha) * s + alpha * ok[t] * x[t]
        w = (1.0 - alpha) * w + alpha * ok[t]
        sums[t], weights[t] = s, w
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.where(weights > 0, sums / weights, np.nan)
    mu, muu, mau, mc, mcc, muc, mv, mus, mdu = (m[:, i] for i in range(_MOMENTS))
    var_u = np.maximum(muu - mu * mu, 0.0)
    var_c = np.maximum(mcc - mc * mc, 0.0)
    cov = muc - mu * mc
    den = np.sqrt(var_u * var_c)
    with np.errstate(invalid="ignore", divide="ignore"):
        # 0 where either is (nearly) constant, as the baselines' correlation feature
        corr = np.where(den > 1e-12, cov / den, np.where(np.isfinite(den), 0.0, np.nan))
    out = dict(zip(POOLED_KEYS, (mu, np.sqrt(var_u), mau, np.sqrt(var_c), corr,
                                 cov / (var_c + SLOPE_FLOOR ** 2), mv, mus, mdu), strict=True))
    next_state = {"sum": s, "weight": w, "u": u[-1].copy(), "c": c[-1].copy()}
    return {k: v.astype(np.float32) for k, v in out.items()}, next_state


def filter_inputs(frames: Mapping[str, Any], spec: Mapping[str, Any],
                  state: FilterState | None = None) -> tuple[dict[str, np.ndarray], FilterState]:
    """The model's view of ``frames`` (``frames[key]`` (T, n); optional ``telemetry_valid``
    (T, n), 1 where the motor was read), continuing the stream ``state`` (None: the start
    of an episode). Returns a new dict (the spec's channels as float32, every other key as
    given) and the state after the last frame; ``frames`` is not modified."""
    state = FilterState() if state is None else state
    filled = [k for k in spec["telemetry"] if k in frames]
    medianed = [k for k in spec["median"] if k in frames and spec["median"][k] > 1]
    keys = filled + [k for k in medianed if k not in filled]
    out = dict(frames)
    length = len(frames[keys[0]]) if keys else 0
    if length == 0:
        return out, state
    n = np.shape(frames[keys[0]])[1]
    valid = frames.get("telemetry_valid")
    valid = (np.ones((length, n), bool) if valid is None
             else np.asarray(valid).reshape(length, n) > 0.5)
    x = {k: np.asarray(frames[k], dtype=np.float32).reshape(length, n) for k in keys}
    next_state = FilterState(pool=state.pool)
    if filled:  # the channels side by side, (T, K n): one vectorised fill for all of them
        block = np.concatenate([x[k] for k in filled], axis=1)
        ok = np.tile(valid, (1, len(filled))) & np.isfinite(block)
        none = np.full(n, np.nan, np.float32)
        held = None if not state.held else np.concatenate(
            [state.held[k] if k in state.held else none for k in filled])
        block = _fill(block, ok, held, spec["missing"])
        for i, key in enumerate(filled):
            x[key] = block[:, i * n : (i + 1) * n]
            next_state.held[key] = x[key][-1].copy()
    for key in medianed:
        window = spec["median"][key]
        recent = state.recent.get(key)
        if recent is None:
            recent = np.full((window - 1, n), np.nan, np.float32)
        next_state.recent[key] = np.concatenate([recent, x[key]])[-(window - 1):].copy()
        x[key] = _trailing_median(x[key], recent)
    if pooled_keys(spec) and all(k in frames for k in POOL_SOURCES):
        effort = x.get("effort", np.asarray(frames["effort"], np.float32).reshape(length, n))
        pooled, next_state.pool = _pool(effort, np.asarray(frames["q_cmd"]).reshape(length, n),
                                        spec["pool"]["frames"], state.pool)
        x.update(pooled)
    out.update({k: np.ascontiguousarray(v) for k, v in x.items()})
    return out, next_state
