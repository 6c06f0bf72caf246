"""``nactuator bench-bam``: the counterfactual actuator on BAM's XL330 pendulum logs.

BAM's own benchmark, like for like (``../shared/data/bam/README.md`` "How BAM scores a
model"): train on the logs recorded at firmware gains kp 100, 200 and 400, then, for each
held-out kp 800 log, reset the simulator to the log's first sample (position *and* speed),
roll out open loop for the whole 6 s from the commands alone (goal, torque enable, the gain)
and score the mean |q_sim - q_real| over every 5 ms sample of the log; the benchmark figure is
the mean over the logs, in mrad. No recorded telemetry enters the rollout: the checkpoint
must be a counterfactual one (its supply voltage is the one read at the log's first sample).

The logs are imported from the raw files onto BAM's processed grid (t = 0, 5 ms, ...;
:func:`nactuator.data.importers.read_bam_log` ``grid="bam"``), which reproduces BAM's
``processed/`` positions and goals, so the trivial anchors below come out exactly as
measured with BAM's tools: q = goal 501.7 mrad, hold the initial position 573.8 mrad.

Steps: import (``<out>/data``), train with ``conf/bench/bam.yaml`` in a subprocess
(``nactuator fit``, ``<out>/train``), score (``bench.json``, ``bench.md``, ``bench_kp800.png``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nactuator.atomic import json_safe, write_json, write_png, write_text
from nactuator.child import run_nactuator
from nactuator.data import Episode
from nactuator.data.episodes import filter_episode
from nactuator.data.importers import import_bam
from nactuator.errors import UserError
from nactuator.eval.episodes import load_episodes
from nactuator.models import load_actuator
from nactuator.platforms import conf_dir, load_platform
from nactuator.rollout import rollout_episodes

__all__ = ["BAM_ANCHORS", "BENCH_SPLITS", "BenchError", "bam_mae", "bench_bam", "score_bam"]

# BAM's protocol: hold out every log of one gain (--validation_kp 800).
BENCH_SPLITS = {100: "train", 200: "train", 400: "train", 800: "test"}
# Held-out kp 800, mrad, measured with BAM's own fitting (CMA-ES) on the same split (issue 13).
BAM_ANCHORS = {
    "BAM M1-M6 (identified friction models, held out)": (88.7, 93.4),
    "BAM M4": (89.3, 89.3),
}
TARGET_MRAD = 45.0  # half of BAM's best identified model


class BenchError(UserError, RuntimeError):
    """The benchmark cannot run; the message says why."""


def bam_mae(q_pred: np.ndarray, q_real: np.ndarray) -> float:
    """BAM's per-log score: mean |q_pred - q_real| over every sample of the log [rad]."""
    q_pred, q_real = np.asarray(q_pred, np.float64), np.asarray(q_real, np.float64)
    if q_pred.shape != q_real.shape:
        raise ValueError(f"prediction {q_pred.shape} and log {q_real.shape} differ in shape")
    return float(np.abs(q_pred - q_real).mean())


def _trivial(ep: Episode) -> dict[str, np.ndarray]:
    """The two reference predictors of BAM's table, from the commands and the first sample."""
    q = ep.frames["q"][:, 0].astype(np.float64)
    return {"q = goal": ep.frames["q_cmd"][:, 0].astype(np.float64),
            "hold initial position": np.full_like(q, q[0])}


def rollout_logs(actuator, sim, episodes: Sequence[Episode]) -> list[np.ndarray]:
    """Open-loop rollouts of whole logs from each log's first sample (position and speed),
    commands only: per episode the simulated q (T,) including the start sample."""
    r = rollout_episodes(actuator, sim.step, [ep.frames for ep in episodes],
                         start_velocity="recorded", device=sim.device)
    return [r.q[j, : ep.length, 0].cpu().numpy().astype(np.float64)
            for j, ep in enumerate(episodes)]


