"""Pinhole camera with a learnable extrinsic, and its YAML file (one per setup).

Conventions (OpenCV): the camera frame has x right, y down, z forward; pixel (u, v) has its
centre at (u + 0.5, v + 0.5) in the continuous image coordinates K maps to. ``T_cb`` maps a
point from the robot base frame into the camera frame: ``p_c = R p_b + t``.

The file (``conf/vision/cameras/<setup>.yaml``)::

    name: so101_front
    platform: so101
    intrinsics: {width: 160, height: 120, fx: 150.0, fy: 150.0, cx: 80.0, cy: 60.0}
    extrinsic:
      look_at: {eye: [0.55, -0.35, 0.35], target: [0.12, 0.0, 0.15], up: [0, 0, 1]}
      # or  T_cb: [[...4 rows of 4...]]  (what `nactuator vision calibrate` writes)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from nactuator.atomic import write_text
from nactuator.errors import UserError
from nactuator.paths import conf_dir
from nactuator.vision.se3 import se3_exp

__all__ = ["Camera", "CameraError", "Intrinsics", "camera_path", "load_camera", "look_at",
           "save_camera"]


class CameraError(UserError, ValueError):
    """A camera file or camera argument is wrong; the message names the file and field."""


@dataclass(frozen=True)
class Intrinsics:
    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float

    def matrix(self) -> np.ndarray:
        return np.array([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]])

    def scaled(self, width: int, height: int) -> Intrinsics:
        """The same camera at another resolution (same field of view)."""
        sx, sy = width / self.width, height / self.height
        return Intrinsics(width, height, self.fx * sx, self.fy * sy, self.cx * sx, self.cy * sy)

    def as_dict(self) -> dict:
        return {"width": self.width, "height": self.height, "fx": self.fx, "fy": self.fy,
                "cx": self.cx, "cy": self.cy}


def look_at(eye, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """T_cb (4, 4) of a camera at ``eye`` looking at ``target`` (base frame, metres)."""
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    z = target - eye
    if np.linalg.norm(z) < 1e-9:
        raise ValueError("look_at: eye and target coincide")
    z = z / np.linalg.norm(z)
    x = np.cross(z, up)  # image x right when up is up: z × up points right
    if np.linalg.norm(x) < 1e-9:
        raise ValueError("look_at: up is parallel to the viewing direction")
    x = x / np.linalg.norm(x)
    y = np.cross(z, x)  # image y down
    rot = np.stack([x, y, z])  # rows: camera axes in base coordinates
    t = np.eye(4)
    t[:3, :3] = rot
    t[:3, 3] = -rot @ eye
    return t


class Camera(torch.nn.Module):
    """Intrinsics (fixed) and an extrinsic ``T_cb = exp(ξ^) T0`` with ``ξ`` a learnable
    se(3) 6-vector, zero at the starting guess ``T0``."""

    def __init__(self, intrinsics: Intrinsics, t_cb: np.ndarray | torch.Tensor,
                 name: str = "camera", platform: str | None = None) -> None:
        super().__init__()
        self.intrinsics = intrinsics
        self.name = name
        self.platform = platform
        t0 = torch.as_tensor(np.asarray(t_cb, dtype=np.float64))
        if t0.shape != (4, 4):
            raise ValueError(f"T_cb must be 4x4, got {tuple(t0.shape)}")
        self.register_buffer("t0", t0)
        self.xi = torch.nn.Parameter(torch.zeros(6, dtype=torch.float64))

    def t_cb(self) -> torch.Tensor:
        """Camera-from-base transform (4, 4), float64, differentiable in ``xi``."""
        return se3_exp(self.xi) @ self.t0

    def project(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Base-frame points (..., 3) -> pixel coordinates (..., 2) and depth (...), in the
        points' dtype. Depth is clamped at 1 cm so a point behind the camera stays finite."""
        t = self.t_cb().to(points.dtype)
        pc = points @ t[:3, :3].T + t[:3, 3]
        k = self.intrinsics
        z = pc[..., 2].clamp_min(0.01)
        u = k.fx * pc[..., 0] / z + k.cx
        v = k.fy * pc[..., 1] / z + k.cy
        return torch.stack([u, v], -1), z

    def with_pose(self, t_cb: np.ndarray | torch.Tensor) -> Camera:
        """A new camera with these intrinsics and another starting pose."""
        return Camera(self.intrinsics, t_cb, self.name, self.platform)

    def at_resolution(self, width: int, height: int) -> Camera:
        return Camera(self.intrinsics.scaled(width, height), self.t_cb().detach(), self.name,
                      self.platform)


