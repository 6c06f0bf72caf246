"""The four output heads every encoder shares (SPEC §4).

An encoder turns a token window into one feature vector ``h`` per sample; the heads read
``h`` and produce the torque surrogate (the only output that drives the simulator), the
end-effector force with its contact gate, and the per-motor condition score.
"""

from __future__ import annotations

import torch
from torch import nn

OUTPUT_KEYS = ("tau", "force", "force_raw", "gate", "gate_logit", "condition", "condition_logit")


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.SiLU(), nn.Linear(hidden, n_out))


class ActuatorHeads(nn.Module):
    """Torque, force/gate and condition heads (MLPs with SiLU) on a pooled feature ``h``.

    ``tau_init_scale`` shrinks the torque readout at initialisation so that the first
    rollouts through the simulator see near-zero effort instead of random kicks of
    several N·m (which would send the arm into its limits and blow up BPTT gradients).
    """

    def __init__(self, width: int, n_motors: int, head_hidden: int = 160,
                 tau_init_scale: float = 0.01) -> None:
        super().__init__()
        hidden = head_hidden
        self.torque = _mlp(width, hidden, n_motors)
        # Force: one force-specific hidden feature, read out twice (raw force, gate), so the
        # gate and the force magnitude agree on what "contact" looks like.
        self.force_hidden = nn.Sequential(nn.Linear(width, hidden), nn.SiLU())
        self.force_readout = nn.Linear(hidden, 3)
        self.gate_readout = nn.Linear(hidden, 1)
        self.condition = _mlp(width, hidden, n_motors)

        with torch.no_grad():
            last = self.torque[-1]
            last.weight.mul_(tau_init_scale)
            last.bias.zero_()

    def forward(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        force_feature = self.force_hidden(h)
        force_raw = self.force_readout(force_feature)
        gate_logit = self.gate_readout(force_feature)
        gate = torch.sigmoid(gate_logit)
        condition_logit = self.condition(h)
        return {
            "tau": self.torque(h),
            "force": gate * force_raw,
            "force_raw": force_raw,
            "gate": gate,
            "gate_logit": gate_logit,
            "condition": torch.sigmoid(condition_logit),
            "condition_logit": condition_logit,
        }
