"""``nactuator adapt``: fine-tune a pretrained checkpoint on N new episodes, and measure it.

The paper's online adaptation: a model pretrained elsewhere (another arm, other tasks, a
synthetic world) is fine-tuned on a few trajectories of the new arm or task, its backbone's
learning rate scaled down (``model.backbone_lr_scale``), and judged on trajectories it never
saw. This module runs that for a list of N (default 1, 2, 4, 8) and writes the curve of
held-out error vs N and vs fine-tuning wall time.

Top to bottom:

1. **Plan** (:func:`plan_episodes`): the held-out episodes are a split of the data (``test``
   if it has one, else ``validation``) plus, optionally, the last ``held_out_runs`` train runs
   of each task; the fine-tuning pool is the remaining train runs, interleaved over tasks
   (run 1 of every task, then run 2, ...), so the N = 2 set contains the N = 1 set.
2. **Data**: for each N a small nactuator dataset ``data/n_NNN`` holds the first N pool episodes
   (train) and the held-out episodes (test, never read by training); ``data/held_out``
   holds only the held-out episodes.
3. **Fine-tune**: ``nactuator train --platform P --data data/n_NNN --config <the train
   section of conf/train/adapt.yaml> --model.init_from=CKPT [extra args]`` in a subprocess
   (one torch thread), no validation (nothing to select on: the last epoch is the result),
   a checkpoint after every epoch, and ``training.callbacks.AdaptClock`` writing each
   epoch's wall time.
4. **Score** with the evaluation protocol (:func:`nactuator.eval.evaluate`, split ``test``):
   the checkpoint itself as N = 0, the last epoch of every N, and every epoch of the
   ``time_curve`` runs (error vs seconds of fine-tuning).
5. **Write** ``adapt.json`` (every figure and command), ``adapt.md`` and ``adapt.png``.

The fine-tunes run one at a time by default (their wall time is a result: side by side on
one machine they slow each other), ``--jobs`` at a time, or as Ray tasks on a cluster
(``--backend ray``, :mod:`nactuator.distributed`); scoring runs here, after them. A
fine-tune whose result exists (same command) is not run again, so an interrupted ``adapt``
continues where it stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nactuator.atomic import write_json, write_png, write_text
from nactuator.child import run_nactuator
from nactuator.data.episodes import open_datasets
from nactuator.data.schema import Episode
from nactuator.distributed import Backend, make_backend, run_all
from nactuator.errors import UserError
from nactuator.model_files import resolve_model_path
from nactuator.platforms import conf_dir
from nactuator.training.callbacks import CLOCK_FILE

__all__ = ["DEFAULT_CONFIG", "AdaptError", "EpisodeRef", "adapt", "load_adapt_config",
           "plan_episodes", "write_subset"]

DEFAULT_CONFIG = conf_dir() / "train" / "adapt.yaml"
EPOCH_CKPT_GLOB = "ft-epoch=*.ckpt"
TIME_CURVES = ("largest", "all", "none")
HELD_OUT = ("auto", "test", "validation")
_ADAPT_KEYS = {"episodes", "metric", "time_curve", "held_out", "held_out_runs"}


class AdaptError(UserError, ValueError):
    """``adapt`` cannot run with these inputs; the message says which and why."""


# --------------------------------------------------------------------------- config


def load_adapt_config(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """``conf/train/adapt.yaml`` (or ``path``): ``{"adapt": {...}, "train": {...}}``.

    ``adapt`` holds the driver's settings, ``train`` a LightningCLI config applied on top of
    ``conf/base.yaml`` and ``conf/train/<platform>.yaml`` for every fine-tune."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise AdaptError(f"{path}: cannot read the adapt config ({err.strerror})") from err
    except yaml.YAMLError as err:
        raise AdaptError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(raw, dict) or set(raw) != {"adapt", "train"}:
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise AdaptError(f"{path}: expected exactly the sections 'adapt' and 'train', got {keys}")
    settings, train = raw["adapt"], raw["train"]
    if not isinstance(settings, dict) or not isinstance(train, dict):
        raise AdaptError(f"{path}: 'adapt' and 'train' must be mappings")
    unknown = sorted(set(settings) - _ADAPT_KEYS)
    missing = sorted(_ADAPT_KEYS - set(settings))
    if unknown or missing:
        raise AdaptError(f"{path}: adapt: unknown key(s) {unknown}, missing {missing}; "
                         f"expected {sorted(_ADAPT_KEYS)}")
    _check_counts(settings["episodes"], f"{path}: adapt.episodes")
    if settings["time_curve"] not in TIME_CURVES:
        raise AdaptError(f"{path}: adapt.time_curve must be one of {list(TIME_CURVES)}, got "
                         f"{settings['time_curve']!r}")
    if settings["held_out"] not in HELD_OUT:
        raise AdaptError(f"{path}: adapt.held_out must be one of {list(HELD_OUT)}, got "
                         f"{settings['held_out']!r}")
    runs = settings["held_out_runs"]
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 0:
        raise AdaptError(f"{path}: adapt.held_out_runs must be an integer >= 0, got {runs!r}")
    if not isinstance(settings["metric"], str):
        raise AdaptError(f"{path}: adapt.metric must be a metric name such as "
                         f"'arm mean (deg), model', got {settings['metric']!r}")
    return {"adapt": dict(settings), "train": dict(train), "source": str(path)}


