"""Image-space point tracking: targets and errors in pixels through the camera model.

The camera is the vision room's pinhole model (:class:`nactuator.vision.camera.Camera`:
intrinsics K and the extrinsic ``T_cb`` from ``conf/vision/cameras/<setup>.yaml``); its
:meth:`~nactuator.vision.camera.Camera.project` is the one definition of a pixel here.
:class:`ImageView` wraps it for the loop: the pixels of base-frame points and the
projection's Jacobian d(pixel)/dx, by autograd through that same ``project`` (2 × 3 per
point, ~1 ms), so the image Jacobian of any of the loop's dx/du (kinematic, actuator-aware,
field) is the chain rule::

    d(pixel)/du = d(project)/dx |_x · dx/du

A pixel path is a CSV with columns ``time, u, v`` (s; pixels at the camera file's
resolution, OpenCV convention: u right, v down, pixel (i, j)'s centre at (i + 0.5, j + 0.5)),
beside the 3-D format ``time, x, y, z`` (:func:`nactuator.control.track.read_path`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from nactuator.errors import UserError
from nactuator.platforms import Platform

from .jacobian import JacobianError

__all__ = ["MIN_DEPTH", "ImageView", "check_in_image", "load_view", "read_pixel_path",
           "write_pixel_path"]

MIN_DEPTH = 0.05  # m: a tracked point nearer the camera plane than this has no usable pixel


class ImageView:
    """A camera as the tracking loop uses it (fixed pose: the file's ``T_cb``)."""

    def __init__(self, camera, source: str | os.PathLike | None = None) -> None:
        camera.requires_grad_(False)  # the loop never moves the extrinsic
        self.camera = camera
        self.source = str(source) if source is not None else camera.name
        self.width, self.height = camera.intrinsics.width, camera.intrinsics.height

    def project(self, x: np.ndarray) -> np.ndarray:
        """Base-frame points (..., 3) [m] -> pixels (..., 2)."""
        with torch.no_grad():
            px, _ = self.camera.project(torch.as_tensor(np.asarray(x, np.float64)))
        return px.numpy()

    def jacobian(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Points (m, 3) -> their pixels (m, 2) and d(pixel)/dx (2m, 3m), block diagonal
        (each point's pixel moves with that point only)."""
        pts = torch.as_tensor(np.asarray(x, np.float64)).reshape(-1, 3).requires_grad_(True)
        with torch.enable_grad():
            px, depth = self.camera.project(pts)
            if (depth <= MIN_DEPTH).any():
                bad = int(torch.argmax((depth <= MIN_DEPTH).int()))
                raise JacobianError(f"camera {self.source}: tracked point {bad} at "
                                    f"{pts[bad].detach().numpy().round(3).tolist()} m is "
                                    f"behind or at the camera (depth {float(depth[bad]):.3f} m)")
            # Row r of the pixels depends on its own point only: one backward pass per
            # image axis gives every point's 2 × 3 block.
            rows = [torch.autograd.grad(px[:, a].sum(), pts, retain_graph=a == 0)[0]
                    for a in range(2)]
        m = len(pts)
        P = np.zeros((2 * m, 3 * m))
        for i in range(m):
            for a in range(2):
                P[2 * i + a, 3 * i: 3 * i + 3] = rows[a][i].numpy()
        return px.detach().numpy(), P

    def image_jacobian(self, x: np.ndarray, J: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The chain rule: pixels (m, 2) of the points ``x`` (m, 3) the Jacobian ``J``
        (3m, n) was taken at, and d(pixel)/du = d(project)/dx · J (2m, n)."""
        px, P = self.jacobian(x)
        return px, P @ J

    def inside(self, px: np.ndarray) -> np.ndarray:
        """Which pixels (..., 2) lie in the image."""
        px = np.asarray(px)
        return ((px[..., 0] >= 0) & (px[..., 0] <= self.width)
                & (px[..., 1] >= 0) & (px[..., 1] <= self.height))


def load_view(camera: str | os.PathLike, platform: Platform | None = None) -> ImageView:
    """``--camera`` (a camera YAML, or a name under conf/vision/cameras/) as an
    :class:`ImageView`; refuses a camera set up for another platform."""
    from nactuator.vision.camera import camera_path, load_camera

    path = camera_path(camera)
    cam = load_camera(path)
    if platform is not None and cam.platform not in (None, platform.name):
        raise UserError(f"--camera {path}: the camera is set up for {cam.platform!r}, not "
                        f"{platform.name!r}")
    return ImageView(cam, path)


def read_pixel_path(path: str | os.PathLike, view: ImageView | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """A pixel path CSV -> times (T,) [s] and pixels (T, 2) (module docstring); with
    ``view``, every row must lie in that camera's image."""
    from .track import read_table

    t, uv = read_table(path, ("u", "v"), "time, u, v (s; px at the camera's resolution)")
    if view is not None:
        check_in_image(path, view, uv)
    return t, uv


def check_in_image(path: str | os.PathLike, view: ImageView, uv: np.ndarray,
                   shift: str = "") -> None:
    """Refuse a pixel path (T, 2) with a row outside the image, naming the file's row
    (``shift``: how the file's values were moved, e.g. by --relative, for the message)."""
    out = np.flatnonzero(~view.inside(uv))
    if len(out):
        i = int(out[0])
        raise UserError(f"{path}: data row {i + 1} (u, v) = ({uv[i, 0]:.1f}, {uv[i, 1]:.1f}) "
                        f"px{shift} lies outside the {view.width}x{view.height} image of "
                        f"camera {view.source}")


def write_pixel_path(path: str | os.PathLike, t: np.ndarray, uv: np.ndarray) -> Path:
    """The pixel path format (module docstring), atomically."""
    import pandas as pd

    from nactuator.atomic import atomic_path

    path = Path(path)
    with atomic_path(path, suffix=".csv") as tmp:
        pd.DataFrame({"time": t, "u": uv[:, 0], "v": uv[:, 1]}).to_csv(
            tmp, index=False, float_format="%.4f")
    return path
