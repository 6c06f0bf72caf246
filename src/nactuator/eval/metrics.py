"""Metrics of the NAD evaluation protocol (nad-format.md §8), in plain numpy.

Everything here works on one episode's arrays; ``aggregate`` then averages per task and
over tasks the way NAD builds its table rows. No metric reads the model or the simulator,
so each one can be checked on a hand-made case.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from nactuator.constants import CONTACT_THRESHOLD_N  # noqa: F401 (re-exported)

__all__ = [
    "CONTACT_THRESHOLD_N",
    "DEGRADED_THRESHOLD",
    "GATE_THRESHOLD",
    "HORIZONS",
    "aggregate",
    "binary_metrics",
    "channel_scales",
    "force_block",
    "force_errors",
    "horizon_keys",
    "no_contact_metrics",
    "prefix_mae",
    "roc_auc",
]

# Prefix windows of the published protocol (OMX uses 10..600, SO-101 100/300/500).
HORIZONS: tuple[int, ...] = (10, 100, 300, 500, 600)
GATE_THRESHOLD = 0.5  # the gate "says contact" above this
DEGRADED_THRESHOLD = 0.5  # condition score c < 0.5 means "degraded" (the positive class)


def channel_scales(kinds: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Factor and unit that turn SI joint errors into the reported units.

    Revolute channels (the SO-101 jaw included) are reported in degrees, prismatic ones
    (the OMX finger) in millimetres.
    """
    factors, units = [], []
    for kind in kinds:
        if kind == "revolute":
            factors.append(180.0 / math.pi)
            units.append("deg")
        elif kind == "prismatic":
            factors.append(1000.0)
            units.append("mm")
        else:
            raise ValueError(f"channel kind must be 'revolute' or 'prismatic', got {kind!r}")
    return np.asarray(factors), units


def horizon_keys(horizons: Iterable[int]) -> list[str]:
    return [f"@{h}" for h in horizons] + ["full"]


def prefix_mae(abs_err: np.ndarray, horizons: Iterable[int] = HORIZONS) -> dict[str, np.ndarray]:
    """Windowed MAE @W = mean |error| over the first W steps of one rollout, plus "full".

    ``abs_err`` is (steps, channels) or (steps,). Horizons longer than the rollout are left
    out of the result (the caller reports them as skipped) rather than silently shortened.
    """
    abs_err = np.asarray(abs_err, dtype=np.float64)
    if abs_err.ndim not in (1, 2) or abs_err.shape[0] == 0:
        raise ValueError(f"abs_err must be (steps,) or (steps, channels) with steps > 0, "
                         f"got shape {abs_err.shape}")
    steps = abs_err.shape[0]
    out = {f"@{h}": abs_err[:h].mean(axis=0) for h in horizons if h <= steps}
    out["full"] = abs_err.mean(axis=0)
    return out


def force_errors(f_pred: np.ndarray, f_label: np.ndarray) -> np.ndarray:
    """Per-step, per-axis |f̂ − f| with unlabelled (NaN) labels counted as 0 N.

    That is the reference convention (−999 → 0): x and y of a payload run and every axis of
    a no-contact run are zero-reference channels.
    """
    f_pred = np.asarray(f_pred, dtype=np.float64)
    f_label = np.nan_to_num(np.asarray(f_label, dtype=np.float64), nan=0.0)
    if f_pred.shape != f_label.shape or f_pred.shape[-1] != 3:
        raise ValueError(f"force arrays must both be (steps, 3), got {f_pred.shape} and "
                         f"{f_label.shape}")
    return np.abs(f_pred - f_label)


