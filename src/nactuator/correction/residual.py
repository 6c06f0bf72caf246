"""A residual policy that corrects commanded joint targets, learned through model + sim.

A position servo sent the target itself lags behind it and sags under gravity (see
``nactuator.planning``). ``plan`` fixes one trajectory by optimising its commands; here one
small network learns the fix for *any* trajectory of the same robot::

    u[t] = target[t] + Δu[t],   Δu[t] = π(target[t - p], ..., target[t + f])

π reads the target's recent history and short preview around t (relative to target[t]) and
target[t] itself (gravity depends on the pose), and is trained by gradient descent on the
tracking error of the differentiable counterfactual actuator model + simulator
(:func:`nactuator.rollout.rollout_episodes`), the model's weights frozen. The last layer
starts at zero, so training starts from the uncorrected commands. π is feedforward: it reads
the target only, never the measured state, so corrected commands are computed before the
motion and replayed as they are (no feedback loop to destabilise).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from nactuator.errors import UserError
from nactuator.rollout import rollout_episodes

__all__ = ["CorrectionError", "ResidualPolicy", "fit_residual", "model_tracking"]


class CorrectionError(UserError, ValueError):
    """The correction cannot be learned or applied; the message says why."""


class ResidualPolicy(nn.Module):
    """Δu (T, n) from a target (T, n): an MLP over each frame's target window."""

    def __init__(self, n: int, offsets: Sequence[int] = (-4, -2, -1, 1, 2, 4, 8),
                 hidden: int = 64, max_delta: float = 0.3,
                 joints: Sequence[int] | None = None) -> None:
        super().__init__()
        self.n, self.offsets, self.max_delta = n, tuple(int(o) for o in offsets), max_delta
        # The joints it corrects; the others get their target unchanged (e.g. a gripper
        # closing on an object, which a free-motion model cannot predict).
        self.joints = list(range(n)) if joints is None else sorted(int(j) for j in joints)
        mask = torch.zeros(n)
        mask[self.joints] = 1.0
        self.register_buffer("mask", mask, persistent=False)
        self.net = nn.Sequential(nn.Linear(n * (len(self.offsets) + 1), hidden), nn.Tanh(),
                                 nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, n))
        # Zero output at the start: training begins at the uncorrected commands.
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def features(self, target: torch.Tensor) -> torch.Tensor:
        """(B, T, n) -> (B, T, n * (offsets + 1)): the window relative to target[t], and
        target[t]; beyond the ends the target holds its first/last value."""
        length = target.shape[-2]
        index = torch.arange(length, device=target.device)
        parts = [target]
        for o in self.offsets:
            shifted = target[..., (index + o).clamp(0, length - 1), :]
            parts.append((shifted - target) * 10.0)  # ~0.1 rad steps -> O(1) inputs
        return torch.cat(parts, dim=-1)

    def forward(self, target: torch.Tensor) -> torch.Tensor:
        return self.max_delta * torch.tanh(self.net(self.features(target))) * self.mask

    def corrected(self, target: np.ndarray) -> np.ndarray:
        """The corrected commands (T, n) for one target (T, n), float64."""
        with torch.no_grad():
            t = torch.as_tensor(np.asarray(target), dtype=torch.float32)
            return (t + self(t)).numpy().astype(np.float64)


def _frames(commands: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """One episode's frames for a counterfactual model: commands, start state at rest."""
    return {"q_cmd": commands, "q_cmd_next": torch.cat([commands[1:], commands[-1:]]),
            "torque_enable": torch.ones_like(commands), "q": target,
            "qd": torch.zeros_like(target)}


@contextmanager
def _frozen(module: nn.Module) -> Iterator[None]:
    flags = [p.requires_grad for p in module.parameters()]
    for p in module.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in zip(module.parameters(), flags, strict=True):
            p.requires_grad_(f)


def _check(actuator) -> None:
    if actuator.mode != "counterfactual":
        raise CorrectionError(f"the checkpoint reads recorded telemetry ({actuator.inputs}), "
                              "which does not exist for commands never executed: learn the "
                              "correction through a counterfactual model (docs/counterfactual.md)")
    exogenous = [k for k in ("kp", "supply_voltage", "initial_temperature")
                 if k in actuator.inputs]
    if exogenous:
        raise CorrectionError(f"the model reads {exogenous}; the correction supports models "
                              "that read only commands and state (q_cmd, q, qd)")


def _simulate(actuator, sim, commands: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    episodes = [_frames(commands[b], targets[b]) for b in range(targets.shape[0])]
    return rollout_episodes(actuator, sim.step, episodes, grad=True).q


def model_tracking(actuator, sim, policy: ResidualPolicy | None, targets: np.ndarray,
                   joints: Sequence[int] | None = None) -> np.ndarray:
    """(B,) mean |q_model - target| [rad] over ``joints`` (default all) of the model + sim,
    corrected (or not: None)."""
    _check(actuator)
    joints = list(range(np.shape(targets)[2])) if joints is None else list(joints)
    tgt = torch.as_tensor(np.asarray(targets), dtype=torch.float32, device=sim.device)
    with torch.no_grad():
        u = tgt if policy is None else tgt + policy(tgt)
        q = _simulate(actuator, sim, u, tgt)[:, : tgt.shape[1]]
    err = (q[:, 1:] - tgt[:, 1:]).abs()[..., joints]
    return err.mean(dim=(1, 2)).cpu().numpy().astype(np.float64)


def fit_residual(actuator, sim, targets: np.ndarray, iterations: int = 60, lr: float = 3e-3,
                 batch: int = 4, smoothness: float = 1e-2, hidden: int = 64,
                 max_delta: float = 0.3, joints: Sequence[int] | None = None, seed: int = 0,
                 progress=None) -> tuple[ResidualPolicy, list[float]]:
    """Train π on training targets (B, T, n) through the frozen model + sim.

    Loss: mean squared tracking error + ``smoothness`` * mean squared Δu step (keeps the
    corrected commands free of chatter the model would not predict well). Returns the
    policy and the loss per iteration."""
    _check(actuator)
    targets = np.asarray(targets, dtype=np.float64)
    if targets.ndim != 3 or targets.shape[0] < 1:
        raise CorrectionError(f"targets must be (trajectories, frames, n), got {targets.shape}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    policy = ResidualPolicy(targets.shape[2], hidden=hidden, max_delta=max_delta,
                            joints=joints).to(sim.device)
    js = policy.joints
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    all_targets = torch.as_tensor(targets, dtype=torch.float32, device=sim.device)
    losses: list[float] = []
    with _frozen(actuator):
        for k in range(iterations):
            pick = rng.choice(len(targets), size=min(batch, len(targets)), replace=False)
            tgt = all_targets[pick]
            delta = policy(tgt)
            q = _simulate(actuator, sim, tgt + delta, tgt)[:, : tgt.shape[1]]
            loss = ((q[:, 1:] - tgt[:, 1:])[..., js] ** 2).mean()
            loss = loss + smoothness * ((delta[:, 1:] - delta[:, :-1]) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            if progress is not None:
                progress(k + 1, iterations, losses[-1])
    return policy, losses
