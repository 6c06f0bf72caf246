"""Time to accuracy (issue 25 item 3): cross-validated accuracy against training CPU time.

Reads the ``cv.json`` of ``nactuator cv`` runs (each fold's ``train_s``: the ``train``
child's CPU seconds, user + sys, and wall seconds) and draws, per headline metric, each
recipe's mean ± sd over its folds against its mean training CPU seconds per fold (the
fold-to-fold spread of both as error bars, every fold as a faint dot). ``--band`` adds a
documented figure with no recorded time (mean ± sd as a horizontal band). Prints a markdown
table and writes the PNG.

Run (docs/results.md, "Time to accuracy (issue 25 item 3)", has the exact commands):
  .venv/bin/python bench/time_to_accuracy.py --out docs/img/time_to_accuracy_omx.png \
      --run "nad_omx.yaml=runs/cv/omx-nad-timed" --run "fast_omx.yaml=runs/cv/omx-fast" \
      --contact --band "worst arm joint (deg), model=1.73,0.79,nad_omx.yaml documented, 9 folds"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ARM = "arm mean (deg), model"
WORST = "worst arm joint (deg), model"
FORCE = "force 3-axis (N), model rollout"
CONTACT_FORCE = "contact/force 3-axis (N), model rollout"


def load(path: Path, selection: str) -> dict:
    """One cv run: its per-fold training CPU / wall seconds and the selection's summary."""
    data = json.loads((path / "cv.json").read_text())
    if "train_s" not in data:
        raise SystemExit(f"{path}/cv.json has no train_s (a cv run before it was recorded)")
    return {"cpu": data["train_s"]["cpu"]["folds"], "wall": data["train_s"]["wall"]["folds"],
            "folds": data["scored_folds"], "summary": data["summary"][selection]}


def _ms(values) -> tuple[float, float]:
    v = np.asarray([x for x in values if x is not None], float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def table(runs: dict[str, dict], metrics: list[str]) -> str:
    head = ["recipe", "folds", "train CPU s / fold", "train wall s / fold",
            *[m.replace(", model", "") for m in metrics]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, run in runs.items():
        cells = [label, ", ".join(map(str, run["folds"]))]
        for key in ("cpu", "wall"):
            m, s = _ms(run[key])
            cells.append(f"{m:.0f} ± {s:.0f}")
        for metric in metrics:
            m, s = _ms(run["summary"][metric]["folds"])
            digits = 3 if "(N)" in metric else 2
            cells.append(f"{m:.{digits}f} ± {s:.{digits}f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(runs: dict[str, dict], metrics: list[str], bands: list[tuple[str, float, float, str]],
           title: str):
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 4.2), squeeze=False)
    colours = plt.get_cmap("tab10")
    for ax, metric in zip(axes[0], metrics, strict=True):
        for i, (label, run) in enumerate(runs.items()):
            ys = run["summary"][metric]["folds"]
            ax.scatter(run["cpu"], ys, s=12, alpha=0.35, color=colours(i))
            (x, sx), (y, sy) = _ms(run["cpu"]), _ms(ys)
            ax.errorbar(x, y, xerr=sx, yerr=sy, fmt="o", color=colours(i), capsize=4,
                        label=f"{label} ({len(ys)} folds)")
        for key, mean, sd, label in bands:
            if key == metric:
                ax.axhspan(mean - sd, mean + sd, color="0.85", zorder=0)
                ax.axhline(mean, color="0.5", lw=1, ls="--", label=f"{label}: {mean:g} ± {sd:g}")
        ax.axvline(180, color="r", lw=0.8, ls=":", label="3 min")
        ax.set_xlabel("training CPU s per fold (user + sys, one torch thread)")
        ax.set_ylabel(metric)
        right = max(max(x for x in run["cpu"] if x is not None) for run in runs.values())
        ax.set_xlim(0, 1.12 * max(right, 180))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=CV_DIR")
    parser.add_argument("--band", action="append", default=[],
                        metavar="METRIC=MEAN,SD,LABEL", help="a documented figure (no time)")
    parser.add_argument("--contact", action="store_true",
                        help="force on the contact episodes (OMX push) instead of all")
    parser.add_argument("--selection", default="best")
    parser.add_argument("--title", default="time to accuracy: cross-validated, `best`")
    parser.add_argument("--out", type=Path, required=True, help="PNG path")
    args = parser.parse_args(argv)
    runs = {}
    for item in args.run:
        label, _, path = item.partition("=")
        runs[label] = load(Path(path), args.selection)
    bands = []
    for item in args.band:
        metric, _, rest = item.partition("=")
        mean, sd, label = rest.split(",", 2)
        bands.append((metric, float(mean), float(sd), label))
    metrics = [ARM, WORST, CONTACT_FORCE if args.contact else FORCE]
    print(table(runs, metrics))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig = figure(runs, metrics, bands, args.title)
    fig.savefig(args.out, dpi=110)
    plt.close(fig)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
