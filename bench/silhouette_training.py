"""Issue 20 item 5: joint-supervised vs silhouette-only vs both, on held-out episodes: the
joint rollout error and force error of `nactuator eval` (metrics.json) and the hard IoU of
the rollout's silhouette against the stored masks (bench/overlay_iou.py's
overlay_iou.json), as one table and one plot (docs/results.md §11.2).

    PYTHONPATH=src .venv/bin/python bench/silhouette_training.py --runs runs/sil \
        --out docs/img/silhouette_training.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

RUNS = (("a-joints", "joints"), ("b-silhouette", "silhouette only"), ("c-both", "both"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", default="runs/sil")
    ap.add_argument("--out", default="docs/img/silhouette_training.png")
    a = ap.parse_args(argv)
    rows = []
    for folder, label in RUNS:
        root = Path(a.runs) / folder
        m = json.loads((root / "eval" / "metrics.json").read_text())
        iou = json.loads((root / "iou" / "overlay_iou.json").read_text())
        model = [r for r in iou if r["state"] == "model"]
        means = np.array([r["mean"] for r in model])
        arm = m["arm_indices"]
        per_ep = [float(np.mean([e["joints"]["model"]["full"][j] for j in arm]))
                  for e in m["per_episode"]]
        rows.append({"run": label, "joint_deg": m["verdict"]["joints_deg"],
                     "joint_lo": min(per_ep), "joint_hi": max(per_ep),
                     "force_n": m["verdict"]["force_n"],
                     "iou": float(means.mean()), "iou_lo": float(means.min()),
                     "iou_hi": float(means.max())})
    print("| training | joint rollout MAE, arm mean (deg; episode range) | force MAE (N) | "
          "held-out IoU (episode means: mean, range) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['joint_deg']:.2f} ({r['joint_lo']:.2f}–{r['joint_hi']:.2f}) "
              f"| {r['force_n']:.3f} | {r['iou']:.3f} "
              f"({r['iou_lo']:.3f}–{r['iou_hi']:.3f}) |")
    fig, ax = plt.subplots(1, 3, figsize=(10, 3.2))
    labels = [r["run"] for r in rows]
    for axis, key, title in ((ax[0], "joint_deg", "joint rollout MAE (deg)"),
                             (ax[1], "force_n", "force MAE (N)"),
                             (ax[2], "iou", "held-out IoU")):
        axis.bar(labels, [r[key] for r in rows], color=["C0", "C1", "C2"])
        axis.set_title(title, fontsize=9)
        axis.tick_params(axis="x", labelsize=8)
    lo = [r["iou"] - r["iou_lo"] for r in rows]
    hi = [r["iou_hi"] - r["iou"] for r in rows]
    ax[2].errorbar(labels, [r["iou"] for r in rows], yerr=[lo, hi], fmt="none", color="k")
    fig.tight_layout()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