def _plot(episodes: Sequence[Episode], sims: Sequence[np.ndarray], scores: Sequence[float],
          path: Path) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 2.1 * len(episodes) + 0.6))
    axes = fig.subplots(len(episodes), 1, squeeze=False)[:, 0]
    for ax, ep, q_sim, score in zip(axes, episodes, sims, scores, strict=True):
        t = np.arange(ep.length) * 0.005
        ax.plot(t, ep.frames["q_cmd"][:, 0], color="0.6", lw=0.8, ls="--", label="goal")
        ax.plot(t, ep.frames["q"][:, 0], color="k", lw=1.1, label="recorded (kp 800)")
        ax.plot(t, q_sim, color="tab:red", lw=1.1, label="ours, open loop")
        ax.set_title(f"{ep.task}: MAE {1000 * score:.1f} mrad", fontsize=9)
        ax.set_ylabel("q [rad]", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("time [s]", fontsize=8)
    fig.tight_layout()
    return write_png(path, fig)


def _markdown(result: dict) -> str:
    rows = result["per_log"]
    lines = [
        "# BAM XL330 benchmark: held-out kp 800, open loop from the initial state",
        "",
        f"checkpoint `{result['checkpoint']}` ({result['mode']} mode), "
        f"{len(rows)} logs, BAM's metric (mean |q_sim - q_real| per log, mean over logs).",
        "",
        "| predictor | " + " | ".join(r["trajectory"] for r in rows) + " | mean [mrad] |",
        "|---|" + "---|" * (len(rows) + 1),
    ]
    for name in ["ours", *result["trivial"]]:
        per = [r[name] for r in rows]
        mean = result["ours_mrad"] if name == "ours" else result["trivial"][name]
        lines.append(f"| {name} | " + " | ".join(f"{x:.1f}" for x in per) + f" | {mean:.1f} |")
    for name, (lo, hi) in BAM_ANCHORS.items():
        span = f"{lo:.1f}" if lo == hi else f"{lo:.1f}-{hi:.1f}"
        lines.append(f"| {name} |" + " |" * len(rows) + f" {span} |")
    verdict = "met" if result["ours_mrad"] <= TARGET_MRAD else "NOT met"
    lines += ["", f"Target <= {TARGET_MRAD:.0f} mrad: {verdict} "
              f"({result['ours_mrad']:.1f} mrad). Plot: `{result['plot']}`."]
    return "\n".join(lines) + "\n"


def score_bam(ckpt: str | os.PathLike, data: str | os.PathLike, out: str | os.PathLike,
              split: str = "test", device: str = "cpu") -> dict:
    """Score a counterfactual checkpoint on the ``split`` logs of an imported BAM dataset;
    writes ``bench.json``, ``bench.md`` and ``bench_kp800.png`` into ``out``."""
    from nactuator.sim import Simulator

    out = Path(out)
    actuator, meta = load_actuator(ckpt, map_location=device, expect_platform="pendulum")
    if actuator.mode != "counterfactual":
        raise BenchError(f"{ckpt} reads recorded telemetry ({actuator.inputs}); BAM's protocol "
                         "rolls out from the commands alone: train a counterfactual model "
                         "(docs/counterfactual.md)")
    platform = load_platform("pendulum")
    episodes = sorted(load_episodes(data, platform, split), key=lambda e: e.meta.get("source", ""))
    if not episodes:
        raise BenchError(f"{data}: no {split} logs to score")
    # The model's inputs through its input filters, as in training; scored on the raw log.
    model_view = [filter_episode(ep, meta["input_filters"]) for ep in episodes]
    sims = rollout_logs(actuator, Simulator(platform, device=device), model_view)
    per_log = []
    for ep, q_sim in zip(episodes, sims, strict=True):
        q = ep.frames["q"][:, 0]
        row = {"trajectory": ep.task, "kp": ep.meta.get("kp"), "source": ep.meta.get("source"),
               "samples": ep.length, "ours": 1000 * bam_mae(q_sim, q)}
        row.update({k: 1000 * bam_mae(v, q) for k, v in _trivial(ep).items()})
        per_log.append(row)
    plot = _plot(episodes, sims, [r["ours"] / 1000 for r in per_log], out / "bench_kp800.png")
    result = {
        "checkpoint": str(ckpt),
        "mode": actuator.mode,
        "features": meta.get("features"),
        "physics": (actuator.physics.parameters_si() if actuator.physics is not None else None),
        "data": str(data),
        "split": split,
        "ours_mrad": float(np.mean([r["ours"] for r in per_log])),
        "trivial": {k: float(np.mean([r[k] for r in per_log])) for k in _trivial(episodes[0])},
        "bam_anchors_mrad": {k: list(v) for k, v in BAM_ANCHORS.items()},
        "target_mrad": TARGET_MRAD,
        "per_log": per_log,
        "plot": plot.name,
    }
    result = json_safe(result)
    write_json(out / "bench.json", result)
    write_text(out / "bench.md", _markdown(result))
    return result


def _check_bench_data(data: Path) -> None:
    """A reused ``<out>/data`` must be the bench's import: BAM's grid and kp splits."""
    from nactuator.data import read_dataset

    for ep in read_dataset(data).episodes:
        kp = ep.meta.get("kp")
        if ep.meta.get("grid") != "bam" or BENCH_SPLITS.get(kp) != ep.split:
            raise BenchError(
                f"{data}: episode {ep.index} ({ep.meta.get('source')}, kp {kp}, split "
                f"{ep.split}, grid {ep.meta.get('grid')}) is not the bench's import (BAM grid, "
                f"splits {BENCH_SPLITS}); remove {data} or choose another --out")


def _train(data: Path, root: Path, config: Path, extra: Sequence[str]) -> Path:
    """``nactuator fit`` with the bench config in a subprocess; returns its last.ckpt."""
    args = ["fit", "--config", str(config),
               "--platform", "pendulum", f"--data.paths=[\"{data}\"]",
               f"--trainer.default_root_dir={root}", *extra]
    root.mkdir(parents=True, exist_ok=True)
    log = root / "train.log"
    print("[bench-bam] nactuator " + " ".join(args) + f"  (log: {log})", flush=True)
    code = run_nactuator(args, log)
    if code != 0:
        raise BenchError(f"training failed (exit {code}); see {log}")
    found = sorted(root.rglob("last.ckpt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise BenchError(f"{root}: training left no last.ckpt (see {log})")
    return found[-1]


def bench_bam(src: str | os.PathLike, out: str | os.PathLike, ckpt: str | None = None,
              config: str | os.PathLike | None = None, extra_args: Sequence[str] = (),
              device: str = "cpu") -> str:
    """Import, train (unless ``ckpt``), score; returns the markdown table."""
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    data = out / "data"
    if not data.exists():
        print(import_bam(src, data, splits=BENCH_SPLITS, grid="bam"), flush=True)
    _check_bench_data(data)
    if ckpt is None:
        config = Path(config) if config else conf_dir() / "bench" / "bam.yaml"
        ckpt = str(_train(data, out / "train", config, extra_args))
    result = score_bam(ckpt, data, out, device=device)
    print(f"[bench-bam] {time.perf_counter() - t0:.0f} s; wrote {out / 'bench.md'}", flush=True)
    return _markdown(result)
