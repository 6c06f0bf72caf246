"""A learned Jacobian field J_θ(q): the Neural Jacobian Fields recipe on world point tracks.

Self-supervised, as the seed fits its field: at random poses near a start pose, random
small command perturbations δu are sent and held ``horizon`` control steps, and the
tracked point's motion Δx (the world's own end-effector, plus Gaussian track noise) is
recorded; a small MLP maps the observation (here the measured joints, no images) to a
3 × n_u Jacobian and is fitted by ``‖J_θ(q) δu − Δx‖²``. Nothing of the world's model is
read: only commands in, point tracks out.

``nactuator field fit`` collects, fits and saves a field file (:func:`save_field`: weights
and sizes only, loaded with ``weights_only=True`` so a file runs no code);
``nactuator track --method field --field FILE`` tracks with it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from nactuator.atomic import atomic_path
from nactuator.constants import GRAVITY
from nactuator.errors import UserError
from nactuator.platforms import Platform

__all__ = ["FIELD_FORMAT", "JacobianField", "collect_perturbations", "fit_field", "load_field",
           "save_field"]

FIELD_FORMAT = "nactuator-jacobian-field/1"


def collect_perturbations(platform: Platform, q0: np.ndarray, joints: list[int], poses: int,
                          per_pose: int, horizon: int, spread: float = 0.3,
                          delta: float = 0.04, noise: float = 0.0005, payload_kg: float = 0.0,
                          world: str | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """(q (N, n) settled joints, du (N, k), dx (N, 3)) from ``poses × per_pose`` world arms
    run in lock-step, each settled at its pose, then its command stepped by δu."""
    from nactuator.world import World, load_world

    rng = np.random.default_rng(seed)
    k = len(joints)
    base = np.repeat(np.asarray(q0, float)[None], poses, axis=0)
    base[:, joints] += rng.uniform(-spread, spread, (poses, k))
    start = np.repeat(base, per_pose, axis=0)
    du = rng.uniform(-delta, delta, (len(start), k))
    w = World(platform, load_world(platform, world, seed), seed=seed, n_envs=len(start))
    w.reset(start)
    w.set_external_force([0.0, 0.0, -GRAVITY * payload_kg])
    w.step(float(w.params.physics["settle_seconds"]))
    q = w.telemetry()["q"]
    x0 = w.ee_position()
    goal = start.copy()
    goal[:, joints] += du
    for _ in range(horizon):
        w.set_goal(goal)
        w.step(platform.control_dt)
    dx = w.ee_position() - x0 + noise * rng.standard_normal(x0.shape)
    return {"q": q, "du": du, "dx": dx}


class JacobianField(torch.nn.Module):
    """J_θ(q): (B, n) measured joints -> (B, 3, k) Jacobian of the tracked point."""

    def __init__(self, n: int, joints: list[int], hidden: int = 64) -> None:
        super().__init__()
        self.n, self.hidden = n, hidden
        self.joints = list(joints)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2 * n, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, 3 * len(joints)))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        features = torch.cat([torch.sin(q), torch.cos(q)], -1)  # joint angles are periodic
        return self.net(features).reshape(len(q), 3, len(self.joints))

    def jacobian(self, q: np.ndarray, n: int) -> np.ndarray:
        """(3, n) at one measured ``q``, zero in the columns it does not control."""
        with torch.no_grad():
            J = self(torch.tensor(np.asarray(q, np.float32)[None]))[0].numpy()
        out = np.zeros((3, n))
        out[:, self.joints] = J
        return out


def fit_field(data: dict[str, np.ndarray], n: int, joints: list[int], steps: int = 3000,
              lr: float = 3e-3, seed: int = 0) -> tuple[JacobianField, dict[str, float]]:
    """Fit by full-batch Adam on ‖J_θ(q) δu − Δx‖²; reports the fit on a 20 % hold-out."""
    torch.manual_seed(seed)
    q = torch.tensor(data["q"], dtype=torch.float32)
    du = torch.tensor(data["du"], dtype=torch.float32)
    dx = torch.tensor(data["dx"], dtype=torch.float32)
    order = torch.randperm(len(q))
    cut = int(0.8 * len(q))
    tr, te = order[:cut], order[cut:]
    field = JacobianField(n, joints)
    opt = torch.optim.Adam(field.parameters(), lr=lr)

    def loss(idx: torch.Tensor) -> torch.Tensor:
        pred = torch.einsum("bij,bj->bi", field(q[idx]), du[idx])
        return ((pred - dx[idx]) ** 2).sum(-1).mean()

    for _ in range(steps):
        opt.zero_grad()
        value = loss(tr)
        value.backward()
        opt.step()
    field.eval()
    with torch.no_grad():
        held = float(loss(te))
        zero = float((dx[te] ** 2).sum(-1).mean())
    return field, {"train_mse": float(value.detach()), "heldout_mse": held,
                   "heldout_r2": 1.0 - held / zero, "samples": len(q)}


def save_field(path: str | os.PathLike, field: JacobianField, platform: str,
               info: dict) -> Path:
    """One file: the format tag, the platform, the sizes, the weights and ``info`` (how it
    was collected and how well it fits; plain numbers and strings)."""
    path = Path(path)
    payload = {"format": FIELD_FORMAT, "platform": platform, "n": field.n,
               "joints": field.joints, "hidden": field.hidden,
               "state_dict": field.state_dict(), "info": info}
    with atomic_path(path, suffix=".pt") as tmp:
        torch.save(payload, tmp)
    return path


def load_field(path: str | os.PathLike, expect_platform: str | None = None) -> JacobianField:
    """A field saved by :func:`save_field`; a clear error for anything else."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--field {path}: no such file (make one with `nactuator field fit`)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated file, a pickle with code, not a torch file
        raise UserError(f"--field {path}: not a Jacobian field file ({exc})") from exc
    if not isinstance(payload, dict) or payload.get("format") != FIELD_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise UserError(f"--field {path}: not a Jacobian field file (expected format "
                        f"{FIELD_FORMAT!r}, found {found!r})")
    if expect_platform is not None and payload["platform"] != expect_platform:
        raise UserError(f"--field {path} was fitted on {payload['platform']!r}, not "
                        f"{expect_platform!r}")
    field = JacobianField(int(payload["n"]), [int(j) for j in payload["joints"]],
                          int(payload["hidden"]))
    field.load_state_dict(payload["state_dict"])
    field.info = dict(payload.get("info", {}))
    return field.eval()
