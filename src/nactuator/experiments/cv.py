"""``nactuator cv``: k-fold cross-validation by episode, the number recipes are judged by.

One validation file is noise. For each fold (:mod:`nactuator.data.folds`: by default
leave-one-episode-out within each task over the train + validation episodes) this trains the same
configuration as ``nactuator train`` with that fold's splits, then scores the held-out episodes
with the evaluation protocol (``nactuator eval``, rollout and causal modes) for the
checkpoint picked by validation (``best``, selected on the fold's inner validation episodes,
never on the held-out ones) and for ``last``. The summary gives every metric's mean ± sd,
min and max over folds, next to the references scored on the same held-out episodes.

Folds run as subprocesses (one torch thread each), ``--jobs`` at a time on this machine or
as Ray tasks on a cluster (``--backend ray``, :mod:`nactuator.distributed`); a fold whose
scores exist is not run again, so an interrupted CV continues where it stopped.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nactuator.atomic import write_json, write_png, write_text
from nactuator.child import run_nactuator
from nactuator.data import read_dataset
from nactuator.data.episodes import dataset_paths
from nactuator.data.folds import episodes_per_task
from nactuator.data.references import is_worse, verdict
from nactuator.distributed import Backend, make_backend, run_all
from nactuator.errors import UserError
from nactuator.platforms import load_platform
from nactuator.uncertainty import (
    NOMINAL_LEVEL,
    conformal_scale,
    cross_fold_coverage,
    episode_coverage,
    gate_scales,
    scale_per_element,
)

__all__ = ["CVError", "run_cv", "summarize_folds"]

SELECTIONS = ("best", "last")  # always scored; a run's extra ModelCheckpoint families too
TRAIN_TIME = "train_time.json"  # per fold: the `train` child's wall_s and cpu_s (user + sys)


class CVError(UserError, RuntimeError):
    """A cross-validation cannot run or a fold failed; the message says which and why."""


def default_folds(paths: Sequence[str]) -> int:
    """Leave-one-run-out within each task: as many folds as the task with most episodes."""
    refs = [(pos, ep.index, ep.task, ep.split) for pos, path in enumerate(paths)
            for ep in read_dataset(path).episodes]
    counts = episodes_per_task(refs)
    if not counts or max(counts.values()) < 2:
        raise CVError(f"{', '.join(paths)}: cross-validation needs a task with at least 2 "
                      f"train/validation episodes (episodes per task: {counts})")
    return max(counts.values())


def _checkpoint(fold_dir: Path, selection: str) -> Path:
    pattern = "last.ckpt" if selection == "last" else f"{selection}-*.ckpt"
    found = sorted(fold_dir.rglob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise CVError(f"{fold_dir}: training left no {pattern} (see {fold_dir / 'train.log'})")
    return found[-1]


def _selections(fold_dir: Path) -> list[str]:
    """``best``, ``last`` and every other checkpoint family the run wrote (a further
    ``ModelCheckpoint`` with ``filename: NAME-{epoch:02d}``, e.g. to compare selection
    rules fold by fold): each is scored on the held-out episodes."""
    names = {p.name.split("-epoch=")[0] for p in fold_dir.rglob("*-epoch=*.ckpt")}
    return [*SELECTIONS, *sorted(names - set(SELECTIONS))]


def _run(args: list[str], log: Path, usage: dict[str, float | None] | None = None) -> None:
    code = run_nactuator(args, log, usage=usage)
    if code != 0:
        raise CVError(f"`nactuator {' '.join(args[:4])} ...` failed with exit code {code}; "
                      f"its output is in {log}")


def _finished(fold_dir: Path) -> dict[str, Path] | None:
    """The fold's scores (one ``metrics.json`` per selection) if all exist, else None."""
    scores = {s: fold_dir / f"eval_{s}" / "metrics.json" for s in _selections(fold_dir)}
    return scores if all(p.is_file() for p in scores.values()) else None


