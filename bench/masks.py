"""Masks beside a dataset: what `nactuator vision render-masks` costs per frame and what the
masks cost on disk per minute of data, for the stored layout (one compressed file per
episode) against LeRobot's PNG per frame (`images/<key>/episode-NNNNNN/frame-NNNNNN.png`,
measured on the same masks in the same run). The dataset is copied first; it is not changed.

    PYTHONPATH=src .venv/bin/python bench/masks.py --data runs/data/m4 --camera so101_front \
        --out runs/bench/masks --plot docs/img/masks_storage.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from nactuator.atomic import write_json, write_png
from nactuator.data import read_dataset
from nactuator.data.masks import read_episode_masks
from nactuator.vision.masks import render_masks
from nactuator.vision.noise import load_mask_noise


def _disk_bytes(folder: Path) -> tuple[int, int]:
    """(apparent bytes, bytes of allocated blocks) of every file under ``folder``."""
    apparent = blocks = 0
    for p in folder.rglob("*"):
        if p.is_file():
            st = p.stat()
            apparent += st.st_size
            blocks += st.st_blocks * 512
    return apparent, blocks


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--camera", default="so101_front")
    ap.add_argument("--out", default="runs/bench/masks")
    ap.add_argument("--plot", default=None, help="PNG of MB per minute by layout")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from PIL import Image

    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    res: dict = {"load_average": os.getloadavg()}
    for name, noise in (("clean", None), ("segmenter", load_mask_noise("segmenter"))):
        ds_copy = out / f"ds-{name}"
        shutil.copytree(a.data, ds_copy)
        r = render_masks(str(ds_copy), a.camera, noise=noise)
        folder = Path(r["folder"])
        apparent, blocks = _disk_bytes(folder)
        res[name] = dict(r, disk_bytes=blocks,
                         mb_per_minute_disk=blocks / 1e6 / r["minutes_of_data"])
        print(name, json.dumps({k: res[name][k] for k in ("render_ms_per_frame", "seconds",
                                                          "state_seconds", "mb_per_minute",
                                                          "mb_per_minute_disk")}))
    ds = read_dataset(out / "ds-clean")
    minutes = res["clean"]["minutes_of_data"]
    # The same clean masks as LeRobot-style PNGs, one per frame.
    png_root = out / "png" / "images" / "observation.masks.camera"
    t_write = t_read_npz = t_read_png = 0.0
    count = 0
    for ep in ds.episodes:
        t = time.perf_counter()
        got = read_episode_masks(out / "ds-clean", ep.index)
        t_read_npz += time.perf_counter() - t
        folder = png_root / f"episode-{ep.index:06d}"
        folder.mkdir(parents=True)
        t = time.perf_counter()
        for f in got.frame_index:
            Image.fromarray(got.masks[f].numpy()).save(folder / f"frame-{f:06d}.png")
        t_write += time.perf_counter() - t
        t = time.perf_counter()
        back = np.stack([np.asarray(Image.open(folder / f"frame-{f:06d}.png"))
                         for f in got.frame_index])
        t_read_png += time.perf_counter() - t
        assert np.array_equal(back, got.masks[got.frame_index].numpy())
        count += len(got.frame_index)
    apparent, blocks = _disk_bytes(png_root)
    res["png_per_frame"] = {"files": count, "bytes": apparent, "disk_bytes": blocks,
                            "mb_per_minute": apparent / 1e6 / minutes,
                            "mb_per_minute_disk": blocks / 1e6 / minutes,
                            "files_per_minute": count / minutes,
                            "write_ms_per_frame": 1000 * t_write / count,
                            "read_ms_per_frame": 1000 * t_read_png / count}
    res["npz_read_ms_per_frame"] = 1000 * t_read_npz / count
    print("png", json.dumps(res["png_per_frame"]), "npz read ms/frame",
          round(res["npz_read_ms_per_frame"], 4))
    write_json(out / "masks.json", res)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = ["PNG per frame\n(on disk)", "PNG per frame\n(bytes)",
                  "episode file\nclean", "episode file\nsegmenter noise"]
        vals = [res["png_per_frame"]["mb_per_minute_disk"], res["png_per_frame"]["mb_per_minute"],
                res["clean"]["mb_per_minute_disk"], res["segmenter"]["mb_per_minute_disk"]]
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        bars = ax.bar(labels, vals, color=["#999", "#bbb", "#3a7", "#c5a"])
        ax.set_yscale("log")
        ax.set_ylabel("MB per minute of data")
        k = res["clean"]["resolution"]
        ax.set_title(f"SO-101 masks at {k[0]}x{k[1]}, {ds.fps:.1f} Hz, {minutes:.1f} min of data")
        for b, v in zip(bars, vals, strict=True):
            ax.text(b.get_x() + b.get_width() / 2, v * 1.1, f"{v:.2f}", ha="center", fontsize=8)
        fig.tight_layout()
        write_png(a.plot, fig)


if __name__ == "__main__":
    main()
