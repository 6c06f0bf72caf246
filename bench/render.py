"""Soft silhouette renderer: forward + backward (w.r.t. the camera extrinsic) per frame at
160x120 for the SO-101 arm, against a batch-size curve, with two baselines measured in the
same run: B = 1 of the same renderer, and MuJoCo's ray casting of one frame (forward only,
no gradient: the reference renderer).

    PYTHONPATH=src .venv/bin/python bench/render.py [--device cuda] [--batches 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from nactuator.vision.camera import load_camera
from nactuator.vision.raycast import RayCastRenderer
from nactuator.vision.run import sample_states
from nactuator.vision.scene import ArmScene
from nactuator.vision.silhouette import SilhouetteRenderer, soft_iou_loss


def _time(fn, repeats: int, sync) -> float:
    fn()  # warm-up
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    cam = load_camera("so101_front").to(a.device)
    renderer = SilhouetteRenderer(ArmScene("so101"), a.device)
    ray = RayCastRenderer("so101", cam)
    q_all = sample_states("so101", max(int(b) for b in a.batches.split(",")), seed=0)
    target = torch.tensor(ray.render(q_all) > 0, dtype=torch.float32, device=a.device)
    t_ray = _time(lambda: ray.render(q_all[0]), a.repeats * 5, lambda: None)
    print(f"# load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, torch threads "
          f"{a.threads}, device {a.device}")
    print(f"MuJoCo ray cast, 1 frame (forward only): {1e3 * t_ray:.1f} ms")
    print("| B | fwd+bwd per batch [ms] | per frame [ms] | frames/s | vs B=1 per frame |")
    print("|---|---|---|---|---|")
    base = None
    for b in (int(x) for x in a.batches.split(",")):
        q = torch.tensor(q_all[:b], dtype=torch.float32, device=a.device)

        def step(q=q, b=b):
            cam.xi.grad = None
            soft_iou_loss(renderer(q, cam, sigma=0.7)["mask"], target[:b]).backward()

        t = _time(step, a.repeats, sync)
        base = base or t
        print(f"| {b} | {1e3 * t:.0f} | {1e3 * t / b:.1f} | {b / t:.1f} | "
              f"{base / (t / b):.2f}x |")
    print(f"soft fwd+bwd per frame at the largest B vs one ray-cast frame: "
          f"{(t / b) / t_ray:.1f}x slower")


if __name__ == "__main__":
    main()
