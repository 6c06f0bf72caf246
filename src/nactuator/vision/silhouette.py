"""Differentiable soft silhouettes in pure torch (the same code on CPU and CUDA).

Each primitive's silhouette is described by a signed 2-D distance in pixels (negative
inside), the soft mask is ``sigmoid(−d / σ)``:

* round primitives (capsules, spheres): distance to the projected segment minus the projected
  radius, interpolated along the segment (``f r / z`` at each end);
* hull primitives (boxes, cylinder prisms): the convex hull of the projected points, as the
  largest signed distance to its edge lines. The hull's edges are found in torch: a pair of
  points is an edge when every other point lies on one side of its line; only the top
  ``V`` candidate half-planes are kept so the per-pixel work is V per primitive.

A link's distance is the minimum over its primitives (the union), the arm's the minimum over
links. The ``σ`` in pixels sets how far the gradient reaches: calibration starts wide and
narrows it. Losses: soft IoU and BCE against observed masks; metric: hard IoU.
"""

from __future__ import annotations

import itertools

import torch

from nactuator.vision.camera import Camera
from nactuator.vision.scene import ArmScene

__all__ = ["SilhouetteRenderer", "bce_loss", "hard_iou", "soft_iou_loss"]

_EDGE_EPS = 1e-4  # px: a point this close to a candidate edge line counts as on it


def _pixel_centres(width: int, height: int, device, dtype) -> torch.Tensor:
    v, u = torch.meshgrid(torch.arange(height, device=device, dtype=dtype) + 0.5,
                          torch.arange(width, device=device, dtype=dtype) + 0.5, indexing="ij")
    return torch.stack([u, v], -1).reshape(-1, 2)  # (P, 2), row-major like the image


def _round_sdf(pa, pb, ra, rb, pix) -> torch.Tensor:
    """(B, N, 2) segment ends, (B, N) end radii [px], (P, 2) pixels -> (B, N, P)."""
    ab = pb - pa
    length2 = (ab * ab).sum(-1).clamp_min(1e-12)
    ap = pix[None, None] - pa[:, :, None]                      # (B, N, P, 2)
    t = ((ap * ab[:, :, None]).sum(-1) / length2[..., None]).clamp(0.0, 1.0)
    closest = ap - t[..., None] * ab[:, :, None]
    dist = torch.sqrt((closest * closest).sum(-1) + 1e-12)
    return dist - (ra[..., None] + t * (rb - ra)[..., None])


