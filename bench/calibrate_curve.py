"""Held-out error against minutes recorded and against weights used, on SO-101 (or OMX) arms
the pretraining never saw (issue 26 item 3): the shipped bundle adapted as `calibrate-arm`
adapts it (optimiser steps scaled to the minutes, conf/calibrate/so101.yaml), the same
recipe and steps from scratch, the bundle as shipped, command following, and the linear
force regression fitted on the same runs.

    PYTHONPATH=src .venv/bin/python bench/calibrate_curve.py --out runs/calibrate-curve
    # the same design on OpenManipulator-X worlds (conf/calibrate/omx.yaml's steps)
    PYTHONPATH=src .venv/bin/python bench/calibrate_curve.py \
        --config conf/bench/calibrate_curve_omx.yaml --out runs/calibrate-curve-omx

The design is conf/bench/calibrate_curve.yaml: one world outside the pretraining's
randomisation (conf/world/so101_worn.yaml), one arm per seed; data from `data synth` (not
through the emulated bus: recording is real time). Per seed, the held-out set is the test
runs of every task of every weight set, the same for every point; the test runs of
``unseen_weights_g`` (weights no point trains on) are scored apart, with the linear
regression fitted on the same N runs. Resumable: a finished
point (``seed_S/points/*.json``) is not run again, and an interrupted fine-tune is resumed
by `adapt` itself. Writes curve.json, curve.md and curve.png into --out.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from nactuator.atomic import write_json, write_png, write_text
from nactuator.child import run_nactuator
from nactuator.data import read_dataset
from nactuator.errors import UserError
from nactuator.experiments.adapt import EpisodeRef, write_subset
from nactuator.paths import conf_dir, project_root
from nactuator.platforms import load_platform

KEYS = {"joints": "arm mean (deg), model", "command following": "arm mean (deg), command following",
        "force": "force 3-axis (N), model rollout",
        "linear": "force 3-axis (N), linear regression"}
CONFIG_KEYS = {"platform", "pretrained", "world", "protocol", "seeds", "run_seconds",
               "trajectories_per_task", "empty_task", "weight_tasks", "unseen_weights_g",
               "curves", "first_pass_max_minutes"}


def load_config(path: Path) -> dict[str, Any]:
    """conf/bench/calibrate_curve.yaml, checked: a wrong key names the file and the key."""
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise UserError(f"{path}: cannot read the curve design ({err})") from err
    if not isinstance(cfg, dict) or set(cfg) != CONFIG_KEYS:
        got = sorted(cfg) if isinstance(cfg, dict) else type(cfg).__name__
        raise UserError(f"{path}: expected the keys {sorted(CONFIG_KEYS)}, got {got}")
    if set(cfg["curves"]) != {"minutes", "weights"}:
        raise UserError(f"{path}: curves: expected 'minutes' and 'weights', got "
                        f"{sorted(cfg['curves'])}")
    return cfg


def set_key(section: dict[str, Any], item: str) -> None:
    """``KEY=VALUE`` (``--set``): ``section[k1][k2]... = yaml(VALUE)``, mappings made on the way."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. model.loss.w_force=120")
    *path, last = key.split(".")
    for k in path:
        section = section.setdefault(k, {})
        if not isinstance(section, dict):
            raise UserError(f"--set {item!r}: {k!r} is not a mapping in the recipe")
    section[last] = yaml.safe_load(value)


def tasks_for(weights: list[int], cfg: dict[str, Any]) -> list[str]:
    """The tasks recorded with these weights: each weight's tasks, then the empty gripper."""
    return [t.format(g=g) for g in weights for t in cfg["weight_tasks"]] + [cfg["empty_task"]]


def unseen_tasks(cfg: dict[str, Any]) -> list[str]:
    """The tasks of the weights no point trains on (scored apart: `measure`)."""
    return [t.format(g=g) for g in cfg["unseen_weights_g"] for t in cfg["weight_tasks"]]


