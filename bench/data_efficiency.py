"""Data efficiency of the joint-wise model (issue 22): held-out rollout error vs trajectories
per task, whole-arm transformer against joint-wise, spread by cross-validation.

For each N a dataset holds the first N + 2 train/validation episodes of every task of one
synthetic dataset; ``nactuator cv --folds N + 2`` then trains every fold on N episodes per task,
selects its checkpoint on one more, and scores the last one (never seen) with
``nactuator eval`` (full-trajectory rollout, replaying the recorded telemetry). Both
architectures see the same folds, the same recipe and the same number of gradient steps;
only ``model.arch`` (and its sizes) differ. ``--archs jointwise jointwise_next_state``
compares the joint-wise model's two dynamics (simulator torque vs DexNDM's direct next-state
predictor) the same way. Writes ``data_efficiency.{json,md,png}``.

Run (docs/results.md, "Joint-wise neural dynamics", has the exact commands):
  .venv/bin/python bench/data_efficiency.py --data runs/de/full --out runs/de \
      --counts 1 2 4 8 --max-folds 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from nactuator.data import read_dataset  # noqa: E402
from nactuator.data.folds import CV_SPLITS  # noqa: E402
from nactuator.experiments.adapt import EpisodeRef, write_subset  # noqa: E402
from nactuator.experiments.cv import run_cv  # noqa: E402
from nactuator.platforms import load_platform  # noqa: E402

METRIC = "arm mean (deg), model"
REFERENCE = "arm mean (deg), command following"
# One recipe for both (conf/train/so101.yaml shortened: compute is 2 shared cores); the
# architectures differ only in model.arch and the per-arch sizes below.
RECIPE = ["--config", "conf/train/so101.yaml", "--trainer.max_epochs={epochs}",
          "--data.horizon={horizon}", "--data.batch_size=8",
          "--data.samples_per_epoch={samples}", "--seed_everything={seed}"]
ARCHS = {
    "transformer": ["--model.arch=transformer", "--model.width=64", "--model.depth=2"],
    "jointwise": ["--model.arch=jointwise", "--model.width=64", "--model.depth=2",
                  "--model.model_sizes={head_hidden: 32, latent_dim: 8, dropout: 0.0}"],
    # The joint-wise model's second mode (DexNDM's own training): each joint predicts its
    # next position and velocity, supervised one step ahead on the recorded windows, no
    # simulator; eval rolls it out open loop from frame 0 with the model as the step.
    "jointwise_next_state": ["--model.arch=jointwise", "--model.dynamics=next_state",
                             "--model.width=64", "--model.depth=2",
                             "--model.model_sizes={head_hidden: 32, latent_dim: 8, "
                             "dropout: 0.0}"],
}


def pool_subset(full: Path, out: Path, runs: int) -> Path:
    """The first ``runs`` train/validation episodes of every task, all as train (cv re-splits)."""
    ds = read_dataset(full)
    by_task: dict[str, list] = {}
    for ep in ds.episodes:
        if ep.split in CV_SPLITS:
            by_task.setdefault(ep.task, []).append(ep)
    short = {t: len(v) for t, v in by_task.items() if len(v) < runs}
    if short:
        raise SystemExit(f"{full}: tasks with fewer than {runs} train/validation episodes: {short}")
    chosen = [(EpisodeRef(str(full), ep.index, ep.task, ep.split), ep)
              for runs_of_task in by_task.values() for ep in runs_of_task[:runs]]
    return write_subset(out, load_platform(ds.platform), ds.fps, chosen, [])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="synthetic dataset (nactuator data synth)")
    ap.add_argument("--out", default="runs/de")
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--archs", nargs="+", default=["transformer", "jointwise"],
                    choices=list(ARCHS))
    ap.add_argument("--max-folds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    # The figures use the defaults; the smoke test (tests/test_bench.py) shrinks both.
    ap.add_argument("--horizon", default="{0: 16, 2: 32, 4: 64}",
                    help="data.horizon: steps, or {epoch: steps} (a curriculum)")
    ap.add_argument("--samples-per-epoch", type=int, default=64)
    ap.add_argument("--plot-only", action="store_true",
                    help="redraw from OUT/data_efficiency.json (with --overlay), train nothing")
    ap.add_argument("--overlay", nargs="*", default=[], metavar="LABEL=JSON",
                    help="also plot the points of another run's data_efficiency.json")
    args = ap.parse_args(argv)
    if args.plot_only:
        saved = json.loads((Path(args.out) / "data_efficiency.json").read_text())
        results = {a: {int(n): v for n, v in by_n.items()} for a, by_n in saved["results"].items()}
        for item in args.overlay:
            label, _, path = item.partition("=")
            other = json.loads(Path(path).read_text())["results"]
            for by_n in other.values():
                results[label] = {int(n): v for n, v in by_n.items()}
        args.counts = saved["counts"]
        write_outputs(results, Path(args.out), args)
        return
    out = Path(args.out)
    platform = read_dataset(args.data).platform
    results: dict[str, dict[int, dict]] = {a: {} for a in args.archs}
    for n in args.counts:
        data = out / f"pool_{n:02d}"
        if not (data / "meta" / "info.json").exists():
            pool_subset(Path(args.data), data, n + 2)
        for arch in args.archs:
            recipe = [a.format(epochs=args.epochs, seed=args.seed, horizon=args.horizon,
                               samples=args.samples_per_epoch) for a in RECIPE]
            cv_out = out / f"cv_{arch}_{n:02d}"
            run_cv(platform, str(data), folds=n + 2, max_folds=args.max_folds,
                   out=cv_out, extra_args=[*recipe, *ARCHS[arch]])
            best = json.loads((cv_out / "cv.json").read_text())["summary"]["best"]
            results[arch][n] = {"model": best[METRIC], "command_following": best[REFERENCE]}
            print(f"{arch} N={n}: {best[METRIC]['folds']}", flush=True)
            write_outputs(results, out, args)  # after every point: a cut-short run still shows


def write_outputs(results: dict[str, dict[int, dict]], out: Path, args) -> None:
    (out / "data_efficiency.json").write_text(json.dumps(
        {"metric": METRIC, "counts": args.counts, "max_folds": args.max_folds,
         "epochs": args.epochs, "results": results}, indent=1))
    lines = ["| N (episodes/task) | " + " | ".join(f"{a} (deg)" for a in results)
             + " | command following (deg) |", "|---" * (len(results) + 2) + "|"]
    for n in sorted({n for by_n in results.values() for n in by_n}):
        cells = []
        for arch in results:
            if n not in results[arch]:
                cells.append("–")
                continue
            m = results[arch][n]["model"]
            sd = "–" if m["sd"] is None else f"{m['sd']:.2f}"
            cells.append(f"{m['mean']:.2f} ± {sd} [{m['min']:.2f}, {m['max']:.2f}]")
        ref = next(by_n[n] for by_n in results.values() if n in by_n)["command_following"]
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {ref['mean']:.2f} |")
    (out / "data_efficiency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for arch, by_n in results.items():
        ns = sorted(by_n)
        if not ns:
            continue
        mean = [by_n[n]["model"]["mean"] for n in ns]
        (line,) = ax.plot(ns, mean, marker="o", label=f"{arch} (mean; dots: folds)")
        for n in ns:
            ax.scatter([n] * len(by_n[n]["model"]["folds"]), by_n[n]["model"]["folds"],
                       s=12, alpha=0.5, color=line.get_color())
    ref = {n: by_n[n]["command_following"]["mean"] for by_n in results.values() for n in by_n}
    ax.plot(sorted(ref), [ref[n] for n in sorted(ref)], ls="--", c="gray",
            label="command following")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("training trajectories per task")
    ax.set_ylabel("held-out arm rollout MAE (deg)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "data_efficiency.png", dpi=120)


if __name__ == "__main__":
    main()