def camera_path(name_or_path: str | Path) -> Path:
    """``conf/vision/cameras/<name>.yaml``, or the path itself if it names a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return p
    return conf_dir() / "vision" / "cameras" / f"{p}.yaml"


def _field(cfg: dict, key: str, source: Path):
    if key not in cfg:
        raise CameraError(f"{source}: missing field {key!r}")
    return cfg[key]


def load_camera(name_or_path: str | Path) -> Camera:
    """Read a camera file (see the module docstring)."""
    path = camera_path(name_or_path)
    if not path.is_file():
        raise CameraError(f"camera file {path} does not exist")
    cfg = yaml.safe_load(path.read_text()) or {}
    if not isinstance(cfg, dict):
        raise CameraError(f"{path}: expected a mapping, got {type(cfg).__name__}")
    ki = _field(cfg, "intrinsics", path)
    try:
        intr = Intrinsics(int(ki["width"]), int(ki["height"]), float(ki["fx"]), float(ki["fy"]),
                          float(ki["cx"]), float(ki["cy"]))
    except (KeyError, TypeError, ValueError) as e:
        raise CameraError(f"{path}: intrinsics needs width, height, fx, fy, cx, cy "
                          f"(numbers): {e}") from None
    if intr.width < 1 or intr.height < 1 or intr.fx <= 0 or intr.fy <= 0:
        raise CameraError(f"{path}: intrinsics {intr.as_dict()} must have positive size and "
                          "focal lengths")
    ext = _field(cfg, "extrinsic", path)
    if isinstance(ext, dict) and "T_cb" in ext:
        t = np.asarray(ext["T_cb"], dtype=np.float64)
        if t.shape != (4, 4) or not np.allclose(t[3], [0, 0, 0, 1]):
            raise CameraError(f"{path}: extrinsic.T_cb must be a 4x4 rigid transform")
        r = t[:3, :3]
        if not np.allclose(r @ r.T, np.eye(3), atol=1e-6) or np.linalg.det(r) < 0:
            raise CameraError(f"{path}: extrinsic.T_cb's rotation is not orthonormal")
    elif isinstance(ext, dict) and "look_at" in ext:
        la = ext["look_at"]
        try:
            t = look_at(la["eye"], la["target"], la.get("up", (0, 0, 1)))
        except (KeyError, TypeError, ValueError) as e:
            raise CameraError(f"{path}: extrinsic.look_at needs eye, target (and up): "
                              f"{e}") from None
    else:
        raise CameraError(f"{path}: extrinsic needs T_cb (4x4) or look_at {{eye, target, up}}")
    return Camera(intr, t, name=str(cfg.get("name", path.stem)), platform=cfg.get("platform"))


def save_camera(camera: Camera, path: str | Path, note: str | None = None) -> Path:
    """Write ``camera`` (its current pose as T_cb) as a camera file."""
    t = camera.t_cb().detach().cpu().numpy()
    cfg = {"name": camera.name, "platform": camera.platform,
           "intrinsics": camera.intrinsics.as_dict(),
           "extrinsic": {"T_cb": [[round(float(v), 9) for v in row] for row in t]}}
    text = (f"# {note}\n" if note else "") + yaml.safe_dump(cfg, sort_keys=False)
    path = Path(path)
    write_text(path, text)
    return path
