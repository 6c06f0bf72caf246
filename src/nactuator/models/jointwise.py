"""Joint-wise neural dynamics (DexNDM, SPEC §7): one small network shared by every joint.

Each joint is encoded from its own history only — the L frames of its own channels
(command, position, velocity, effort telemetry, its own tracking error, ...) — by weights
shared across joints, plus a learned joint-id embedding. System-wide effects (inertial and
gravity coupling, a payload) enter through one low-dimensional *system latent*: each joint
writes a ``latent_dim``-vector (≤ 8), the vectors are mean-pooled over joints, and the pooled
latent is fed back to every joint. Mean pooling keeps the latent independent of the joint
count and of joint order, which is what lets one network learn from every joint's data at
once (data efficiency) and is the hook for moving a model between arms.

The encoder returns per-joint features (B, n_motors, width); :class:`JointwiseHeads` reads
them with the same outputs as :class:`~nactuator.models.heads.ActuatorHeads`: torque and
condition per joint through a readout shared by all joints, the whole-arm force and contact
gate from a deep-set pooling (mean over joints) of per-joint force features.

Two dynamics (``dynamics``): ``torque`` (the default, our trained-through-the-simulator
setting: each joint's readout is its simulator torque) or ``next_state`` (DexNDM's own
training): each joint's readout is its own change of position and velocity over the next
control step, ``state_delta`` (B, n, 2) in units of the training data's per-step std
(:class:`~nactuator.models.NeuralActuator` scales it to ``dq``, ``dqd``); the model then *is*
the step of a rollout, no simulator (:mod:`nactuator.rollout`), trained by a supervised
next-state loss on recorded windows (:func:`nactuator.rollout.teacher_forced_rollout`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nactuator.models.heads import ForceLogVariance, head_outputs

MAX_LATENT_DIM = 8  # SPEC §7: "a low-dimensional variable"; issue 22 caps it at 8
DYNAMICS = ("torque", "next_state")


class JointwiseEncoder(nn.Module):
    """Tokens (B, L, n_in) -> per-joint features (B, n_motors, hidden).

    The token layout is the FeatureBuilder's (channel-major: ``n_channels`` blocks of
    ``n_motors`` columns), so joint ``j``'s history is column ``j`` of every block.
    """

    def __init__(self, n_in: int, window_length: int = 9, n_motors: int = 1, hidden: int = 128,
                 n_layers: int = 2, latent_dim: int = 8, dropout: float = 0.1) -> None:
        super().__init__()
        if n_motors < 1 or n_in % n_motors:
            raise ValueError(f"jointwise needs n_in divisible by n_motors, got n_in={n_in}, "
                             f"n_motors={n_motors}")
        if n_layers < 1:
            raise ValueError(f"jointwise n_layers must be >= 1, got {n_layers}")
        if not 0 <= latent_dim <= MAX_LATENT_DIM:
            raise ValueError(f"jointwise latent_dim must be in 0..{MAX_LATENT_DIM} (0: joints "
                             f"independent, no system latent), got {latent_dim}")
        self.width = hidden
        self.n_motors = n_motors
        self.n_channels = n_in // n_motors
        self.window_length = window_length
        self.latent_dim = latent_dim
        # Joint-id embedding as a per-joint bias of the first layer: the same function as a
        # Linear on [history, one-hot id], without broadcasting an id tensor per batch.
        self.history_proj = nn.Linear(window_length * self.n_channels, hidden)
        self.joint_embedding = nn.Parameter(torch.randn(n_motors, hidden) * 0.02)
        layers: list[nn.Module] = [nn.SiLU(), nn.Dropout(dropout)]
        for _ in range(n_layers - 1):
            layers += [nn.Linear(hidden, hidden), nn.SiLU(), nn.Dropout(dropout)]
        self.history = nn.Sequential(*layers)
        if latent_dim:
            self.to_latent = nn.Linear(hidden, latent_dim)
            self.from_latent = nn.Linear(latent_dim, hidden)
            self.fuse = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def joint_histories(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, L, C·n) -> (B, n, L·C): each joint's own window, flattened."""
        per = tokens.reshape(-1, self.window_length, self.n_channels, self.n_motors)
        return per.permute(0, 3, 1, 2).reshape(-1, self.n_motors,
                                               self.window_length * self.n_channels)

    def system_latent(self, features: torch.Tensor) -> torch.Tensor:
        """(B, n, hidden) per-joint features -> (B, latent_dim), pooled over joints."""
        return self.to_latent(features).mean(dim=1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        f = self.history(self.history_proj(self.joint_histories(tokens)) + self.joint_embedding)
        if self.latent_dim:
            z = self.system_latent(f)
            # Residual update of each joint's feature from itself and the shared latent.
            f = f + F.silu(self.fuse(f) + self.from_latent(z).unsqueeze(1))
        return self.norm(f)


class JointwiseHeads(nn.Module):
    """The outputs of :class:`~nactuator.models.heads.ActuatorHeads` from per-joint features.

    Torque and condition: ``Linear -> SiLU -> Linear(1)`` on each joint's feature, weights
    shared by all joints. Force and gate: the same first layer on each joint, mean over joints
    (a deep set: the joint-id embedding inside each feature says which joint contributed),
    then the force readout. ``tau_init_scale`` shrinks the torque readout as there.
    """

    def __init__(self, width: int, n_motors: int, head_hidden: int = 160,
                 tau_init_scale: float = 0.01, uncertainty: bool = False,
                 dynamics: str = "torque") -> None:
        super().__init__()
        if dynamics not in DYNAMICS:
            raise ValueError(f"jointwise dynamics must be one of {DYNAMICS}, got {dynamics!r}")
        self.dynamics = dynamics
        self.head_hidden = head_hidden
        self.n_motors = n_motors
        self.hidden = nn.Linear(width, 3 * head_hidden)
        self.torque_readout = nn.Linear(head_hidden, 1)
        self.force_readout = nn.Linear(head_hidden, 4)
        self.condition_readout = nn.Linear(head_hidden, 1)
        self.force_log_var = ForceLogVariance(head_hidden) if uncertainty else None
        with torch.no_grad():
            self.torque_readout.weight.mul_(tau_init_scale)
            self.torque_readout.bias.zero_()
        # next_state: the per-joint readout is (Δq, Δqd) in per-step std units, shared by all
        # joints; it replaces the torque readout (started at "no change", as the torque's
        # small start is "no torque").
        self.state_readout = None
        if dynamics == "next_state":
            self.torque_readout = None
            self.state_readout = nn.Linear(head_hidden, 2)
            with torch.no_grad():
                self.state_readout.weight.mul_(tau_init_scale)
                self.state_readout.bias.zero_()

    def forward(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        torque_feature, force_feature, condition_feature = F.silu(self.hidden(h)).split(
            self.head_hidden, dim=-1)
        pooled = force_feature.mean(dim=1)
        force_raw, gate_logit = self.force_readout(pooled).split((3, 1), dim=-1)
        if self.state_readout is not None:
            # no torque: the model predicts the state; "tau" is NaN (not predicted)
            state_delta = self.state_readout(torque_feature)
            tau = torch.full_like(state_delta[..., 0], float("nan"))
        else:
            tau = self.torque_readout(torque_feature).squeeze(-1)
        out = head_outputs(tau, force_raw, gate_logit,
                           self.condition_readout(condition_feature).squeeze(-1))
        if self.state_readout is not None:
            out["state_delta"] = state_delta
        if self.force_log_var is not None:
            out["force_log_var"] = self.force_log_var(pooled)
        return out