def _run_fold(platform: str, paths: list[str], folds: int, fold: int, out: Path,
              extra_args: Sequence[str]) -> dict[str, Path]:
    """Train fold ``fold`` and score its checkpoints (one task of :func:`run_cv`)."""
    fold_dir = out / f"fold_{fold}"
    if (scores := _finished(fold_dir)) is not None:
        return scores
    shutil.rmtree(fold_dir, ignore_errors=True)  # a fold interrupted half-way starts over
    fold_dir.mkdir(parents=True)
    log = fold_dir / "train.log"
    usage: dict[str, float | None] = {}
    _run(["train", "--platform", platform, "--data", ",".join(paths),
                f"--data.cv_folds={folds}", f"--data.cv_fold={fold}",
                f"--trainer.default_root_dir={fold_dir}", "--logger", "csv",
                "--trainer.enable_progress_bar=false", *extra_args], log, usage)
    write_json(fold_dir / TRAIN_TIME, usage)  # the `train` child alone, not its `eval`
    scores = {s: fold_dir / f"eval_{s}" / "metrics.json" for s in _selections(fold_dir)}
    # One `eval` process scores every selection (one start-up and one kernel load per fold).
    _run(["eval", "--ckpt", *(str(_checkpoint(fold_dir, s)) for s in scores),
          "--data", ",".join(paths), "--split", "test", "--folds", str(folds),
          "--fold", str(fold), "--out", *(str(p.parent) for p in scores.values())], log)
    return scores


# ------------------------------------------------------------------------ summary


def train_times(fold_dirs: Sequence[Path]) -> dict[str, dict[str, Any]]:
    """Per fold, the ``train`` child's CPU seconds (user + sys: what the training costs on a
    shared machine) and wall seconds, summarised as :func:`summarize_folds` does; None for a
    fold trained before this was recorded."""
    rows = []
    for fold_dir in fold_dirs:
        path = fold_dir / TRAIN_TIME
        usage = json.loads(path.read_text()) if path.is_file() else {}
        rows.append({"cpu": usage.get("cpu_s"), "wall": usage.get("wall_s")})
    return summarize_folds(rows)


def _arm(values: Sequence[float] | None, arm: Sequence[int], how: str) -> float | None:
    if values is None or any(values[i] is None for i in arm):
        return None
    picked = [values[i] for i in arm]
    return float(np.mean(picked)) if how == "mean" else float(np.max(picked))


def fold_row(metrics: dict) -> dict[str, float | None]:
    """The figures one fold contributes, from its ``metrics.json`` (whole episodes)."""
    arm = metrics["arm_indices"]
    row: dict[str, float | None] = {}
    for group in ("all", "contact", "no_contact"):
        block = (metrics["aggregate"].get(group) or {}).get("mean")
        if block is None:
            continue
        prefix = "" if group == "all" else f"{group}/"
        joints = block["joints"]
        for method, name in (("model", "model"), ("command_following", "command following")):
            full = joints.get(method, {}).get("full")
            row[f"{prefix}arm mean (deg), {name}"] = _arm(full, arm, "mean")
            row[f"{prefix}worst arm joint (deg), {name}"] = _arm(full, arm, "max")
        for method, name in (("model", "model rollout"), ("model_causal", "model causal"),
                             ("model_residual", "model residual"),
                             ("linear_regression", "linear regression")):
            full = block["force"].get(method, {}).get("full")
            if full is not None:
                row[f"{prefix}force 3-axis (N), {name}"] = full["mae"]
                row[f"{prefix}force z (N), {name}"] = full["mae_z"]
        payload = block.get("payload")
        if payload:
            for method, name in (("model", "model rollout"), ("model_causal", "model causal"),
                                 ("model_residual", "model residual"),
                                 ("linear_regression", "linear regression")):
                if method in payload:
                    row[f"{prefix}payload error (g), {name}"] = payload[method]["abs_error_g"]
        nc = block.get("no_contact_run")
        if group == "no_contact" and nc:
            for method, name in (("model", "model rollout"), ("model_causal", "model causal")):
                if method in nc:
                    row[f"{prefix}false contacts (%), {name}"] = 100 * nc[method][
                        "false_contact_rate"]
                    row[f"{prefix}mean ‖f̂‖ (N), {name}"] = nc[method]["mean_force_norm"]
    return row


