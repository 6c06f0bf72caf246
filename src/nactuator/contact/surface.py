"""Candidate contact points on the arm's links, and their Jacobians on the nominal arm.

The robot MJCFs carry no collision geometry, so each link's surface is a capsule around the
segment from its body origin to its child body's origin (the last link: to the platform's
end-effector point); the radius comes from ``conf/contact/<platform>.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np
import yaml

from nactuator.errors import UserError
from nactuator.platforms import Platform, conf_dir

__all__ = ["LinkSurfaces", "load_contact_config"]


def load_contact_config(platform: Platform, path: str | Path | None = None) -> dict:
    p = Path(path) if path else conf_dir() / "contact" / f"{platform.name}.yaml"
    if not p.exists():
        raise UserError(f"{p}: no contact configuration for platform {platform.name!r}")
    cfg = yaml.safe_load(p.read_text()) or {}
    for key in ("links", "surface_points", "friction"):
        if key not in cfg:
            raise UserError(f"{p}: missing key {key!r}")
    return cfg


def _fibonacci_capsule(a: np.ndarray, b: np.ndarray, radius: float, k: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """k points (and outward normals) spread over the side of the capsule around a-b."""
    axis = b - a
    length = float(np.linalg.norm(axis))
    u = axis / length if length > 1e-9 else np.array([0.0, 0.0, 1.0])
    e1 = np.cross(u, [1.0, 0.0, 0.0] if abs(u[0]) < 0.9 else [0.0, 1.0, 0.0])
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(u, e1)
    i = np.arange(k)
    s = (i + 0.5) / k  # along the segment
    phi = i * np.pi * (3.0 - np.sqrt(5.0))  # golden angle around it
    normals = np.cos(phi)[:, None] * e1 + np.sin(phi)[:, None] * e2
    points = a + s[:, None] * axis + radius * normals
    return points, normals


@dataclass
class LinkSurfaces:
    """Per contact link: body id, sampled points and outward normals in the body frame."""

    model: mujoco.MjModel
    names: list[str]
    bodies: np.ndarray  # (K,) body ids
    points: list[np.ndarray]  # K x (P, 3) body frame
    normals: list[np.ndarray]  # K x (P, 3) body frame
    last_joint: np.ndarray  # (K,) index of the joint that moves each link (its parent joint)

    @classmethod
    def build(cls, platform: Platform, cfg: dict) -> LinkSurfaces:
        model = mujoco.MjModel.from_xml_path(str(platform.robot_model_path()))
        names = list(cfg["links"])
        bodies, points, normals, last = [], [], [], []
        ee = platform.end_effector
        for name in names:
            b = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name)
            if b < 0:
                raise UserError(f"contact config: no body {name!r} in "
                                f"{platform.robot_model_path()}")
            children = [c for c in range(model.nbody) if model.body_parentid[c] == b and c != b]
            if name == ee.body or not children:
                end = np.asarray(ee.offset, float) if name == ee.body else np.zeros(3)
            else:
                end = model.body_pos[children[0]].copy()
            p, nrm = _fibonacci_capsule(np.zeros(3), end, float(cfg["links"][name]),
                                        int(cfg["surface_points"]))
            bodies.append(b)
            points.append(p)
            normals.append(nrm)
            last.append(int(model.jnt_dofadr[model.body_jntadr[b]]))
        return cls(model, names, np.array(bodies), points, normals, np.array(last))

    def kinematics(self, q: np.ndarray) -> mujoco.MjData:
        """The nominal arm's body frames at q (what the point Jacobians read)."""
        d = mujoco.MjData(self.model)
        d.qpos[:] = q
        mujoco.mj_kinematics(self.model, d)
        mujoco.mj_comPos(self.model, d)
        return d

    def world_points(self, q: np.ndarray, link: int, local: np.ndarray | None = None,
                     data: mujoco.MjData | None = None
                     ) -> tuple[np.ndarray, np.ndarray, mujoco.MjData]:
        """World positions and normals of a link's points (default: all its samples) at q
        (``data``: :meth:`kinematics` of that q, to share one across links)."""
        d = self.kinematics(q) if data is None else data
        b = int(self.bodies[link])
        R = d.xmat[b].reshape(3, 3)
        pts = self.points[link] if local is None else np.atleast_2d(local)
        return d.xpos[b] + pts @ R.T, self.normals[link] @ R.T, d

    def point_jacobian(self, d: mujoco.MjData, link: int, p_world: np.ndarray) -> np.ndarray:
        """(3, nv) position Jacobian of a world point fixed to the link."""
        jacp = np.zeros((3, self.model.nv))
        mujoco.mj_jac(self.model, d, jacp, None, p_world, int(self.bodies[link]))
        return jacp

    def point_jacobians(self, d: mujoco.MjData, link: int, p_world: np.ndarray) -> np.ndarray:
        """(P, 3, nv) position Jacobians of world points ``p_world`` (P, 3) fixed to the link:
        one ``mj_jac`` at the body origin o, then column j at p is ``jacp_j(o) + jacr_j x
        (p - o)`` (a rigid body's velocity field), so P points cost one MuJoCo call."""
        b = int(self.bodies[link])
        jacp = np.zeros((3, self.model.nv))
        jacr = np.zeros((3, self.model.nv))
        origin = d.xpos[b].copy()
        mujoco.mj_jac(self.model, d, jacp, jacr, origin, b)
        arm = np.atleast_2d(p_world) - origin  # (P, 3)
        spin = np.cross(jacr.T[None, :, :], arm[:, None, :])  # (P, nv, 3)
        return jacp[None] + np.swapaxes(spin, 1, 2)