class SilhouetteRenderer(torch.nn.Module):
    """Soft per-link silhouettes of an :class:`ArmScene` seen by a :class:`Camera`.

    ``renderer(q, camera, sigma)`` -> ``{"sdf": (B, L, H, W), "link": soft (B, L, H, W),
    "mask": soft union (B, H, W)}``; ``q`` (B, n) on the renderer's device, any float dtype.
    """

    def __init__(self, scene: ArmScene, device: str | torch.device = "cpu") -> None:
        super().__init__()
        self.scene = scene.to(device)
        self.device = torch.device(device)
        v = scene.hull_points.shape[1]
        pairs = torch.tensor(list(itertools.combinations(range(v), 2)), dtype=torch.long)
        real = torch.arange(v)[None] < scene.hull_count[:, None]          # (Nh, V)
        self.register_buffer("pair_i", pairs[:, 0].to(device))
        self.register_buffer("pair_j", pairs[:, 1].to(device))
        # Pairs involving a padding copy would repeat real edges and crowd the top-V.
        self.register_buffer("pair_real", (real[:, pairs[:, 0]] & real[:, pairs[:, 1]])
                             .to(device))
        self.n_keep = v
        self._pix: dict[tuple, torch.Tensor] = {}

    def _pixels(self, camera: Camera, dtype) -> torch.Tensor:
        k = camera.intrinsics
        key = (k.width, k.height, dtype)
        if key not in self._pix:
            self._pix[key] = _pixel_centres(k.width, k.height, self.device, dtype)
        return self._pix[key]

    def _hull_sdf(self, pts: torch.Tensor, pix: torch.Tensor) -> torch.Tensor:
        """(B, Nh, V, 2) projected points, (P, 2) pixels -> (B, Nh, P)."""
        pi, pj = pts[:, :, self.pair_i], pts[:, :, self.pair_j]          # (B, Nh, E, 2)
        e = pj - pi
        length = torch.sqrt((e * e).sum(-1) + 1e-20)
        n = torch.stack([e[..., 1], -e[..., 0]], -1) / length[..., None]
        side = torch.einsum("bhec,bhvc->bhev", n, pts) - (n * pi).sum(-1, keepdim=True)
        ok = self.pair_real[None] & (length > 1e-6)
        with torch.no_grad():
            outward_n = ok & (side <= _EDGE_EPS).all(-1)    # others on the −n side: n points out
            outward_m = ok & (side >= -_EDGE_EPS).all(-1)
        normals = torch.cat([n, -n], 2)                                  # (B, Nh, 2E, 2)
        offsets = torch.cat([(n * pi).sum(-1), -(n * pi).sum(-1)], 2)    # (B, Nh, 2E)
        valid = torch.cat([outward_n, outward_m], 2)
        keep = torch.topk(valid.to(pts.dtype), self.n_keep, dim=-1).indices
        normals = torch.gather(normals, 2, keep[..., None].expand(-1, -1, -1, 2))
        offsets = torch.gather(offsets, 2, keep)
        valid = torch.gather(valid, 2, keep)
        d = torch.einsum("bhkc,pc->bhkp", normals, pix) - offsets[..., None]
        d = torch.where(valid[..., None], d, torch.full_like(d, -1e6))
        return d.amax(2)

    def forward(self, q: torch.Tensor, camera: Camera, sigma: float = 0.7) -> dict:
        k = camera.intrinsics
        prim = self.scene.primitives(q)
        pix = self._pixels(camera, q.dtype)
        focal = 0.5 * (k.fx + k.fy)
        pa, za = camera.project(prim["round_a"])
        pb, zb = camera.project(prim["round_b"])
        rad = self.scene.round_radius.to(q.dtype)
        d_round = _round_sdf(pa, pb, focal * rad / za, focal * rad / zb, pix)
        hull_uv, _ = camera.project(prim["hull"])
        d_hull = self._hull_sdf(hull_uv, pix)
        b, n_links = q.shape[0], self.scene.n_links
        big = torch.full((b, n_links, pix.shape[0]), 1e6, dtype=q.dtype, device=q.device)
        # Union per link = minimum over the link's primitives (scatter by link index).
        idx_r = self.scene.round_link.to(q.device)[None, :, None].expand_as(d_round)
        idx_h = self.scene.hull_link.to(q.device)[None, :, None].expand_as(d_hull)
        sdf = big.scatter_reduce(1, idx_r, d_round, reduce="amin")
        sdf = sdf.scatter_reduce(1, idx_h, d_hull, reduce="amin")
        sdf = sdf.reshape(b, n_links, k.height, k.width)
        union = sdf.amin(1)
        return {"sdf": sdf, "link": torch.sigmoid(-sdf / sigma),
                "mask": torch.sigmoid(-union / sigma), "union_sdf": union}


def soft_iou_loss(pred: torch.Tensor, target: torch.Tensor,
                  valid: torch.Tensor | None = None) -> torch.Tensor:
    """1 − soft IoU per frame (masks (B, H, W) in [0, 1]), mean over the valid frames."""
    inter = (pred * target).flatten(1).sum(-1)
    union = (pred + target - pred * target).flatten(1).sum(-1).clamp_min(1e-6)
    loss = 1 - inter / union
    return loss.mean() if valid is None else loss[valid].mean()


def bce_loss(pred: torch.Tensor, target: torch.Tensor,
             valid: torch.Tensor | None = None) -> torch.Tensor:
    """Per-pixel binary cross-entropy, mean over the valid frames."""
    per = torch.nn.functional.binary_cross_entropy(pred.clamp(1e-6, 1 - 1e-6), target,
                                                   reduction="none").flatten(1).mean(-1)
    return per.mean() if valid is None else per[valid].mean()


def hard_iou(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """IoU per frame of two masks thresholded at 0.5, (B,); 1 when both are empty."""
    a, b = pred > 0.5, target > 0.5
    inter = (a & b).flatten(1).sum(-1).to(torch.float64)
    union = (a | b).flatten(1).sum(-1).to(torch.float64)
    return torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(union))