def _check_counts(values: Any, where: str) -> list[int]:
    if (not isinstance(values, list | tuple) or not values
            or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values)):
        raise AdaptError(f"{where}: expected a non-empty list of positive integers (the "
                         f"numbers of fine-tuning trajectories), got {values!r}")
    return sorted(set(values))


# ----------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class EpisodeRef:
    dataset: str
    index: int
    task: str
    split: str

    def label(self) -> str:
        return f"{Path(self.dataset).name}#{self.index} ({self.task})"


@dataclass(frozen=True)
class Plan:
    """Which episodes fine-tune (``pool``, in the order N takes them) and which score."""

    pool: list[tuple[EpisodeRef, Episode]]
    held_out: list[tuple[EpisodeRef, Episode]]
    held_out_split: str
    held_out_runs: int


def plan_episodes(datasets: Sequence[Any], held_out: str = "auto",
                  held_out_runs: int = 0) -> Plan:
    """Split the episodes of ``datasets`` (``read_dataset`` results) into the fine-tuning
    pool and the held-out set (see the module docstring)."""
    episodes = [(EpisodeRef(str(ds.root), ep.index, ep.task, ep.split), ep)
                for ds in datasets for ep in ds.episodes]
    if held_out == "auto":
        held_out = "test" if any(r.split == "test" for r, _ in episodes) else "validation"
    if held_out not in ("test", "validation"):
        raise AdaptError(f"held-out split must be one of {list(HELD_OUT)}, got {held_out!r}")
    held = [(r, ep) for r, ep in episodes if r.split == held_out]
    by_task: dict[str, list[tuple[EpisodeRef, Episode]]] = {}
    for r, ep in episodes:
        if r.split == "train":
            by_task.setdefault(r.task, []).append((r, ep))
    if held_out_runs:
        for task, runs in by_task.items():
            if len(runs) <= held_out_runs:
                raise AdaptError(f"task {task!r} has {len(runs)} train run(s); holding out "
                                 f"{held_out_runs} would leave none to fine-tune on")
            held += runs[-held_out_runs:]
            by_task[task] = runs[:-held_out_runs]
    pool = [runs[j] for j in range(max((len(r) for r in by_task.values()), default=0))
            for runs in by_task.values() if j < len(runs)]
    roots = sorted({str(ds.root) for ds in datasets})
    if not held:
        raise AdaptError(f"{', '.join(roots)}: no {held_out} episodes to score on; choose "
                         "--held-out, or hold train runs out with --held-out-runs")
    if not pool:
        raise AdaptError(f"{', '.join(roots)}: no train episodes left to fine-tune on")
    return Plan(pool, held, held_out, held_out_runs)


def write_subset(root: Path, platform: Any, fps: float, train: Sequence[tuple],
                 test: Sequence[tuple]) -> Path:
    """A nactuator dataset of ``train`` (split train) and ``test`` (split test) episodes."""
    from nactuator.data import DatasetWriter

    if root.exists():
        shutil.rmtree(root)
    tmp = root.with_name(f".{root.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    metadata = {"adapt_subset": {"train": [r.label() for r, _ in train],
                                 "test": [r.label() for r, _ in test]}}
    with DatasetWriter(tmp, platform, fps=fps, metadata=metadata) as writer:
        for split, items in (("train", train), ("test", test)):
            for ref, ep in items:
                meta = {k: v for k, v in ep.meta.items() if k != "split"}
                meta["adapt_source"] = {"dataset": ref.dataset, "episode_index": ref.index,
                                        "split": ref.split}
                writer.add_episode(dict(ep.frames), ep.task, split, episode_meta=meta)
    os.replace(tmp, root)
    return root


