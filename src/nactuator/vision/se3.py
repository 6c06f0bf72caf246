"""The SE(3) exponential map in torch: the camera extrinsic is learned as a 6-vector.

A pose is ``T = exp(ξ^) T0`` with ``ξ = (ρ, ω)`` (translation part first, metres; rotation
part second, radians), so ``ξ = 0`` is the starting guess and the optimiser moves in the
tangent space, where every direction is a valid rigid motion (no re-orthonormalisation).
"""

from __future__ import annotations

import torch

__all__ = ["rotation_angle", "se3_exp", "so3_exp"]

_SMALL = 1e-4  # below this |ω| the Taylor series are exact to float64 rounding


def _hat(w: torch.Tensor) -> torch.Tensor:
    x, y, z = w.unbind(-1)
    o = torch.zeros_like(x)
    return torch.stack([o, -z, y, z, o, -x, -y, x, o], -1).reshape(*w.shape[:-1], 3, 3)


def _coefficients(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sin θ/θ, (1 − cos θ)/θ², (θ − sin θ)/θ³ with their series near 0 (finite gradients)."""
    small = theta < _SMALL
    t = torch.where(small, torch.ones_like(theta), theta)  # no 0/0 in the unused branch
    t2 = theta * theta
    a = torch.where(small, 1 - t2 / 6, torch.sin(t) / t)
    b = torch.where(small, 0.5 - t2 / 24, (1 - torch.cos(t)) / (t * t))
    c = torch.where(small, 1 / 6 - t2 / 120, (t - torch.sin(t)) / (t * t * t))
    return a, b, c


def so3_exp(w: torch.Tensor) -> torch.Tensor:
    """Rotation vectors (..., 3) -> rotation matrices (..., 3, 3) (Rodrigues)."""
    theta = torch.sqrt((w * w).sum(-1) + 1e-30)  # + tiny: finite gradient at ω = 0
    a, b, _ = _coefficients(theta)
    k = _hat(w)
    eye = torch.eye(3, dtype=w.dtype, device=w.device).expand_as(k)
    return eye + a[..., None, None] * k + b[..., None, None] * (k @ k)


def se3_exp(xi: torch.Tensor) -> torch.Tensor:
    """Twists ``(..., 6) = (ρ, ω)`` -> homogeneous transforms (..., 4, 4)."""
    if xi.shape[-1] != 6:
        raise ValueError(f"an se(3) vector has 6 entries (rho, omega), got shape {tuple(xi.shape)}")
    rho, w = xi[..., :3], xi[..., 3:]
    theta = torch.sqrt((w * w).sum(-1) + 1e-30)
    a, b, c = _coefficients(theta)
    k = _hat(w)
    eye = torch.eye(3, dtype=xi.dtype, device=xi.device).expand_as(k)
    rot = eye + a[..., None, None] * k + b[..., None, None] * (k @ k)
    v = eye + b[..., None, None] * k + c[..., None, None] * (k @ k)  # left Jacobian of SO(3)
    t = (v @ rho[..., None])[..., 0]
    top = torch.cat([rot, t[..., None]], -1)
    bottom = torch.zeros(*xi.shape[:-1], 1, 4, dtype=xi.dtype, device=xi.device)
    bottom[..., 0, 3] = 1
    return torch.cat([top, bottom], -2)


def rotation_angle(r: torch.Tensor) -> torch.Tensor:
    """Angle (rad) of rotation matrices (..., 3, 3), robust near 0 and π."""
    cos = ((r.diagonal(dim1=-2, dim2=-1).sum(-1) - 1) / 2).clamp(-1.0, 1.0)
    w = torch.stack([r[..., 2, 1] - r[..., 1, 2], r[..., 0, 2] - r[..., 2, 0],
                     r[..., 1, 0] - r[..., 0, 1]], -1)
    sin = torch.linalg.vector_norm(w, dim=-1) / 2
    return torch.atan2(sin, cos)
