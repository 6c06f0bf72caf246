"""Reference masks from an independent renderer: MuJoCo's CPU ray casting.

One ray per pixel centre from the camera centre (``mujoco.mj_multiRay``) against the visual
geoms of the platform MJCF (``geometry.visual_model``), placed by MuJoCo's own forward
kinematics at the given joint state. The hit geom's body names the link. No GL, no
projection code of ours: what this renders shares only the geom file and the camera with
the soft renderer, so it can judge it. Labels: 0 background, 1 + link index.
"""

from __future__ import annotations

import mujoco
import numpy as np

from nactuator.vision.camera import Camera
from nactuator.vision.geometry import VISUAL_GROUP, load_link_geometry, visual_model

__all__ = ["RayCastRenderer"]


class RayCastRenderer:
    """Label images (H, W) uint8 of a platform's arm at joint states ``q``."""

    def __init__(self, platform: str, camera: Camera) -> None:
        self.model = visual_model(platform)
        self.data = mujoco.MjData(self.model)
        links = load_link_geometry(platform).links
        body_label = np.zeros(self.model.nbody, dtype=np.uint8)
        for i, name in enumerate(links):
            body_label[self.model.body(name).id] = i + 1
        self.geom_label = np.concatenate([body_label[self.model.geom_bodyid], [0]])
        self.links = links
        self.n = self.model.nq
        self.set_camera(camera)

    def set_camera(self, camera: Camera) -> None:
        k = camera.intrinsics
        t = camera.t_cb().detach().cpu().numpy()
        rot, trans = t[:3, :3], t[:3, 3]
        self.shape = (k.height, k.width)
        v, u = np.meshgrid(np.arange(k.height) + 0.5, np.arange(k.width) + 0.5, indexing="ij")
        rays_c = np.stack([(u - k.cx) / k.fx, (v - k.cy) / k.fy, np.ones_like(u)], -1)
        rays_c /= np.linalg.norm(rays_c, axis=-1, keepdims=True)
        self.origin = np.ascontiguousarray(-rot.T @ trans)
        self.vec = np.ascontiguousarray((rays_c.reshape(-1, 3) @ rot).ravel())  # R^T d per ray
        self.nray = k.height * k.width
        self.group = np.zeros(6, dtype=np.uint8)
        self.group[VISUAL_GROUP] = 1

    def render(self, q: np.ndarray) -> np.ndarray:
        """(n,) joint state -> labels (H, W); (T, n) -> (T, H, W)."""
        q = np.asarray(q, dtype=np.float64)
        if q.ndim == 2:
            return np.stack([self.render(row) for row in q])
        if q.shape != (self.n,):
            raise ValueError(f"q must have shape ({self.n},), got {q.shape}")
        self.data.qpos[:] = q
        mujoco.mj_kinematics(self.model, self.data)
        geom = np.empty(self.nray, dtype=np.int32)
        dist = np.empty(self.nray, dtype=np.float64)
        mujoco.mj_multiRay(self.model, self.data, self.origin, self.vec, self.group, True, -1,
                           geom, dist, None, self.nray, mujoco.mjMAXVAL)
        return self.geom_label[geom].reshape(self.shape)  # geom −1 (miss) -> the appended 0
