"""How much the silhouette loss sees of each joint, per camera (docs/results.md §11.3/§11.4).

Renders the stored state of one episode (every ``--every``-th frame that has a mask) with
``SilhouetteRenderer`` at the training loss's size (mask size / ``--downsample``, edge
``--sigma`` px), scores it with ``soft_iou_loss`` against the camera's stored masks
(area-averaged to that size, as ``training.objective.silhouette_loss`` does), then moves
one joint at a time by ±``--degrees`` and prints the loss change per degree (the mean of
the + and − changes, divided by the step): the gradient signal a silhouette-only training
gets for that joint. A camera without masks in the dataset (``--camera`` may also be a
camera file, to try a placement before rendering masks) is scored against the renderer's
own hard silhouette (> 0.5) of the stored state instead, which is what ray-cast masks of a
clean dataset are to within ~1 % IoU (§11.2: 0.990).

    PYTHONPATH=src .venv/bin/python bench/silhouette_probe.py --data runs/data/sil \
        --camera so101_front so101_side --episode 3
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from nactuator.data import read_dataset
from nactuator.data.masks import mask_cameras, read_episode_masks
from nactuator.platforms import load_platform
from nactuator.vision.camera import load_camera
from nactuator.vision.masks import episode_states
from nactuator.vision.scene import ArmScene
from nactuator.vision.silhouette import SilhouetteRenderer, soft_iou_loss


def probe(data: str, camera: str, episode: int, every: int, downsample: int, sigma: float,
          degrees: float) -> tuple[float, list[float], str]:
    """(loss at the stored state, loss change per degree per joint, target used)."""
    ds = read_dataset(data)
    renderer = SilhouetteRenderer(ArmScene(ds.platform))
    q_all = episode_states(ds, [episode], "stored")[episode]
    if camera in mask_cameras(data):
        m = read_episode_masks(data, episode, camera)
        frames = [int(f) for f in m.frame_index if int(f) % every == 0]
        cam = load_camera(m.camera_file)
        target = m.masks[frames].float()
        source = "stored masks"
    else:
        cam = load_camera(camera)
        frames = list(range(0, len(q_all), every))
        target = None
        source = "own hard render"
    k = cam.intrinsics
    q = torch.tensor(q_all[frames], dtype=torch.float32)
    with torch.no_grad():
        if target is None:  # the camera's clean mask of the stored state, at full size
            target = (renderer(q, cam, sigma)["mask"] > 0.5).float()
        small = cam.at_resolution(k.width // downsample, k.height // downsample)
        if downsample > 1:
            target = F.avg_pool2d(target[:, None], downsample)[:, 0]
        base = float(soft_iou_loss(renderer(q, small, sigma)["mask"], target))
        per_degree = []
        for j in range(q.shape[1]):
            change = []
            for sign in (-1.0, 1.0):
                moved = q.clone()
                moved[:, j] += sign * float(np.deg2rad(degrees))
                change.append(float(soft_iou_loss(renderer(moved, small, sigma)["mask"],
                                                  target)) - base)
            per_degree.append(float(np.mean(change)) / degrees)
    return base, per_degree, f"{source}, {len(frames)} frames"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--camera", nargs="+", required=True,
                    help="camera names with masks in --data, or camera files")
    ap.add_argument("--episode", type=int, default=3)
    ap.add_argument("--every", type=int, default=40, help="every Nth frame of the episode")
    ap.add_argument("--downsample", type=int, default=2)
    ap.add_argument("--sigma", type=float, default=0.5)
    ap.add_argument("--degrees", type=float, default=5.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    names = load_platform(read_dataset(args.data).platform).channel_names
    print(f"loss change per degree (x1e-3), ±{args.degrees:g} deg, episode {args.episode}, "
          f"1/{args.downsample} size, sigma {args.sigma:g} px")
    print("| camera | loss at stored state | " + " | ".join(names) + " | target |")
    print("|---|---|" + "---|" * len(names) + "---|")
    for camera in args.camera:
        base, per, source = probe(args.data, camera, args.episode, args.every,
                                  args.downsample, args.sigma, args.degrees)
        print(f"| {camera} | {base:.3f} | " + " | ".join(f"{1e3 * v:.2f}" for v in per)
              + f" | {source} |")


if __name__ == "__main__":
    main()
