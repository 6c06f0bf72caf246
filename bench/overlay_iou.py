"""Hard IoU of our soft renderer's silhouette against the masks stored beside a dataset, per
frame, at the stored joint state and at the state a model's closed-loop rollout reaches
(`nactuator vision overlay`'s numbers over many frames): mean, spread and worst per episode.

    PYTHONPATH=src .venv/bin/python bench/overlay_iou.py --data runs/bench/masks/ds-clean \
        --episodes 2,5,8,11 --every 25 --ckpt pretrained/so101 --out runs/bench/overlay_iou

A dataset with masks of several cameras needs ``--mask-camera NAME`` (the camera scored).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from nactuator.atomic import write_json
from nactuator.data import read_dataset
from nactuator.data.masks import read_episode_masks
from nactuator.vision.masks import overlay


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--episodes", required=True)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--ckpt", default=None)
    ap.add_argument("--out", default="runs/bench/overlay_iou")
    ap.add_argument("--mask-camera", default=None,
                    help="the camera whose masks are scored (needed with several)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    ds = read_dataset(a.data)
    rows = []
    for e in (int(x) for x in a.episodes.split(",")):
        m = read_episode_masks(a.data, e, a.mask_camera)
        frames = [int(f) for f in m.frame_index if f % a.every == 0]
        for label, ckpt in (("stored", None), ("model", a.ckpt)):
            if label == "model" and ckpt is None:
                continue
            r = overlay(a.data, e, frames, os.path.join(a.out, f"ep{e}-{label}"), ckpt=ckpt,
                        mask_camera=a.mask_camera)
            iou = np.array(r["iou"])
            rows.append({"episode": e, "task": ds.episodes[e].task, "state": label,
                         "frames": len(iou), "mean": float(iou.mean()),
                         "sd": float(iou.std(ddof=1)), "min": float(iou.min()),
                         "iou": iou.tolist()})
            print(f"episode {e:2d} {rows[-1]['task']:28s} {label:6s} {len(iou):3d} frames: "
                  f"IoU {iou.mean():.3f} +- {iou.std(ddof=1):.3f} (min {iou.min():.3f})",
                  flush=True)
    for label in ("stored", "model"):
        means = [r["mean"] for r in rows if r["state"] == label]
        if means:
            print(f"{label}: mean over episodes {np.mean(means):.3f}, spread of episode means "
                  f"{np.min(means):.3f}..{np.max(means):.3f}")
    write_json(os.path.join(a.out, "overlay_iou.json"), rows)


if __name__ == "__main__":
    main()