# -------------------------------------------------------------------- fine-tuning


def _run(args: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    code = run_nactuator(args, log)
    if code != 0:
        raise AdaptError(f"fine-tuning failed with exit code {code}; its output is in {log}")
    return time.perf_counter() - t0


def _epoch_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in run_dir.rglob(EPOCH_CKPT_GLOB):
        epoch = path.stem.removeprefix("ft-epoch=").split("-")[0]
        if epoch.isdigit():
            found.append((int(epoch), path))
    return sorted(found)


def _fine_tune(n: int, platform: str, data: Path, ckpt: Path, train_config: Path, out: Path,
               extra_args: Sequence[str]) -> dict[str, Any]:
    """Fine-tune on ``data`` (its N train episodes); reuse a finished run of the same command."""
    run_dir = out / f"n_{n:03d}"
    args = ["train", "--platform", platform, "--data", str(data), "--config", str(train_config),
            f"--model.init_from={ckpt}", f"--trainer.default_root_dir={run_dir}",
            "--logger", "csv", "--trainer.enable_progress_bar=false", *extra_args]
    command = ["-m", "nactuator.cli", *args]  # what done.json records (as before)
    done = run_dir / "done.json"
    if done.is_file():
        record = json.loads(done.read_text())
        if record.get("command") == command and _epoch_checkpoints(run_dir):
            return record
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    process_s = _run(args, run_dir / "train.log")
    clock = json.loads((run_dir / CLOCK_FILE).read_text())["epochs"]
    if not _epoch_checkpoints(run_dir):
        raise AdaptError(f"{run_dir}: fine-tuning left no {EPOCH_CKPT_GLOB} (the train "
                         "config must keep a checkpoint per epoch); see train.log")
    record = {"command": command, "process_s": process_s, "fit_s": clock[-1]["seconds"],
              "fit_cpu_s": clock[-1].get("cpu_seconds"), "clock": clock}
    write_json(done, record)
    return record


# ------------------------------------------------------------------------ scoring


def _score(ckpt: Path, data: Path, out: Path) -> dict[str, Any]:
    """``nactuator eval`` of ``ckpt`` on the test split of ``data`` (reused if present)."""
    from nactuator.eval import evaluate
    from nactuator.experiments.cv import fold_row

    metrics = out / "metrics.json"
    stamp = out / "checkpoint.txt"
    key = f"{ckpt.resolve()} {ckpt.stat().st_mtime_ns}"
    if not (metrics.is_file() and stamp.is_file() and stamp.read_text() == key):
        evaluate(ckpt, data, split="test", out=out)
        write_text(stamp, key)
    return fold_row(json.loads(metrics.read_text()))


def _reduction(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before <= 0:
        return None
    return 1.0 - after / before


# ------------------------------------------------------------------------- report


def _fmt(x: float | None, digits: int) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _digits(key: str) -> int:
    return 1 if "%" in key else 3 if "(N)" in key else 2


# The columns of adapt.md (those the evaluation produced); adapt.json has every figure.
COLUMNS = (
    "arm mean (deg), model", "worst arm joint (deg), model",
    "arm mean (deg), command following",
    "force 3-axis (N), model rollout", "force 3-axis (N), model causal",
    "force 3-axis (N), linear regression",
    "contact/force 3-axis (N), model rollout", "contact/force 3-axis (N), linear regression",
    "no_contact/force 3-axis (N), model rollout", "no_contact/false contacts (%), model rollout",
)


def markdown_report(result: dict[str, Any]) -> str:
    metric = result["metric"]
    points = result["points"]
    keys = [k for k in COLUMNS if any(k in p["metrics"] for p in points)]
    lines = [f"# Adaptation: {result['platform']}, `{result['checkpoint']}`", "",
             f"- data: {', '.join(f'`{p}`' for p in result['data'])}",
             f"- held out ({len(result['held_out']['episodes'])} episodes, never fine-tuned "
             f"on): split `{result['held_out']['split']}`"
             + (f" + the last {result['held_out']['runs']} train run(s) of each task"
                if result["held_out"]["runs"] else "")
             + ": " + ", ".join(result["held_out"]["episodes"]),
             f"- fine-tuning pool, in the order N takes it: {', '.join(result['pool'])}",
             f"- recipe: `{result['config']['source']}` (train section) "
             + (f"+ `{' '.join(result['extra_args'])}`" if result["extra_args"] else ""),
             "- scores: `nactuator eval` on the held-out episodes, whole episodes, mean over "
             "tasks; N = 0 is the checkpoint as given; the linear regression is fitted on the "
             "same N episodes",
             f"- headline metric: **{metric}**", "",
             "| N | fine-tune s | process s | reduction of headline | "
             + " | ".join(keys) + " |",
             "|---" * (4 + len(keys)) + "|"]
    for p in points:
        cells = [str(p["n"]), _fmt(p.get("fit_s"), 0), _fmt(p.get("process_s"), 0),
                 "—" if p["reduction"] is None else f"{100 * p['reduction']:.0f} %"]
        cells += [_fmt(p["metrics"].get(k), _digits(k)) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    if result["time_curve"]:
        lines += ["", f"Error vs fine-tuning wall time ({metric}):", "",
                  "| N | epoch | step | seconds | " + metric + " | reduction |",
                  "|---|---|---|---|---|---|"]
        for t in result["time_curve"]:
            lines.append(f"| {t['n']} | {t['epoch']} | {t['step']} | {t['seconds']:.0f} | "
                         f"{_fmt(t['value'], _digits(metric))} | "
                         + ("—" if t["reduction"] is None else f"{100 * t['reduction']:.0f} %")
                         + " |")
    lines += ["", "Adapted checkpoints: " + ", ".join(
        f"N = {p['n']}: `{p['checkpoint']}`" for p in points if p["n"] > 0),
        f"Wall time of this `adapt`: {result['wall_time_s']:.0f} s"
        + (f", the fine-tunes on {result['backend']}." if result.get("backend") else "."), ""]
    return "\n".join(lines)


def plot_curves(result: dict[str, Any], path: Path) -> Path:
    from matplotlib.figure import Figure  # no pyplot: the caller's backend stays as it was

    metric = result["metric"]
    points = result["points"]
    fig = Figure(figsize=(11, 4))
    a, b = fig.subplots(1, 2)
    ns = [p["n"] for p in points]
    a.plot(ns, [p["metrics"].get(metric) for p in points], "o-", label="model")
    reference = metric.rsplit(", ", 1)[0] + ", command following"
    if any(reference in p["metrics"] for p in points):
        a.plot(ns, [p["metrics"].get(reference) for p in points], "s--", label="command following")
    a.set_xscale("symlog", linthresh=1)
    a.set_xticks(ns, [str(n) for n in ns])
    a.set_xlabel("fine-tuning trajectories N (0 = pretrained checkpoint)")
    a.set_ylabel(metric)
    a.set_title("held-out error vs N")
    a.legend(fontsize=8)
    base = points[0]["metrics"].get(metric)
    for n in sorted({t["n"] for t in result["time_curve"]}):
        curve = [t for t in result["time_curve"] if t["n"] == n]
        b.plot([0.0] + [t["seconds"] for t in curve], [base] + [t["value"] for t in curve],
               "o-", label=f"N = {n}")
    b.set_xlabel("fine-tuning wall time (s)")
    b.set_ylabel(metric)
    b.set_title("held-out error vs wall time")
    if result["time_curve"]:
        b.legend(fontsize=8)
    fig.tight_layout()
    return write_png(path, fig, dpi=110)


# ------------------------------------------------------------------------- driver


def adapt(ckpt: str | os.PathLike, data: str | Sequence[str], episodes: Sequence[int] | None = None,
          out: str | os.PathLike = "runs/adapt", held_out: str | None = None,
          held_out_runs: int | None = None, config: str | os.PathLike | None = None,
          extra_args: Sequence[str] = (), backend: Backend | None = None) -> str:
    """Fine-tune ``ckpt`` on N trajectories of ``data`` for each N of ``episodes`` and score
    every result on the held-out episodes; returns ``adapt.md`` (also writes ``adapt.json``
    and ``adapt.png`` into ``out``). ``episodes``, ``held_out`` and ``held_out_runs``
    default to the ``adapt`` section of ``config`` (``conf/train/adapt.yaml``); the
    fine-tunes run on ``backend`` (default: one local job at a time)."""
    from nactuator.models import load_actuator
    from nactuator.platforms import load_platform
    from nactuator.progress import progress_bar

    t0 = time.perf_counter()
    backend = backend or make_backend("local")
    cfg = load_adapt_config(config)
    settings = cfg["adapt"]
    counts = _check_counts(list(episodes) if episodes is not None else settings["episodes"],
                           "--episodes")
    held_split = held_out if held_out is not None else settings["held_out"]
    runs = held_out_runs if held_out_runs is not None else settings["held_out_runs"]
    ckpt = resolve_model_path(ckpt).resolve()  # `pretrained/NAME` names a shipped bundle
    _, meta = load_actuator(ckpt)
    platform = load_platform(meta["platform"])
    datasets = open_datasets(data, platform, owner=f"the checkpoint {ckpt}", error=AdaptError)
    plan = plan_episodes(datasets, held_split, runs)
    too_many = [n for n in counts if n > len(plan.pool)]
    if too_many:
        raise AdaptError(f"--episodes {too_many}: only {len(plan.pool)} trajectories are left "
                         f"to fine-tune on ({len(plan.held_out)} held out)")

    out = Path(out).resolve()  # a Ray task may start in another folder
    out.mkdir(parents=True, exist_ok=True)
    train_config = out / "adapt_train.yaml"
    write_text(train_config, "# the `train` section of " + cfg["source"] + "\n"
               + yaml.safe_dump(cfg["train"], sort_keys=False))
    fps = datasets[0].fps
    held_data = write_subset(out / "data" / "held_out", platform, fps, [], plan.held_out)
    curve_ns = {"largest": counts[-1:], "all": counts, "none": []}[settings["time_curve"]]
    metric = settings["metric"]

    points: list[dict[str, Any]] = []
    time_curve: list[dict[str, Any]] = []
    with progress_bar(total=2 * len(counts) + 1, desc=f"adapt {platform.name}",
                      unit="step") as bar:
        bar.set_postfix_str("scoring the checkpoint (N = 0)")
        base = _score(ckpt, held_data, out / "n_000" / "eval")
        if metric not in base:
            raise AdaptError(f"adapt.metric {metric!r} is not a figure of this evaluation; "
                             f"available: {sorted(base)}")
        points.append({"n": 0, "episodes": [], "checkpoint": str(ckpt), "metrics": base,
                       "reduction": None})
        bar.update(1)
        subsets = {n: write_subset(out / "data" / f"n_{n:03d}", platform, fps,
                                    plan.pool[:n], plan.held_out) for n in counts}
        bar.set_postfix_str(f"fine-tuning N = {', '.join(map(str, counts))} on "
                            f"{backend.describe()}")
        calls = [(n, platform.name, subsets[n], ckpt, train_config, out, list(extra_args))
                 for n in counts]
        tuned: dict[int, dict[str, Any]] = {}
        for i, run in run_all(backend, _fine_tune, calls):
            tuned[counts[i]] = run
            bar.set_postfix_str(f"fine-tuned N = {counts[i]} ({run['fit_s']:.0f} s)")
            bar.update(1)
        for n in counts:
            run = tuned[n]
            epochs = _epoch_checkpoints(out / f"n_{n:03d}")
            clock = {c["epoch"]: c for c in run["clock"]}
            bar.set_postfix_str(f"scoring N = {n}")
            for epoch, path in epochs if n in curve_ns else epochs[-1:]:
                row = _score(path, subsets[n], out / f"n_{n:03d}" / "eval" / f"epoch_{epoch:03d}")
                if n in curve_ns:
                    time_curve.append({"n": n, "epoch": epoch, "step": clock[epoch]["step"],
                                       "seconds": clock[epoch]["seconds"],
                                       "value": row.get(metric),
                                       "reduction": _reduction(base[metric], row.get(metric))})
            points.append({"n": n, "episodes": [r.label() for r, _ in plan.pool[:n]],
                           "checkpoint": str(epochs[-1][1]), "metrics": row,
                           "fit_s": run["fit_s"], "fit_cpu_s": run.get("fit_cpu_s"),
                           "process_s": run["process_s"],
                           "reduction": _reduction(base[metric], row.get(metric))})
            bar.set_postfix_str(f"N = {n}: {metric} {_fmt(row.get(metric), _digits(metric))}")
            bar.update(1)

    result = {
        "checkpoint": str(ckpt), "platform": platform.name,
        "data": [str(ds.root) for ds in datasets],
        "held_out": {"split": plan.held_out_split, "runs": plan.held_out_runs,
                     "episodes": [r.label() for r, _ in plan.held_out]},
        "pool": [r.label() for r, _ in plan.pool], "config": cfg,
        "extra_args": list(extra_args), "metric": metric, "points": points,
        "time_curve": time_curve, "wall_time_s": time.perf_counter() - t0,
        "backend": backend.describe(),
    }
    text = markdown_report(result)
    write_json(out / "adapt.json", result)
    write_text(out / "adapt.md", text)
    plot_curves(result, out / "adapt.png")
    return text