def plan_points(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (seed, weights, minutes) point, in the order measured: each seed's minutes curve
    up to ``first_pass_max_minutes``, then each seed's weights curve, then the rest."""
    mc, wc = cfg["curves"]["minutes"], cfg["curves"]["weights"]
    first, later = [], []
    for seed in cfg["seeds"]:
        for m in mc["minutes"]:
            item = {"seed": seed, "weights": sorted(mc["weights_g"]), "minutes": float(m),
                    "with_scratch": bool(mc["scratch"])}
            (first if m <= cfg["first_pass_max_minutes"] else later).append(item)
    weights = []
    for seed in cfg["seeds"]:
        for ws in wc["weight_sets"]:
            item = {"seed": seed, "weights": sorted(ws), "minutes": float(wc["minutes"]),
                    "with_scratch": bool(wc["scratch"])}
            if not any(_key(p) == _key(item) for p in first + later):
                weights.append(item)
    return first + weights + later


def _key(p: dict[str, Any]) -> str:
    return f"s{p['seed']}_w{'-'.join(map(str, p['weights']))}_m{p['minutes']:g}"


def synth(cfg: dict[str, Any], seed: int, tasks: list[str], folder: Path) -> Path:
    """`data synth` of every task the curves use, once per seed (kept for a rerun)."""
    data = folder / "synth"
    folder.mkdir(parents=True, exist_ok=True)
    if not (data / "meta" / "info.json").is_file():
        code = run_nactuator(["data", "synth", "--platform", cfg["platform"], "--world",
                              cfg["world"], "--seed", str(seed), "--out", str(data),
                              "--trajectories-per-task", str(cfg["trajectories_per_task"]),
                              "--seconds", str(cfg["run_seconds"]), "--tasks", *tasks],
                             folder / "synth.log")
        if code != 0:
            raise UserError(f"data synth failed, see {folder / 'synth.log'}")
    return data


def split_pools(synth_dir: Path, folder: Path, weight_sets: list[list[int]],
                cfg: dict[str, Any]) -> tuple[Path, dict[str, Path]]:
    """The held-out dataset (the test runs of every task) and, per weight set, a dataset of
    the train runs of its tasks only: `adapt` on [pool, held_out] fine-tunes on the first N
    of the pool (interleaved over its tasks) and scores on the held-out runs."""
    unseen = set(unseen_tasks(cfg))
    wanted = {"held_out": ("test", lambda task: task not in unseen)}
    if unseen:
        wanted["held_out_unseen"] = ("test", unseen.__contains__)
    for ws in weight_sets:
        wanted["pool_" + "-".join(map(str, ws))] = ("train", set(tasks_for(ws, cfg)).__contains__)
    paths = {name: folder / name for name in wanted}
    ds = None
    for name, (split, keep) in wanted.items():
        if not (paths[name] / "meta" / "info.json").is_file():
            ds = ds or read_dataset(synth_dir)
            runs = runs_of(ds, split, keep)
            write_subset(paths[name], load_platform(ds.platform), ds.fps,
                         train=runs if split == "train" else [],
                         test=runs if split == "test" else [])
    return paths.pop("held_out"), paths  # paths: the pools and "held_out_unseen" if any


def runs_of(ds: Any, split: str, keep: Any = lambda task: True) -> list[tuple[Any, Any]]:
    """(reference, episode) of dataset ``ds``'s ``split`` runs whose task ``keep`` accepts,
    as `adapt`'s subset writer takes them."""
    return [(EpisodeRef(str(ds.root), ep.index, ep.task, ep.split), ep)
            for ep in ds.episodes if ep.split == split and keep(ep.task)]


def _metrics(row: dict[str, Any]) -> dict[str, float | None]:
    out = {}
    for k, v in KEYS.items():
        x = row.get(v)
        out[k] = None if x is None or not math.isfinite(x) else float(x)
    return out


def with_test_runs(train_data: Path, test_data: Path, out: Path) -> Path:
    """A dataset of ``train_data``'s train runs and ``test_data``'s test runs: `eval` on it
    scores the test runs and fits the linear regression on the train runs."""
    if not (out / "meta" / "info.json").is_file():
        train, test = read_dataset(train_data), read_dataset(test_data)
        write_subset(out, load_platform(train.platform), train.fps,
                     train=runs_of(train, "train"), test=runs_of(test, "test"))
    return out


def measure(point: dict[str, Any], cfg: dict[str, Any], folder: Path, held: Path, pool: Path,
            adapt_cfg: Path, per_epoch: int, steps_override: int | None,
            held_unseen: Path | None = None) -> dict[str, Any]:
    """One point: adapt the shipped bundle on the first N runs of ``pool``, and (if asked)
    the same recipe and steps from scratch; both scored on ``held``, the adapted model also
    on ``held_unseen`` (weights no point trains on)."""
    from nactuator.eval import evaluate
    from nactuator.experiments.adapt import adapt
    from nactuator.experiments.cv import fold_row
    from nactuator.guide.calibrate import fit_horizon
    from nactuator.guide.protocol import adapt_steps, load_protocol

    proto = load_protocol(cfg["platform"], project_root() / cfg["protocol"])
    n = max(1, round(point["minutes"] * 60.0 / cfg["run_seconds"]))
    seconds = n * cfg["run_seconds"]
    steps = steps_override or adapt_steps(seconds, proto)
    epochs = max(1, math.ceil(steps / per_epoch))
    train_cfg = yaml.safe_load(adapt_cfg.read_text())["train"]
    frames = math.floor(cfg["run_seconds"] * load_platform(cfg["platform"]).fps)
    horizon = fit_horizon(train_cfg["data"]["horizon"], frames)
    extra = [f"--trainer.max_epochs={epochs}", f"--data.horizon={horizon}"]
    wdir = folder / ("w" + "-".join(map(str, point["weights"])))
    adapt_out = wdir / "adapt"
    t = time.perf_counter()
    adapt(cfg["pretrained"], [str(pool), str(held)], episodes=[n], out=adapt_out,
          held_out="test", held_out_runs=0, config=adapt_cfg, extra_args=extra)
    adapt_wall = time.perf_counter() - t
    res = json.loads((adapt_out / "adapt.json").read_text())
    base, tuned = res["points"][0], res["points"][-1]
    row = {**point, "runs": n, "record_minutes": seconds / 60.0, "steps": epochs * per_epoch,
           "held_out": res["held_out"]["episodes"],
           "pretrained": _metrics(base["metrics"]), "adapted": _metrics(tuned["metrics"]),
           "adapt_fit_s": tuned["fit_s"], "adapt_fit_cpu_s": tuned.get("fit_cpu_s"),
           "adapt_total_s": adapt_wall}
    subset = adapt_out / "data" / f"n_{n:03d}"  # the N runs `adapt` fine-tuned on
    if held_unseen is not None:
        unseen = with_test_runs(subset, held_unseen, adapt_out / "data" / f"unseen_n_{n:03d}")
        scored = adapt_out / f"eval_unseen_n_{n:03d}"
        if not (scored / "metrics.json").is_file():
            evaluate(Path(tuned["checkpoint"]), unseen, split="test", out=scored)
        row["adapted_unseen"] = _metrics(fold_row(json.loads((scored / "metrics.json")
                                                             .read_text())))
    if point["with_scratch"]:
        # From scratch: the same recipe, steps and N runs, without init_from.
        run_dir = wdir / "scratch" / f"n_{n:03d}"
        if not (run_dir / "done.json").is_file():
            shutil.rmtree(run_dir, ignore_errors=True)  # a cut-off run starts again whole
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            code = run_nactuator(["train", "--platform", cfg["platform"], "--data", str(subset),
                                  "--config", str(adapt_out / "adapt_train.yaml"),
                                  f"--trainer.default_root_dir={run_dir}", "--logger", "csv",
                                  "--trainer.enable_progress_bar=false", *extra],
                                 run_dir.parent / f"n_{n:03d}.log")
            if code != 0:
                raise UserError(f"scratch training failed, see {run_dir.parent}/n_{n:03d}.log")
            write_json(run_dir / "done.json", {"extra": extra})
        last = sorted(run_dir.rglob("ft-epoch=*.ckpt"))[-1]
        clock = json.loads((run_dir / "clock.json").read_text())["epochs"][-1]
        evaluate(last, subset, split="test", out=run_dir / "eval")
        row["scratch"] = _metrics(fold_row(json.loads((run_dir / "eval" /
                                                       "metrics.json").read_text())))
        row["scratch_fit_s"], row["scratch_fit_cpu_s"] = clock["seconds"], clock.get(
            "cpu_seconds")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/calibrate-curve")
    ap.add_argument("--config", default=str(conf_dir() / "bench" / "calibrate_curve.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", help="replaces the config's seeds")
    ap.add_argument("--minutes", type=float, nargs="+", help="replaces the minutes curve's")
    ap.add_argument("--weight-sets", nargs="+", metavar="G,G",
                    help="replaces the weights curve's sets, e.g. 200 200,400")
    ap.add_argument("--weights-minutes", type=float, help="the weights curve's minutes")
    ap.add_argument("--minutes-weights", metavar="G,G",
                    help="replaces the minutes curve's weights, e.g. 200,300,400")
    ap.add_argument("--run-seconds", type=float, help="replaces the config's run length")
    ap.add_argument("--trajectories-per-task", type=int)
    ap.add_argument("--steps", type=int, help="fixed optimiser steps (tests), not scaled")
    ap.add_argument("--adapt-config", metavar="YAML",
                    help="replaces the protocol's adapt config (its `train` section is the "
                         "fine-tuning recipe; the steps stay the protocol's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="sets one key of the recipe's `train` section (a YAML value), e.g. "
                         "model.loss.w_force=120; repeatable")
    ap.add_argument("--no-scratch", action="store_true",
                    help="adapted from the shipped bundle only (no from-scratch column)")
    ap.add_argument("--only", choices=["first", "all"], default="all",
                    help="first: stop after the first pass (conf first_pass_max_minutes)")
    a = ap.parse_args(argv)
    cfg = load_config(Path(a.config))
    if a.seeds:
        cfg["seeds"] = a.seeds
    if a.minutes:
        cfg["curves"]["minutes"]["minutes"] = a.minutes
    if a.weight_sets:
        cfg["curves"]["weights"]["weight_sets"] = [[int(g) for g in s.split(",")]
                                                   for s in a.weight_sets]
    if a.weights_minutes:
        cfg["curves"]["weights"]["minutes"] = a.weights_minutes
    if a.minutes_weights:
        cfg["curves"]["minutes"]["weights_g"] = [int(g) for g in a.minutes_weights.split(",")]
    if a.no_scratch:
        cfg["curves"]["minutes"]["scratch"] = cfg["curves"]["weights"]["scratch"] = False
    if a.run_seconds:
        cfg["run_seconds"] = a.run_seconds
    if a.trajectories_per_task:
        cfg["trajectories_per_task"] = a.trajectories_per_task
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    from nactuator.experiments.adapt import load_adapt_config
    from nactuator.guide.calibrate import _adapt_config
    from nactuator.guide.protocol import load_protocol

    proto = load_protocol(cfg["platform"], project_root() / cfg["protocol"])
    adapt_cfg = load_adapt_config(Path(a.adapt_config) if a.adapt_config
                                  else project_root() / proto["adapt"]["config"])
    for item in a.set:
        set_key(adapt_cfg["train"], item)
    adapt_path = _adapt_config(adapt_cfg, out / "adapt-config.yaml")
    per_epoch = (adapt_cfg["train"]["data"]["samples_per_epoch"]
                 // adapt_cfg["train"]["data"]["batch_size"])
    points = plan_points(cfg)
    if a.only == "first":
        points = [p for p in points if p["minutes"] <= cfg["first_pass_max_minutes"]]
    weight_sets = sorted({tuple(p["weights"]) for p in points})
    all_tasks = sorted({t for ws in weight_sets for t in tasks_for(list(ws), cfg)}
                       | set(unseen_tasks(cfg)))
    rows = []
    for p in points:
        folder = out / f"seed_{p['seed']}"
        done = folder / "points" / f"{_key(p)}.json"
        if done.is_file():
            rows.append(json.loads(done.read_text()))
            continue
        data = synth(cfg, p["seed"], all_tasks, folder)
        held, pools = split_pools(data, folder, [list(ws) for ws in weight_sets], cfg)
        row = measure(p, cfg, folder, held, pools["pool_" + "-".join(map(str, p["weights"]))],
                      adapt_path, per_epoch, a.steps, pools.get("held_out_unseen"))
        write_json(done, row)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"config": cfg, "rows": rows, "summary": summarize(rows, cfg),
              "command": " ".join(["PYTHONPATH=src .venv/bin/python", "bench/calibrate_curve.py",
                                   *(argv if argv is not None else sys.argv[1:])]),
              "wall_s": time.perf_counter() - t0}
    write_json(out / "curve.json", result)
    text = table(result)
    write_text(out / "curve.md", text)
    plot(result, out / "curve.png")
    print(text)
    return 0


# ------------------------------------------------------------------------ summary


def _spread(values: list[float | None]) -> dict[str, Any]:
    xs = [v for v in values if v is not None]
    if not xs:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize(rows: list[dict[str, Any]], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (weights, minutes): mean and range over the seeds of every column."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((tuple(r["weights"]), r["minutes"]), []).append(r)
    out = []
    for (ws, m), rs in sorted(groups.items(), key=lambda kv: (len(kv[0][0]), kv[0][0], kv[0][1])):
        s = {"weights": list(ws), "minutes": m, "seeds": [r["seed"] for r in rs],
             "runs": rs[0]["runs"], "steps": rs[0]["steps"],
             "record_minutes": rs[0]["record_minutes"]}
        for model in ("adapted", "scratch", "pretrained", "adapted_unseen"):
            for k in KEYS:
                s[f"{model}/{k}"] = _spread([r.get(model, {}).get(k) for r in rs])
        for k in ("adapt_fit_s", "adapt_fit_cpu_s", "scratch_fit_s", "scratch_fit_cpu_s"):
            s[k] = _spread([r.get(k) for r in rs])
        s["joint_reduction_vs_shipped"] = _spread([
            1 - r["adapted"]["joints"] / r["pretrained"]["joints"] for r in rs])
        s["force_ratio_vs_linear"] = _spread([
            r["adapted"]["force"] / r["adapted"]["linear"] for r in rs
            if r["adapted"]["linear"]])
        s["unseen_force_ratio_vs_linear"] = _spread([
            r["adapted_unseen"]["force"] / r["adapted_unseen"]["linear"] for r in rs
            if r.get("adapted_unseen", {}).get("linear")])
        out.append(s)
    return out


def _ms(s: dict[str, Any], d: int) -> str:
    """mean (min–max) over seeds; the mean alone with one seed."""
    if s["mean"] is None:
        return "—"
    if s["n"] == 1:
        return f"{s['mean']:.{d}f}"
    return f"{s['mean']:.{d}f} ({s['min']:.{d}f}–{s['max']:.{d}f})"


def table(r: dict[str, Any]) -> str:
    lines = ["| weights g | minutes | runs | steps | seeds | joints ° adapted | from scratch | "
             "as shipped | command following | force N adapted | from scratch | as shipped | "
             "linear regression | adapt fit CPU s | unseen weights: force N adapted | "
             "linear regression |", "|---" * 16 + "|"]
    for s in r["summary"]:
        lines.append(
            f"| {'+'.join(map(str, s['weights']))} | {s['record_minutes']:.2f} | {s['runs']} | "
            f"{s['steps']} | {len(s['seeds'])} | {_ms(s['adapted/joints'], 2)} | "
            f"{_ms(s['scratch/joints'], 2)} | {_ms(s['pretrained/joints'], 2)} | "
            f"{_ms(s['adapted/command following'], 2)} | {_ms(s['adapted/force'], 3)} | "
            f"{_ms(s['scratch/force'], 3)} | {_ms(s['pretrained/force'], 3)} | "
            f"{_ms(s['adapted/linear'], 3)} | {_ms(s['adapt_fit_cpu_s'], 0)} | "
            f"{_ms(s['adapted_unseen/force'], 3)} | {_ms(s['adapted_unseen/linear'], 3)} |")
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    mc = r["config"]["curves"]["minutes"]
    fig = Figure(figsize=(12, 8))
    axes = fig.subplots(2, 2)
    curve = [s for s in r["summary"] if s["weights"] == sorted(mc["weights_g"])]
    by_w = {}
    for s in r["summary"]:
        if s["minutes"] == float(r["config"]["curves"]["weights"]["minutes"]):
            by_w[len(s["weights"])] = s
    wsets = [by_w[k] for k in sorted(by_w)]
    series = (("adapted", "o-", "C0"), ("scratch", "s--", "C1"), ("pretrained", ":", "C2"))
    for row, (metric, ref, ref_label, what) in enumerate((
            ("joints", "command following", "command following",
             "held-out joint error, arm mean (°)"),
            ("force", "linear", "linear regression, same runs",
             "held-out force error, 3-axis MAE (N)"))):
        for col, (points, xs, xlabel) in enumerate((
                (curve, [s["record_minutes"] for s in curve], "minutes recorded"),
                (wsets, [len(s["weights"]) for s in wsets], "weights used"))):
            ax = axes[row][col]
            labels = {"adapted": "adapted from the shipped bundle",
                      "scratch": "same steps from scratch", "pretrained": "shipped bundle as is"}
            items = [(f"{model}/{metric}", style, color, labels[model])
                     for model, style, color in series]
            items.append((f"adapted/{ref}", "-.", "k", ref_label))
            if metric == "force":  # the weights no point trains on, scored apart
                unseen = ", ".join(map(str, r["config"].get("unseen_weights_g", [])))
                items += [("adapted_unseen/force", "o:", "C3",
                           f"adapted, on weights not used ({unseen} g)"),
                          ("adapted_unseen/linear", "x:", "0.4",
                           f"linear regression, on weights not used ({unseen} g)")]
            for key, style, color, label in items:
                if not points or any(s.get(key, {}).get("mean") is None for s in points):
                    continue  # a series measured at only some of the panel's points
                mean = [s[key]["mean"] for s in points]
                lo = [s[key]["min"] if s[key]["min"] is not None else math.nan for s in points]
                hi = [s[key]["max"] if s[key]["max"] is not None else math.nan for s in points]
                ax.plot(xs, mean, style, color=color, label=label)
                ax.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0)
            if col == 0:
                ax.set_xscale("log")
                ax.set_xticks(xs, [f"{x:.2g}" for x in xs])
                ax.minorticks_off()
            else:
                ax.set_xticks(xs, ["+".join(map(str, s["weights"])) + " g" for s in points])
            ax.set_xlabel(xlabel if col == 0 else
                          f"{xlabel} ({points[0]['record_minutes']:.1f} min)" if points else xlabel)
            ax.set_ylabel(what)
            ax.set_yscale("log")  # from scratch at 1 min is several times the rest
            ax.legend(fontsize=7)
    seeds = r["config"]["seeds"]
    arm = {"so101": "SO-101", "omx": "OpenManipulator-X"}.get(r["config"]["platform"],
                                                              r["config"]["platform"])
    fig.suptitle(f"{arm} arms outside the pretraining's randomisation ({r['config']['world']}, "
                 f"seeds {', '.join(map(str, seeds))}): mean, band = range over seeds", fontsize=10)
    fig.tight_layout()
    write_png(path, fig, dpi=90)


if __name__ == "__main__":
    raise SystemExit(main())
