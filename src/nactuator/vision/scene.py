"""The arm as the soft renderer sees it: link primitives placed by the simulator's torch FK.

Moving links take their poses from ``sim.kinematics.ChainKinematics`` (the FK training runs
through: renderer → FK → simulator → model); links without a joint (the base) keep the pose
MuJoCo gives them at q = 0. Everything is a torch buffer, so ``.to(device)`` moves the scene.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from nactuator.platforms import Platform, load_platform
from nactuator.sim.builder import _leaf, body_index, build_newton_model, joint_arrays
from nactuator.sim.kinematics import ChainKinematics
from nactuator.vision.geometry import LinkGeometry, load_link_geometry

__all__ = ["ArmScene", "chain_kinematics"]


@lru_cache(maxsize=4)
def _reference(platform: str):
    p = load_platform(platform)
    model = build_newton_model(p, 1, "cpu")
    return p, joint_arrays(model, p.n), [_leaf(k) for k in model.body_label], \
        body_index(model, p.end_effector.body)


def chain_kinematics(platform: str) -> tuple[ChainKinematics, list[str]]:
    """The simulator's FK of ``platform`` (as ``Simulator`` builds it) and its body names."""
    p, arrays, names, ee = _reference(platform)
    kin = ChainKinematics(arrays, kinds=[c.kind for c in p.channels],
                          armature=[c.armature for c in p.channels], ee_body=ee,
                          ee_offset=p.end_effector.offset)
    return kin, list(names)


class ArmScene(torch.nn.Module):
    """Link primitives of one platform in the base frame for a batch of joint states."""

    def __init__(self, platform: str | Platform, kinematics: ChainKinematics | None = None,
                 body_names: list[str] | None = None) -> None:
        super().__init__()
        name = platform.name if isinstance(platform, Platform) else str(platform)
        if kinematics is None:
            kinematics, body_names = chain_kinematics(name)
        self.kinematics = kinematics
        self.geometry: LinkGeometry = load_link_geometry(name)
        g = self.geometry
        self.links = list(g.links)
        self.n_links = len(self.links)
        # Each link's pose: a moving body of the chain, or a static one (fixed pose).
        moving, static_r, static_p = [], [], []
        for link in self.links:
            if link in g.static_pose:
                moving.append(-1)
                r, p = g.static_pose[link]
            else:
                if body_names is None or link not in body_names:
                    raise ValueError(f"link {link!r} is neither static nor a body of the chain "
                                     f"{body_names}")
                moving.append(body_names.index(link))
                r, p = np.eye(3), np.zeros(3)
            static_r.append(r)
            static_p.append(p)
        self.chain_body = moving
        f32 = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
        self.register_buffer("static_rot", f32(static_r))
        self.register_buffer("static_pos", f32(static_p))
        self.register_buffer("round_a", f32(g.round_a))
        self.register_buffer("round_b", f32(g.round_b))
        self.register_buffer("round_radius", f32(g.round_radius))
        self.register_buffer("hull_points", f32(g.hull_points))
        self.round_link = torch.as_tensor(g.round_link)
        self.hull_link = torch.as_tensor(g.hull_link)
        self.hull_count = torch.as_tensor(g.hull_count)

    def link_poses(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotations (B, L, 3, 3) and origins (B, L, 3) of the links in the base frame."""
        frames = self.kinematics.frames(q)
        b = q.shape[0]
        rots, poss = [], []
        for i, body in enumerate(self.chain_body):
            if body < 0:
                rots.append(self.static_rot[i].to(q.dtype).expand(b, 3, 3))
                poss.append(self.static_pos[i].to(q.dtype).expand(b, 3))
            else:
                rots.append(frames["body_rot"][:, body])
                poss.append(frames["body_pos"][:, body])
        return torch.stack(rots, 1), torch.stack(poss, 1)

    def primitives(self, q: torch.Tensor) -> dict[str, torch.Tensor]:
        """World (base-frame) primitives: ``round_a``/``round_b`` (B, Nr, 3), ``hull`` (B, Nh,
        V, 3), in q's dtype."""
        rot, pos = self.link_poses(q)
        dt = q.dtype

        def place(points: torch.Tensor, link: torch.Tensor) -> torch.Tensor:
            r, p = rot[:, link], pos[:, link]  # (B, N, 3, 3), (B, N, 3)
            pts = points.to(dt)
            if pts.ndim == 2:
                return (r @ pts[None, :, :, None])[..., 0] + p
            return torch.einsum("bnij,nvj->bnvi", r, pts) + p[:, :, None]

        return {"round_a": place(self.round_a, self.round_link),
                "round_b": place(self.round_b, self.round_link),
                "hull": place(self.hull_points, self.hull_link)}
