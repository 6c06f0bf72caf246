"""``nactuator detect``: a checkpoint's condition score on mid-run fault episodes.

Runs the deployment path (:func:`nactuator.eval.infer.predict_episodes`, causal windows after
the checkpoint's input filters) on every episode whose condition label switches from nominal
to degraded on one motor (``conf/world/*_onset.yaml`` datasets), and reports per episode and
per fault the figures of :mod:`nactuator.eval.detection`: delay of the causal flag rule after
the onset, false flags before it, and whether the faulted motor's score moved most. Writes
``detection.json`` and one PNG per task (score vs time, onset marked) under ``out``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from nactuator.atomic import write_png, write_text
from nactuator.data.episodes import filter_episode
from nactuator.eval.baselines.condition import ConditionBaselines
from nactuator.eval.baselines.features import window_features
from nactuator.eval.baselines.settings import load_settings
from nactuator.eval.detection import DetectionResult, detect, summarise
from nactuator.eval.episodes import EvalDataError, load_episodes
from nactuator.eval.infer import predict_episodes
from nactuator.models import load_model
from nactuator.platforms import conf_dir, load_platform, read_yaml_mapping

__all__ = ["baseline_frame_scores", "default_rule", "fault_onset", "run_detection"]


def default_rule(platform: str, path: str | os.PathLike | None = None) -> tuple[float, int]:
    """(threshold, hold frames) of the flag rule for ``platform`` from
    ``conf/eval/detection.yaml`` (or ``path``): ``hold_frames`` per platform, else its
    ``default``. Errors name the file and the field."""
    path = Path(path) if path is not None else conf_dir() / "eval" / "detection.yaml"
    cfg = read_yaml_mapping(path, EvalDataError, "detection rule file")
    holds = cfg.get("hold_frames")
    if not isinstance(holds, dict) or "default" not in holds:
        raise EvalDataError(f"{path}: hold_frames must be a mapping with a 'default' entry")
    hold = holds.get(platform, holds["default"])
    threshold = cfg.get("threshold")
    if isinstance(hold, bool) or not isinstance(hold, int) or hold < 1:
        raise EvalDataError(f"{path}: hold_frames.{platform if platform in holds else 'default'}"
                            f" must be an integer >= 1, got {hold!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
            or not 0 <= threshold <= 1:
        raise EvalDataError(f"{path}: threshold must be a number in [0, 1], got {threshold!r}")
    return float(threshold), int(hold)


def baseline_frame_scores(fitted: ConditionBaselines, method: str, ep, n: int) -> np.ndarray:
    """(T, n) degraded score in [0, 1] of a fitted window classifier, per frame and motor:
    the window of the ``fitted.window`` frames ending at each frame (causal; NaN before the
    first whole window). Every motor is scored with the classifier fitted on the condition
    channels (features are per motor), so a fault on another joint can show."""
    T, w = ep.length, fitted.window
    out = np.full((T, n), np.nan)
    if T < w:
        return out
    starts = np.arange(0, T - w + 1)
    clf = fitted.methods[method]
    for j in range(n):
        raw = clf.score(window_features(ep, j, starts, w))
        # random forest: P(degraded) - 0.5; SVM / threshold: a margin -> logistic squash.
        prob = raw + 0.5 if method == "random-forest" else 1.0 / (1.0 + np.exp(-raw))
        out[w - 1:, j] = prob
    return out


def fault_onset(condition: np.ndarray) -> tuple[int, int] | None:
    """(onset frame, motor) where the label first says degraded (< 0.5) on a motor that
    was nominal on frame 0; None for a run nominal throughout or degraded from the start."""
    lab = np.where(np.isfinite(condition), condition, 1.0) < 0.5
    if lab[0].any() or not lab.any():
        return None
    t, j = np.argwhere(lab)[0]
    return int(t), int(j)


def _fault_kind(ep) -> str:
    fault = (ep.meta or {}).get("fault")
    if isinstance(fault, dict) and "kind" in fault:
        return str(fault["kind"])
    return "wear" if "worn" in ep.task or "wear" in ep.task else "band"


def _plot(ep, score: np.ndarray, onset: int, channel: int, names: list[str], dt: float,
          threshold: float, result: DetectionResult, path: Path, method: str) -> None:
    t = np.arange(score.shape[0]) * dt
    fig = Figure(figsize=(9, 3.5))
    ax = fig.subplots()
    for j, name in enumerate(names):
        ax.plot(t, score[:, j], lw=2.0 if j == channel else 0.8,
                label=f"{name}{' (faulted)' if j == channel else ''}")
    ax.axvline(onset * dt, color="k", ls="--", label="onset")
    ax.axhline(threshold, color="grey", ls=":", label="threshold")
    if result.flagged:
        ax.axvline((onset + result.delay_frames) * dt, color="r", ls="-.", label="first flag")
    ax.set(xlabel="time [s]", ylabel="degraded score 1 - c", ylim=(-0.05, 1.05),
           title=f"{method}: {ep.task} (episode {ep.index})")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    write_png(path, fig)


def run_detection(ckpt: str | os.PathLike, data, split: str | None = None,
                  threshold: float | None = None, hold: int | None = None,
                  out: str | os.PathLike | None = None, train_data=None) -> str:
    """Detection figures of ``ckpt`` on the fault-onset episodes of ``data``; a report.

    ``threshold`` / ``hold`` None: the platform's rule (:func:`default_rule`).
    ``train_data``: the dataset the checkpoint was trained on; the random forest is then
    fitted on its train split and scored frame by frame beside the model."""
    actuator, meta = load_model(ckpt)
    platform = load_platform(meta["platform"])
    if threshold is None or hold is None:
        conf_threshold, conf_hold = default_rule(platform.name)
        threshold = conf_threshold if threshold is None else threshold
        hold = conf_hold if hold is None else hold
    episodes = [ep for ep in load_episodes(data, platform, split)
                if fault_onset(ep.frames["condition"]) is not None]
    if not episodes:
        raise EvalDataError(f"{data}: no episode whose condition label switches from nominal "
                            "to degraded mid-run (make one with `nactuator data synth --world "
                            f"conf/world/{platform.name}_onset.yaml`)")
    episodes = [filter_episode(ep, meta["input_filters"]) for ep in episodes]
    preds = predict_episodes(actuator, episodes)
    dt, names = platform.control_dt, platform.channel_names
    scores = {"model": [1.0 - p["condition"] for p in preds]}
    if train_data is not None:
        cfg = load_settings()
        fitted = ConditionBaselines.fit(load_episodes(train_data, platform, "train"),
                                        platform.n, ["random-forest"], cfg.window, cfg.stride,
                                        cfg.svm, cfg.random_forest)
        scores["random-forest"] = [baseline_frame_scores(fitted, "random-forest", ep,
                                                         platform.n) for ep in episodes]
    lines = [f"detect: {len(episodes)} fault-onset episode(s), flag rule: degraded score "
             f"1 - c > {threshold} on {hold} consecutive frames ({hold * dt:.3f} s), causal"]
    body = {"rule": {"threshold": threshold, "hold_frames": hold, "dt": dt}}
    for method, per_ep in scores.items():
        summary, results = _score_method(episodes, per_ep, method, names, dt, threshold, hold,
                                         out)
        body[method] = {"summary": summary, "episodes": [vars(r) for r in results]}
        lines += _table(method, summary, names)
    if out is not None:
        write_text(Path(out) / "detection.json", json.dumps(body, indent=2))
        lines.append(f"written: {Path(out) / 'detection.json'} and detection_*_<task>.png")
    return "\n".join(lines)


def _score_method(episodes, per_ep, method, names, dt, threshold, hold, out):
    results, plotted = [], set()
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    for ep, score in zip(episodes, per_ep, strict=True):
        onset, channel = fault_onset(ep.frames["condition"])
        r = detect(score, onset, channel, dt, task=ep.task, fault=_fault_kind(ep),
                   threshold=threshold, hold=hold)
        results.append(r)
        if out_dir is not None and ep.task not in plotted:
            plotted.add(ep.task)
            _plot(ep, score, onset, channel, names, dt, threshold, r,
                  out_dir / f"detection_{method}_{ep.task}.png", method)
    return summarise(results), results


def _table(method: str, summary: dict, names) -> list[str]:
    lines = [f"{method}:", f"{'fault@motor':<18}{'episodes':>9}{'flagged':>9}{'median delay':>14}"
             f"{'(not pre-flagged)':>19}{'worst delay':>13}{'false flags':>13}"
             f"{'pre-flagged':>13}{'localised':>11}"]
    for key, s in summary.items():
        fault, ch = key.split("@")
        med = "-" if s["median_delay_s"] is None else f"{s['median_delay_s']:.2f} s"
        worst = "-" if s["worst_delay_s"] is None else f"{s['worst_delay_s']:.2f} s"
        clean = s["median_delay_not_preflagged_s"]
        clean = "-" if clean is None else f"{clean:.2f} s"
        lines.append(f"{fault + '@' + names[int(ch)]:<18}{s['episodes']:>9}{s['flagged']:>9}"
                     f"{med:>14}{clean:>19}{worst:>13}{100 * s['false_flag_rate']:>12.1f}%"
                     f"{s['flagged_before_onset']:>13}"
                     f"{s['localised']:>8}/{s['episodes']}")
    return lines
