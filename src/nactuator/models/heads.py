"""The four output heads every encoder shares (SPEC §4).

An encoder turns a token window into one feature vector ``h`` per sample; the heads read
``h`` and produce the torque surrogate (the only output that drives the simulator), the
end-effector force with its contact gate, and the per-motor condition score.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nactuator.uncertainty import LOG_VAR_MAX, LOG_VAR_MIN

OUTPUT_KEYS = ("tau", "force", "force_raw", "gate", "gate_logit", "condition", "condition_logit")
# With ``uncertainty``: the log-variance (N²) of each force axis (the gated force's).
UNCERTAINTY_KEYS = ("force_log_var",)
INITIAL_FORCE_SIGMA_N = 0.3  # the log-variance readout starts at this σ (bias), weights small


class ForceLogVariance(nn.Module):
    """``Linear(head_hidden, 3)`` -> clamped log σ² per force axis (β-NLL-trained; the
    interval is :class:`~nactuator.models.NeuralActuator`'s, from its calibration scale)."""

    def __init__(self, head_hidden: int) -> None:
        super().__init__()
        self.readout = nn.Linear(head_hidden, 3)
        with torch.no_grad():
            self.readout.weight.mul_(0.1)
            self.readout.bias.fill_(2.0 * math.log(INITIAL_FORCE_SIGMA_N))

    def forward(self, force_feature: torch.Tensor) -> torch.Tensor:
        return self.readout(force_feature).clamp(LOG_VAR_MIN, LOG_VAR_MAX)


def head_outputs(tau: torch.Tensor, force_raw: torch.Tensor, gate_logit: torch.Tensor,
                 condition_logit: torch.Tensor) -> dict[str, torch.Tensor]:
    """The heads' outputs (``OUTPUT_KEYS``) from their readouts: the force is the raw force
    times the contact gate, gate and condition are the sigmoids of their logits."""
    gate = torch.sigmoid(gate_logit)
    return {"tau": tau, "force": gate * force_raw, "force_raw": force_raw, "gate": gate,
            "gate_logit": gate_logit, "condition": torch.sigmoid(condition_logit),
            "condition_logit": condition_logit}


class ActuatorHeads(nn.Module):
    """Torque, force/gate and condition heads (MLPs with SiLU) on a pooled feature ``h``.

    Each head is ``Linear -> SiLU -> Linear``. The three first layers all read ``h``, so
    they are stored as one ``Linear(width, 3 * head_hidden)`` (rows: torque, force,
    condition) and run as one matmul; the force head's two readouts (raw force, gate
    logit) likewise share one ``Linear(head_hidden, 4)``. This is the same function as
    separate layers with fewer kernel launches, which is what batch-1 latency is made of.

    ``uncertainty`` adds a heteroscedastic force head (:class:`ForceLogVariance`, output
    ``force_log_var``) on the force feature, trained with β-NLL (``nactuator.uncertainty``).

    ``tau_init_scale`` shrinks the torque readout at initialisation so that the first
    rollouts through the simulator see near-zero effort instead of random kicks of
    several N·m (which would send the arm into its limits and blow up BPTT gradients).
    """

    def __init__(self, width: int, n_motors: int, head_hidden: int = 160,
                 tau_init_scale: float = 0.01, uncertainty: bool = False) -> None:
        super().__init__()
        self.head_hidden = head_hidden
        self.hidden = nn.Linear(width, 3 * head_hidden)
        self.torque_readout = nn.Linear(head_hidden, n_motors)
        # Raw force (3) and contact-gate logit (1) read the same force-specific feature, so
        # the gate and the force magnitude agree on what "contact" looks like.
        self.force_readout = nn.Linear(head_hidden, 4)
        self.condition_readout = nn.Linear(head_hidden, n_motors)
        # Optional (off: the state dict and outputs of models before it, unchanged).
        self.force_log_var = ForceLogVariance(head_hidden) if uncertainty else None

        with torch.no_grad():
            self.torque_readout.weight.mul_(tau_init_scale)
            self.torque_readout.bias.zero_()

    def forward(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        torque_feature, force_feature, condition_feature = F.silu(self.hidden(h)).split(
            self.head_hidden, dim=-1)
        force_raw, gate_logit = self.force_readout(force_feature).split((3, 1), dim=-1)
        out = head_outputs(self.torque_readout(torque_feature), force_raw, gate_logit,
                           self.condition_readout(condition_feature))
        if self.force_log_var is not None:
            out["force_log_var"] = self.force_log_var(force_feature)
        return out


class PooledConditionHead(nn.Module):
    """The condition logit of each motor from that motor's pooled statistics alone
    (model_config ``condition_head: {kind: pooled, hidden: H}``; the input filters'
    ``pool``, normalised by the feature builder): per motor its own
    ``Linear(P, H) -> SiLU -> Linear(H, H) -> SiLU -> Linear(H, 1)``, batched as einsums.

    Why not the network's head: it reads the 9-frame window of every channel, and on a few
    dozen recorded runs it learns to recognise the runs themselves (train condition loss
    ~1e-4, validation rising; SO-101, docs/results.md §6.3.2). A motor's ~1 s statistics of
    its effort against its command are what a restriction changes, and a small classifier of
    only those cannot memorise a trajectory.

    ``shared=True`` (``condition_head: {kind: pooled, hidden: H, shared: true}``): one MLP
    whose weights are tied over the motors (parameters of leading size 1), so the head does
    not know which motor it scores: what the degraded joint of the training data looked
    like in its own normalised statistics is applied to every motor (a restriction of a
    joint never degraded in training, docs/results.md §6.3.3), it trains on every motor's
    frames, and permuting the motors permutes the logits.
    """

    def __init__(self, n_motors: int, n_stats: int, hidden: int = 32,
                 shared: bool = False) -> None:
        super().__init__()
        self.n_motors, self.n_stats, self.hidden = n_motors, n_stats, hidden
        self.shared = bool(shared)
        m = 1 if self.shared else n_motors

        def uniform(*shape: int, fan_in: int) -> nn.Parameter:  # nn.Linear's default init
            bound = 1.0 / math.sqrt(fan_in)
            return nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))

        self.w1 = uniform(m, n_stats, hidden, fan_in=n_stats)
        self.b1 = uniform(m, hidden, fan_in=n_stats)
        self.w2 = uniform(m, hidden, hidden, fan_in=hidden)
        self.b2 = uniform(m, hidden, fan_in=hidden)
        self.w3 = uniform(m, hidden, fan_in=hidden)
        self.b3 = uniform(m, fan_in=hidden)

    def forward(self, stats: torch.Tensor) -> torch.Tensor:
        """stats (B, P, n): each motor's normalised pooled statistics -> logits (B, n)."""
        if self.shared:  # one MLP on every motor's statistics
            x = stats.transpose(1, 2)  # (B, n, P)
            h = F.silu(x @ self.w1[0] + self.b1[0])
            h = F.silu(h @ self.w2[0] + self.b2[0])
            return h @ self.w3[0] + self.b3[0]
        h = F.silu(torch.einsum("bpn,nph->bnh", stats, self.w1) + self.b1)
        h = F.silu(torch.einsum("bnh,nhk->bnk", h, self.w2) + self.b2)
        return torch.einsum("bnh,nh->bn", h, self.w3) + self.b3