def roc_auc(score: np.ndarray, target: np.ndarray) -> float:
    """Area under the ROC curve (probability a positive outranks a negative; ties count ½).

    NaN when only one class is present, because the AUC is undefined there.
    """
    score = np.asarray(score, dtype=np.float64).ravel()
    target = np.asarray(target, dtype=bool).ravel()
    n_pos = int(target.sum())
    n_neg = target.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(score, kind="mergesort")
    sorted_scores = score[order]
    ranks = np.empty(score.size, dtype=np.float64)
    # Average ranks over ties (1-based), the Mann-Whitney U statistic.
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    u = ranks[target].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def binary_metrics(score: np.ndarray, target: np.ndarray, threshold: float = 0.5) -> dict:
    """Accuracy, precision, recall, F1, specificity and AUC of ``score > threshold``
    against ``target``.

    Precision/recall/F1 are NaN when undefined (no predicted / no actual positives), and
    specificity (the share of negatives called negative) when there is no negative, so a
    table never shows a made-up 0 or 1. With no positive at all, accuracy equals the
    specificity: it only says how often the nominal class was called nominal.
    """
    score = np.asarray(score, dtype=np.float64).ravel()
    target = np.asarray(target, dtype=bool).ravel()
    if score.shape != target.shape:
        raise ValueError(f"score and target must have the same size, got {score.size} and "
                         f"{target.size}")
    if score.size == 0:
        return {"n": 0, "positives": 0, "accuracy": float("nan"), "precision": float("nan"),
                "recall": float("nan"), "f1": float("nan"), "specificity": float("nan"),
                "auc": float("nan")}
    pred = score > threshold
    tp = int(np.sum(pred & target))
    fp = int(np.sum(pred & ~target))
    fn = int(np.sum(~pred & target))
    tn = int(np.sum(~pred & ~target))
    precision = tp / (tp + fp) if tp + fp else float("nan")
    recall = tp / (tp + fn) if tp + fn else float("nan")
    if tp + fp and tp + fn and precision + recall > 0:
        f1 = 2 * precision * recall / (precision + recall)
    elif tp + fn:
        f1 = 0.0 if tp + fp else float("nan")
    else:
        f1 = float("nan")
    return {
        "n": int(score.size),
        "positives": int(target.sum()),
        "accuracy": float(np.mean(pred == target)),
        "precision": float(precision),
        "recall": float(recall),
        "f1": float(f1),
        "specificity": tn / (tn + fp) if tn + fp else float("nan"),
        "auc": roc_auc(score, target),
    }


def no_contact_metrics(gate: np.ndarray, force: np.ndarray) -> dict:
    """False-contact rate (gate > 0.5) and mean force magnitude on frames with no contact."""
    gate = np.asarray(gate, dtype=np.float64).ravel()
    force = np.asarray(force, dtype=np.float64).reshape(-1, 3)
    if gate.size == 0:
        return {"frames": 0, "false_contact_rate": float("nan"),
                "mean_force_norm": float("nan"), "mean_abs_force": float("nan")}
    return {
        "frames": int(gate.size),
        "false_contact_rate": float(np.mean(gate > GATE_THRESHOLD)),
        "mean_force_norm": float(np.linalg.norm(force, axis=1).mean()),
        "mean_abs_force": float(np.abs(force).mean()),
    }


def _mean_of(values: list):
    """Mean of numbers or equal-length lists, ignoring NaN; NaN if nothing is defined."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0 or np.all(np.isnan(arr), axis=0).all():
        return np.full(arr.shape[1:], np.nan).tolist() if arr.ndim > 1 else float("nan")
    with np.errstate(invalid="ignore"):
        m = np.nanmean(arr, axis=0)
    return m.tolist() if arr.ndim > 1 else float(m)


# Leaves that count things: summed, not averaged, when episodes and tasks are merged.
_COUNT_KEYS = frozenset({"n", "positives", "frames", "steps", "episodes"})


def _merge(dicts: list[Mapping]) -> dict:
    """Average a list of equally-shaped nested metric dicts leaf by leaf (counts are summed).

    A key missing in some dicts (a horizon longer than some episodes) is averaged over the
    dicts that have it.
    """
    keys: list[str] = []
    for d in dicts:
        keys.extend(k for k in d if k not in keys)
    out: dict = {}
    for k in keys:
        vals = [d[k] for d in dicts if k in d]
        if isinstance(vals[0], Mapping):
            out[k] = _merge(vals)
        elif isinstance(vals[0], str):
            out[k] = vals[0]
        elif k in _COUNT_KEYS:
            out[k] = int(sum(vals))
        else:
            out[k] = _mean_of(vals)
    return out


def aggregate(per_episode: Sequence[Mapping]) -> dict:
    """NAD aggregation: mean over each task's episodes, then mean over tasks.

    Each item needs ``task`` plus nested numeric metrics (numbers or per-channel lists).
    Returns ``{"tasks": {task: metrics}, "mean": metrics}``.
    """
    if not per_episode:
        raise ValueError("aggregate needs at least one episode")
    by_task: dict[str, list[Mapping]] = {}
    for ep in per_episode:
        metrics = {k: v for k, v in ep.items()
                   if k not in ("task", "episode_index", "dataset")}
        by_task.setdefault(str(ep["task"]), []).append(metrics)
    tasks = {t: _merge(eps) for t, eps in by_task.items()}
    return {"tasks": tasks, "mean": _merge(list(tasks.values()))}


def force_block(pred: np.ndarray, label: np.ndarray, horizons: Iterable[int] = HORIZONS) -> dict:
    """One method's force figures on one episode: per horizon, the 3-axis MAE, the z MAE
    and the per-axis MAE (the layout of every force table)."""
    err = force_errors(pred, label)
    mae = prefix_mae(err.mean(axis=1), horizons)
    mae_z = prefix_mae(err[:, 2], horizons)
    axes = prefix_mae(err, horizons)
    return {k: {"mae": float(mae[k]), "mae_z": float(mae_z[k]), "mae_axes": axes[k].tolist()}
            for k in mae}