def interval_rows(score_files: Sequence[Path], level: float = NOMINAL_LEVEL
                  ) -> tuple[list[dict[str, float | None]], dict[str, Any] | None]:
    """The force interval of a cross-validation, calibrated by pooling out-of-fold episodes:
    for fold f the conformal scale (:func:`nactuator.uncertainty.cross_fold_coverage`,
    the episode as the unit) comes from the held-out episodes of every other fold, each
    scored by its own fold's model, and is judged on fold f's held-out episodes (coverage,
    mean width, contact / no-contact coverage). When the score files hold the gate, the
    same again with gate-conditional scales (rows "…, by gate"). Also the scale pooled over
    all folds (what `nactuator calibrate-intervals --scale` gives the recipe's final model;
    ``pooled["by_gate"]`` the pair for ``--scale … --contact-scale …``). ([], None) when a
    fold has no scores (a model without the uncertainty head)."""
    from nactuator.eval.intervals import load_scores

    if not score_files or not all(Path(p).is_file() for p in score_files):
        return [], None
    folds = [load_scores(p) for p in score_files]
    scores = [[e["scores"] for e in fold] for fold in folds]
    gates = [[e["gate_contact"] for e in fold] for fold in folds]
    have_gate = all(g is not None for fold in gates for g in fold)
    variants = [("", cross_fold_coverage(scores, level))]
    if have_gate:
        variants.append((", by gate", cross_fold_coverage(scores, level, gates)))
    rows: list[dict[str, float | None]] = [{} for _ in folds]
    for suffix, lofo in variants:
        for row, fold, cal in zip(rows, folds, lofo, strict=True):
            if cal["by_gate"] is None:
                row[f"interval scale (σ), out-of-fold{suffix}"] = cal["scale"]
            else:
                row[f"interval scale, gate closed (σ), out-of-fold{suffix}"] = cal["scale"]
                row[f"interval scale, gate open (σ), out-of-fold{suffix}"] = \
                    cal["by_gate"]["contact"]
            row[f"interval coverage (%), out-of-fold{suffix}"] = (
                None if cal["coverage"] is None else 100 * cal["coverage"])
            if cal["scale"] is None:
                continue
            per = np.concatenate([
                np.broadcast_to(scale_per_element(cal["scale"], e["gate_contact"],
                                                  cal["by_gate"]), e["scores"].shape)
                for e in fold])
            flat = np.concatenate([e["scores"] for e in fold])
            sigma = np.concatenate([e["sigma"] for e in fold])
            contact = np.concatenate([e["contact"] for e in fold])
            row[f"interval width (N), out-of-fold{suffix}"] = float(np.mean(2 * per * sigma))
            for name, keep in (("contact", contact), ("no contact", ~contact)):
                row[f"interval coverage (%), {name}, out-of-fold{suffix}"] = (
                    float(100 * np.mean(flat[keep] <= per[keep])) if keep.any() else None)
    everyone = [s for fold in scores for s in fold]
    pooled = conformal_scale(everyone, level)
    per_fold = float(np.mean([len(fold) for fold in scores]))
    pooled["episodes_per_fold"] = per_fold
    pooled["episode_sd"] = _episode_spread(everyone, None, level)
    if have_gate:
        gated = [g for fold in gates for g in fold]
        fits = gate_scales(everyone, gated, level)
        pooled["by_gate"] = {"free": fits["free"]["scale"], "contact": fits["contact"]["scale"]}
        pooled["episode_sd_by_gate"] = _episode_spread(everyone, gated, level)
    return rows, pooled


