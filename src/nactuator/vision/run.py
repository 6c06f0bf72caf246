"""``nactuator vision calibrate``: the synthetic hand-eye experiment, judged against the true
camera. Joint states are drawn from 60 % of each joint's range (diverse configurations);
observed masks come from MuJoCo ray casting at the true camera (``raycast``), damaged by
``noise``; the start is the true camera perturbed by exactly ``translation`` / ``rotation``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from nactuator.atomic import write_json
from nactuator.platforms import load_platform
from nactuator.vision.calibrate import (
    calibrate_extrinsic,
    mask_iou,
    perturb_camera,
    pose_error,
)
from nactuator.vision.camera import CameraError, load_camera, save_camera
from nactuator.vision.noise import MaskNoise, add_mask_noise
from nactuator.vision.raycast import RayCastRenderer
from nactuator.vision.scene import ArmScene

__all__ = ["calibrate_synthetic", "format_report", "sample_states"]


def sample_states(platform: str, n: int, seed: int) -> np.ndarray:
    p = load_platform(platform)
    lo = np.array([c.limit_lower for c in p.channels])
    hi = np.array([c.limit_upper for c in p.channels])
    return np.random.default_rng(seed).uniform(0.6 * lo, 0.6 * hi, (n, p.n))


def calibrate_synthetic(camera: str, frames: int = 16, held_out: int = 8,
                        translation: float = 0.05, rotation_deg: float = 5.0, seed: int = 0,
                        iterations: int = 150, noise: bool = True, out: str | None = None,
                        device: str = "cpu") -> dict:
    truth = load_camera(camera)
    if truth.platform is None:
        raise CameraError(f"{camera}: the camera file needs a 'platform' field")
    if frames < 1 or held_out < 1:
        raise CameraError(f"--frames and --held-out must be >= 1, got {frames}, {held_out}")
    scene = ArmScene(truth.platform)
    ray = RayCastRenderer(truth.platform, truth)
    q_fit = sample_states(truth.platform, frames, seed)
    q_test = sample_states(truth.platform, held_out, seed + 1000)
    clean_fit = ray.render(q_fit) > 0
    fit = add_mask_noise(clean_fit, MaskNoise() if noise else MaskNoise(0, 0, 0, 0, 0), seed)
    test = torch.tensor(ray.render(q_test) > 0, dtype=torch.float32)
    qf, qt = torch.tensor(q_fit, dtype=torch.float32), torch.tensor(q_test, dtype=torch.float32)
    start = perturb_camera(truth, translation, rotation_deg, seed)
    result = calibrate_extrinsic(scene, qf, torch.tensor(fit), start, iterations=iterations,
                                 device=device)
    t_true = truth.t_cb().detach()
    e0 = pose_error(start.t_cb().detach(), t_true)
    e1 = pose_error(result.camera.t_cb().detach(), t_true)
    clean = torch.tensor(clean_fit, dtype=torch.float32)
    report = {
        "camera": str(camera), "platform": truth.platform, "frames": frames,
        "missed_frames": int(np.isnan(fit).reshape(frames, -1).all(-1).sum()),
        "held_out": held_out, "noise": noise, "seed": seed, "device": device,
        "start_error": {"translation_m": e0[0], "rotation_deg": e0[1]},
        "final_error": {"translation_m": e1[0], "rotation_deg": e1[1]},
        "iou_fit_before": float(mask_iou(scene, qf, clean, start).mean()),
        "iou_fit_after": float(mask_iou(scene, qf, clean, result.camera).mean()),
        "iou_held_out_before": float(mask_iou(scene, qt, test, start).mean()),
        "iou_held_out_after": float(mask_iou(scene, qt, test, result.camera).mean()),
        "iou_held_out_true_camera": float(mask_iou(scene, qt, test, truth).mean()),
        "iterations": result.iterations, "seconds": result.seconds,
        "torch_threads": torch.get_num_threads(),
    }
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "calibrate.json", report)
        save_camera(result.camera, folder / "camera.yaml",
                    note=f"refined by nactuator vision calibrate from {camera}")
    return report


def format_report(r: dict) -> str:
    s, f = r["start_error"], r["final_error"]
    return (f"hand-eye on {r['frames']} frames ({r['missed_frames']} missed, noise "
            f"{'on' if r['noise'] else 'off'}): error {100 * s['translation_m']:.2f} cm / "
            f"{s['rotation_deg']:.2f} deg -> {100 * f['translation_m']:.2f} cm / "
            f"{f['rotation_deg']:.2f} deg in {r['iterations']} iterations, "
            f"{r['seconds']:.1f} s ({r['device']}); IoU fit {r['iou_fit_before']:.3f} -> "
            f"{r['iou_fit_after']:.3f}, held-out {r['iou_held_out_before']:.3f} -> "
            f"{r['iou_held_out_after']:.3f} (true camera {r['iou_held_out_true_camera']:.3f})")
