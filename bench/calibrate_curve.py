"""Held-out error against minutes recorded on an SO-101 the pretraining never saw (issue 26
item 3, a first, small measurement): the shipped bundle adapted as `calibrate-arm` adapts it
(steps scaled to the minutes), the same recipe and steps from scratch, and the linear force
regression fitted on the same runs.

    PYTHONPATH=src .venv/bin/python bench/calibrate_curve.py --out runs/calibrate-curve

The arm: conf/world/so101_worn.yaml (servo parameters outside the pretraining's
randomisation), seed 7; data from `data synth` (not through the emulated bus: recording is
real time), the calibrate protocol's kinds of runs: lift-and-hold and pick-and-place with
200 g and 400 g, and pick-and-place empty, 11 s each; the test split (one run per task)
is held out. Writes curve.json, curve.md and curve.png into --out.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from nactuator.atomic import write_json, write_png, write_text
from nactuator.child import run_nactuator
from nactuator.experiments.adapt import adapt
from nactuator.experiments.cv import fold_row
from nactuator.guide.calibrate import fit_horizon
from nactuator.guide.protocol import adapt_steps, load_protocol

TASKS = ["go_up_and_stay_still_200g", "go_up_and_stay_still_400g", "pick_and_place_200g",
         "pick_and_place_400g", "pick_and_place_empty"]
KEYS = {"joints": "arm mean (deg), model", "command following": "arm mean (deg), command following",
        "force": "force 3-axis (N), model rollout",
        "linear": "force 3-axis (N), linear regression"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/calibrate-curve")
    ap.add_argument("--runs", type=int, nargs="+", default=[1, 5, 20])
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    out = Path(a.out)
    data = out / "data"
    (out / "scratch").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not (data / "meta" / "info.json").is_file():
        code = run_nactuator(["data", "synth", "--platform", "so101", "--world",
                              "conf/world/so101_worn.yaml", "--seed", str(a.seed), "--out",
                              str(data), "--trajectories-per-task", "6", "--tasks", *TASKS],
                             out / "synth.log")
        assert code == 0, f"synth failed, see {out / 'synth.log'}"
    proto = load_protocol("so101")
    cfg_path = out / "adapt-config.yaml"
    from nactuator.experiments.adapt import load_adapt_config
    from nactuator.guide.calibrate import _adapt_config

    cfg = load_adapt_config()
    _adapt_config(cfg, cfg_path)
    per_epoch = cfg["train"]["data"]["samples_per_epoch"] // cfg["train"]["data"]["batch_size"]
    rows = []
    for n in a.runs:
        minutes = n * 11.0 / 60.0
        steps = adapt_steps(minutes * 60, proto)
        epochs = max(1, math.ceil(steps / per_epoch))
        horizon = fit_horizon(cfg["train"]["data"]["horizon"], 600)
        extra = [f"--trainer.max_epochs={epochs}", f"--data.horizon={horizon}"]
        t = time.perf_counter()
        adapt("pretrained/so101", str(data), episodes=[n], out=out / "adapt", held_out="test",
              config=cfg_path, extra_args=extra)
        res = json.loads((out / "adapt" / "adapt.json").read_text())
        base, tuned = res["points"][0]["metrics"], res["points"][-1]["metrics"]
        adapt_s = time.perf_counter() - t
        # From scratch: the same recipe and steps on the same N runs, without init_from.
        subset = out / "adapt" / "data" / f"n_{n:03d}"
        run_dir = out / "scratch" / f"n_{n:03d}"
        last = sorted(run_dir.rglob("ft-epoch=*.ckpt"))
        t = time.perf_counter()
        if not last:
            code = run_nactuator(["train", "--platform", "so101", "--data", str(subset),
                                  "--config", str(out / "adapt" / "adapt_train.yaml"),
                                  f"--trainer.default_root_dir={run_dir}", "--logger", "csv",
                                  "--trainer.enable_progress_bar=false", *extra],
                                 run_dir.parent / f"n_{n:03d}.log")
            assert code == 0, f"scratch training failed, see {run_dir.parent}"
            last = sorted(run_dir.rglob("ft-epoch=*.ckpt"))
        scratch_s = time.perf_counter() - t
        from nactuator.eval import evaluate

        evaluate(last[-1], subset, split="test", out=run_dir / "eval")
        scratch = fold_row(json.loads((run_dir / "eval" / "metrics.json").read_text()))
        rows.append({"runs": n, "minutes": minutes, "steps": epochs * per_epoch,
                     "weights": _weights(res["points"][-1]["episodes"]),
                     "pretrained": {k: base.get(v) for k, v in KEYS.items()},
                     "adapted": {k: tuned.get(v) for k, v in KEYS.items()},
                     "scratch": {k: scratch.get(v) for k, v in KEYS.items()},
                     "adapt_s": adapt_s, "scratch_s": scratch_s})
        print(json.dumps(rows[-1]), flush=True)
    result = {"world": "conf/world/so101_worn.yaml", "seed": a.seed, "tasks": TASKS,
              "held_out": res["held_out"]["episodes"], "rows": rows,
              "command": " ".join(["PYTHONPATH=src .venv/bin/python", *sys.argv]),
              "wall_s": time.perf_counter() - t0}
    write_json(out / "curve.json", result)
    write_text(out / "curve.md", table(result))
    plot(result, out / "curve.png")
    print(table(result))
    return 0


def _weights(labels: list[str]) -> list[str]:
    """The payloads among the runs trained on ("data#3 (pick_and_place_200g)" -> "200g")."""
    tasks = [label.rsplit("(", 1)[1].rstrip(")") for label in labels]
    return sorted({t.rsplit("_", 1)[1] for t in tasks if t.endswith("g")})


def _f(x, d):
    return "—" if x is None else f"{x:.{d}f}"


def table(r) -> str:
    lines = ["| runs | minutes | steps | joints ° adapted | scratch | pretrained as is | "
             "command following | force N adapted | scratch | pretrained as is | "
             "linear regression |", "|---" * 11 + "|"]
    for x in r["rows"]:
        a, s, p = x["adapted"], x["scratch"], x["pretrained"]
        lines.append(f"| {x['runs']} | {x['minutes']:.2f} | {x['steps']} | "
                     f"{_f(a['joints'], 2)} | {_f(s['joints'], 2)} | {_f(p['joints'], 2)} | "
                     f"{_f(a['command following'], 2)} | {_f(a['force'], 3)} | "
                     f"{_f(s['force'], 3)} | {_f(p['force'], 3)} | {_f(a['linear'], 3)} |")
    return "\n".join(lines) + "\n"


def plot(r, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    ax_j, ax_f = fig.subplots(1, 2)
    m = [x["minutes"] for x in r["rows"]]
    for key, style in (("adapted", "o-"), ("scratch", "s--"), ("pretrained", ":")):
        ax_j.plot(m, [x[key]["joints"] for x in r["rows"]], style, label=key)
        ax_f.plot(m, [x[key]["force"] for x in r["rows"]], style, label=key)
    ax_j.plot(m, [x["adapted"]["command following"] for x in r["rows"]], "k-.",
              label="command following")
    ax_f.plot(m, [x["adapted"]["linear"] for x in r["rows"]], "k-.", label="linear regression")
    for ax, what in ((ax_j, "held-out joint error, arm mean (°)"),
                     (ax_f, "held-out force error, 3-axis MAE (N)")):
        ax.set_xscale("log")
        ax.set_xticks(m, [f"{x:.2g}" for x in m])
        ax.minorticks_off()
        ax.set_xlabel("minutes recorded on the unseen arm")
        ax.set_ylabel(what)
        ax.legend(fontsize=8)
    fig.suptitle("SO-101 world outside the pretraining's randomisation (so101_worn, seed 7)")
    fig.tight_layout()
    write_png(path, fig, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
