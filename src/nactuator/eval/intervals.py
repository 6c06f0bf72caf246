"""The force interval judged on episodes, and calibrated on them (docs/uncertainty.md).

``interval_report`` is what ``eval`` adds for a model with the uncertainty head: the
empirical coverage of the nominal 90 % interval ``f̂ ± s·σ`` (s: the bundle's calibration,
else the Gaussian 1.645) on the causal (``infer``/``live``) path, its mean width, and both
split by contact / no contact (label |f| above ``CONTACT_THRESHOLD_N``) and by seen / unseen
task (a task with episodes in the train split or not). Unlabelled axes count as 0 N, the
convention every force figure of ``eval`` uses. ``interval_scores`` are the per-episode
normalised scores ``|f − f̂| / σ`` it also writes (``uncertainty_scores.npz``), from which
``cv`` calibrates by pooling out-of-fold episodes.

``calibrate`` is ``nactuator calibrate-intervals``: the split-conformal scale from held-out
episodes (:func:`nactuator.uncertainty.conformal_scale`, the episode as the unit), or a
given one (e.g. the pooled out-of-fold scale a ``cv`` printed), stored in the checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nactuator.atomic import atomic_path
from nactuator.constants import CONTACT_THRESHOLD_N
from nactuator.data import Episode
from nactuator.data.episodes import dataset_paths, filter_episode
from nactuator.eval.episodes import EvalDataError, force_labels, load_episodes
from nactuator.uncertainty import (
    GATE_CONTACT,
    NOMINAL_LEVEL,
    calibration_record,
    conformal_scale,
    coverage_metrics,
    gate_scales,
    normalised_scores,
)

__all__ = ["SCORES_FILE", "calibrate", "interval_markdown", "interval_report",
           "interval_scores", "load_scores"]

SCORES_FILE = "uncertainty_scores.npz"


def _truth(ep: Episode) -> np.ndarray:
    return np.nan_to_num(force_labels(ep), nan=0.0)


def interval_scores(episodes: Sequence[Episode], preds: Sequence[dict[str, np.ndarray]],
                    train_tasks: set[str] | None = None) -> list[dict[str, Any]]:
    """Per episode: ``scores`` (T, 3) = |f − f̂| / σ, ``sigma`` (T, 3), ``contact`` (T,)
    (the label says contact), ``gate_contact`` (T,) (the model's gate says contact: what a
    gate-conditional scale is chosen by) and ``seen`` (its task has train episodes; None if
    unknown)."""
    rows = []
    for ep, p in zip(episodes, preds, strict=True):
        truth = _truth(ep)
        rows.append({"scores": normalised_scores(p["force"], p["force_sigma"], truth),
                     "sigma": np.asarray(p["force_sigma"], np.float64),
                     "contact": np.linalg.norm(truth, axis=1) > CONTACT_THRESHOLD_N,
                     "gate_contact": np.asarray(p["gate"]).reshape(-1) >= GATE_CONTACT,
                     "seen": None if train_tasks is None else ep.task in train_tasks,
                     "task": ep.task, "episode_index": ep.index})
    return rows


def interval_report(episodes: Sequence[Episode], preds: Sequence[dict[str, np.ndarray]],
                    scale: float, calibration: dict | None,
                    train_tasks: set[str] | None = None) -> dict[str, Any]:
    """Coverage and width of the interval on ``episodes`` (see the module docstring)."""
    truth = np.concatenate([_truth(ep) for ep in episodes])
    force = np.concatenate([p["force"] for p in preds])
    lo = np.concatenate([p["force_lo"] for p in preds])
    hi = np.concatenate([p["force_hi"] for p in preds])
    contact = np.linalg.norm(truth, axis=1) > CONTACT_THRESHOLD_N
    groups: dict[str, np.ndarray] = {"contact": contact, "no_contact": ~contact}
    if train_tasks is not None:
        seen = np.concatenate([np.full(ep.length, ep.task in train_tasks) for ep in episodes])
        groups.update(seen_task=seen, unseen_task=~seen)
    report = coverage_metrics(force, lo, hi, truth, groups)
    per_episode = []
    for ep, p in zip(episodes, preds, strict=True):
        block = coverage_metrics(p["force"], p["force_lo"], p["force_hi"], _truth(ep))["all"]
        per_episode.append({"task": ep.task, "episode_index": ep.index, **block})
    return {"level": NOMINAL_LEVEL, "scale": scale,
            "calibration": calibration or "none: Gaussian z_0.95 = 1.645 (run `nactuator "
                                          "calibrate-intervals`)",
            "path": "model causal (the infer/live path)",
            **report, "per_episode": per_episode, "scores_file": SCORES_FILE}


def write_scores(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """The per-episode scores as one ``.npz`` (``scores_i``, ``sigma_i``, ``contact_i``,
    ``gate_contact_i``, ``seen`` (−1 unknown), ``task``)."""
    arrays: dict[str, np.ndarray] = {}
    for i, r in enumerate(rows):
        arrays[f"scores_{i}"] = r["scores"]
        arrays[f"sigma_{i}"] = r["sigma"]
        arrays[f"contact_{i}"] = r["contact"]
        arrays[f"gate_contact_{i}"] = r["gate_contact"]
    arrays["seen"] = np.array([-1 if r["seen"] is None else int(r["seen"]) for r in rows])
    arrays["task"] = np.array([r["task"] for r in rows])
    arrays["episode_index"] = np.array([r["episode_index"] for r in rows])
    with atomic_path(path, suffix=".npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return path


def load_scores(path: str | os.PathLike) -> list[dict[str, Any]]:
    """What :func:`write_scores` wrote, as the rows of :func:`interval_scores`
    (``gate_contact`` None in a file written before the gate was stored)."""
    with np.load(path) as z:
        n = len(z["seen"])
        return [{"scores": z[f"scores_{i}"], "sigma": z[f"sigma_{i}"],
                 "contact": z[f"contact_{i}"],
                 "gate_contact": z[f"gate_contact_{i}"] if f"gate_contact_{i}" in z else None,
                 "seen": None if z["seen"][i] < 0 else bool(z["seen"][i]),
                 "task": str(z["task"][i]), "episode_index": int(z["episode_index"][i])}
                for i in range(n)]


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def interval_markdown(report: dict[str, Any]) -> str:
    """The ``metrics.md`` section of :func:`interval_report`."""
    by_gate = (report["calibration"] or {}).get("by_gate") if isinstance(
        report["calibration"], dict) else None
    half = (f"{report['scale']:.3f} σ" if by_gate is None else
            f"{by_gate['free']:.3f} σ (gate open: {by_gate['contact']:.3f} σ)")
    lines = ["", "## Force interval (nominal 90 %)", "",
             f"Causal path; interval f̂ ± {half} "
             f"({'calibrated' if isinstance(report['calibration'], dict) else 'uncalibrated'}"
             "); unlabelled axes as 0 N.", "",
             "| frames | coverage | coverage x / y / z | mean width (N) | MAE (N) | elements |",
             "|---|---|---|---|---|---|"]
    for name in ("all", "contact", "no_contact", "seen_task", "unseen_task"):
        block = report.get(name)
        if block is None:
            continue
        axes = " / ".join(f"{100 * c:.1f}" for c in block["coverage_per_axis"])
        lines.append(f"| {name.replace('_', ' ')} | {_pct(block['coverage'])} | {axes} | "
                     f"{block['width']:.3f} | {block['mae']:.3f} | {block['elements']} |")
    return "\n".join(lines) + "\n"


def calibrate(ckpt: str | os.PathLike, data=None, split: str = "validation",
              out: str | os.PathLike | None = None, level: float = NOMINAL_LEVEL,
              scale: float | None = None, cv: tuple[int, int] | None = None,
              by_gate: bool = False, contact_scale: float | None = None) -> str:
    """Fit (or set, ``scale``) the force interval's conformal scale and store it in the
    checkpoint (``out``, default: in place). Returns a summary.

    ``by_gate``: fit one scale on the frames the model's gate calls contact and one on the
    rest (:func:`nactuator.uncertainty.gate_scales`); with ``scale`` given,
    ``contact_scale`` sets the contact frames' scale (``scale`` is then the free frames')."""
    from nactuator.eval.infer import predict_episodes
    from nactuator.models import load_actuator
    from nactuator.models.bundle import set_calibration
    from nactuator.platforms import load_platform

    actuator, meta = load_actuator(ckpt)
    if not actuator.has_uncertainty:
        raise EvalDataError(f"{ckpt}: the model has no uncertainty head; train it with "
                            "--config conf/train/uncertainty.yaml (model.uncertainty: true)")
    gated = None
    if contact_scale is not None and scale is None:
        raise EvalDataError("--contact-scale goes with --scale (the free frames' scale)")
    if scale is not None:
        fit = {"scale": float(scale), "level": level, "episodes": 0, "guarantee": False}
        source = "given (--scale)"
        if contact_scale is not None:
            gated = {"free": float(scale), "contact": float(contact_scale)}
            source = "given (--scale, --contact-scale)"
    else:
        if data is None:
            raise EvalDataError("calibrate needs --data (held-out episodes) or --scale")
        platform = load_platform(meta["platform"])
        episodes = [filter_episode(ep, meta["input_filters"])
                    for ep in load_episodes(data, platform, split, cv)]
        if not episodes:
            where = ", ".join(str(p) for p in dataset_paths(data))
            raise EvalDataError(f"{where}: no episodes in split {split!r} to calibrate on")
        preds = predict_episodes(actuator, episodes)
        rows = interval_scores(episodes, preds)
        fit = conformal_scale([r["scores"] for r in rows], level)
        source = (f"{', '.join(str(p) for p in dataset_paths(data))} split {split}"
                  + ("" if cv is None else f" (cv fold {cv[1]} of {cv[0]})"))
        if by_gate:
            fits = gate_scales([r["scores"] for r in rows], [r["gate_contact"] for r in rows],
                               level)
            gated = {"free": fits["free"]["scale"], "contact": fits["contact"]["scale"]}
            source += (f"; gate closed in {fits['free']['episodes']}, open in "
                       f"{fits['contact']['episodes']} of the episodes")
            if fits["fallback"] is not None:
                state = "open" if fits["fallback"] == "contact" else "closed"
                source += f"; no frame with the gate {state}: both scales from the other frames"
    try:
        record = calibration_record(fit, source, gated)
    except ValueError as err:
        raise EvalDataError(f"calibrate-intervals: {err}") from err
    target = set_calibration(ckpt, record, out)
    note = ("finite-sample guarantee (conformal risk control)" if record["guarantee"] else
            f"no finite-sample guarantee: {record['episodes']} episode(s) < "
            # 1 / (1 - 0.9) is 10.000000000000002 in floating point: 9 episodes, not 10
            f"{int(np.ceil(1 / (1 - level) - 1 - 1e-9))} needed at level {level:g}")
    what = (f"scale {record['scale']:.4f} σ" if gated is None else
            f"scales {gated['free']:.4f} σ (gate closed) and {gated['contact']:.4f} σ "
            "(gate open)")
    return (f"calibrate: {what} for the {100 * level:g} % force interval from {source}"
            + (f"; {record['episodes']} episode(s), {note}" if scale is None else "")
            + f"\nwritten: {target}")
