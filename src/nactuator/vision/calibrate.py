"""Hand-eye refinement from silhouettes alone (EasyHeC-style): optimise the camera extrinsic
``ξ`` so the soft silhouettes of the arm at known joint states match observed masks.

Coarse to fine: the first stage renders at half resolution with a wide sigmoid (the gradient
reaches masks a dozen pixels away), the second at full resolution with a narrow one. Adam on
``ξ`` (metres and radians in the camera frame, cosine-decayed step); the loss is soft IoU,
nothing else.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from nactuator.vision.camera import Camera
from nactuator.vision.scene import ArmScene
from nactuator.vision.se3 import rotation_angle, so3_exp
from nactuator.vision.silhouette import SilhouetteRenderer, hard_iou, soft_iou_loss

__all__ = ["CalibrationResult", "calibrate_extrinsic", "perturb_camera", "pose_error"]


def pose_error(t_a: np.ndarray | torch.Tensor, t_b: np.ndarray | torch.Tensor
               ) -> tuple[float, float]:
    """(camera-centre distance [m], rotation angle [deg]) between two T_cb."""
    a, b = (torch.as_tensor(np.asarray(t, dtype=np.float64)) for t in (t_a, t_b))
    centre = lambda t: -(t[:3, :3].T @ t[:3, 3])  # noqa: E731
    dist = torch.linalg.vector_norm(centre(a) - centre(b)).item()
    angle = rotation_angle(a[:3, :3] @ b[:3, :3].T).item()
    return dist, float(np.degrees(angle))


def perturb_camera(camera: Camera, translation: float, rotation_deg: float,
                   seed: int = 0) -> Camera:
    """The camera with its centre moved by exactly ``translation`` m and its orientation
    turned by exactly ``rotation_deg`` about its centre, in random directions."""
    rng = np.random.default_rng(seed)
    t = camera.t_cb().detach().numpy()
    shift = rng.normal(size=3)
    axis = rng.normal(size=3)
    rot_delta = so3_exp(torch.tensor(axis / np.linalg.norm(axis)
                                     * np.radians(rotation_deg))).numpy()
    centre = -t[:3, :3].T @ t[:3, 3] + shift / np.linalg.norm(shift) * translation
    out = np.eye(4)
    out[:3, :3] = rot_delta @ t[:3, :3]
    out[:3, 3] = -out[:3, :3] @ centre
    return camera.with_pose(out)


@dataclass
class CalibrationResult:
    camera: Camera
    iterations: int
    seconds: float
    loss: list[float] = field(default_factory=list)


def _stages(iterations: int, coarse_fraction: float = 0.6) -> list[tuple[float, float, float]]:
    """(scale, sigma, _) per iteration: ``coarse_fraction`` at half resolution, then full."""
    coarse = int(round(coarse_fraction * iterations))
    out = []
    for i in range(iterations):
        if i < coarse:
            f = i / max(1, coarse - 1)
            out.append((0.5, 3.0 * (1 - f) + 0.8 * f, 0.0))
        else:
            f = (i - coarse) / max(1, iterations - coarse - 1)
            out.append((1.0, 1.2 * (1 - f) + 0.5 * f, 0.0))
    return out


def _resize(masks: torch.Tensor, scale: float) -> torch.Tensor:
    if scale == 1.0:
        return masks
    return torch.nn.functional.avg_pool2d(masks[:, None], int(round(1 / scale)))[:, 0]


def calibrate_extrinsic(scene: ArmScene, q: torch.Tensor, masks: torch.Tensor,
                        camera: Camera, iterations: int = 150, lr: float = 1e-2,
                        device: str = "cpu", coarse_fraction: float = 0.6) -> CalibrationResult:
    """Refine ``camera``'s extrinsic (a copy; the argument is untouched) from ``masks``
    (N, H, W) in [0, 1] observed at joint states ``q`` (N, n). Frames whose mask is all NaN
    (missed frames) are skipped."""
    k = camera.intrinsics
    if masks.shape[1:] != (k.height, k.width):
        raise ValueError(f"masks are {tuple(masks.shape[1:])}, the camera is "
                         f"{k.height}x{k.width}")
    keep = ~torch.isnan(masks).flatten(1).all(-1)
    q, masks = q[keep].to(device, torch.float32), masks[keep].to(device, torch.float32)
    cam = camera.with_pose(camera.t_cb().detach()).to(device)
    renderer = SilhouetteRenderer(scene, device)
    opt = torch.optim.Adam([cam.xi], lr=lr)
    # Cosine decay to lr/10: large steps while the masks barely overlap, small ones at the end.
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, iterations, eta_min=lr / 10)
    half = Camera(k.scaled(k.width // 2, k.height // 2), cam.t0, cam.name, cam.platform)
    half.xi = cam.xi  # the same parameter, rendered at half resolution
    targets = {1.0: masks, 0.5: _resize(masks, 0.5)}
    losses: list[float] = []
    start = time.perf_counter()
    for scale, sigma, _ in _stages(iterations, coarse_fraction):
        opt.zero_grad()
        view = half if scale < 1 else cam
        loss = soft_iou_loss(renderer(q, view, sigma=sigma)["mask"], targets[scale])
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    seconds = time.perf_counter() - start
    out = camera.with_pose(cam.t_cb().detach().cpu())
    return CalibrationResult(camera=out, iterations=iterations, seconds=seconds, loss=losses)


def mask_iou(scene: ArmScene, q: torch.Tensor, masks: torch.Tensor, camera: Camera,
             device: str = "cpu") -> np.ndarray:
    """Hard IoU per frame of the rendered union mask vs ``masks``."""
    with torch.no_grad():
        out = SilhouetteRenderer(scene, device)(q.to(device, torch.float32), camera.to(device))
        return hard_iou(out["mask"], masks.to(device)).cpu().numpy()