def _episode_spread(scores: Sequence[np.ndarray], gates: Sequence[np.ndarray] | None,
                    level: float) -> float | None:
    """The sd (points) of the episodes' own coverage at the scale (or gate scales) that
    covers ``level`` on average, without the finite-sample correction (which at n = 9
    covers every element and leaves no spread to see): how far one fold's coverage moves
    by the draw of its episodes alone is this over √(episodes a fold). None for one episode."""
    if len(scores) < 2:
        return None
    if gates is None:
        scale = conformal_scale(scores, level, finite_sample=False)["scale"]
        each = episode_coverage(scores, scale)
    else:
        fits = gate_scales(scores, gates, level, finite_sample=False)
        by_gate = {k: fits[k]["scale"] for k in ("free", "contact")}
        each = np.array([np.mean(np.asarray(s) <= scale_per_element(by_gate["free"], g, by_gate))
                         for s, g in zip(scores, gates, strict=True)])
    return float(np.std(100 * each, ddof=1))


def summarize_folds(rows: Sequence[dict[str, float | None]]) -> dict[str, dict[str, Any]]:
    """Per metric: the per-fold values and their mean, sd (n − 1), min and max. A fold
    whose value is missing (e.g. a diverged rollout) makes the summary None, not hidden."""
    keys = [k for k in rows[0]] + [k for r in rows[1:] for k in r if k not in rows[0]]
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        values = [r.get(key) for r in rows]
        known = [v for v in values if v is not None and math.isfinite(v)]
        complete = len(known) == len(values)
        out[key] = {
            "folds": values,
            "mean": float(np.mean(known)) if complete else None,
            "sd": float(np.std(known, ddof=1)) if complete and len(known) > 1 else None,
            "min": float(min(known)) if known else None,
            "max": float(max(known)) if known else None,
        }
    return out


def cv_verdict(table: dict[str, dict[str, Any]]) -> str:
    """The verdict line of a selection's fold means against the trivial references."""
    def mean(key: str) -> float | None:
        return (table.get(key) or {}).get("mean")

    figures: dict[str, float] = {}
    pairs = (("joints_deg", "arm mean (deg), model"),
             ("joints_command_deg", "arm mean (deg), command following"),
             ("force_n", "force 3-axis (N), model rollout"),
             ("force_reference_n", "force 3-axis (N), linear regression"))
    for name, key in pairs:
        if mean(key) is not None:
            figures[name] = mean(key)
    if "joints_command_deg" not in figures:
        figures.pop("joints_deg", None)
    if "force_reference_n" not in figures:
        figures.pop("force_n", None)
    line = verdict(figures, "linear regression")
    return line + (" — the model is no better than a trivial reference" if is_worse(figures)
                   else "")


def _fmt(x: float | None, digits: int) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def markdown_summary(summary: dict[str, dict[str, dict]], header: list[str]) -> str:
    lines = header + [""]
    for selection, table in summary.items():
        lines += [f"## checkpoint `{selection}`", "",
                  "| metric | mean ± sd | min | max | per fold |", "|---|---|---|---|---|"]
        for key, s in table.items():
            digits = 1 if "%" in key else 3 if "(N)" in key else 2
            per_fold = ", ".join(_fmt(v, digits) for v in s["folds"])
            lines.append(f"| {key} | {_fmt(s['mean'], digits)} ± {_fmt(s['sd'], digits)} | "
                         f"{_fmt(s['min'], digits)} | {_fmt(s['max'], digits)} | {per_fold} |")
        lines.append("")
    return "\n".join(lines)


# Headline metrics of cv.png: (key stem in the summary, panel title, y-axis label).
PLOT_PANELS = (("arm mean (deg)", "joints: arm mean", "mean joint error [deg]"),
               ("worst arm joint (deg)", "joints: worst arm joint", "worst joint error [deg]"),
               ("force 3-axis (N)", "force: 3-axis MAE", "force MAE [N]"))


def plot_summary(summary: dict[str, dict[str, dict]], path: Path) -> Path:
    """``cv.png``: :func:`summary_figure` as a PNG."""
    return write_png(path, summary_figure(summary), dpi=110)


