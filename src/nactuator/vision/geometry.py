"""Link geometry: the platform MJCF with the visual geoms of ``conf/vision/geoms/<platform>.yaml``
attached (``mujoco.MjSpec``), compiled by MuJoCo, read back as primitives in body frames.

Two kinds of primitive, the ones the soft renderer draws:

* *round* — capsules and spheres: a segment ``a → b`` and a radius (a sphere is a segment of
  length 0); its silhouette is the projected segment thickened by the projected radius;
* *hull* — boxes and cylinders (a cylinder as its ``cylinder_sides``-sided prism): a point
  set whose silhouette is the convex hull of the projected points.

Meshes are not supported: no platform has any (the MJCFs are inertial-only).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import mujoco
import numpy as np
import yaml

from nactuator.errors import UserError
from nactuator.paths import conf_dir
from nactuator.platforms import Platform, load_platform

__all__ = ["GeometryError", "LinkGeometry", "geometry_path", "load_link_geometry",
           "visual_model"]

_TYPES = {"capsule": mujoco.mjtGeom.mjGEOM_CAPSULE, "sphere": mujoco.mjtGeom.mjGEOM_SPHERE,
          "box": mujoco.mjtGeom.mjGEOM_BOX, "cylinder": mujoco.mjtGeom.mjGEOM_CYLINDER}
_CAPSULE, _SPHERE, _BOX = (int(_TYPES[k]) for k in ("capsule", "sphere", "box"))
# MuJoCo geom group of the visual geoms: what the reference ray caster looks at.
VISUAL_GROUP = 3


class GeometryError(UserError, ValueError):
    """A link-geometry file is wrong; the message names the file and the geom."""


def geometry_path(platform: str) -> Path:
    return conf_dir() / "vision" / "geoms" / f"{platform}.yaml"


def _read(platform: Platform) -> dict:
    path = geometry_path(platform.name)
    if not path.is_file():
        raise GeometryError(f"no link geometry for platform {platform.name!r}: {path} does not "
                            "exist (write one: conf/vision/geoms/so101.yaml is an example)")
    cfg = yaml.safe_load(path.read_text()) or {}
    if not isinstance(cfg.get("geoms"), list) or not cfg["geoms"]:
        raise GeometryError(f"{path}: 'geoms' must be a non-empty list")
    cfg["_source"] = path
    return cfg


def visual_model(platform: str | Platform) -> mujoco.MjModel:
    """The platform MJCF plus its visual geoms (group ``VISUAL_GROUP``, no contacts, no mass:
    the bodies' explicit inertials stay what they are)."""
    p = platform if isinstance(platform, Platform) else load_platform(platform)
    cfg = _read(p)
    src = cfg["_source"]
    spec = mujoco.MjSpec.from_file(str(p.robot_model_path()))
    for i, g in enumerate(cfg["geoms"]):
        where = f"{src}: geoms[{i}]"
        if not isinstance(g, dict) or "body" not in g or "type" not in g or "size" not in g:
            raise GeometryError(f"{where}: needs body, type and size, got {g!r}")
        if g["type"] not in _TYPES:
            raise GeometryError(f"{where}: type {g['type']!r} is not one of {sorted(_TYPES)}")
        body = spec.body(str(g["body"]))
        if body is None:
            raise GeometryError(f"{where}: body {g['body']!r} is not in {p.robot_model_path()}")
        size = [float(v) for v in g["size"]] + [0.0] * (3 - len(g["size"]))
        kw = {"type": _TYPES[g["type"]], "size": size, "group": VISUAL_GROUP,
              "contype": 0, "conaffinity": 0, "name": f"visual_{i}_{g['body']}"}
        if "fromto" in g:
            kw["fromto"] = [float(v) for v in g["fromto"]]
        if "pos" in g:
            kw["pos"] = [float(v) for v in g["pos"]]
        if "quat" in g:
            q = np.asarray(g["quat"], dtype=np.float64)
            kw["quat"] = (q / np.linalg.norm(q)).tolist()
        body.add_geom(**kw)
    return spec.compile()


@dataclass(frozen=True)
class LinkGeometry:
    """Primitives in their bodies' frames (numpy float64), and which link each belongs to.

    ``links`` are the names of the bodies that carry geometry, in MJCF order; ``round_*`` and
    ``hull_*`` index into them. ``hull_points`` is padded to a common count with copies of the
    first point; ``hull_count`` says how many are real.
    """

    platform: str
    links: list[str]
    round_a: np.ndarray      # (Nr, 3)
    round_b: np.ndarray      # (Nr, 3)
    round_radius: np.ndarray  # (Nr,)
    round_link: np.ndarray   # (Nr,) int
    hull_points: np.ndarray  # (Nh, V, 3)
    hull_count: np.ndarray   # (Nh,) int
    hull_link: np.ndarray    # (Nh,) int
    static_pose: dict[str, tuple[np.ndarray, np.ndarray]]  # body -> (R, p) at q = 0


def _quat_wxyz_matrix(q: np.ndarray) -> np.ndarray:
    m = np.zeros(9)
    mujoco.mju_quat2Mat(m, np.asarray(q, dtype=np.float64))
    return m.reshape(3, 3)


@lru_cache(maxsize=8)
def load_link_geometry(platform: str) -> LinkGeometry:
    """The link primitives of ``platform`` (cached: the file is read and compiled once)."""
    p = load_platform(platform)
    sides = int(_read(p).get("cylinder_sides", 12))
    m = visual_model(p)
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    visual = [g for g in range(m.ngeom) if m.geom_group[g] == VISUAL_GROUP]
    bodies = sorted({int(m.geom_bodyid[g]) for g in visual})
    links = [m.body(b).name for b in bodies]
    link_of = {b: i for i, b in enumerate(bodies)}
    ra, rb, rr, rl, hp, hl = [], [], [], [], [], []
    for g in visual:
        rot, pos, size = _quat_wxyz_matrix(m.geom_quat[g]), m.geom_pos[g], m.geom_size[g]
        link = link_of[int(m.geom_bodyid[g])]
        t = int(m.geom_type[g])  # an int; MuJoCo's enums compare unequal to numpy ints
        if t in (_CAPSULE, _SPHERE):
            half = size[1] if t == _CAPSULE else 0.0
            ra.append(pos - rot[:, 2] * half)
            rb.append(pos + rot[:, 2] * half)
            rr.append(size[0])
            rl.append(link)
            continue
        if t == _BOX:
            signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
            local = signs * size[:3]
        else:  # cylinder: radius size[0], half-height size[1], axis local z
            ang = 2 * np.pi * np.arange(sides) / sides
            ring = np.stack([np.cos(ang), np.sin(ang), np.zeros(sides)], 1) * size[0]
            local = np.concatenate([ring + [0, 0, -size[1]], ring + [0, 0, size[1]]])
        hp.append(local @ rot.T + pos)
        hl.append(link)
    width = max((len(h) for h in hp), default=1)
    hull = np.zeros((len(hp), width, 3))
    for i, h in enumerate(hp):
        hull[i, : len(h)] = h
        hull[i, len(h):] = h[0]
    static = {m.body(b).name: (d.xmat[b].reshape(3, 3).copy(), d.xpos[b].copy())
              for b in bodies if m.body_jntnum[b] == 0 and m.body_parentid[b] == 0}
    as_int = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return LinkGeometry(
        platform=p.name, links=links,
        round_a=np.asarray(ra).reshape(-1, 3), round_b=np.asarray(rb).reshape(-1, 3),
        round_radius=np.asarray(rr, dtype=np.float64), round_link=as_int(rl),
        hull_points=hull, hull_count=as_int([len(h) for h in hp]), hull_link=as_int(hl),
        static_pose=static,
    )