def summary_figure(summary: dict[str, dict[str, dict]]) -> Any:
    """The headline metrics, one panel each: every fold as a dot (one colour per fold in
    every panel; folds are independent, so no lines join them) and mean ± sd in black, per
    method (model and references). Returns a matplotlib ``Figure``."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure  # no pyplot: the caller's backend stays as it was

    selection = "best" if "best" in summary else next(iter(summary))
    table = summary[selection]
    folds = max(len(s["folds"]) for s in table.values())
    colour = colormaps["tab10"]
    fig = Figure(figsize=(4.8 * len(PLOT_PANELS), 4.6))
    axes = fig.subplots(1, len(PLOT_PANELS), squeeze=False)[0]
    for ax, (stem, title, ylabel) in zip(axes, PLOT_PANELS, strict=True):
        rows = [(key.split(", ", 1)[1], s) for key, s in table.items()
                if key.startswith(stem + ", ")]
        spread = np.linspace(-0.2, 0.2, folds) if folds > 1 else np.zeros(1)
        for x, (_, s) in enumerate(rows):
            for f, v in enumerate(s["folds"]):
                if v is not None and math.isfinite(v):
                    ax.scatter(x - 0.1 + spread[f], v, s=24, color=colour(f % 10), zorder=3,
                               label=f"fold {f}" if x == 0 else None)
            mean, sd = s.get("mean"), s.get("sd")
            if mean is None:
                ax.annotate("no mean:\na fold has no value", (x, 0), ha="center",
                            va="bottom", fontsize=7, xycoords=("data", "axes fraction"))
                continue
            ax.errorbar(x + 0.28, mean, yerr=sd or 0.0, fmt="_", color="k", markersize=14,
                        capsize=4, lw=1.2, zorder=4)
            text = f"{mean:.3g} ± {sd:.2g}" if sd is not None else f"{mean:.3g}"
            ax.annotate(text, (x + 0.28, mean + (sd or 0.0)), xytext=(0, 3),
                        textcoords="offset points", fontsize=7, ha="center", va="bottom")
        ax.set_xticks(range(len(rows)), [m.replace(" ", "\n", 1) for m, _ in rows], fontsize=8)
        ax.set_xlim(-0.6, len(rows) - 0.3)
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.08)  # room for the top label
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="y", labelsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(folds, 10), fontsize=8,
                   frameon=False, title="held-out fold (dots); black: mean ± sd over folds",
                   title_fontsize=8)
    fig.suptitle(f"cross-validation, checkpoint `{selection}`: {folds} fold(s)", fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def run_cv(platform: str, data: str | Sequence[str], folds: int | None = None,
           max_folds: int | None = None, jobs: int = 1, out: str | os.PathLike = "runs/cv",
           extra_args: Sequence[str] = (), backend: Backend | None = None) -> str:
    """Cross-validate ``nactuator train --platform platform --data data [extra_args]``.

    Writes ``cv.json``, ``cv.md`` and ``cv.png`` into ``out`` (plus one folder per fold);
    returns ``cv.md``. ``max_folds`` runs only the first folds (a quicker, noisier look).
    The folds run on ``backend`` (default: ``jobs`` local jobs; see
    :mod:`nactuator.distributed`).
    """
    from nactuator.progress import progress_bar

    name = load_platform(platform).name
    paths = [str(p) for p in dataset_paths(data, CVError)]
    k = folds if folds is not None else default_folds(paths)
    chosen = list(range(k if max_folds is None else min(k, max_folds)))
    backend = backend or make_backend("local", jobs=jobs)
    out = Path(out).resolve()  # a Ray task may start in another folder
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    done = {f: s for f in chosen if (s := _finished(out / f"fold_{f}")) is not None}
    todo = [f for f in chosen if f not in done]
    with progress_bar(total=len(chosen), desc=f"cv {name} ({k} folds)", unit="fold") as bar:
        bar.update(len(done))
        calls = [(name, paths, k, f, out, list(extra_args)) for f in todo]
        for i, scores in run_all(backend, _run_fold, calls):
            done[todo[i]] = scores
            bar.update(1)
    summary, pooled_scales = {}, {}
    for selection in done[chosen[0]]:
        rows = [fold_row(json.loads(done[f][selection].read_text())) for f in chosen]
        extra, pooled = interval_rows([done[f][selection].parent / "uncertainty_scores.npz"
                                       for f in chosen])
        for row, more in zip(rows, extra, strict=False):
            row.update(more)
        if pooled is not None:
            pooled_scales[selection] = pooled
        summary[selection] = summarize_folds(rows)
    header = [f"# Cross-validation: {name}, {len(chosen)} of {k} folds", "",
              f"- data: {', '.join(f'`{p}`' for p in paths)}; folds by episode "
              "(nactuator.data.folds: episode j of each task in group j % k; fold f holds out "
              "group f, validates on group f + 1, trains on the rest)",
              f"- recipe: `nactuator train --platform {name}` "
              + (f"`{' '.join(extra_args)}`" if extra_args else "(defaults)"),
              "- scores: `nactuator eval` on the held-out episodes, whole episodes, mean over "
              "tasks; sd over folds (n − 1)",
              f"- wall time {time.perf_counter() - t0:.0f} s with {backend.describe()}"
              + (f" ({len(chosen) - len(todo)} fold(s) from an earlier run)"
                 if len(todo) < len(chosen) else "")]
    header.append(f"- verdict (`best`, mean over folds): {cv_verdict(summary['best'])}")
    for selection, pooled in pooled_scales.items():
        header.append(
            f"- force interval (`{selection}`): each fold's conformal scale from the other "
            f"folds' held-out episodes (out-of-fold, the episode as the unit); pooled over "
            f"all {pooled['episodes']} held-out episodes: {pooled['scale']:.3f} σ "
            f"(`nactuator calibrate-intervals --ckpt CKPT --scale {pooled['scale']:.3f}`)"
            + ("" if pooled["guarantee"] else "; fewer than 9 episodes: no finite-sample "
               "guarantee")
            + ("" if "by_gate" not in pooled else
               f"; by gate {pooled['by_gate']['free']:.3f} σ closed, "
               f"{pooled['by_gate']['contact']:.3f} σ open (`--scale "
               f"{pooled['by_gate']['free']:.3f} --contact-scale "
               f"{pooled['by_gate']['contact']:.3f}`)"))
        if pooled.get("episode_sd") is not None:
            k = pooled["episodes_per_fold"]
            spread = [(pooled["episode_sd"], "")]
            if pooled.get("episode_sd_by_gate") is not None:
                spread.append((pooled["episode_sd_by_gate"], " (by gate)"))
            header.append(
                f"  - at the scale that covers {100 * pooled['level']:g} % on average, the "
                "held-out episodes' own coverage varies by "
                + ", ".join(f"{sd:.1f} points{what}" for sd, what in spread)
                + f" (sd): with {k:.1f} episodes a fold, the draw of its episodes alone moves "
                "a fold's coverage by about "
                + ", ".join(f"±{sd / math.sqrt(k):.1f}{what}" for sd, what in spread)
                + " points")
    train_s = train_times([out / f"fold_{f}" for f in chosen])
    header.append("- training per fold (the `train` child; CPU = user + sys): "
                  + "; ".join(f"{what} {_fmt(s['mean'], 0)} ± {_fmt(s['sd'], 0)} s "
                              f"({', '.join(_fmt(v, 0) for v in s['folds'])})"
                              for what, s in (("CPU", train_s["cpu"]),
                                              ("wall", train_s["wall"]))))
    text = markdown_summary(summary, header)
    write_json(out / "cv.json", {"platform": name, "data": paths, "folds": k,
                                 "scored_folds": chosen, "extra_args": list(extra_args),
                                 "backend": backend.describe(), "train_s": train_s,
                                 "interval_scale_pooled": pooled_scales, "summary": summary})
    write_text(out / "cv.md", text)
    plot_summary(summary, out / "cv.png")
    return text
